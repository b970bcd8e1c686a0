// The window-offsets forward (cpu/window_forward_cpu.cc) against the float64 reference run with
// the equivalent dense bool mask, on every compiled SIMD target; and its validation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "attention_test_util.h"
#include "hwy/targets.h"

namespace attn2d {
namespace testing {
namespace {

enum class Shape { kSquare, kDiamond, kDisk };

// Offsets of a size x size window (diamond and disk: radius size / 2) in steps of `dilation`,
// written here from the pattern's definition (attn2d.patterns.Window), independently of Python.
struct Offsets {
  std::vector<std::int32_t> dr, dc;
  WindowOffsets view;
  Offsets(std::int64_t height, std::int64_t width, int size, Shape shape, int dilation) {
    const int lo = -(size / 2), r = size / 2;
    for (int di = lo; di < lo + size; ++di) {
      for (int dj = lo; dj < lo + size; ++dj) {
        if (shape == Shape::kDiamond && std::abs(di) + std::abs(dj) > r) continue;
        if (shape == Shape::kDisk && di * di + dj * dj > r * r) continue;
        // Offsets that can never land inside the map are left out, as the binding's caller does.
        if (std::abs(di * dilation) >= height || std::abs(dj * dilation) >= width) continue;
        dr.push_back(di * dilation);
        dc.push_back(dj * dilation);
      }
    }
    view.height = height, view.width = width;
    view.count = static_cast<std::int64_t>(dr.size());
    view.dr = dr.data(), view.dc = dc.data();
  }
  // (Lq, Lk) bools: may query pixel n see key pixel m.
  std::vector<unsigned char> dense() const {
    const std::int64_t N = view.height * view.width;
    std::vector<unsigned char> m(static_cast<size_t>(N * N), 0);
    for (std::int64_t n = 0; n < N; ++n) {
      const std::int64_t i = n / view.width, j = n % view.width;
      for (size_t o = 0; o < dr.size(); ++o) {
        const std::int64_t ki = i + dr[o], kj = j + dc[o];
        if (ki < 0 || ki >= view.height || kj < 0 || kj >= view.width) continue;
        m[static_cast<size_t>(n * N + ki * view.width + kj)] = 1;
      }
    }
    return m;
  }
};

class WindowAttention : public ::testing::TestWithParam<std::int64_t> {
 protected:
  void SetUp() override { hwy::SetSupportedTargetsForTest(GetParam()); }
  void TearDown() override { hwy::SetSupportedTargetsForTest(0); }
};

INSTANTIATE_TEST_SUITE_P(Targets, WindowAttention,
                         ::testing::ValuesIn(hwy::SupportedAndGeneratedTargets()),
                         [](const ::testing::TestParamInfo<std::int64_t>& info) {
                           return std::string(hwy::TargetName(info.param));
                         });

template <typename T>
void expect_window_matches_dense(std::int64_t B, std::int64_t H, std::int64_t height,
                                 std::int64_t width, std::int64_t E, std::int64_t Ev, int size,
                                 Shape shape, int dilation, Layout layout, std::uint64_t seed) {
  const std::int64_t N = height * width;
  const Offsets win(height, width, size, shape, dilation);
  auto dense = make_problem<double>(B, H, N, N, E, Ev, layout, seed, MaskKind::kBool,
                                    {true, true, false, false});
  dense.mask.bools = win.dense();
  auto ours_pr = make_problem<T>(B, H, N, N, E, Ev, layout, seed);
  auto cast = [](const Tensor4<T>& t) { return t.template cast<double>(); };
  dense.q = cast(ours_pr.q), dense.k = cast(ours_pr.k), dense.v = cast(ours_pr.v);
  const Result<double> oracle = run(dense, Backend::kReference, serial_host());
  ASSERT_TRUE(oracle.forward_status.ok());

  auto out = make_tensor<T>({B, H, N, Ev}, Layout::kChannelsFirst);
  std::vector<T> lse(static_cast<size_t>(B * H * N), T(0));
  AttentionParams p = forward_params(ours_pr, out, lse);
  p.window = &win.view;
  const Status s = attention_forward(p, thread_host(3));
  ASSERT_TRUE(s.ok()) << s.message();
  // Inputs and outputs of order 1; float32 accumulates count x E products per score.
  const double tol = sizeof(T) == 4 ? 2e-5 : 1e-12;
  const std::string what = std::to_string(height) + "x" + std::to_string(width) + " size " +
                           std::to_string(size) + " E " + std::to_string(E) + " Ev " +
                           std::to_string(Ev);
  EXPECT_LE(max_abs_diff(out, oracle.out), tol) << what;
  double lse_err = 0.0;
  for (size_t r = 0; r < lse.size(); ++r) {
    lse_err = std::max(lse_err, std::abs(static_cast<double>(lse[r]) - oracle.lse[r]));
  }
  EXPECT_LE(lse_err, sizeof(T) == 4 ? 1e-5 : 1e-12) << what;
}

TEST_P(WindowAttention, MatchesTheDenseMaskOracle) {
  // Prime sides, a width below one vector (rows wrap inside a vector), a 1 x N map, E and Ev
  // odd or above 16 (several register sweeps), a window as large as the map, dilation.
  expect_window_matches_dense<double>(1, 2, 13, 11, 7, 5, 5, Shape::kSquare, 1,
                                      Layout::kContiguous, 1);
  expect_window_matches_dense<double>(2, 1, 7, 3, 20, 9, 4, Shape::kSquare, 1,
                                      Layout::kSequenceMajor, 2);
  expect_window_matches_dense<double>(1, 1, 1, 37, 3, 18, 7, Shape::kSquare, 2,
                                      Layout::kChannelsFirst, 3);
  expect_window_matches_dense<float>(1, 3, 17, 19, 16, 16, 7, Shape::kDiamond, 1,
                                     Layout::kChannelsFirst, 4);
  expect_window_matches_dense<float>(2, 2, 23, 29, 33, 1, 9, Shape::kDisk, 2,
                                     Layout::kSequenceMajor, 5);
  expect_window_matches_dense<float>(1, 1, 5, 5, 8, 8, 9, Shape::kSquare, 1,
                                     Layout::kContiguous, 6);
  expect_window_matches_dense<float>(1, 2, 32, 40, 16, 64, 15, Shape::kSquare, 1,
                                     Layout::kContiguous, 7);
}

TEST_P(WindowAttention, WholeVectorRowsMatchTheDenseMaskOracle) {
  // Widths that are multiples of the vector length (every vector within one pixel row, the
  // interior fast path common): several e and ev sweeps, windows wider than a vector, and a
  // 33 x 33 window (1089 offsets).
  expect_window_matches_dense<double>(1, 2, 9, 16, 20, 18, 5, Shape::kSquare, 1,
                                      Layout::kSequenceMajor, 11);
  expect_window_matches_dense<float>(2, 1, 20, 32, 16, 16, 7, Shape::kDiamond, 1,
                                     Layout::kChannelsFirst, 12);
  expect_window_matches_dense<float>(1, 2, 6, 48, 5, 7, 9, Shape::kDisk, 2,
                                     Layout::kContiguous, 13);
  expect_window_matches_dense<float>(1, 1, 40, 16, 3, 33, 15, Shape::kSquare, 1,
                                     Layout::kSequenceMajor, 14);
  expect_window_matches_dense<float>(1, 1, 37, 48, 8, 8, 33, Shape::kSquare, 1,
                                     Layout::kContiguous, 15);
}

TEST(WindowValidation, MalformedWindowsAreInvalidArguments) {
  auto pr = make_problem<float>(1, 1, 20, 20, 4, 4, Layout::kContiguous, 9);
  auto out = make_tensor<float>({1, 1, 20, 4}, Layout::kContiguous);
  std::vector<float> lse(20);
  AttentionParams p = forward_params(pr, out, lse);
  std::vector<std::int32_t> dr{0, 1, -1}, dc{0, 0, 2};
  WindowOffsets w{4, 5, 3, dr.data(), dc.data()};
  p.window = &w;
  ASSERT_TRUE(validate(p).ok()) << validate(p).message();
  struct Case {
    const char* what;
    void (*mutate)(WindowOffsets&, std::vector<std::int32_t>&, std::vector<std::int32_t>&);
  } cases[] = {
      {"grid does not match len", [](WindowOffsets& w, auto&, auto&) { w.width = 4; }},
      {"no offsets", [](WindowOffsets& w, auto&, auto&) { w.count = 0; }},
      {"row offset past the map", [](WindowOffsets&, auto& r, auto&) { r[1] = 4; }},
      {"column offset past the map", [](WindowOffsets&, auto&, auto& c) { c[2] = -5; }},
      {"duplicate offset", [](WindowOffsets&, auto& r, auto& c) { r[2] = 1, c[2] = 0; }},
      {"null offsets", [](WindowOffsets& w, auto&, auto&) { w.dr = nullptr; }},
  };
  for (const Case& c : cases) {
    std::vector<std::int32_t> r = dr, cc = dc;
    WindowOffsets bad{4, 5, 3, r.data(), cc.data()};
    c.mutate(bad, r, cc);
    p.window = &bad;
    EXPECT_EQ(validate(p).code(), StatusCode::kInvalidArgument) << c.what;
  }
  p.window = &w;
  p.is_causal = true;
  EXPECT_EQ(validate(p).code(), StatusCode::kInvalidArgument) << "window with is_causal";
  p.is_causal = false;
  // Forward only: the backward takes the pattern as a layout.
  AttentionBackwardParams bp;
  bp.fwd = p;
  EXPECT_EQ(validate(bp).code(), StatusCode::kUnsupported);
}

}  // namespace
}  // namespace testing
}  // namespace attn2d
