// ScatteredTiles: whether channels-first views are copied to rows before a layout's tiles
// gather them (src/cpu/tiled/row_staging-inl.h).

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "attn2d/sparse_layout.h"
#include "cpu/tiled/layout_scan.h"

namespace attn2d {
namespace testing {
namespace {

// Patterns over 128 positions, each cut into two query tiles of 64 rows; key tiles the same.
struct PatternTiles {
  std::vector<std::int64_t> begin{0};
  std::vector<std::int32_t> rows;
  SparseLayout view;

  explicit PatternTiles(const std::vector<std::vector<std::int32_t>>& patterns) {
    for (const auto& order : patterns) {
      rows.insert(rows.end(), order.begin(), order.end());
      begin.push_back(begin.back() + 2);
    }
    view.block_q = view.block_k = 64;
    view.num_layouts = static_cast<std::int64_t>(patterns.size());
    view.q_tile_begin = view.k_tile_begin = begin.data();
    view.q_rows = view.k_rows = rows.data();
  }
};

std::vector<std::int32_t> Order(std::int32_t step) {
  std::vector<std::int32_t> order;
  for (std::int32_t i = 0; i < 128; ++i) order.push_back(i * step % 128);
  return order;
}

// 8x8 pixel blocks of a 16-wide map (a window layout's tiles): a run of 16 left once in 8 rows.
std::vector<std::int32_t> PixelBlocks() {
  std::vector<std::int32_t> order;
  for (std::int32_t block = 0; block < 2; ++block) {
    for (std::int32_t r = 0; r < 8; ++r) {
      for (std::int32_t c = 0; c < 8; ++c) order.push_back((block * 8 + r) * 16 + c);
    }
  }
  return order;
}

// Pairs of neighbouring rows, each pair 34 rows past the last (YLG's floor tiles under the
// geometric mapping, 2x2 query blocks): every second step leaves its run of 16.
std::vector<std::int32_t> RowPairs() {
  std::vector<std::int32_t> order;
  for (std::int32_t i = 0; i < 64; ++i) {
    const std::int32_t first = 2 * (i * 17 % 64);
    order.push_back(first);
    order.push_back(first + 1);
  }
  return order;
}

TEST(ScatteredTiles, RowsApartInAnyOnePatternCount) {
  const auto raster = Order(1), apart = Order(17);  // steps of 17 rows leave every run of 16
  for (bool query : {true, false}) {
    EXPECT_FALSE(cpu::ScatteredTiles(PatternTiles({raster}).view, query));
    EXPECT_FALSE(cpu::ScatteredTiles(PatternTiles({PixelBlocks()}).view, query));
    EXPECT_TRUE(cpu::ScatteredTiles(PatternTiles({apart}).view, query));
    EXPECT_TRUE(cpu::ScatteredTiles(PatternTiles({RowPairs()}).view, query));
    // YLG's raster repetitive heads beside its floor heads: outnumbered, the scattered pattern
    // still decides (the whole layout's steps are only a quarter apart).
    EXPECT_TRUE(cpu::ScatteredTiles(PatternTiles({raster, apart, raster, raster}).view, query));
    EXPECT_TRUE(cpu::ScatteredTiles(PatternTiles({apart, raster}).view, query));
  }
}

}  // namespace
}  // namespace testing
}  // namespace attn2d
