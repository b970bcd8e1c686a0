// The softmax's exp and log-sum-exp, per target: SoftmaxExp in float32 (the main per-score cost
// of heads 8 to 16 wide, hence a short polynomial of its own), Bf16SoftmaxExp for probabilities
// that are rounded to bf16 next, and Highway's Exp in float64.
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_COMMON_EXP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_COMMON_EXP_INL_H_
#undef ATTN2D_SRC_CPU_COMMON_EXP_INL_H_
#else
#define ATTN2D_SRC_CPU_COMMON_EXP_INL_H_
#endif

#include <limits>
#include <type_traits>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The exps' last step: p * 2^n, where n sits in the low mantissa bits of `rounded` (an integer
// plus `magic` = 1.5 * 2^23: its bits minus magic's are n as an int32, two's complement), and
// 2^n goes straight into the exponent bits, valid for n >= -126; below x = -87 the result is 0,
// as exp underflows there anyway next to the row maximum's exp(0) = 1. NaN x stays NaN (a NaN
// score must give a NaN output, as naive attention does, not a silent 0). AVX-512 targets take
// VSCALEFPS, p * 2^n in one instruction (n = rounded - magic, which SoftmaxExp has already
// formed), where the exponent-bit arithmetic and the NaN blend take five: 4 instructions in
// all against 7. It is the same exact scaling for every x >= -87 (n >= -126 and a normal
// result), and a NaN x makes p and the result NaN.
template <class D>
HWY_INLINE hn::Vec<D> TimesPow2(D d, hn::Vec<D> x, hn::Vec<D> p, hn::Vec<D> rounded,
                                hn::Vec<D> magic) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (std::is_same<hn::TFromD<D>, float>::value && hn::MaxLanes(D()) == 16) {
    const auto n = hn::Sub(rounded, magic);
    const hn::Vec<D> scaled{_mm512_scalef_ps(p.raw, n.raw)};
    return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -87.0f)), scaled);
  }
#endif
  const hn::RebindToSigned<D> di;
  const auto ni = hn::Sub(hn::BitCast(di, rounded), hn::BitCast(di, magic));
  const auto scaled = hn::BitCast(d, hn::Add(hn::BitCast(di, p), hn::ShiftLeft<23>(ni)));
  const auto result = hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -87.0f)), scaled);
  return hn::IfThenElse(hn::IsNaN(x), x, result);
}

// exp(x) for the softmax's arguments (x <= 0 up to rounding, or -inf, or NaN), in float32:
// Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, and e^r by a degree-6 minimax polynomial
// (Remez, relative error 1.9e-9; 1.7e-8 with its coefficients rounded to float32, where c0 and
// c1 become 1; under float32's 6e-8 rounding), one multiply-add fewer than a degree-7 Taylor
// polynomial (truncation 6e-9) for the same worst error over [-87, 0], 2.9 units of 2^-24
// (tests/cpp/softmax_exp_test.cc). n comes from adding
// 1.5 * 2^23, which rounds x log2(e) to the nearest integer and leaves that integer in the low
// mantissa bits (valid for |x log2 e| < 2^22): one add instead of a round plus a float-to-int
// conversion (which Highway guards against overflow with 4 more instructions); TimesPow2 does
// the rest. About 19 instructions per vector, 15 on AVX-512 (TimesPow2); on E=8..16 heads
// the exp is the main per-score cost.
template <class D>
HWY_INLINE hn::Vec<D> SoftmaxExp(D d, hn::Vec<D> x) {
  const auto magic = hn::Set(d, 12582912.0f);  // 1.5 * 2^23
  const auto t = hn::MulAdd(x, hn::Set(d, 1.44269504088896341f), magic);
  const auto n = hn::Sub(t, magic);  // x log2(e), rounded to the nearest integer
  auto r = hn::MulAdd(n, hn::Set(d, -0.693145751953125f), x);  // ln2's leading 16 bits
  r = hn::MulAdd(n, hn::Set(d, -1.428606765330187045e-6f), r);  // and the rest
  // Estrin's scheme: 3 dependent multiply-adds after r^2 where Horner's takes 7. A row of 64
  // scores (a sparse tile's) is 4 vectors, too few independent exps to hide Horner's chain.
  const auto r2 = hn::Mul(r, r);
  const auto r4 = hn::Mul(r2, r2);
  const auto p01 = hn::Add(r, hn::Set(d, 1.0f));
  const auto p23 = hn::MulAdd(r, hn::Set(d, 0.166664198f), hn::Set(d, 0.499999911f));
  const auto p45 = hn::MulAdd(r, hn::Set(d, 0.00837481581f), hn::Set(d, 0.0416682251f));
  const auto p46 = hn::MulAdd(r2, hn::Set(d, 0.00138368458f), p45);
  const auto p03 = hn::MulAdd(p23, r2, p01);
  return TimesPow2(d, x, hn::MulAdd(p46, r4, p03), t, magic);
}

// exp for probabilities that are rounded to bf16 next (the bf16 products' P; relative unit 2^-9):
// 2^t with t = x log2(e) split as n + f, |f| <= 1/2, and 2^f by a degree-4 minimax polynomial
// (relative error 2.7e-6, plus up to 6e-8 |t| from rounding t), 5 multiply-adds where
// SoftmaxExp's Cody-Waite reduction and polynomial take more: the multiply-add pipes also run
// the VDPBF16PS products, so every multiply-add the exp saves goes to them. Same range rules as
// SoftmaxExp: 0 below x = -87 (and for -inf), NaN stays NaN.
template <class D>
HWY_INLINE hn::Vec<D> Bf16SoftmaxExp(D d, hn::Vec<D> x) {
  const auto magic = hn::Set(d, 12582912.0f);  // 1.5 * 2^23: rounds to an integer, see above
  const auto t = hn::Mul(x, hn::Set(d, 1.44269504088896341f));
  const auto tm = hn::Add(t, magic);
  const auto f = hn::Sub(t, hn::Sub(tm, magic));
  auto p = hn::Set(d, 0.009570068679749966f);
  p = hn::MulAdd(p, f, hn::Set(d, 0.055917806923389435f));
  p = hn::MulAdd(p, f, hn::Set(d, 0.240247443318367f));
  p = hn::MulAdd(p, f, hn::Set(d, 0.6931218504905701f));
  p = hn::MulAdd(p, f, hn::Set(d, 0.9999992847442627f));
  return TimesPow2(d, x, p, tm, magic);
}

// exp for the softmax: SoftmaxExp in float32; Highway's Exp in float64 (the accurate kernels'
// type), where NaN, which it maps to 0, is put back.
template <class D, class V>
HWY_INLINE V ExpOf(D d, V x) {
  if constexpr (std::is_same<hn::TFromD<D>, float>::value) {
    return SoftmaxExp(d, x);
  } else {
    return hn::IfThenElse(hn::IsNaN(x), x, hn::Exp(d, x));
  }
}

// Rows' log-sum-exps from their maxima and exp sums, a vector of rows: m + log l, and -inf for
// a row that saw no key (m = -inf, l = 0; log of 1 in that lane keeps it finite). Highway's
// float Log is documented to 4 ulp, well within the output's own rounding.
template <class D, class V>
HWY_INLINE V LogSumExp(D d, V row_max, V row_sum) {
  const auto empty = hn::Eq(row_max, hn::Set(d, -std::numeric_limits<hn::TFromD<D>>::infinity()));
  const auto sum = hn::IfThenElse(empty, hn::Set(d, hn::TFromD<D>(1)), row_sum);
  return hn::IfThenElse(empty, row_max, hn::Add(row_max, hn::Log(d, sum)));
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_COMMON_EXP_INL_H_
