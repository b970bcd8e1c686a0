// Where the window kernels (window_forward.cc, window_backward.cc) find each offset's
// keys: the offsets as raster distances in the order the kernels walk them, and the geometry of
// the packed (rows, ld) buffers in which position n sits at column margin + n.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <vector>

#include "attn2d/status.h"
#include "attn2d/window_offsets.h"
#include "cpu/common/tiling.h"

namespace attn2d {
namespace cpu {

// A map whose width is not a multiple of the vector's L lanes is laid out on rows of a pitch
// rounded up to L where pitch / width stays at most 4 / 3 (kMaxPitchRatio*): each pixel row starts
// a vector, a block's vectors are whole vectors one pixel row apart, and the blocked kernels
// serve it; the pad columns hold zeros and no query. Otherwise the one-vector-at-a-time kernels
// run on the raster itself: past 4/3 the pad columns cost more than the blocks save (on an Intel
// Xeon, L = 16, pitched rows ran a 7x7 square's backward on 100x100 1.4x as fast as the raster,
// and a 32x20 map, pitch 32, slower).
constexpr std::int64_t kMaxPitchRatioNum = 4, kMaxPitchRatioDen = 3;

// The blocks the window kernels ask of a geometry (block_rows_wanted, block_offsets): query
// vectors per block and column offsets per dots sweep, R x D = 24 accumulators + R query
// vectors + 1 key vector of AVX-512's 32 registers; (R + (R + D - 1)) / (R D) = 0.54 loads per
// multiply-add.
constexpr size_t kBlockRows = 4;
constexpr size_t kBlockOffsets = 6;

// The kernel chooser (core/kernel_choice.cc) builds the same geometry to pick the blocked or the
// one-vector kernels; a kernel whose geometry disagrees with that choice refuses to run.
inline Status WindowChoiceDisagrees() {
  return Status::Unsupported("the window geometry disagrees with the kernel choice");
}

template <typename T>
struct WindowGeometry {
  std::int64_t height = 0, width = 0, count = 0;
  // Positions in the kernels' raster: position n is pixel (n / pitch, n % pitch), a pad column
  // when n % pitch >= width. pitch == width unless the map is laid out pitched (above).
  std::int64_t pitch = 0;
  // (count,) raster distances dr * pitch + dc, ascending: consecutive offsets read nearby key
  // columns.
  std::vector<std::int64_t> off;
  std::vector<T> dr, dc;          // (count,) the same offsets' rows and columns, as T
  T dr_min = 0, dr_max = 0, dc_min = 0, dc_max = 0;
  std::int64_t off_min = 0, off_max = 0;
  std::int64_t lanes = 0;    // queries per vector
  std::int64_t margin = 0;   // zeros on each side of a packed row: max |off| + lanes
  std::int64_t vectors = 0;  // query vectors per head, ceil(positions() / lanes)
  std::int64_t ld = 0;       // packed row length: margin + vectors * lanes + margin
  std::int64_t per_row = 0;  // vectors per pixel row, ceil(width / lanes)

  // The offsets again, grouped by column dc for the blocked kernels: where each column's row
  // offsets are evenly spaced by one step s (a square, diamond or disk, dilated or not), query
  // vectors `block_stride` = s * width apart share key loads: query k of a block
  // at its column's m-th offset reads the key row u = k + m, so R queries x D offsets of a
  // column read R + D - 1 key rows instead of R D.
  struct Column {
    std::int64_t base;   // raster distance of the column's first offset (its smallest dr)
    std::int64_t n;      // its offsets: base + m * block_stride, m < n
    std::int64_t first;  // index of its first offset in column order
  };
  std::vector<Column> columns;
  // The columns cut into dots sweeps of at most `block_offsets` offsets (equal parts: a
  // 15-offset column in 3 of 5, not 6 + 6 + 3), ordered by their first key row and then by
  // column, so that consecutive sweeps read the same key rows while they are in L1.
  std::vector<Column> sweeps;
  std::vector<T> col_dr, col_dc;  // (count,) the offsets in column order
  std::int64_t block_rows = 1;    // R, query vectors per block; 1 where blocks do not apply
  std::int64_t block_stride = 0;  // raster distance between a block's vectors, a multiple of L

  // block_rows: the R wanted; blocks apply when the columns are evenly spaced with one step s
  // and s * pitch is a multiple of L (the vectors of a block then are whole vectors of
  // the raster tiling).
  WindowGeometry(const WindowOffsets& w, std::int64_t L, std::int64_t block_rows_wanted = 1,
                 std::int64_t block_offsets = 1)
      : height(w.height), width(w.width), count(w.count), pitch(w.width), lanes(L) {
    const std::vector<size_t> by_column = ColumnOrder(w);
    const std::int64_t step = ColumnStep(w, by_column);
    const std::int64_t rounded = round_up(width, L);
    if (block_rows_wanted > 1 && step > 0 && step * width % L != 0 &&
        rounded * kMaxPitchRatioDen <= width * kMaxPitchRatioNum) {
      pitch = rounded;
    }
    const size_t n = static_cast<size_t>(count);
    std::vector<size_t> idx(n);
    std::iota(idx.begin(), idx.end(), size_t{0});
    auto raster = [&](size_t o) { return std::int64_t{w.dr[o]} * pitch + w.dc[o]; };
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
    BuildColumns(w, by_column, L, block_rows_wanted, block_offsets, step);
    // Blocks read up to block_rows - 1 strides past their first vector, for queries and keys.
    margin = (reach + (block_rows - 1) * block_stride + L + L - 1) / L * L;
    vectors = (positions() + L - 1) / L;
    // An odd number of vectors (of 64 bytes in float) per packed row. A dots sweep reads the
    // same pixel columns of every row e (16 at E = 16) for 8 key pixel rows W positions apart,
    // and at 128x128 an even count (1188, 76,032 bytes: 36 cache lines mod 64) put those lines
    // into a quarter of L1's 64 sets, where they evicted one another.
    ld = 2 * margin + vectors * L;
    if (ld / L % 2 == 0) ld += L;
    per_row = (pitch + L - 1) / L;
  }

  // Positions of the raster: height * pitch.
  std::int64_t positions() const { return height * pitch; }
  // Where position n (a pixel, not a pad column) sits in the (height * width) tensors.
  std::int64_t tensor_position(std::int64_t n) const {
    return pitch == width ? n : n / pitch * width + n % pitch;
  }
  // Queries of the vector from q0 held by the tensors: they are its first lanes (a pitched
  // vector lies in one pixel row, its pad columns last).
  size_t valid_lanes(std::int64_t q0) const {
    const std::int64_t left = pitch == width ? height * width - q0 : width - q0 % pitch;
    return static_cast<size_t>(std::clamp<std::int64_t>(left, 0, lanes));
  }
  // fn(i, a, b) for each raster row i (pitch positions from i * pitch; inside the map or not)
  // that positions [n0, n1) meet, with the columns [a, b) they cover there.
  template <class Fn>
  void ForEachRowRun(std::int64_t n0, std::int64_t n1, Fn&& fn) const {
    for (std::int64_t i = floor_div(n0, pitch); i * pitch < n1; ++i) {
      fn(i, std::max(n0, i * pitch) - i * pitch, std::min(n1, i * pitch + pitch) - i * pitch);
    }
  }

  // The step s by which every column's row offsets are evenly spaced (the gcd of the row gaps
  // within columns, 1 for single-offset columns), or 0 where some column is not evenly spaced.
  static std::int64_t ColumnStep(const WindowOffsets& w, const std::vector<size_t>& idx) {
    const size_t n = static_cast<size_t>(w.count);
    std::int64_t step = 0;
    for (size_t t = 1; t < n; ++t) {
      if (w.dc[idx[t]] == w.dc[idx[t - 1]]) {
        step = std::gcd(step, std::int64_t{w.dr[idx[t]]} - w.dr[idx[t - 1]]);
      }
    }
    step = std::max<std::int64_t>(step, 1);
    for (size_t t = 0; t < n;) {
      size_t e = t + 1;
      while (e < n && w.dc[idx[e]] == w.dc[idx[t]]) ++e;
      const std::int64_t span = std::int64_t{w.dr[idx[e - 1]]} - w.dr[idx[t]];
      if (span != static_cast<std::int64_t>(e - t - 1) * step) return 0;
      t = e;
    }
    return step;
  }
  // The offsets' indices by column dc, then row dr.
  static std::vector<size_t> ColumnOrder(const WindowOffsets& w) {
    std::vector<size_t> idx(static_cast<size_t>(w.count));
    std::iota(idx.begin(), idx.end(), size_t{0});
    std::sort(idx.begin(), idx.end(), [&](size_t x, size_t y) {
      return w.dc[x] != w.dc[y] ? w.dc[x] < w.dc[y] : w.dr[x] < w.dr[y];
    });
    return idx;
  }

  // Fills columns, col_dr, col_dc, block_rows and block_stride; idx from ColumnOrder, step
  // from ColumnStep.
  void BuildColumns(const WindowOffsets& w, const std::vector<size_t>& idx, std::int64_t L,
                    std::int64_t block_rows_wanted, std::int64_t block_offsets,
                    std::int64_t step) {
    const size_t n = static_cast<size_t>(count);
    for (size_t t = 0; t < n;) {
      size_t e = t + 1;
      while (e < n && w.dc[idx[e]] == w.dc[idx[t]]) ++e;
      columns.push_back({std::int64_t{w.dr[idx[t]]} * pitch + w.dc[idx[t]],
                         static_cast<std::int64_t>(e - t), static_cast<std::int64_t>(t)});
      t = e;
    }
    for (size_t t = 0; t < n; ++t) {
      col_dr.push_back(static_cast<T>(w.dr[idx[t]]));
      col_dc.push_back(static_cast<T>(w.dc[idx[t]]));
    }
    if (block_rows_wanted > 1 && step > 0 && step * pitch % L == 0) {
      block_rows = block_rows_wanted;
      block_stride = step * pitch;
    }
    std::vector<std::int64_t> first_dr;  // per sweep
    for (const Column& c : columns) {
      const std::int64_t parts = (c.n + block_offsets - 1) / block_offsets;
      for (std::int64_t s = 0, m0 = 0; s < parts; ++s) {
        const std::int64_t m1 = c.n * (s + 1) / parts;
        sweeps.push_back({c.base + m0 * block_stride, m1 - m0, c.first + m0});
        first_dr.push_back(static_cast<std::int64_t>(col_dr[static_cast<size_t>(c.first + m0)]));
        m0 = m1;
      }
    }
    std::vector<size_t> order(sweeps.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t x, size_t y) { return first_dr[x] < first_dr[y]; });
    std::vector<Column> sorted;
    for (size_t i : order) sorted.push_back(sweeps[i]);
    sweeps.swap(sorted);
  }

  // True when all L lanes of the vector from query q0 lie in one pixel row and every offset of
  // every lane lands inside the map (no lane needs the mask).
  bool interior(std::int64_t q0) const {
    const std::int64_t i0 = q0 / pitch, j0 = q0 % pitch;
    return q0 + lanes <= positions() && j0 + lanes <= width && i0 + dr_min >= 0 &&
           i0 + dr_max < height && j0 + dc_min >= 0 && j0 + lanes - 1 + dc_max < width;
  }
};

}  // namespace cpu
}  // namespace attn2d
