// Scans of a sparse layout's tiles that decide how the CPU kernels read their inputs: plain
// functions of the layout, shared by every SIMD target and unit-tested.
#pragma once

#include <cstdint>

#include "attn2d/sparse_layout.h"

namespace attn2d {
namespace cpu {

// Whether one of a layout's patterns has query (or key) tiles whose rows lie apart: at more
// than a quarter of its tiles' steps from one row to the next the position leaves its run of 16
// (a line of a channels-first float plane). A window's 8x8-pixel tiles leave it once in 8 rows,
// and the copies then cost more than they save (a 7x7 window over 2x-pooled keys, one head,
// E = 8, Ev = 32, 128x128: forward 1.14-1.18x the row-major time with them, 1.04-1.06x
// without). YLG's floor patterns leave it at every row under the official mapping and at every
// second row under the geometric one (a 2x2 block of queries shares a pattern row), where the
// copies pay too: YLG(8, mapping="geometric") at 128x128 over 64x64 on channels-first views,
// forward / backward against row-major inputs 1.21-1.22x / 1.12-1.16x with them and
// 1.29-1.30x / 1.25-1.30x without (one thread; two threads 1.18-1.21x / 1.18x against
// 1.23-1.38x / 1.25-1.27x). Its repetitive patterns' raster runs leave it once in 16. Asked
// per pattern: the copies serve every head, and YLG's repetitive heads would otherwise outvote
// its floor heads.
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
