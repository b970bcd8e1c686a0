// Scans of a sparse layout's tiles that decide how the CPU kernels read their inputs: plain
// functions of the layout, shared by every SIMD target and unit-tested.
#pragma once

#include <algorithm>
#include <cstdint>

#include "attn2d/sparse_layout.h"

namespace attn2d {
namespace cpu {

// Tasks per (batch, head): the most query (or key) tiles any layout has.
inline std::int64_t MostLayoutTiles(const SparseLayout& lay, bool query) {
  const std::int64_t* begin = query ? lay.q_tile_begin : lay.k_tile_begin;
  std::int64_t most = 0;
  for (std::int64_t i = 0; i < lay.num_layouts; ++i) most = std::max(most, begin[i + 1] - begin[i]);
  return most;
}

// Whether one of a layout's patterns has query (or key) tiles whose rows lie apart: at more
// than a quarter of its tiles' steps from one row to the next the position leaves its run of 16
// (a line of a channels-first float plane). A window's 8x8-pixel tiles leave it once in 8 rows,
// and the copies then cost more than they save. YLG's floor patterns leave it at every row under
// the official mapping and at every second row under the geometric one (a 2x2 block of queries
// shares a pattern row), where the copies pay. Its repetitive patterns' raster runs leave it
// once in 16. Asked per pattern: the copies serve every head, and YLG's repetitive heads would
// otherwise outvote its floor heads.
inline bool ScatteredTiles(const SparseLayout& lay, bool query) {
  const std::int64_t* begin = query ? lay.q_tile_begin : lay.k_tile_begin;
  const std::int32_t* rows = query ? lay.q_rows : lay.k_rows;
  const std::int64_t block = query ? lay.block_q : lay.block_k;
  for (std::int64_t pattern = 0; pattern < lay.num_layouts; ++pattern) {
    std::int64_t steps = 0, apart = 0;
    for (std::int64_t t = begin[pattern]; t < begin[pattern + 1]; ++t) {
      const std::int32_t* r = rows + t * block;
      for (std::int64_t i = 1; i < block && r[i] >= 0; ++i) {
        ++steps;
        apart += (r[i] >> 4) != (r[i - 1] >> 4) ? 1 : 0;
      }
    }
    if (4 * apart > steps) return true;
  }
  return false;
}

}  // namespace cpu
}  // namespace attn2d
