// Where the window kernels (window_forward_cpu.cc, window_backward_cpu.cc) find each offset's
// keys: the offsets as raster distances in the order the kernels walk them, and the geometry of
// the packed (rows, ld) buffers in which position n sits at column margin + n.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <vector>

#include "attn2d/window_offsets.h"

namespace attn2d {
namespace cpu {

template <typename T>
struct WindowGeometry {
  std::int64_t height = 0, width = 0, count = 0;
  // (count,) raster distances dr * width + dc, ascending: consecutive offsets read nearby key
  // columns (against column-major order, the backward's loads ran 1.8x faster at 128x128 with
  // a 15x15 window, one thread, best of 9).
  std::vector<std::int64_t> off;
  std::vector<T> dr, dc;          // (count,) the same offsets' rows and columns, as T
  T dr_min = 0, dr_max = 0, dc_min = 0, dc_max = 0;
  std::int64_t off_min = 0, off_max = 0;
  std::int64_t lanes = 0;    // queries per vector
  std::int64_t margin = 0;   // zeros on each side of a packed row: max |off| + lanes
  std::int64_t vectors = 0;  // query vectors per head, ceil(N / lanes)
  std::int64_t ld = 0;       // packed row length: margin + vectors * lanes + margin
  std::int64_t per_row = 0;  // vectors per pixel row, ceil(width / lanes)

  WindowGeometry(const WindowOffsets& w, std::int64_t L)
      : height(w.height), width(w.width), count(w.count), lanes(L) {
    const size_t n = static_cast<size_t>(count);
    std::vector<size_t> idx(n);
    std::iota(idx.begin(), idx.end(), size_t{0});
    auto raster = [&](size_t o) { return std::int64_t{w.dr[o]} * width + w.dc[o]; };
    std::sort(idx.begin(), idx.end(), [&](size_t x, size_t y) { return raster(x) < raster(y); });
    off.resize(n);
    dr.resize(n);
    dc.resize(n);
    std::int64_t reach = 0;
    for (size_t o = 0; o < n; ++o) {
      off[o] = raster(idx[o]);
      dr[o] = static_cast<T>(w.dr[idx[o]]);
      dc[o] = static_cast<T>(w.dc[idx[o]]);
      reach = std::max(reach, std::abs(off[o]));
    }
    dr_min = *std::min_element(dr.begin(), dr.end());
    dr_max = *std::max_element(dr.begin(), dr.end());
    dc_min = *std::min_element(dc.begin(), dc.end());
    dc_max = *std::max_element(dc.begin(), dc.end());
    off_min = *std::min_element(off.begin(), off.end());
    off_max = *std::max_element(off.begin(), off.end());
    margin = (reach + L + L - 1) / L * L;
    vectors = (height * width + L - 1) / L;
    ld = 2 * margin + vectors * L;
    per_row = (width + L - 1) / L;
  }

  // True when all L lanes of the vector from query q0 lie in one pixel row and every offset of
  // every lane lands inside the map (no lane needs the mask).
  bool interior(std::int64_t q0) const {
    const std::int64_t i0 = q0 / width, j0 = q0 % width;
    return q0 + lanes <= height * width && j0 + lanes <= width && i0 + dr_min >= 0 &&
           i0 + dr_max < height && j0 + dc_min >= 0 && j0 + lanes - 1 + dc_max < width;
  }
};

}  // namespace cpu
}  // namespace attn2d
