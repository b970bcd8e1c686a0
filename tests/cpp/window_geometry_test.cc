// The packed-buffer geometry of the window kernels (cpu/window/window_geometry.h): every shifted load
// stays inside a row, and rows hold an odd number of vectors (so that a sweep's reads of one
// pixel column in 16 consecutive rows spread over L1's sets; see the comment on `ld`).
#include "cpu/window/window_geometry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace attn2d {
namespace cpu {
namespace {

// Offsets of a size x size square (diamond: |dr| + |dc| <= size / 2), clipped to what a
// height x width map allows.
struct Window {
  std::vector<std::int32_t> dr, dc;
  WindowOffsets view;
  Window(std::int64_t height, std::int64_t width, int size, bool diamond) {
    const int r = size / 2;
    for (int i = -r; i <= r; ++i) {
      for (int j = -r; j <= r; ++j) {
        if (diamond && std::abs(i) + std::abs(j) > r) continue;
        if (std::abs(i) >= height || std::abs(j) >= width) continue;
        dr.push_back(i);
        dc.push_back(j);
      }
    }
    view = WindowOffsets{height, width, static_cast<std::int64_t>(dr.size()), dr.data(),
                         dc.data()};
  }
};

template <typename T>
void expect_rows_hold_every_load(std::int64_t height, std::int64_t width, int size, bool diamond,
                                 std::int64_t L) {
  const Window w(height, width, size, diamond);
  const WindowGeometry<T> g(w.view, L, 4, 6);
  const std::string what = std::to_string(height) + "x" + std::to_string(width) + " size " +
                           std::to_string(size) + (diamond ? " diamond" : " square") +
                           " L " + std::to_string(L);
  EXPECT_EQ(g.ld % L, 0) << what;
  EXPECT_EQ(g.ld / L % 2, 1) << what;
  EXPECT_GE(g.ld, 2 * g.margin + g.vectors * L) << what;
  // A block's last vector at its largest offset, and its first at the smallest, stay inside.
  const std::int64_t reach = std::max(-g.off_min, g.off_max);
  EXPECT_GE(g.margin, reach + (g.block_rows - 1) * g.block_stride + L) << what;
  const std::int64_t rounded = (width + L - 1) / L * L;
  if (width % L == 0) {
    EXPECT_EQ(g.pitch, width) << what;
    EXPECT_EQ(g.block_rows, 4) << what;
    EXPECT_EQ(g.block_stride, width) << what;
  } else if (3 * rounded <= 4 * width) {
    // Pitched: every pixel row starts a vector, and the blocks apply.
    EXPECT_EQ(g.pitch, rounded) << what;
    EXPECT_EQ(g.block_rows, 4) << what;
    EXPECT_EQ(g.block_stride, rounded) << what;
  } else {
    EXPECT_EQ(g.pitch, width) << what;
    EXPECT_EQ(g.block_rows, 1) << what;
  }
  EXPECT_EQ(g.vectors, (height * g.pitch + L - 1) / L) << what;
  // Each pixel's raster position maps back to its tensor position; the first lanes of a
  // vector are its pixels.
  for (std::int64_t i = 0; i < height; ++i) {
    for (std::int64_t j = 0; j < width; ++j) {
      ASSERT_EQ(g.tensor_position(i * g.pitch + j), i * width + j) << what;
    }
  }
  if (g.pitch != width) {
    EXPECT_EQ(g.valid_lanes(0), static_cast<size_t>(std::min(L, width))) << what;
    EXPECT_EQ(g.valid_lanes(g.pitch - L), static_cast<size_t>(width - (g.pitch - L))) << what;
  }
}

TEST(WindowGeometry, RowsHoldAnOddNumberOfVectorsAndEveryLoad) {
  const struct {
    std::int64_t height, width;
    int size;
  } maps[] = {{128, 128, 15}, {256, 256, 15}, {64, 64, 7}, {37, 48, 9}, {1, 48, 5},
              {16, 16, 33}, {23, 29, 5}, {56, 56, 7}, {28, 28, 15}, {9, 12, 3},
              {32, 20, 7}, {100, 100, 15}};
  for (const auto& m : maps) {
    for (bool diamond : {false, true}) {
      expect_rows_hold_every_load<float>(m.height, m.width, m.size, diamond, 16);
      expect_rows_hold_every_load<float>(m.height, m.width, m.size, diamond, 8);
      expect_rows_hold_every_load<double>(m.height, m.width, m.size, diamond, 8);
    }
  }
}

}  // namespace
}  // namespace cpu
}  // namespace attn2d
