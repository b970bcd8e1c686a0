// The kernel chooser's table: one case per kernel family, and the refusals that decide it.
#include "attn2d/kernel_choice.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attn2d/bf16_products.h"

namespace attn2d {
namespace {

AttentionParams dense(DType dtype, std::int64_t heads = 2, std::int64_t len = 64,
                      std::int64_t dim = 16) {
  AttentionParams p;
  p.dtype = dtype;
  p.batch = 1, p.heads = heads, p.len_q = len, p.len_k = len, p.dim_qk = dim, p.dim_v = dim;
  return p;
}

// One layout of one query tile and one key tile: enough for the chooser, which reads sizes.
struct OneTileLayout {
  std::int32_t head_layout[2] = {0, 0};
  std::int64_t q_tile_begin[2] = {0, 1};
  std::int64_t k_tile_begin[2] = {0, 1};
  SparseLayout view;
  OneTileLayout() {
    view.block_q = 64, view.block_k = 64, view.num_layouts = 1;
    view.head_layout = head_layout;
    view.q_tile_begin = q_tile_begin;
    view.k_tile_begin = k_tile_begin;
  }
};

// A square window of side 2r+1 on an h x w grid.
struct SquareWindow {
  std::vector<std::int32_t> dr, dc;
  WindowOffsets view;
  SquareWindow(std::int64_t h, std::int64_t w, int r) {
    for (int i = -r; i <= r; ++i) {
      for (int j = -r; j <= r; ++j) {
        if (std::abs(i) < h && std::abs(j) < w) dr.push_back(i), dc.push_back(j);
      }
    }
    view.height = h, view.width = w, view.count = static_cast<std::int64_t>(dr.size());
    view.dr = dr.data(), view.dc = dc.data();
  }
};

bool refused(const KernelChoice& c, Kernel kernel, const std::string& words) {
  for (const KernelRefusal& r : c.refused) {
    if (r.kernel == kernel) return r.reason.find(words) != std::string::npos;
  }
  return false;
}

const Host kTwoThreads = [] {
  Host h = serial_host();
  h.num_threads = 2;
  return h;
}();

TEST(KernelChoice, DenseFloat32RunsOnDenseTiles) {
  const AttentionParams p = dense(DType::kFloat32);
  const KernelChoice f = choose_forward(p, kTwoThreads, true);
  EXPECT_EQ(f.kernel, Kernel::kDenseTiles);
  EXPECT_EQ(f.products, Products::kFloat32);
  EXPECT_TRUE(refused(f, Kernel::kReference, "only when asked for"));
  EXPECT_TRUE(refused(f, Kernel::kSparseTiles, "no pattern"));
  EXPECT_TRUE(refused(f, Kernel::kWindow, "no window offsets"));
  const KernelChoice b = choose_backward(p, kTwoThreads, true);
  EXPECT_EQ(b.kernel, Kernel::kDenseTiles);
  EXPECT_EQ(b.schedule, Schedule::kWholeHeads);
  EXPECT_TRUE(refused(b, Kernel::kQueryLanes, "forward only"));
}

TEST(KernelChoice, OneLongHeadOnTwoThreadsSplitsItsBackward) {
  const KernelChoice b = choose_backward(dense(DType::kFloat32, 1, 2048), kTwoThreads);
  EXPECT_EQ(b.kernel, Kernel::kDenseTiles);
  EXPECT_NE(b.schedule, Schedule::kWholeHeads);
}

TEST(KernelChoice, Float64AndFloat16Products) {
  EXPECT_EQ(choose_forward(dense(DType::kFloat64), kTwoThreads).products, Products::kFloat64);
  EXPECT_EQ(choose_forward(dense(DType::kFloat16), kTwoThreads).products, Products::kWidened);
}

TEST(KernelChoice, Bf16ProductsFollowTheProcessChoice) {
  set_bf16_products(Bf16Products::kFloat);
  EXPECT_EQ(choose_forward(dense(DType::kBFloat16), kTwoThreads).products, Products::kWidened);
  set_bf16_products(Bf16Products::kPairs);
  const KernelChoice pairs = choose_backward(dense(DType::kBFloat16), kTwoThreads, true);
  if (bf16_pairs_in_use()) {
    EXPECT_TRUE(pairs.products == Products::kBf16Pairs ||
                pairs.reason.find("SIMD target has no") != std::string::npos);
  } else {
    EXPECT_EQ(pairs.products, Products::kWidened);
  }
  set_bf16_products(Bf16Products::kAuto);
}

TEST(KernelChoice, LayoutRunsOnQueryLanesForFloat32AndTilesOtherwise) {
  OneTileLayout lay;
  AttentionParams p = dense(DType::kFloat32);
  p.layout = &lay.view;
  const KernelChoice f = choose_forward(p, kTwoThreads, true);
  EXPECT_EQ(f.kernel, Kernel::kQueryLanes);
  EXPECT_TRUE(refused(f, Kernel::kDenseTiles, "pattern"));
  EXPECT_EQ(choose_backward(p, kTwoThreads).kernel, Kernel::kSparseTiles);
  p.dtype = DType::kFloat64;
  const KernelChoice d = choose_forward(p, kTwoThreads, true);
  EXPECT_EQ(d.kernel, Kernel::kSparseTiles);
  EXPECT_TRUE(refused(d, Kernel::kQueryLanes, "float64 inputs"));
  p.dtype = DType::kFloat32;
  p.dim_v = 257;
  const KernelChoice wide = choose_forward(p, kTwoThreads, true);
  EXPECT_EQ(wide.kernel, Kernel::kSparseTiles);
  EXPECT_TRUE(refused(wide, Kernel::kQueryLanes, "up to 256 wide"));
}

TEST(KernelChoice, ClipWindowRunsOnWindowKernels) {
  SquareWindow w(32, 32, 7);
  AttentionParams p = dense(DType::kFloat32, 2, 32 * 32);
  p.window = &w.view;
  const KernelChoice f = choose_forward(p, kTwoThreads, true);
  EXPECT_EQ(f.kernel, Kernel::kWindow);
  EXPECT_NE(f.reason.find("225 offsets"), std::string::npos);
  const KernelChoice b = choose_backward(p, kTwoThreads, true);
  EXPECT_EQ(b.kernel, Kernel::kWindow);
  EXPECT_EQ(b.schedule, Schedule::kWindowBlocked);
  SquareWindow narrow(20, 20, 3);
  p.len_q = p.len_k = 400;
  p.window = &narrow.view;
  EXPECT_EQ(choose_backward(p, kTwoThreads).schedule, Schedule::kWindowVectors);
}

TEST(KernelChoice, WindowPastTwiceTheAllowedPairsFallsBackToTheLayout) {
  SquareWindow w(5, 23, 5);  // 11x11 on 5x23: 2.04x the allowed pairs
  EXPECT_NE(window_kernel_refusal(w.view).find("2.04x"), std::string::npos);
  EXPECT_EQ(window_kernel_refusal(SquareWindow(5, 23, 4).view), "");
  OneTileLayout lay;
  AttentionParams p = dense(DType::kFloat32, 2, 5 * 23);
  p.window = &w.view;
  p.layout = &lay.view;
  const KernelChoice f = choose_forward(p, kTwoThreads, true);
  EXPECT_EQ(f.kernel, Kernel::kQueryLanes);
  EXPECT_TRUE(refused(f, Kernel::kWindow, "above 2x the tiles waste less"));
  // Without a layout to fall back to, the window kernels still serve it.
  p.layout = nullptr;
  EXPECT_EQ(choose_forward(p, kTwoThreads).kernel, Kernel::kWindow);
}

TEST(KernelChoice, NamesAreStable) {
  EXPECT_STREQ(kernel_name(Kernel::kDenseTiles), "dense_tiles");
  EXPECT_STREQ(kernel_name(Kernel::kSparseTiles), "sparse_tiles");
  EXPECT_STREQ(kernel_name(Kernel::kQueryLanes), "query_lanes");
  EXPECT_STREQ(kernel_name(Kernel::kWindow), "window");
  EXPECT_STREQ(kernel_name(Kernel::kReference), "reference");
  EXPECT_STREQ(products_name(Products::kBf16Pairs), "bf16 pairs");
  EXPECT_STREQ(schedule_name(Schedule::kWindowBlocked), "blocked rows");
}

}  // namespace
}  // namespace attn2d
