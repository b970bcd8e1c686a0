// The tiled CPU kernels against the double-precision reference, on every SIMD target that this
// build compiled and this CPU runs (the scalar/EMU128 baseline included).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>

#include "attention_test_util.h"
#include "hwy/targets.h"

namespace attn2d {
namespace testing {
namespace {

using reference::Precision;

// Every test on each SIMD target this build compiled and this CPU runs.
class CpuAttention : public hwy::TestWithParamTarget {};
ATTN2D_TARGET_INSTANTIATE_TEST_SUITE_P(CpuAttention);

// float32: our error may be at most twice the error of naive float32 attention, plus 1e-6.
// float64: the oracle is naive float64 attention itself, so only reordering noise is allowed.
template <typename T>
double tolerance(double naive_error) {
  return sizeof(T) == 4 ? 2.0 * naive_error + 1e-6 : 2.0 * naive_error + 1e-12;
}

template <typename T>
void expect_matches_reference(const Problem<T>& pr, const std::string& what) {
  SCOPED_TRACE(what);
  const Result<T> ours = run(pr, Backend::kCpu, thread_host(2));
  ASSERT_TRUE(ours.forward_status.ok()) << ours.forward_status.message();
  ASSERT_TRUE(ours.backward_status.ok()) << ours.backward_status.message();

  Problem<double> pr64;
  pr64.B = pr.B, pr64.H = pr.H, pr64.Lq = pr.Lq, pr64.Lk = pr.Lk, pr64.E = pr.E, pr64.Ev = pr.Ev;
  pr64.scale = pr.scale, pr64.causal = pr.causal, pr64.layout = pr.layout;
  pr64.q = pr.q.template cast<double>(), pr64.k = pr.k.template cast<double>();
  pr64.v = pr.v.template cast<double>(), pr64.dout = pr.dout.template cast<double>();
  pr64.mask.kind = pr.mask.kind, pr64.mask.stride = pr.mask.stride;
  pr64.mask.bools = pr.mask.bools;
  pr64.mask.bias.assign(pr.mask.bias.begin(), pr.mask.bias.end());
  const Result<double> oracle = run(pr64, Backend::kReference, serial_host(), Precision::kFloat64);
  const Result<T> naive = run(pr, Backend::kReference, serial_host(), Precision::kInput);
  ASSERT_TRUE(oracle.forward_status.ok() && oracle.backward_status.ok());

  const struct {
    const char* name;
    const Tensor4<T>& ours;
    const Tensor4<T>& naive;
    const Tensor4<double>& oracle;
  } outputs[] = {{"out", ours.out, naive.out, oracle.out},
                 {"dq", ours.dq, naive.dq, oracle.dq},
                 {"dk", ours.dk, naive.dk, oracle.dk},
                 {"dv", ours.dv, naive.dv, oracle.dv}};
  for (const auto& o : outputs) {
    const double err = max_abs_diff(o.ours, o.oracle);
    const double naive_err = max_abs_diff(o.naive, o.oracle);
    EXPECT_LE(err, tolerance<T>(naive_err)) << o.name << ": naive error " << naive_err;
  }
  for (std::size_t r = 0; r < static_cast<std::size_t>(pr.B * pr.H * pr.Lq); ++r) {
    const double want = oracle.lse[r], got = ours.lse[r];
    if (std::isinf(want)) {
      EXPECT_EQ(got, want) << "lse row " << r;
    } else {
      const double naive_err = std::abs(static_cast<double>(naive.lse[r]) - want);
      EXPECT_LE(std::abs(got - want), tolerance<T>(naive_err) + 4e-7 * std::abs(want))
          << "lse row " << r;
    }
  }
}

struct Shape {
  std::int64_t B, H, Lq, Lk, E, Ev;
};

// Awkward sizes: odd and tiny head widths, E != Ev, Lq != Lk, lengths around tile edges.
const Shape kShapes[] = {
    {1, 1, 1, 1, 1, 1},     {1, 1, 7, 97, 3, 5},    {2, 3, 97, 7, 8, 64},
    {1, 2, 129, 97, 59, 17}, {1, 1, 97, 1025, 64, 128}, {2, 2, 33, 65, 128, 8},
    {1, 1, 1025, 7, 1, 3},  {1, 1, 16, 16, 16, 16},  {3, 4, 17, 300, 8, 32},
};
const Layout kLayouts[] = {Layout::kContiguous, Layout::kSequenceMajor, Layout::kChannelsFirst};

TEST_P(CpuAttention, Float32ShapesAndLayouts) {
  int n = 0;
  for (const Shape& s : kShapes) {
    const Layout layout = kLayouts[n % 3];
    const auto pr = make_problem<float>(s.B, s.H, s.Lq, s.Lk, s.E, s.Ev, layout, 100 + n);
    expect_matches_reference(pr, "shape #" + std::to_string(n));
    ++n;
  }
}

TEST_P(CpuAttention, Float64ShapesAndLayouts) {
  int n = 0;
  for (const Shape& s : kShapes) {
    const Layout layout = kLayouts[(n + 1) % 3];
    const auto pr = make_problem<double>(s.B, s.H, s.Lq, s.Lk, s.E, s.Ev, layout, 200 + n);
    expect_matches_reference(pr, "shape #" + std::to_string(n));
    ++n;
  }
}

TEST_P(CpuAttention, MasksBroadcastEveryWay) {
  int n = 0;
  for (MaskKind kind : {MaskKind::kBool, MaskKind::kAdditive}) {
    for (int bits = 0; bits < 16; ++bits) {
      const std::array<bool, 4> broadcast{(bits & 1) != 0, (bits & 2) != 0, (bits & 4) != 0,
                                          (bits & 8) != 0};
      const auto pr = make_problem<float>(2, 3, 37, 45, 8, 12, kLayouts[n % 3], 300 + n, kind,
                                          broadcast);
      expect_matches_reference(pr, "mask kind " + std::to_string(static_cast<int>(kind)) +
                                       " broadcast bits " + std::to_string(bits));
      ++n;
    }
  }
}

TEST_P(CpuAttention, CausalWithAndWithoutMask) {
  const Shape shapes[] = {{1, 2, 97, 97, 8, 16}, {2, 1, 300, 129, 16, 8}, {1, 1, 40, 300, 5, 7}};
  int n = 0;
  for (const Shape& s : shapes) {
    for (MaskKind kind : {MaskKind::kNone, MaskKind::kBool, MaskKind::kAdditive}) {
      const auto pr = make_problem<float>(s.B, s.H, s.Lq, s.Lk, s.E, s.Ev, kLayouts[n % 3],
                                          400 + n, kind, {}, /*causal=*/true);
      expect_matches_reference(pr, "causal #" + std::to_string(n));
      ++n;
    }
  }
}

TEST_P(CpuAttention, FullyMaskedRowsGiveZeroOutputAndGradient) {
  for (MaskKind kind : {MaskKind::kBool, MaskKind::kAdditive}) {
    const auto pr = make_problem<float>(1, 2, 50, 70, 8, 16, Layout::kContiguous, 500, kind,
                                        {false, false, false, false}, false,
                                        /*fully_masked_rows=*/true);
    expect_matches_reference(pr, "fully masked");
    // Scratch full of NaN: a row with no visible key must still read only what was written.
    const Result<float> r = run(pr, Backend::kCpu, poisoned_host(2));
    for (std::int64_t h = 0; h < 2; ++h) {
      for (std::int64_t i = 0; i < 50; ++i) {
        if ((h * 50 + i) % 3 != 0) continue;  // every third (head, row) is fully masked
        EXPECT_TRUE(std::isinf(r.lse[h * 50 + i]) && r.lse[h * 50 + i] < 0);
        for (std::int64_t e = 0; e < 16; ++e) EXPECT_EQ(r.out.at(0, h, i, e), 0.0f);
        for (std::int64_t e = 0; e < 8; ++e) EXPECT_EQ(r.dq.at(0, h, i, e), 0.0f);
      }
    }
  }
}

TEST_P(CpuAttention, ZeroSizedDimensions) {
  const Shape shapes[] = {{0, 2, 5, 5, 4, 4}, {2, 0, 5, 5, 4, 4}, {1, 1, 0, 5, 4, 4},
                          {1, 1, 5, 0, 4, 4}, {1, 1, 5, 5, 0, 4}, {1, 1, 5, 5, 4, 0}};
  int n = 0;
  for (const Shape& s : shapes) {
    const auto pr = make_problem<float>(s.B, s.H, s.Lq, s.Lk, s.E, s.Ev, Layout::kContiguous,
                                        600 + n);
    expect_matches_reference(pr, "zero-size #" + std::to_string(n));
    ++n;
  }
  // No keys: every row is fully masked.
  const auto pr = make_problem<float>(1, 1, 5, 0, 4, 4, Layout::kContiguous, 650);
  const Result<float> r = run(pr, Backend::kCpu, serial_host());
  r.out.for_each([&](auto b, auto h, auto i, auto e) { EXPECT_EQ(r.out.at(b, h, i, e), 0.0f); });
  r.dq.for_each([&](auto b, auto h, auto i, auto e) { EXPECT_EQ(r.dq.at(b, h, i, e), 0.0f); });
}

TEST_P(CpuAttention, NanInOneQueryRowStaysInThatRow) {
  auto pr = make_problem<float>(1, 1, 20, 40, 8, 8, Layout::kContiguous, 700);
  pr.q.at(0, 0, 5, 3) = std::numeric_limits<float>::quiet_NaN();
  const Result<float> r = run(pr, Backend::kCpu, serial_host());
  for (std::int64_t i = 0; i < 20; ++i) {
    for (std::int64_t e = 0; e < 8; ++e) {
      EXPECT_EQ(std::isnan(r.out.at(0, 0, i, e)), i == 5) << "row " << i;
    }
  }
}

// A NaN key makes one score of every row NaN, and the row maxima stay finite (key 2 sits in the
// first of three vectors, which SIMD max drops NaN from): the exp itself must keep the NaN. Its
// payload 0x7FC0FFFF, read as the exp's integer part, carries into the exponent bits; with
// Highway 1.0.3's Ne(x, x), false for NaN on x86, as the NaN test, the exp gave 2.6e38 there.
TEST_P(CpuAttention, NanInOneKeyReachesEveryRow) {
  auto pr = make_problem<float>(1, 1, 20, 40, 8, 8, Layout::kContiguous, 710);
  const std::uint32_t bits = 0x7FC0FFFFu;
  std::memcpy(&pr.k.at(0, 0, 2, 3), &bits, sizeof(bits));
  const Result<float> r = run(pr, Backend::kCpu, serial_host());
  for (std::int64_t i = 0; i < 20; ++i) {
    for (std::int64_t e = 0; e < 8; ++e) EXPECT_TRUE(std::isnan(r.out.at(0, 0, i, e))) << i;
  }
}

TEST_P(CpuAttention, BitwiseDeterministicAcrossRunsAndThreadCounts) {
  const auto pr = make_problem<float>(2, 3, 300, 257, 24, 40, Layout::kSequenceMajor, 800,
                                      MaskKind::kAdditive, {true, false, false, false});
  const Result<float> a = run(pr, Backend::kCpu, thread_host(2));
  const Result<float> b = run(pr, Backend::kCpu, thread_host(2));
  const Result<float> c = run(pr, Backend::kCpu, serial_host());
  const Result<float> d = run(pr, Backend::kCpu, thread_host(3));
  for (const Result<float>* other : {&b, &c, &d}) {
    EXPECT_EQ(0, std::memcmp(a.out.data.data(), other->out.data.data(), a.out.data.size() * 4));
    EXPECT_EQ(0, std::memcmp(a.dq.data.data(), other->dq.data.data(), a.dq.data.size() * 4));
    EXPECT_EQ(0, std::memcmp(a.dk.data.data(), other->dk.data.data(), a.dk.data.size() * 4));
    EXPECT_EQ(0, std::memcmp(a.dv.data.data(), other->dv.data.data(), a.dv.data.size() * 4));
  }
}

// One thread runs the backward by whole heads. Four threads on two heads of two key tiles run it
// by key-tile groups; on one head of one key tile (and three query tiles), in two passes. All
// must agree to the bit, including the causal edge where a query tile sees a key tile that is
// entirely masked for it (Lk > Lq).
TEST_P(CpuAttention, BackwardSchedulesAgreeBitwise) {
  struct Shape {
    std::int64_t heads, len_q, len_k;
  };
  for (const Shape& shape : {Shape{2, 150, 333}, Shape{1, 600, 200}}) {
    for (bool causal : {false, true}) {
      const auto pr = make_problem<float>(1, shape.heads, shape.len_q, shape.len_k, 12, 20,
                                          Layout::kChannelsFirst, 850, MaskKind::kAdditive,
                                          {false, true, false, false}, causal);
      const Result<float> one = run(pr, Backend::kCpu, serial_host());
      const Result<float> four = run(pr, Backend::kCpu, thread_host(4));
      EXPECT_EQ(0, std::memcmp(one.dq.data.data(), four.dq.data.data(), one.dq.data.size() * 4));
      EXPECT_EQ(0, std::memcmp(one.dk.data.data(), four.dk.data.data(), one.dk.data.size() * 4));
      EXPECT_EQ(0, std::memcmp(one.dv.data.data(), four.dv.data.data(), one.dv.data.size() * 4));
      expect_matches_reference(pr, causal ? "causal" : "not causal");
    }
  }
}

TEST_P(CpuAttention, DispatchesToTheTargetUnderTest) {
  EXPECT_STREQ(cpu_simd_target(), hwy::TargetName(GetParam()));
}

TEST(CpuAttentionHost, AllocatorFailureIsAStatusNotACrash) {
  Host host = serial_host();
  host.allocate = [](void*, std::size_t) -> void* { return nullptr; };
  const auto pr = make_problem<float>(1, 1, 8, 8, 4, 4, Layout::kContiguous, 900);
  const Result<float> r = run(pr, Backend::kCpu, host);
  EXPECT_EQ(r.forward_status.code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(r.backward_status.code(), StatusCode::kOutOfMemory);
}

}  // namespace
}  // namespace testing
}  // namespace attn2d
