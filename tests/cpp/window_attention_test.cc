// The window-offsets forward and backward (cpu/window/window_forward.cc, window_backward.cc)
// against the float64 reference run with the equivalent dense bool mask, on every compiled SIMD
// target; and their validation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <new>
#include <random>
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
    set_view(height, width);
  }
  // Offsets given one by one.
  Offsets(std::int64_t height, std::int64_t width, std::vector<std::int32_t> dr_,
          std::vector<std::int32_t> dc_)
      : dr(std::move(dr_)), dc(std::move(dc_)) {
    set_view(height, width);
  }
  Offsets(const Offsets&) = delete;
  void set_view(std::int64_t height, std::int64_t width) {
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

class WindowAttention : public hwy::TestWithParamTarget {};
ATTN2D_TARGET_INSTANTIATE_TEST_SUITE_P(WindowAttention);

template <typename T>
void expect_window_matches_dense(std::int64_t B, std::int64_t H, std::int64_t E, std::int64_t Ev,
                                 const Offsets& win, Layout layout, std::uint64_t seed) {
  const std::int64_t height = win.view.height, width = win.view.width, N = height * width;
  const std::string size = std::to_string(win.view.count) + " offsets";
  auto dense = make_problem<double>(B, H, N, N, E, Ev, layout, seed, MaskKind::kBool,
                                    {true, true, false, false});
  dense.mask.bools = win.dense();
  auto ours_pr = make_problem<T>(B, H, N, N, E, Ev, layout, seed);
  auto cast = [](const Tensor4<T>& t) { return t.template cast<double>(); };
  dense.q = cast(ours_pr.q), dense.k = cast(ours_pr.k), dense.v = cast(ours_pr.v);
  dense.dout = cast(ours_pr.dout);
  const Result<double> oracle = run(dense, Backend::kReference, serial_host());
  ASSERT_TRUE(oracle.forward_status.ok());

  const Result<T> ours = run(ours_pr, Backend::kCpu, thread_host(3),
                             reference::Precision::kFloat64, &win.view);
  ASSERT_TRUE(ours.forward_status.ok()) << ours.forward_status.message();
  ASSERT_TRUE(ours.backward_status.ok()) << ours.backward_status.message();
  // Inputs and outputs of order 1; float32 accumulates count x E products per score, and each
  // gradient element sums up to count terms of order 1.
  const double tol = sizeof(T) == 4 ? 2e-5 : 1e-12;
  const double grad_tol = sizeof(T) == 4 ? 1e-4 : 1e-11;
  const std::string what = std::to_string(height) + "x" + std::to_string(width) + ", " + size +
                           ", E " + std::to_string(E) + " Ev " + std::to_string(Ev);
  EXPECT_LE(max_abs_diff(ours.out, oracle.out), tol) << what;
  double lse_err = 0.0;
  for (size_t r = 0; r < ours.lse.size(); ++r) {
    lse_err = std::max(lse_err, std::abs(static_cast<double>(ours.lse[r]) - oracle.lse[r]));
  }
  EXPECT_LE(lse_err, sizeof(T) == 4 ? 1e-5 : 1e-12) << what;
  EXPECT_LE(max_abs_diff(ours.dq, oracle.dq), grad_tol) << what << " dq";
  EXPECT_LE(max_abs_diff(ours.dk, oracle.dk), grad_tol) << what << " dk";
  EXPECT_LE(max_abs_diff(ours.dv, oracle.dv), grad_tol) << what << " dv";
  // The scatter of dK and dV runs in a fixed order whatever the thread count.
  const Result<T> serial = run(ours_pr, Backend::kCpu, serial_host(),
                               reference::Precision::kFloat64, &win.view);
  EXPECT_EQ(max_abs_diff(serial.dk, ours.dk), 0.0) << what;
  EXPECT_EQ(max_abs_diff(serial.dv, ours.dv), 0.0) << what;
  EXPECT_EQ(max_abs_diff(serial.dq, ours.dq), 0.0) << what;
  // Gradients written past the caches (non-temporal stores, cpu/common/result_stores.h; problems
  // this small never choose them by themselves) must land on the same elements with the same
  // bits.
  Host streamed = thread_host(2);
  streamed.stream_result_bytes = 0;
  const Result<T> past = run(ours_pr, Backend::kCpu, streamed, reference::Precision::kFloat64,
                             &win.view);
  ASSERT_TRUE(past.backward_status.ok()) << past.backward_status.message();
  EXPECT_EQ(max_abs_diff(past.dk, ours.dk), 0.0) << what << " streamed";
  EXPECT_EQ(max_abs_diff(past.dv, ours.dv), 0.0) << what << " streamed";
  EXPECT_EQ(max_abs_diff(past.dq, ours.dq), 0.0) << what << " streamed";
}

template <typename T>
void expect_window_matches_dense(std::int64_t B, std::int64_t H, std::int64_t height,
                                 std::int64_t width, std::int64_t E, std::int64_t Ev, int size,
                                 Shape shape, int dilation, Layout layout, std::uint64_t seed) {
  const Offsets win(height, width, size, shape, dilation);
  expect_window_matches_dense<T>(B, H, E, Ev, win, layout, seed);
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
  // Maps with fewer pixel rows than a block has vectors (1 x 48: three of the four vectors of
  // every block lie past the map), and a dilated diamond whose columns step by 3 rows.
  expect_window_matches_dense<float>(1, 2, 1, 48, 16, 16, 5, Shape::kSquare, 1,
                                     Layout::kContiguous, 16);
  expect_window_matches_dense<double>(2, 1, 3, 32, 7, 9, 7, Shape::kDiamond, 1,
                                      Layout::kChannelsFirst, 17);
  expect_window_matches_dense<float>(1, 1, 20, 16, 8, 8, 5, Shape::kDiamond, 3,
                                     Layout::kSequenceMajor, 18);
}

TEST_P(WindowAttention, WindowsOnOneSideOfTheQueryMatchTheDenseMaskOracle) {
  // Windows without offset 0, all below or all above the query, on whole-vector rows (the
  // blocked kernels): a band's planes then span its keys on one side and its own queries on
  // the other. 40 pixel rows give 10 block rows, bands of 2 (cpu/window/window_plan-inl.h), so the
  // forward walks 5 bands a head and moves its kept keys to the front of its planes.
  const Offsets below(40, 32, {2, 3, 4, 2, 3, 4}, {1, 1, 1, 5, 5, 5});
  expect_window_matches_dense<float>(2, 2, 16, 8, below, Layout::kContiguous, 31);
  const Offsets above(40, 32, {-4, -3, -4, -3}, {-2, -2, 0, 0});
  expect_window_matches_dense<double>(1, 3, 5, 7, above, Layout::kChannelsFirst, 32);
}

TEST_P(WindowAttention, StreamedSegmentsMatchTheDenseMaskOracle) {
  // The blocked backward walks each head in segments whose shared keys are summed apart and
  // added at the end (cpu/window/stream_backward-inl.h, StreamBackward). One head of 64 x 32
  // pixels gives bands of 2 block rows (256 queries) and a segment per band under a 3 x 3 window
  // (7 boundaries), per 2 bands under a 7 x 7 diamond; a window below the query (no offset 0)
  // shares keys only past each boundary; 61 rows leave the last band partly past the map.
  expect_window_matches_dense<float>(1, 1, 64, 32, 16, 16, 3, Shape::kSquare, 1,
                                     Layout::kContiguous, 41);
  expect_window_matches_dense<double>(1, 1, 64, 32, 5, 9, 7, Shape::kDiamond, 1,
                                      Layout::kChannelsFirst, 42);
  expect_window_matches_dense<float>(1, 2, 61, 32, 7, 3, 5, Shape::kDisk, 2,
                                     Layout::kSequenceMajor, 43);
  const Offsets below(64, 32, {2, 3, 4, 2, 3, 4}, {-1, -1, -1, 3, 3, 3});
  expect_window_matches_dense<float>(1, 1, 8, 16, below, Layout::kContiguous, 44);
}

TEST_P(WindowAttention, PitchedRowsMatchTheDenseMaskOracle) {
  // Widths within 4/3 of a multiple of the vector length run the blocked kernels on rows
  // pitched to that multiple (window_geometry.h): pad columns that a query's window overhangs,
  // vectors with pad lanes at every row's end, a window wider than the pad (its keys in the
  // next row's pixels must stay masked), streamed segments over 60 rows, a dilated disk
  // (column step 2) and a window as wide as the map.
  expect_window_matches_dense<float>(1, 2, 20, 28, 16, 16, 7, Shape::kSquare, 1,
                                     Layout::kContiguous, 51);
  expect_window_matches_dense<double>(2, 1, 9, 60, 7, 9, 15, Shape::kDiamond, 1,
                                      Layout::kChannelsFirst, 52);
  expect_window_matches_dense<float>(1, 1, 60, 14, 5, 3, 5, Shape::kDisk, 2,
                                     Layout::kSequenceMajor, 53);
  expect_window_matches_dense<float>(1, 1, 6, 13, 8, 8, 27, Shape::kSquare, 1,
                                     Layout::kContiguous, 54);
}

TEST_P(WindowAttention, RandomWindowsMatchTheDenseMaskOracle) {
  // Seeded draws of everything at once, on every compiled target (the Python suite runs only
  // the best one): maps of 1-32 rows, widths of 1-33 or a multiple of 16 (the blocked kernels),
  // squares, diamonds and disks of 1-11, dilation 1-3, E and Ev 1-20, the three layouts, float
  // and double, 1-2 batches of 1-3 heads.
  std::mt19937_64 rng(20261204);
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  const Layout layouts[] = {Layout::kContiguous, Layout::kSequenceMajor, Layout::kChannelsFirst};
  const Shape shapes[] = {Shape::kSquare, Shape::kDiamond, Shape::kDisk};
  for (int draw = 0; draw < 96; ++draw) {
    const std::int64_t height = pick(1, 32);
    const std::int64_t width = pick(0, 2) == 0 ? 16 * pick(1, 2) : pick(1, 33);
    const Offsets win(height, width, static_cast<int>(pick(1, 11)), shapes[pick(0, 2)],
                      static_cast<int>(pick(1, 3)));
    if (win.view.count == 0) continue;  // no offset lands inside the map
    const std::int64_t B = pick(1, 2), H = pick(1, 3), E = pick(1, 20), Ev = pick(1, 20);
    const Layout layout = layouts[pick(0, 2)];
    const std::uint64_t seed = 100 + static_cast<std::uint64_t>(draw);
    SCOPED_TRACE("draw " + std::to_string(draw));
    if (pick(0, 1) == 0) {
      expect_window_matches_dense<float>(B, H, E, Ev, win, layout, seed);
    } else {
      expect_window_matches_dense<double>(B, H, E, Ev, win, layout, seed);
    }
  }
}

TEST_P(WindowAttention, RowsThatSeeNoKeyGiveZeroOutputAndGradients) {
  // Offsets (0, 2) and (1, -3) on a 3 x 4 map: query (i, j) sees (i, j + 2) when j < 2 and
  // (i + 1, j - 3) when j = 3 and i < 2; queries (i, 2) and (2, 3) see nothing.
  const std::int64_t height = 3, width = 4, N = height * width;
  std::vector<std::int32_t> dr{0, 1}, dc{2, -3};
  const WindowOffsets w{height, width, 2, dr.data(), dc.data()};
  auto ours_pr = make_problem<float>(1, 2, N, N, 5, 3, Layout::kChannelsFirst, 21);
  auto dense = make_problem<double>(1, 2, N, N, 5, 3, Layout::kChannelsFirst, 21,
                                    MaskKind::kBool, {true, true, false, false});
  dense.mask.bools.assign(static_cast<size_t>(N * N), 0);
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int64_t i = n / width, j = n % width;
    if (j < 2) dense.mask.bools[static_cast<size_t>(n * N + i * width + j + 2)] = 1;
    if (j == 3 && i < 2) dense.mask.bools[static_cast<size_t>(n * N + (i + 1) * width + 0)] = 1;
  }
  dense.q = ours_pr.q.cast<double>(), dense.k = ours_pr.k.cast<double>();
  dense.v = ours_pr.v.cast<double>(), dense.dout = ours_pr.dout.cast<double>();
  const Result<double> oracle = run(dense, Backend::kReference, serial_host());
  const Result<float> ours = run(ours_pr, Backend::kCpu, thread_host(2),
                                 reference::Precision::kFloat64, &w);
  ASSERT_TRUE(ours.backward_status.ok()) << ours.backward_status.message();
  EXPECT_LE(max_abs_diff(ours.out, oracle.out), 1e-5);
  EXPECT_LE(max_abs_diff(ours.dq, oracle.dq), 1e-5);
  EXPECT_LE(max_abs_diff(ours.dk, oracle.dk), 1e-5);
  EXPECT_LE(max_abs_diff(ours.dv, oracle.dv), 1e-5);
  for (std::int64_t n : {2, 6, 10, 11}) {
    for (std::int64_t e = 0; e < 5; ++e) {
      EXPECT_EQ(ours.dq.at(0, 1, n, e), 0.0f) << "query " << n;
    }
    EXPECT_EQ(ours.out.at(0, 1, n, 0), 0.0f) << "query " << n;
  }
}

// The size of the host's last allocation (the backward's workspace, allocated after the
// forward's).
std::size_t last_allocation = 0;

Host recording_host(int threads) {
  Host host = thread_host(threads);
  host.allocate = [](void*, std::size_t bytes) -> void* {
    last_allocation = bytes;
    return ::operator new(bytes, std::align_val_t{64}, std::nothrow);
  };
  return host;
}

TEST(WindowBackwardWorkspace, DoesNotGrowWithIdleThreads) {
  // One 64 x 32 head under a 3 x 3 window: 8 segments, so 8 tasks. The blocked backward keeps
  // planes (~0.2 MB each here) for the threads that run a task, not for every thread the host
  // has, and the sums do not depend on either.
  const Offsets win(64, 32, 3, Shape::kSquare, 1);
  const auto pr = make_problem<float>(1, 1, 64 * 32, 64 * 32, 16, 16, Layout::kContiguous, 51);
  const Result<float> few = run(pr, Backend::kCpu, recording_host(8),
                                reference::Precision::kFloat64, &win.view);
  const std::size_t few_bytes = last_allocation;
  const Result<float> many = run(pr, Backend::kCpu, recording_host(64),
                                 reference::Precision::kFloat64, &win.view);
  ASSERT_TRUE(many.backward_status.ok()) << many.backward_status.message();
  EXPECT_EQ(last_allocation, few_bytes);
  EXPECT_GT(few_bytes, std::size_t{0});
  EXPECT_EQ(max_abs_diff(few.dk, many.dk), 0.0);
  EXPECT_EQ(max_abs_diff(few.dv, many.dv), 0.0);
  EXPECT_EQ(max_abs_diff(few.dq, many.dq), 0.0);
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
  // The backward checks the same window.
  AttentionBackwardParams bp;
  bp.fwd = p;
  std::vector<std::int32_t> r2 = dr;
  r2[2] = 1, dc[2] = 0;
  WindowOffsets dup{4, 5, 3, r2.data(), dc.data()};
  bp.fwd.window = &dup;
  EXPECT_EQ(validate(bp).code(), StatusCode::kInvalidArgument) << "backward, duplicate offset";
}

// Found by tests/fuzz/window_fuzz: a grid whose pixel count overflows int64 when the kernels
// size their packed rows (and height * width before that) is refused, naming the limit.
TEST(WindowValidation, GridsPastTwoToTheThirtyOnePixelsAreInvalidArguments) {
  auto pr = make_problem<float>(1, 1, 20, 20, 4, 4, Layout::kContiguous, 9);
  auto out = make_tensor<float>({1, 1, 20, 4}, Layout::kContiguous);
  std::vector<float> lse(20);
  AttentionParams p = forward_params(pr, out, lse);
  std::vector<std::int32_t> dr{0}, dc{0};
  for (const std::int64_t side : {std::int64_t{1} << 16, std::int64_t{1} << 32}) {
    WindowOffsets huge{side, side, 1, dr.data(), dc.data()};
    p.window = &huge;
    p.len_q = p.len_k = side * 20;  // anything: the grid is refused first
    const Status s = validate(p);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << side;
    EXPECT_NE(s.message().find("height * width must be at most 2147483647"), std::string::npos)
        << s.message();
  }
}

}  // namespace
}  // namespace testing
}  // namespace attn2d
