// A pattern (local window, YLG, ...) as the CPU kernels consume it: a block-sparse, gathered
// tiling. Query tiles and key tiles are lists of raster rows; each query tile visits a list of
// key tiles, each key tile is visited by a list of query tiles (the backward walks those), and a
// visit either allows every pair or carries a bit mask of the allowed ones. Compiled from a
// pattern by attn2d/patterns.h (the Python package caches it per pattern, grids and heads);
// validated by attn2d::validate.
#pragma once

#include <cstdint>

namespace attn2d {

struct SparseLayout {
  std::int64_t block_q = 0;  // rows per query tile: a multiple of 4, at most 256
  std::int64_t block_k = 0;  // keys per key tile: 64, one mask word per query row
  std::int64_t num_layouts = 0;  // distinct patterns; head h uses layout head_layout[h]
  const std::int32_t* head_layout = nullptr;   // (heads,)
  const std::int64_t* q_tile_begin = nullptr;  // (num_layouts + 1,) global query-tile ranges
  const std::int64_t* k_tile_begin = nullptr;  // (num_layouts + 1,) global key-tile ranges
  // (total query tiles, block_q) query rows, then -1 padding; a layout's query tiles partition
  // 0..len_q-1, its key tiles partition 0..len_k-1 (each key in exactly one tile).
  const std::int32_t* q_rows = nullptr;
  const std::int32_t* k_rows = nullptr;  // (total key tiles, block_k)
  const std::int64_t* fwd_begin = nullptr;   // (total query tiles + 1,) CSR offsets
  const std::int32_t* fwd_k_tile = nullptr;  // (visits,) global key tile of each visit
  const std::int64_t* fwd_mask = nullptr;    // (visits,) mask index, -1: all pairs allowed
  const std::int64_t* bwd_begin = nullptr;   // (total key tiles + 1,) CSR offsets
  const std::int32_t* bwd_q_tile = nullptr;  // (visits,) global query tile of each visit
  const std::int64_t* bwd_mask = nullptr;    // (visits,)
  std::int64_t num_masks = 0;
  const std::uint64_t* masks = nullptr;  // (num_masks, block_q): bit c of row r allows key c
};

}  // namespace attn2d
