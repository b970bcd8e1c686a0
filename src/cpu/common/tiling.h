// Tile sizes for the tiled CPU kernels: a pure function of the problem, so it is unit-tested
// and the same problem always gets the same tiles (and so bitwise-equal results).
#pragma once

#include <cstddef>
#include <cstdint>

#include "attn2d/kernel_choice.h"

namespace attn2d {
namespace cpu {

struct TileSizes {
  std::int64_t block_q = 0;  // query rows per tile, a multiple of 4 (the micro-kernel's rows)
  std::int64_t block_k = 0;  // keys per tile, a multiple of `granule` (>= the SIMD lanes)
};

// granule: the SIMD vector length in elements on the widest target (16 floats on AVX-512);
// block_k is a multiple of it so every target's vectors tile a key block exactly.
TileSizes choose_tiles(std::int64_t len_q, std::int64_t len_k, std::int64_t dim_qk,
                       std::int64_t dim_v, std::size_t elem_bytes, std::size_t granule);

// Key-tile groups of the backward's dQ sum: up to 8, a function of the problem only.
std::int64_t backward_dq_groups(std::int64_t k_tiles);

// The tiled backward's cheapest schedule (Schedule::kWholeHeads, kKeyTileGroups or kTwoPasses,
// tiled/tiled_backward.cc explains each) whose dQ buffers fit in max_share_bytes; slices =
// batch * heads, share_elems = len_q * E_pad (one (batch, head) slice's dQ share). All give
// bitwise-equal results, so the choice is free to depend on the thread count.
Schedule choose_backward_schedule(std::int64_t slices, int threads, std::int64_t dim_qk,
                                  std::int64_t dim_v, std::int64_t dq_groups,
                                  std::size_t share_elems, std::size_t elem_bytes,
                                  std::size_t max_share_bytes);

inline std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }
// floor(x / m) for m > 0 and x of either sign (C++ division truncates toward zero).
inline std::int64_t floor_div(std::int64_t x, std::int64_t m) {
  return x >= 0 ? x / m : -((-x + m - 1) / m);
}

}  // namespace cpu
}  // namespace attn2d
