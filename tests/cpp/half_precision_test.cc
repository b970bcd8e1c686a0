// bfloat16 and float16 storage (float32 compute) against the float64 reference run on the same
// rounded values, on every SIMD target this build compiled and this CPU runs.
//
// Every product and sum runs in float32 and each result is rounded once to 16 bits, so the
// error is the output rounding (half an ulp: 2^-9 relative for bfloat16, 2^-12 for float16)
// plus float32 noise; the backward's delta = rowsum(dO*O) reads the forward's output, rounded
// (or in float through out_accum).
// The bound is 4 rounding units of the tensor's largest magnitude.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "attn2d/bf16_products.h"
#include "cpu/common/half.h"
#include "hwy/targets.h"

namespace attn2d {
namespace testing {
namespace {

using cpu::BFloat16;
using cpu::Float16;

class HalfPrecision : public hwy::TestWithParamTarget {
 protected:
  void TearDown() override {
    hwy::TestWithParamTarget::TearDown();
    set_bf16_products(Bf16Products::kAuto);
  }
};

// Runs check once on each of bf16's products (pairs on VDPBF16PS where the CPU has AVX512-BF16,
// widened float32 FMAs), whichever kAuto would pick on this CPU.
template <class Check>
void ForEachBf16Products(const Check& check) {
  for (Bf16Products choice : {Bf16Products::kPairs, Bf16Products::kFloat}) {
    SCOPED_TRACE(choice == Bf16Products::kPairs ? "bf16 pair products" : "float32 products");
    set_bf16_products(choice);
    check();
  }
}

ATTN2D_TARGET_INSTANTIATE_TEST_SUITE_P(HalfPrecision);

template <typename H>
struct Traits;
template <>
struct Traits<BFloat16> {
  static constexpr DType kDType = DType::kBFloat16;
  static constexpr double kUnit = 1.0 / 512;  // half an ulp, relative
  static BFloat16 narrow(float x) { return cpu::narrow_bf16(x); }
};
template <>
struct Traits<Float16> {
  static constexpr DType kDType = DType::kFloat16;
  static constexpr double kUnit = 1.0 / 4096;
  static Float16 narrow(float x) { return cpu::narrow_f16(x); }
};

// The same view as t, with 16-bit elements; t's values are rounded in place to what they hold.
template <typename H>
Tensor4<H> to_half(Tensor4<float>& t) {
  Tensor4<H> h;
  h.size = t.size, h.stride = t.stride;
  h.data.resize(t.data.size());
  for (std::size_t i = 0; i < t.data.size(); ++i) {
    h.data[i] = Traits<H>::narrow(t.data[i]);
    t.data[i] = cpu::widen(h.data[i]);
  }
  return h;
}

template <typename H>
Tensor4<H> empty_like(const Tensor4<float>& t) {
  Tensor4<H> h;
  h.size = t.size, h.stride = t.stride;
  h.data.resize(t.data.size());
  return h;
}

template <typename H>
double max_error(const Tensor4<H>& ours, const Tensor4<double>& oracle, double* largest) {
  double worst = 0.0;
  *largest = 0.0;
  oracle.for_each([&](auto b, auto h, auto i, auto j) {
    const double want = oracle.at(b, h, i, j);
    const double got = cpu::widen(ours.at(b, h, i, j));
    worst = std::isnan(got) ? INFINITY : std::max(worst, std::abs(got - want));
    *largest = std::max(*largest, std::abs(want));
  });
  return worst;
}

// The float64 oracle of pr (whose values are the rounded ones) and the 16-bit problem's tensors:
// inputs rounded from pr, outputs and the params of a forward and backward over them, with
// views and strides from the float32 runner's layout.
template <typename H>
struct HalfRun {
  Result<double> oracle;
  Tensor4<H> q, k, v, dout, out, dq, dk, dv;
  std::vector<float> lse;
  AttentionBackwardParams bp;

  explicit HalfRun(Problem<float>& pr) {
    q = to_half<H>(pr.q), k = to_half<H>(pr.k), v = to_half<H>(pr.v);
    dout = to_half<H>(pr.dout);
    Problem<double> pr64;
    pr64.B = pr.B, pr64.H = pr.H, pr64.Lq = pr.Lq, pr64.Lk = pr.Lk, pr64.E = pr.E;
    pr64.Ev = pr.Ev, pr64.scale = pr.scale, pr64.causal = pr.causal, pr64.layout = pr.layout;
    pr64.q = pr.q.cast<double>(), pr64.k = pr.k.cast<double>(), pr64.v = pr.v.cast<double>();
    pr64.dout = pr.dout.cast<double>();
    pr64.mask.kind = pr.mask.kind, pr64.mask.stride = pr.mask.stride;
    pr64.mask.bools = pr.mask.bools;
    pr64.mask.bias.assign(pr.mask.bias.begin(), pr.mask.bias.end());
    oracle = run(pr64, Backend::kReference, serial_host(), reference::Precision::kFloat64);
    Result<float> shape_of = run(pr, Backend::kCpu, serial_host());
    out = empty_like<H>(shape_of.out), dq = empty_like<H>(shape_of.dq);
    dk = empty_like<H>(shape_of.dk), dv = empty_like<H>(shape_of.dv);
    lse.resize(shape_of.lse.size());
    bp.fwd = forward_params(pr, shape_of.out, lse);
    bp.fwd.dtype = Traits<H>::kDType;
    bp.fwd.q = q.data.data(), bp.fwd.k = k.data.data(), bp.fwd.v = v.data.data();
    bp.fwd.out = out.data.data();
    bp.dout = dout.data.data();
    std::copy(dout.stride.begin(), dout.stride.end(), bp.dout_stride);
    bp.dq = dq.data.data(), bp.dk = dk.data.data(), bp.dv = dv.data.data();
    std::copy(dq.stride.begin(), dq.stride.end(), bp.dq_stride);
    std::copy(dk.stride.begin(), dk.stride.end(), bp.dk_stride);
    std::copy(dv.stride.begin(), dv.stride.end(), bp.dv_stride);
  }
};

template <typename H>
void expect_close_to_reference(Problem<float> pr, const std::string& what) {
  SCOPED_TRACE(what);
  HalfRun<H> r(pr);
  ASSERT_TRUE(r.oracle.forward_status.ok() && r.oracle.backward_status.ok());
  ASSERT_TRUE(attention_forward(r.bp.fwd, thread_host(2)).ok());
  const Status s = attention_backward(r.bp, thread_host(2));
  ASSERT_TRUE(s.ok()) << s.message();
  const Tensor4<H>&out = r.out, &dq = r.dq, &dk = r.dk, &dv = r.dv;
  const Result<double>& oracle = r.oracle;
  const std::vector<float>& lse = r.lse;

  const struct {
    const char* name;
    const Tensor4<H>& ours;
    const Tensor4<double>& oracle;
  } outputs[] = {{"out", out, oracle.out}, {"dq", dq, oracle.dq}, {"dk", dk, oracle.dk},
                 {"dv", dv, oracle.dv}};
  for (const auto& o : outputs) {
    double largest;
    const double err = max_error(o.ours, o.oracle, &largest);
    EXPECT_LE(err, 4.0 * Traits<H>::kUnit * largest + 1e-6) << o.name << " (largest " << largest
                                                            << ")";
  }
  for (std::size_t r = 0; r < lse.size(); ++r) {
    const double want = oracle.lse[r];
    if (std::isinf(want)) {
      EXPECT_EQ(lse[r], want) << "lse row " << r;
    } else {
      EXPECT_NEAR(lse[r], want, 1e-5 * (1.0 + std::abs(want))) << "lse row " << r;
    }
  }
}

struct Shape {
  std::int64_t B, H, Lq, Lk, E, Ev;
};
const Shape kShapes[] = {{1, 1, 1, 1, 1, 1},      {2, 3, 97, 7, 8, 64},
                         {1, 2, 129, 97, 59, 17}, {1, 1, 300, 1025, 64, 64},
                         {3, 4, 17, 300, 8, 32}};
const Layout kLayouts[] = {Layout::kContiguous, Layout::kSequenceMajor, Layout::kChannelsFirst};

TEST_P(HalfPrecision, BFloat16ShapesAndLayouts) {
  ForEachBf16Products([] {
    int n = 0;
    for (const Shape& s : kShapes) {
      expect_close_to_reference<BFloat16>(
          make_problem<float>(s.B, s.H, s.Lq, s.Lk, s.E, s.Ev, kLayouts[n % 3], 700 + n),
          "shape #" + std::to_string(n));
      ++n;
    }
  });
}

// Scores that span ~+-100 (scale 3 at E = 16): the bf16 products' cheaper exp (Bf16SoftmaxExp)
// must hold its error across the whole range, underflow to 0 below -87, and leave lse as close.
TEST_P(HalfPrecision, BFloat16WideScores) {
  auto pr = make_problem<float>(1, 2, 150, 333, 16, 24, Layout::kContiguous, 950);
  pr.scale = 3.0;
  ForEachBf16Products([&] { expect_close_to_reference<BFloat16>(pr, "scale 3"); });
}

TEST_P(HalfPrecision, Float16ShapesAndLayouts) {
  int n = 0;
  for (const Shape& s : kShapes) {
    expect_close_to_reference<Float16>(
        make_problem<float>(s.B, s.H, s.Lq, s.Lk, s.E, s.Ev, kLayouts[(n + 1) % 3], 800 + n),
        "shape #" + std::to_string(n));
    ++n;
  }
}

TEST_P(HalfPrecision, MasksCausalAndFullyMaskedRows) {
  ForEachBf16Products([] {
    int n = 0;
    for (MaskKind kind : {MaskKind::kBool, MaskKind::kAdditive}) {
      for (bool causal : {false, true}) {
        expect_close_to_reference<BFloat16>(
            make_problem<float>(2, 2, 45, 70, 16, 24, Layout::kChannelsFirst, 900 + n, kind,
                                {false, true, false, false}, causal, /*fully_masked_rows=*/true),
            "mask kind " + std::to_string(static_cast<int>(kind)) + (causal ? " causal" : ""));
        ++n;
      }
    }
  });
}

template <typename H>
double rms_error(const Tensor4<H>& ours, const Tensor4<double>& oracle) {
  double sum = 0.0;
  oracle.for_each([&](auto b, auto h, auto i, auto j) {
    const double e = cpu::widen(ours.at(b, h, i, j)) - oracle.at(b, h, i, j);
    sum += e * e;
  });
  return std::sqrt(sum / static_cast<double>(oracle.numel()));
}

// out_accum: the forward writes the float output whose rounding is `out`, and the backward's
// D = rowsum(dO * O) read from it keeps dQ closer to float64 than D from the rounded output.
// Non-negative inputs: each row of dP shares a large common part that D must cancel.
template <typename H>
void expect_out_accum_sharpens_dq(Problem<float> pr) {
  for (Tensor4<float>* t : {&pr.q, &pr.k, &pr.v, &pr.dout}) {
    for (float& x : t->data) x = std::abs(x);
  }
  HalfRun<H> r(pr);
  ASSERT_TRUE(r.oracle.backward_status.ok());
  Tensor4<float> out_accum = empty_like<float>(r.oracle.out.template cast<float>());
  r.bp.fwd.out_accum = out_accum.data.data();
  std::copy(out_accum.stride.begin(), out_accum.stride.end(), r.bp.fwd.out_accum_stride);
  ASSERT_TRUE(attention_forward(r.bp.fwd, thread_host(2)).ok());
  out_accum.for_each([&](auto b, auto h, auto i, auto j) {
    ASSERT_EQ(cpu::widen(Traits<H>::narrow(out_accum.at(b, h, i, j))),
              cpu::widen(r.out.at(b, h, i, j)));
  });
  ASSERT_TRUE(attention_backward(r.bp, thread_host(2)).ok());
  const double from_accum = rms_error(r.dq, r.oracle.dq);
  r.bp.fwd.out_accum = nullptr;
  ASSERT_TRUE(attention_backward(r.bp, thread_host(2)).ok());
  const double from_rounded = rms_error(r.dq, r.oracle.dq);
  EXPECT_LT(from_accum, 0.5 * from_rounded);
  // Without out the backward reads O from out_accum alone.
  r.bp.fwd.out_accum = out_accum.data.data();
  r.bp.fwd.out = nullptr;
  ASSERT_TRUE(attention_backward(r.bp, thread_host(2)).ok());
  EXPECT_EQ(rms_error(r.dq, r.oracle.dq), from_accum);
}

TEST_P(HalfPrecision, OutAccumKeepsDqCloser) {
  const auto pr = make_problem<float>(1, 2, 120, 150, 16, 32, Layout::kContiguous, 990,
                                      MaskKind::kBool, {false, false, false, false},
                                      /*causal=*/false, /*fully_masked_rows=*/true);
  expect_out_accum_sharpens_dq<Float16>(pr);
  ForEachBf16Products([&] { expect_out_accum_sharpens_dq<BFloat16>(pr); });
}

TEST(HalfPrecisionConversions, RoundToNearestEvenAndKeepNaN) {
  // 1 + 2^-8 lies halfway between bfloat16's 1 and 1 + 2^-7: ties go to the even mantissa.
  EXPECT_EQ(cpu::widen(cpu::narrow_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(cpu::widen(cpu::narrow_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_EQ(cpu::widen(cpu::narrow_bf16(1.0f + 1.5f / 256)), 1.0f + 2.0f / 256);
  EXPECT_TRUE(std::isnan(cpu::widen(cpu::narrow_bf16(NAN))));
  EXPECT_TRUE(std::isinf(cpu::widen(cpu::narrow_bf16(INFINITY))));
  EXPECT_EQ(cpu::widen(cpu::narrow_f16(1.0f + 1.0f / 2048)), 1.0f);
  EXPECT_EQ(cpu::widen(cpu::narrow_f16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(cpu::widen(cpu::narrow_f16(1e6f))));
}

}  // namespace
}  // namespace testing
}  // namespace attn2d
