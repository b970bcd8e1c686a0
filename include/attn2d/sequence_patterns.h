// Patterns over token sequences, the sparse attention ViT users ask for: a 1-D window, BigBird's
// random blocks with global tokens, and a user's block mask. The query and key grids are read
// as raster sequences of len_q = Hq*Wq and len_k = Hk*Wk tokens (a plain sequence is a 1 x L
// grid); query i is centred at key floor(i * len_k / len_q). Each has the calls of
// attn2d/patterns.h's Window and YLG: validate, dense_mask and compile to the block-sparse layout
// the kernels read; attn2d/pattern.h combines any of them.
#pragma once

#include <cstdint>
#include <vector>

#include "attn2d/patterns.h"

namespace attn2d {

// Query i sees the keys c + dilation*o for its centre c and o from -(size/2) to
// size-1-size/2 (an even size has one more key before the centre than after), or with `causal`
// from -(size-1) to 0: the centre and the keys before it. Keys outside the sequence are
// dropped. dilation*(size-1) must be smaller than len_k.
struct Window1D {
  std::int64_t size = 1;
  std::int64_t dilation = 1;
  bool causal = false;

  Status validate(GridShape q_hw, GridShape kv_hw, std::int64_t heads) const;
  Status dense_mask(GridShape q_hw, GridShape kv_hw, std::int64_t heads,
                    std::vector<std::uint8_t>* mask) const;
  // Tiles of 64 consecutive tokens on both sides; one layout shared by every head.
  Status compile(GridShape q_hw, GridShape kv_hw, std::int64_t heads,
                 CompiledLayout* layout) const;
};

// BigBird's random attention (Zaheer et al., 2020) on blocks of `block` tokens. Query block b
// (queries b*block .. b*block+block-1) sees its own key block, floor(b * key blocks / query
// blocks), and `blocks_per_row` other key blocks drawn at random; every query sees the first
// `global_tokens` keys, and the first `global_tokens` queries see every key. The draw is a
// partial Fisher-Yates shuffle of the other key blocks driven by SplitMix64, seeded by `seed`
// and the query block, with unbiased bounded integers from 64-bit arithmetic alone: the same
// blocks for the same seed on every run and every platform. Every head sees the same blocks.
struct Random {
  std::int64_t blocks_per_row = 1;
  std::int64_t block = 64;
  std::uint64_t seed = 0;
  std::int64_t global_tokens = 0;

  // block >= 1; 0 <= blocks_per_row < the key blocks; 0 <= global_tokens <= min(len_q, len_k).
  Status validate(GridShape q_hw, GridShape kv_hw, std::int64_t heads) const;
  Status dense_mask(GridShape q_hw, GridShape kv_hw, std::int64_t heads,
                    std::vector<std::uint8_t>* mask) const;
  Status compile(GridShape q_hw, GridShape kv_hw, std::int64_t heads,
                 CompiledLayout* layout) const;
  // The key blocks query block `query_block` sees beyond the global tokens (its own block and
  // the drawn ones, ascending), for len_q and len_k tokens; validate first.
  std::vector<std::int64_t> key_blocks(std::int64_t query_block, std::int64_t len_q,
                                       std::int64_t len_k) const;
};

// A user's boolean block layout: query i sees key j when mask[h][i / block_q][j / block_k] is
// nonzero, for head h (mask_heads = 1: one mask for every head).
struct BlockMask {
  std::int64_t block_q = 64;
  std::int64_t block_k = 64;
  std::int64_t mask_heads = 1;
  std::int64_t rows = 0;  // must be ceil(len_q / block_q)
  std::int64_t cols = 0;  // must be ceil(len_k / block_k)
  std::vector<std::uint8_t> mask;  // (mask_heads, rows, cols), row-major

  Status validate(GridShape q_hw, GridShape kv_hw, std::int64_t heads) const;
  Status dense_mask(GridShape q_hw, GridShape kv_hw, std::int64_t heads,
                    std::vector<std::uint8_t>* mask) const;
  // One layout per distinct head mask.
  Status compile(GridShape q_hw, GridShape kv_hw, std::int64_t heads,
                 CompiledLayout* layout) const;
};

}  // namespace attn2d
