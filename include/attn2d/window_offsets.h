// A translation-invariant local window over one pixel grid, the shape most 2-D local attention
// takes (attn2d.patterns.Window with border "clip", queries and keys on the same grid): query
// pixel (i, j) sees key pixel (i + dr[o], j + dc[o]) for every offset o that lands inside the
// map. The CPU kernel for it vectorises across neighbouring queries, so it computes one score
// per (query, offset) instead of every pair of a visited 8x8-pixel tile pair (2.5x the allowed
// pairs for a 15x15 square, 4.9x for a diamond).
#pragma once

#include <cstdint>

namespace attn2d {

struct WindowOffsets {
  std::int64_t height = 0;  // the grid; len_q = len_k = height * width, raster order
  std::int64_t width = 0;
  std::int64_t count = 0;            // distinct offsets, at least 1
  const std::int32_t* dr = nullptr;  // (count,) row offsets in key pixels, |dr| < height
  const std::int32_t* dc = nullptr;  // (count,) column offsets, |dc| < width
};

}  // namespace attn2d
