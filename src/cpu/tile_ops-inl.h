// Per-target building blocks of the tiled attention kernels: packing strided tensors into
// tiles, one register-blocked GEMM micro-kernel, row-wise softmax pieces, tile masking.
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_TILE_OPS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_TILE_OPS_INL_H_
#undef ATTN2D_SRC_CPU_TILE_OPS_INL_H_
#else
#define ATTN2D_SRC_CPU_TILE_OPS_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "attn2d/sparse_layout.h"
#include "core/strided.h"
#include "cpu/bf16_pairs_avx512.h"
#include "cpu/half.h"
#include "hwy/cache_control.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <typename T>
HWY_INLINE size_t VectorLanes() {
  return hn::Lanes(hn::ScalableTag<T>());
}

// ---------------------------------------------------------------------------------------------
// GEMM micro-kernel.
// C (M x N, row stride ldc) = [C +] A * B, where A(m, k) = A[m * a_rs + k * a_ks] is read one
// scalar at a time and broadcast, and B (K x N, row stride ldb) is read in vectors. N must be a
// multiple of the vector length. Because A may be any strided view, this one kernel serves
// Q*K^T, P*V, dO*V^T, P^T*dO, dS^T*Q and dS*K.

// kRows x 2 vectors of C. The accumulators must cover FMA latency x throughput (4 x 2 on
// current x86 cores) with room to spare, and each B vector loaded feeds kRows FMAs.
template <size_t kRows, bool kAccumulate, class D, typename T>
HWY_INLINE void BlockRowsx2(D d, size_t K, const T* HWY_RESTRICT A, size_t a_rs, size_t a_ks,
                            const T* HWY_RESTRICT B, size_t ldb, T* HWY_RESTRICT C, size_t ldc) {
  using V = decltype(hn::Zero(d));
  const size_t L = hn::Lanes(d);
  V c0[kRows], c1[kRows];
  HWY_UNROLL(12)
  for (size_t r = 0; r < kRows; ++r) {
    c0[r] = kAccumulate ? hn::LoadU(d, C + r * ldc) : hn::Zero(d);
    c1[r] = kAccumulate ? hn::LoadU(d, C + r * ldc + L) : hn::Zero(d);
  }
  for (size_t k = 0; k < K; ++k) {
    const auto b0 = hn::LoadU(d, B + k * ldb);
    const auto b1 = hn::LoadU(d, B + k * ldb + L);
    const T* a = A + k * a_ks;
    HWY_UNROLL(12)
    for (size_t r = 0; r < kRows; ++r) {
      const auto ar = hn::Set(d, a[r * a_rs]);
      c0[r] = hn::MulAdd(ar, b0, c0[r]);
      c1[r] = hn::MulAdd(ar, b1, c1[r]);
    }
  }
  HWY_UNROLL(12)
  for (size_t r = 0; r < kRows; ++r) {
    hn::StoreU(c0[r], d, C + r * ldc);
    hn::StoreU(c1[r], d, C + r * ldc + L);
  }
}

// kRows x 1 vector of C: the last (or only) vector of columns, e.g. P*V at Ev <= 16 floats.
// 4 rows kept 4 multiply-add chains in flight, half the 8 that 4-cycle FMAs at 2 a cycle need.
template <size_t kRows, bool kAccumulate, class D, typename T>
HWY_INLINE void BlockRowsx1(D d, size_t K, const T* HWY_RESTRICT A, size_t a_rs, size_t a_ks,
                            const T* HWY_RESTRICT B, size_t ldb, T* HWY_RESTRICT C, size_t ldc) {
  using V = decltype(hn::Zero(d));
  V c[kRows];
  HWY_UNROLL(12)
  for (size_t r = 0; r < kRows; ++r) c[r] = kAccumulate ? hn::LoadU(d, C + r * ldc) : hn::Zero(d);
  for (size_t k = 0; k < K; ++k) {
    const auto b = hn::LoadU(d, B + k * ldb);
    const T* a = A + k * a_ks;
    HWY_UNROLL(12)
    for (size_t r = 0; r < kRows; ++r) c[r] = hn::MulAdd(hn::Set(d, a[r * a_rs]), b, c[r]);
  }
  HWY_UNROLL(12)
  for (size_t r = 0; r < kRows; ++r) hn::StoreU(c[r], d, C + r * ldc);
}

template <bool kAccumulate, typename T>
HWY_NOINLINE void Gemm(size_t M, size_t N, size_t K, const T* HWY_RESTRICT A, size_t a_rs,
                       size_t a_ks, const T* HWY_RESTRICT B, size_t ldb, T* HWY_RESTRICT C,
                       size_t ldc) {
  const hn::ScalableTag<T> d;
  const size_t L = hn::Lanes(d);
  size_t n = 0;
  // 12 rows where the target has 32 vector registers (24 accumulators, 2 B vectors, 1
  // broadcast), else 6 (12 + 3 of 16). On AVX-512 (Zen 5) 12 rows made the ViT-B N=1024
  // forward 1.16x and its backward 1.25x faster than 4 rows, 8 rows 1.08x and 1.18x.
  constexpr size_t kRows = HWY_TARGET <= HWY_AVX3 ? 12 : 6;
  // Column panels outermost: a K x 2L panel of B stays in L1 while every row block uses it.
  for (; n + 2 * L <= N; n += 2 * L) {
    size_t m = 0;
    for (; m + kRows <= M; m += kRows) {
      BlockRowsx2<kRows, kAccumulate>(d, K, A + m * a_rs, a_rs, a_ks, B + n, ldb,
                                      C + m * ldc + n, ldc);
    }
    for (; m + 4 <= M; m += 4) {
      BlockRowsx2<4, kAccumulate>(d, K, A + m * a_rs, a_rs, a_ks, B + n, ldb, C + m * ldc + n,
                                  ldc);
    }
    for (; m < M; ++m) {
      BlockRowsx2<1, kAccumulate>(d, K, A + m * a_rs, a_rs, a_ks, B + n, ldb, C + m * ldc + n,
                                  ldc);
    }
  }
  for (; n < N; n += L) {
    size_t m = 0;
    for (; m + kRows <= M; m += kRows) {
      BlockRowsx1<kRows, kAccumulate>(d, K, A + m * a_rs, a_rs, a_ks, B + n, ldb,
                                      C + m * ldc + n, ldc);
    }
    for (; m + 4 <= M; m += 4) {
      BlockRowsx1<4, kAccumulate>(d, K, A + m * a_rs, a_rs, a_ks, B + n, ldb, C + m * ldc + n,
                                  ldc);
    }
    for (; m < M; ++m) {
      BlockRowsx1<1, kAccumulate>(d, K, A + m * a_rs, a_rs, a_ks, B + n, ldb, C + m * ldc + n,
                                  ldc);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Row operations on score tiles; n is a multiple of the vector length.

template <typename T>
HWY_INLINE T RowMax(const T* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<T> d;
  const size_t L = hn::Lanes(d);
  auto m = hn::Set(d, -std::numeric_limits<T>::infinity());
  for (size_t j = 0; j < n; j += L) m = hn::Max(m, hn::LoadU(d, x + j));
  return hn::GetLane(hn::MaxOfLanes(d, m));
}

// IsNaN, not Ne(v, v): Highway 1.0.3 compares != as NEQ_OQ on x86, false when a lane is NaN.
template <typename T>
HWY_INLINE bool RowHasNaN(const T* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<T> d;
  const size_t L = hn::Lanes(d);
  for (size_t j = 0; j < n; j += L) {
    const auto v = hn::LoadU(d, x + j);
    if (!hn::AllFalse(d, hn::IsNaN(v))) return true;
  }
  return false;
}

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
// c1 become 1; under float32's 6e-8 rounding), one multiply-add fewer than the degree-7 Taylor
// polynomial it replaced (truncation 6e-9), with the same worst error over [-87, 0], 2.9 units
// of 2^-24 (tests/cpp/softmax_exp_test.cc). n comes from adding
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
// SoftmaxExp's Cody-Waite reduction and degree-7 polynomial take 11. The multiply-add pipes
// also run VDPBF16PS; the exp took 22% of the bf16 ViT-B N=1024 forward. Same range rules as
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
// float Log is documented to 4 ulp; over l in [1, 70000] (a row sum lies in [1, Lk]) it measured
// 0.89 ulp at most, 5e-7 absolute, against the float64 log.
template <class D, class V>
HWY_INLINE V LogSumExp(D d, V row_max, V row_sum) {
  const auto empty = hn::Eq(row_max, hn::Set(d, -std::numeric_limits<hn::TFromD<D>>::infinity()));
  const auto sum = hn::IfThenElse(empty, hn::Set(d, hn::TFromD<D>(1)), row_sum);
  return hn::IfThenElse(empty, row_max, hn::Add(row_max, hn::Log(d, sum)));
}

// x = exp(x - shift) in place; returns the sum's lanes (their total is the row's sum).
template <class D>
HWY_INLINE hn::Vec<D> ExpShiftSumLanes(D d, hn::TFromD<D>* HWY_RESTRICT x, size_t n,
                                       hn::Vec<D> shift) {
  const size_t L = hn::Lanes(d);
  auto sum = hn::Zero(d);
  for (size_t j = 0; j < n; j += L) {
    const auto p = ExpOf(d, hn::Sub(hn::LoadU(d, x + j), shift));
    hn::StoreU(p, d, x + j);
    sum = hn::Add(sum, p);
  }
  return sum;
}

// x = exp(x - shift) in place; returns the sum.
template <typename T>
HWY_INLINE T ExpShiftSum(T* HWY_RESTRICT x, size_t n, T shift) {
  const hn::ScalableTag<T> d;
  return hn::GetLane(hn::SumOfLanes(d, ExpShiftSumLanes(d, x, n, hn::Set(d, shift))));
}

template <typename T>
HWY_INLINE void ScaleRow(T* HWY_RESTRICT x, size_t n, T a) {
  const hn::ScalableTag<T> d;
  const size_t L = hn::Lanes(d);
  const auto va = hn::Set(d, a);
  for (size_t j = 0; j < n; j += L) hn::StoreU(hn::Mul(hn::LoadU(d, x + j), va), d, x + j);
}

template <typename T>
HWY_INLINE void ZeroRow(T* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<T> d;
  const size_t L = hn::Lanes(d);
  for (size_t j = 0; j < n; j += L) hn::StoreU(hn::Zero(d), d, x + j);
}

// acc += x over n elements (a multiple of the vector length).
template <typename T>
HWY_INLINE void AddRow(T* HWY_RESTRICT acc, const T* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<T> d;
  const size_t L = hn::Lanes(d);
  for (size_t j = 0; j < n; j += L) {
    hn::StoreU(hn::Add(hn::LoadU(d, acc + j), hn::LoadU(d, x + j)), d, acc + j);
  }
}

// The backward's recomputation of one row: s = P = exp(s - lse) and dp = dS = P * (dp - D), in
// one pass (it was an exp pass, which also summed P for nothing, then a pass reading P again).
template <typename T>
HWY_INLINE void ProbabilityGradRow(T* HWY_RESTRICT s, T* HWY_RESTRICT dp, size_t n, T lse, T D) {
  const hn::ScalableTag<T> d;
  const size_t L = hn::Lanes(d);
  const auto vlse = hn::Set(d, lse), vD = hn::Set(d, D);
  for (size_t j = 0; j < n; j += L) {
    const auto p = ExpOf(d, hn::Sub(hn::LoadU(d, s + j), vlse));
    hn::StoreU(p, d, s + j);
    hn::StoreU(hn::Mul(p, hn::Sub(hn::LoadU(d, dp + j), vD)), d, dp + j);
  }
}

// ---------------------------------------------------------------------------------------------
// Packing: strided tensor slices into dense tiles (the only reads of user memory).

// Which rows of a (len, width) tensor slice a tile holds: `count` consecutive rows from `first`
// (dense attention), or listed ones (a gathered tile of a sparse pattern).
struct Rows {
  const std::int32_t* index = nullptr;  // (count,) row numbers; null: consecutive
  std::int64_t first = 0;
  size_t count = 0;
  std::int64_t operator[](size_t r) const {
    return index != nullptr ? index[r] : first + static_cast<std::int64_t>(r);
  }
};

// Element (r, c) of a tile is base[rows[r] * rs + c * cs]. The loops walk the source along its
// smaller stride: an NCHW conv output viewed as (L, d) has stride 1 along L and H*W along d, so
// walking d first would touch one cache line (and at 256x256 one page) per element.

// Where a request puts its lines: kL1 for rows read right away; kL2 for rows a later task or a
// later block reads. Requests a task ahead into L1 evicted the task's own arrays: a sparse
// forward task's scores, packed tiles and accumulators take ~41 KiB, over a 32 KiB L1, and on a
// Zen 4 core (2 threads, 8 YLG heads at 128x128 over 64x64, E = Ev = 16, the two requests
// alternated call by call) its next tile's rows requested into L2 made the forward 9-14% faster,
// its floor heads 10-14% (attention_forward_cpu.cc, PrefetchQueryTile).
enum class PrefetchTo : int { kL2 = 2, kL1 = 3 };

// Requests the cache lines of rows `rows` of a (positions, width) tensor view (base at the head's
// position 0, strides in elements), for writing when kWrite: up to 4 lines (256 bytes) of each
// row, where a row's elements are contiguous (cs == 1; a strided view's elements lie one line
// apart each, and are left to the copy).
template <bool kWrite, PrefetchTo kTo = PrefetchTo::kL1, typename IO>
HWY_INLINE void PrefetchRows(const IO* base, const Rows& rows, std::int64_t rs, std::int64_t cs,
                             size_t width) {
  if (cs != 1) return;
  const size_t lines = std::min<size_t>((width * sizeof(IO) + 63) / 64, 4);
  for (size_t r = 0; r < rows.count; ++r) {
    const char* row = reinterpret_cast<const char*>(base + rows[r] * rs);
    for (size_t i = 0; i < lines; ++i) {
      __builtin_prefetch(row + 64 * i, kWrite ? 1 : 0, static_cast<int>(kTo));
    }
  }
}

// dst[r * ld + c] = alpha * element(r, c) for r < rows.count, c < cols; zero for c in
// [cols, ld) and for r in [rows.count, rows_pad). Elements are stored as IO (T, or a 16-bit
// type widened here) and packed as the compute type T.
template <typename T, typename IO>
HWY_INLINE void PackRows(const IO* HWY_RESTRICT base, const Rows& rows, std::int64_t rs,
                         std::int64_t cs, size_t cols, T alpha, T* HWY_RESTRICT dst, size_t ld,
                         size_t rows_pad) {
  const size_t n = rows.count;
  if (cs != 1 && std::abs(rs) < std::abs(cs)) {
    for (size_t c = 0; c < cols; ++c) {
      const IO* s = base + static_cast<std::int64_t>(c) * cs;
      for (size_t r = 0; r < n; ++r) dst[r * ld + c] = alpha * Load<T>(s[rows[r] * rs]);
    }
  } else {
    // Gathered rows (a sparse tile's) are scattered over the head: every row's line is
    // requested before the first is copied (the copy of a YLG query tile's rows was 25% of the
    // sparse forward task's own samples, 11% with the prefetches).
    if (rows.index != nullptr) PrefetchRows<false>(base, rows, rs, cs, cols);
    for (size_t r = 0; r < n; ++r) {
      const IO* s = base + rows[r] * rs;
      if (cs == 1) {
        size_t c = 0;
        if constexpr (std::is_same<IO, T>::value) {
          // Whole vectors: with alpha = 1 GCC turned the element loop into a memmove call per
          // row (64 bytes at E = 16), 2.2% of a YLG 128x128 forward and backward's samples, in
          // DeltaTask (the backward, 2 threads: 11.1-11.8 ms against 11.1-12.3, 4 rounds).
          const hn::ScalableTag<T> d;
          const size_t L = hn::Lanes(d);
          const auto va = hn::Set(d, alpha);
          for (; c + L <= cols; c += L) {
            hn::StoreU(hn::Mul(hn::LoadU(d, s + c), va), d, dst + r * ld + c);
          }
        }
        for (; c < cols; ++c) dst[r * ld + c] = alpha * Load<T>(s[c]);
      } else {
        for (size_t c = 0; c < cols; ++c) {
          dst[r * ld + c] = alpha * Load<T>(s[static_cast<std::int64_t>(c) * cs]);
        }
      }
    }
  }
  for (size_t r = 0; r < n; ++r) {
    for (size_t c = cols; c < ld; ++c) dst[r * ld + c] = T(0);
  }
  for (size_t r = n; r < rows_pad; ++r) {
    for (size_t c = 0; c < ld; ++c) dst[r * ld + c] = T(0);
  }
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
// dst[c * ld + r] = src[r][c0 + c] for an 8 x 8 block of floats, in registers (AVX2 and
// AVX-512 targets): the scalar walk took 6% of the d = 64 forward, one store per element.
HWY_INLINE void Transpose8x8(const float* const* src, size_t c0, float* HWY_RESTRICT dst,
                             size_t ld) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src[i] + c0);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);      // a0 b0 a1 b1 | a4 b4 a5 b5
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);  // a2 b2 a3 b3 | a6 b6 a7 b7
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);      // a0 b0 c0 d0 | a4 b4 c4 d4
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);  // a1 b1 c1 d1 | a5 ...
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);  // a2 ... | a6 ...
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);  // a3 ... | a7 ...
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * ld, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * ld, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}
#endif

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// out[c] lane i = r[i] lane c for a 16 x 16 block of floats held in registers (AVX-512
// targets; r is overwritten): 64 shuffles for 256 elements against 96 for the same elements
// in four 8 x 8 blocks, and each store a whole 64-byte row where the 8 x 8 blocks store
// half-rows. The window kernels transpose every position of Q, K, V, dO and O into planes and
// dQ, dK, dV out of them: that packing was 14% of a 15x15 diamond's backward at 128x128
// (E = Ev = 16, one thread).
HWY_INLINE void Transpose16x16InRegisters(__m512 r[16], __m512 out[16]) {
  __m512 t[16];
  // Row pairs: t[2k] = r0c0 r1c0 r0c1 r1c1 | r0c4 r1c4 r0c5 r1c5 | ... (per 128-bit lane).
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  // Row quads: r[4g + j] holds, in 128-bit lane l, rows 4g .. 4g + 3 of column 4l + j.
  for (int i = 0; i < 16; i += 4) {
    const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
    const __m512d c = _mm512_castps_pd(t[i + 2]), e = _mm512_castps_pd(t[i + 3]);
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, e));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, e));
  }
  // Lanes across the quads: t[j] = (quad 0 lane 0, quad 0 lane 2, quad 1 lane 0, quad 1 lane 2),
  // t[4 + j] the same of lanes 1 and 3; t[8 + j], t[12 + j] of quads 2 and 3.
  for (int j = 0; j < 4; ++j) {
    t[j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
    t[4 + j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);
    t[8 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
    t[12 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
  }
  // Column 4l + j: lane l of each quad, in quad order.
  for (int j = 0; j < 4; ++j) {
    out[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
    out[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xDD);
    out[4 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0x88);
    out[12 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0xDD);
  }
}

// out[c] lane i = src[i * rs + c], c < 16, i < 16. The rows are consecutive at one stride: an
// array of 16 row pointers, as the 8 x 8 block takes, made GCC 12 spill the pointers (half the
// packing's samples).
HWY_INLINE void Transpose16x16ToRegisters(const float* HWY_RESTRICT src, std::int64_t rs,
                                          __m512 out[16]) {
  __m512 r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * rs);
  Transpose16x16InRegisters(r, out);
}

// dst[c * ld + r] = src[r * rs + c]: Transpose16x16ToRegisters, each column stored as a row.
// stream: non-temporal stores to 64-byte aligned rows (cpu/result_stores.h).
HWY_INLINE void Transpose16x16(const float* HWY_RESTRICT src, std::int64_t rs,
                               float* HWY_RESTRICT dst, size_t ld, bool stream) {
  __m512 col[16];
  Transpose16x16ToRegisters(src, rs, col);
  for (size_t c = 0; c < 16; ++c) {
    if (stream) {
      _mm512_stream_ps(dst + c * ld, col[c]);
    } else {
      _mm512_storeu_ps(dst + c * ld, col[c]);
    }
  }
}
#endif

// How far ahead PackTransposed requests its source rows: with 16 rows of stores in flight to
// 16 destination rows, the hardware prefetcher did not keep up with the source. Packing Q, K and
// V of 4 heads at 128x128 (E = 16, 12 MB, out of cache) took 3.06 ms without requests, 1.69 /
// 1.58 / 1.53 / 1.65 ms with requests 2 / 4 / 8 / 16 KiB ahead (medians of 40, one thread).
// The requests go to L2 (PrefetchTo::kL2): on a Zen 4 core (4 heads, E = Ev = 16, 2 threads,
// builds alternated call by call) the window forwards ran 2-5% faster (diamond 15 at 128x128
// 4.70 / 5.04 -> 4.56 / 4.79 ms, at 256x256 23.6 -> 22.9 ms; 15x15 square 8.89 -> 8.73 ms) and
// the backwards the same (10.9-50.3 ms, within 1%).
constexpr size_t kPackPrefetchBytes = 6144;

// dst[c * ld + r] = element(r, c) for r < rows.count, c < cols; zero for r in
// [rows.count, rows_pad). stream (a result past the caches, cpu/result_stores.h): the whole
// 64-byte rows of 16 x 16 blocks are written with non-temporal stores where dst's rows are
// aligned, and the stores are fenced before returning, so that another thread that learns of
// the task's end sees them.
template <typename T, typename IO>
HWY_INLINE void PackTransposed(const IO* HWY_RESTRICT base, const Rows& rows, std::int64_t rs,
                               std::int64_t cs, size_t cols, T* HWY_RESTRICT dst, size_t ld,
                               size_t rows_pad, bool stream = false) {
  const size_t n = rows.count;
  if (std::abs(rs) < std::abs(cs)) {
    for (size_t c = 0; c < cols; ++c) {
      const IO* s = base + static_cast<std::int64_t>(c) * cs;
      T* o = dst + c * ld;
      for (size_t r = 0; r < n; ++r) o[r] = Load<T>(s[rows[r] * rs]);
    }
  } else {
    // 8 x 8 blocks: a whole key tile (64 x 256 floats = 64 KiB) outgrows a 48 KiB L1, so the
    // row-by-row walk, whose stores stride by ld, missed on nearly every store (23% of the
    // ViT-B N=1024 forward); a block touches 8 source and 8 destination lines. Rows [r0, r1)
    // (at most 8), columns from c_begin.
    constexpr size_t kBlock = 8;
    auto blocks8 = [&](size_t r0, size_t r1, size_t c_begin) {
      const IO* src[kBlock];
      for (size_t r = r0; r < r1; ++r) src[r - r0] = base + rows[r] * rs;
      for (size_t c0 = c_begin; c0 < cols; c0 += kBlock) {
        const size_t c1 = std::min(cols, c0 + kBlock);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
        if constexpr (std::is_same<T, float>::value && std::is_same<IO, float>::value) {
          if (cs == 1 && r1 - r0 == kBlock && c1 - c0 == kBlock) {
            Transpose8x8(src, c0, dst + c0 * ld + r0, ld);
            continue;
          }
        }
#endif
        for (size_t c = c0; c < c1; ++c) {
          T* o = dst + c * ld;
          const std::int64_t off = static_cast<std::int64_t>(c) * cs;
          for (size_t r = r0; r < r1; ++r) o[r] = Load<T>(src[r - r0][off]);
        }
      }
    };
    size_t r_begin = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    if constexpr (std::is_same<T, float>::value && std::is_same<IO, float>::value) {
      if (cs == 1 && cols >= 16 && rows.index == nullptr) {
        constexpr size_t kWide = 16;
        const bool aligned = reinterpret_cast<std::uintptr_t>(dst) % 64 == 0 && ld % kWide == 0;
        const size_t c_full = cols / kWide * kWide;
        // Rows ahead of the 16 being packed to request (a multiple of 16, at least 16).
        const size_t ahead = std::max<size_t>(
            kWide, kPackPrefetchBytes / (static_cast<size_t>(std::abs(rs)) * sizeof(float)) /
                       kWide * kWide);
        for (; r_begin + kWide <= n; r_begin += kWide) {
          const float* src = base + rows[r_begin] * rs;
          if (r_begin + ahead + kWide <= n) {
            PrefetchRows<false, PrefetchTo::kL2>(base, Rows{nullptr, rows[r_begin + ahead], kWide},
                                                 rs, 1, cols);
          }
          for (size_t c0 = 0; c0 < c_full; c0 += kWide) {
            Transpose16x16(src + c0, rs, dst + c0 * ld + r_begin, ld, stream && aligned);
          }
          if (c_full < cols) {
            blocks8(r_begin, r_begin + kBlock, c_full);
            blocks8(r_begin + kBlock, r_begin + kWide, c_full);
          }
        }
      }
    }
#endif
    for (size_t r0 = r_begin; r0 < n; r0 += kBlock) blocks8(r0, std::min(n, r0 + kBlock), 0);
  }
  for (size_t c = 0; c < cols; ++c) {
    for (size_t r = n; r < rows_pad; ++r) dst[c * ld + r] = T(0);
  }
  if (stream) hwy::FlushStream();
}

// element(r, c) = alpha * src[r * ld + c] for r < rows.count, c < cols: the inverse of PackRows,
// rounding once to the storage type. src's rows are read in whole vectors: ld >= cols rounded up
// to the vector length. Contiguous rows of the compute type are stored a vector at a time; a
// sparse layout's dQ rows, stored by gathered tiles, wait on their scattered lines (2.5% of the
// YLG 128x128 backward's samples, one thread) unless stream (a result past the caches,
// cpu/result_stores.h) writes rows of whole vectors that start on a vector boundary with
// non-temporal stores, fenced before returning.
template <typename T, typename IO>
HWY_INLINE void StoreTile(const T* HWY_RESTRICT src, size_t ld, const Rows& rows, size_t cols,
                          T alpha, IO* HWY_RESTRICT base, std::int64_t rs, std::int64_t cs,
                          bool stream) {
  if constexpr (std::is_same<IO, T>::value) {
    if (cs == 1) {
      const hn::ScalableTag<T> d;
      const size_t L = hn::Lanes(d);
      const auto va = hn::Set(d, alpha);
      const size_t vector_bytes = L * sizeof(T);
      const bool whole = stream && cols % L == 0 &&
                         reinterpret_cast<std::uintptr_t>(base) % vector_bytes == 0 &&
                         (rs * sizeof(T)) % vector_bytes == 0;
      for (size_t r = 0; r < rows.count; ++r) {
        IO* o = base + rows[r] * rs;
        const T* s = src + r * ld;
        size_t c = 0;
        if (whole) {
          for (; c < cols; c += L) hn::Stream(hn::Mul(hn::LoadU(d, s + c), va), d, o + c);
          continue;
        }
        for (; c + L <= cols; c += L) hn::StoreU(hn::Mul(hn::LoadU(d, s + c), va), d, o + c);
        if (c < cols) {
          hn::BlendedStore(hn::Mul(hn::LoadU(d, s + c), va), hn::FirstN(d, cols - c), d, o + c);
        }
      }
      if (whole) hwy::FlushStream();
      return;
    }
  }
  for (size_t r = 0; r < rows.count; ++r) {
    IO* o = base + rows[r] * rs;
    for (size_t c = 0; c < cols; ++c) {
      o[static_cast<std::int64_t>(c) * cs] = Store<IO>(alpha * src[r * ld + c]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// bf16 pair packing for the AVX512-BF16 products (cpu/bf16_pairs_avx512.h): built on the AVX-512
// targets when the compiler has the instruction; the kernels use it only if the CPU does.

#if defined(ATTN2D_HAVE_AVX512_BF16) && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL)
inline std::uint32_t Bf16Pair(BFloat16 lo, BFloat16 hi) {
  return static_cast<std::uint32_t>(lo.bits) | static_cast<std::uint32_t>(hi.bits) << 16;
}

// Element c of row r, or 0 past the width: a pair's missing high half when the width is odd.
inline BFloat16 ElementOrZero(const BFloat16* row, std::int64_t cs, size_t c, size_t width) {
  return c < width ? row[static_cast<std::int64_t>(c) * cs] : BFloat16{0};
}

// dst[r * W + w] = (q[r][2w], q[r][2w + 1]) for the tile's rows, W = ceil(E / 2).
inline void PackQueryPairs(const BFloat16* base, const Rows& rows, std::int64_t rs,
                           std::int64_t cs, size_t E, std::uint32_t* dst) {
  const size_t W = (E + 1) / 2;
  for (size_t r = 0; r < rows.count; ++r) {
    const BFloat16* s = base + rows[r] * rs;
    if (cs == 1 && E % 2 == 0) {
      std::memcpy(dst + r * W, s, E * sizeof(BFloat16));
      continue;
    }
    for (size_t w = 0; w < W; ++w) {
      dst[r * W + w] = Bf16Pair(ElementOrZero(s, cs, 2 * w, E), ElementOrZero(s, cs, 2 * w + 1, E));
    }
  }
}

// S (rows x cols_pad, row stride ld_s) = scale * Q K^T from q pairs (rows x W) and K^T pairs
// (W x ld_kt): the scores of both passes, so the backward recomputes exactly the forward's.
inline void PairScores(size_t rows, size_t cols_pad, size_t W, const std::uint32_t* q2,
                       const std::uint32_t* kt2, size_t ld_kt, float scale, float* S,
                       size_t ld_s) {
  gemm_bf16_pairs(false, rows, cols_pad, W, q2, W, kt2, ld_kt, S, ld_s, scale);
}

// dst[w * ld + n] = (k[n][2w], k[n][2w + 1]); zero for n in [keys.count, cols_pad). Rows of an
// even width, stored contiguously at 4-byte alignment, are already pair words: transposed as
// floats (bit moves only).
inline void PackKeyPairsTransposed(const BFloat16* base, const Rows& keys, std::int64_t rs,
                                   std::int64_t cs, size_t E, std::uint32_t* dst, size_t ld,
                                   size_t cols_pad) {
  const size_t W = (E + 1) / 2;
  if (cs == 1 && E % 2 == 0 && rs % 2 == 0 && reinterpret_cast<std::uintptr_t>(base) % 4 == 0) {
    PackTransposed<float, float>(reinterpret_cast<const float*>(base), keys, rs / 2, 1, W,
                                 reinterpret_cast<float*>(dst), ld, cols_pad);
    return;
  }
  for (size_t n = 0; n < keys.count; ++n) {
    const BFloat16* s = base + keys[n] * rs;
    for (size_t w = 0; w < W; ++w) {
      dst[w * ld + n] = Bf16Pair(ElementOrZero(s, cs, 2 * w, E), ElementOrZero(s, cs, 2 * w + 1, E));
    }
  }
  for (size_t w = 0; w < W; ++w) {
    for (size_t n = keys.count; n < cols_pad; ++n) dst[w * ld + n] = 0;
  }
}

// dst[w * ld + e] = (x[2w][e], x[2w + 1][e]) for w < pairs: bf16 rows paired along the row axis
// (V and K along the keys, q and dO along the queries). Zero high halves for a missing row
// 2w + 1, zero words past the rows and for e in [width, ld).
inline void PackRowPairs(const BFloat16* base, const Rows& rows, std::int64_t rs, std::int64_t cs,
                         size_t width, size_t ld, size_t pairs, std::uint32_t* dst) {
  for (size_t w = 0; w < pairs; ++w) {
    std::uint32_t* o = dst + w * ld;
    if (2 * w >= rows.count) {
      std::fill(o, o + ld, 0u);
      continue;
    }
    const BFloat16* a = base + rows[2 * w] * rs;
    const BFloat16* b = 2 * w + 1 < rows.count ? base + rows[2 * w + 1] * rs : nullptr;
    if (cs == 1) {
      interleave_bf16_rows(&a->bits, b == nullptr ? nullptr : &b->bits, width, o);
    } else {
      for (size_t e = 0; e < width; ++e) {
        const std::int64_t off = static_cast<std::int64_t>(e) * cs;
        o[e] = Bf16Pair(a[off], b == nullptr ? BFloat16{0} : b[off]);
      }
    }
    std::fill(o + width, o + ld, 0u);
  }
}

#endif

// ---------------------------------------------------------------------------------------------
// Sparse layouts (attn2d/sparse_layout.h): a tile's rows, a head's tiles, a visit's mask.

// The rows of global query (or key) tile `global`: its leading non-negative entries (validate
// checks that the -1 padding only ends a tile), counted a vector at a time. A scan of 64
// entries with a branch each was 2.7% of the YLG forward at 128x128, and the binary search that
// replaced it, mispredicted on the partly filled tiles, 3.0% (forward task's own samples) and
// 3.3% (the backward's key-tile task).
HWY_INLINE Rows LayoutTileRows(const SparseLayout& lay, std::int64_t global, bool query) {
  const hn::ScalableTag<std::int32_t> d;
  const size_t L = hn::Lanes(d);
  const size_t block = static_cast<size_t>(query ? lay.block_q : lay.block_k);
  const std::int32_t* idx = (query ? lay.q_rows : lay.k_rows) + global * block;
  size_t count = 0, c = 0;
  for (; c + L <= block; c += L) {
    count += hn::CountTrue(d, hn::Gt(hn::LoadU(d, idx + c), hn::Set(d, -1)));
  }
  for (; c < block; ++c) count += idx[c] >= 0 ? 1 : 0;
  return Rows{idx, 0, count};
}

// Head h's query (or key) tile number `local`: false past the end of its layout's tiles.
HWY_INLINE bool LayoutTile(const SparseLayout& lay, std::int64_t h, std::int64_t local,
                           bool query, std::int64_t* global, Rows* rows) {
  const std::int64_t layout = lay.head_layout[h];
  const std::int64_t* begin = query ? lay.q_tile_begin : lay.k_tile_begin;
  *global = begin[layout] + local;
  if (*global >= begin[layout + 1]) return false;
  *rows = LayoutTileRows(lay, *global, query);
  return true;
}

// Task `task` of a sparse pass (tiles_per_head tasks per (batch, head)): its batch b, head h
// and tile of the head's layout; false when that layout has fewer tiles.
HWY_INLINE bool SparseTaskTile(const SparseLayout& lay, std::int64_t heads,
                               std::int64_t tiles_per_head, std::int64_t task, bool query,
                               std::int64_t* b, std::int64_t* h, std::int64_t* global,
                               Rows* rows) {
  const std::int64_t bh = task / tiles_per_head;
  *b = bh / heads;
  *h = bh % heads;
  return LayoutTile(lay, *h, task % tiles_per_head, query, global, rows);
}

// Tasks per (batch, head): the most query (or key) tiles any layout has.
HWY_INLINE std::int64_t MostLayoutTiles(const SparseLayout& lay, bool query) {
  const std::int64_t* begin = query ? lay.q_tile_begin : lay.k_tile_begin;
  std::int64_t most = 0;
  for (std::int64_t i = 0; i < lay.num_layouts; ++i) most = std::max(most, begin[i + 1] - begin[i]);
  return most;
}

HWY_INLINE const std::uint64_t* MaskWords(const SparseLayout& lay, std::int64_t m) {
  return m < 0 ? nullptr : lay.masks + m * lay.block_q;
}

// The leading columns of a key tile that hold every pair a visit allows: all `cols` for a full
// visit (null words), else up to the highest bit any of its `rows` mask words sets. The layouts
// put the keys a query tile sees partly first (YLG's floor tiles: a tile of 16 positions sees
// the first 16, 32, 48 or 64 keys of its block), so a visit computes 40 columns of 64 on
// average there, where the masked columns past them cost as much as allowed ones.
HWY_INLINE size_t VisitColumns(const std::uint64_t* words, size_t rows, size_t cols) {
  if (words == nullptr) return cols;
  std::uint64_t any = 0;
  for (size_t r = 0; r < rows; ++r) any |= words[r];
  // The layouts' visits hold an allowed pair each (_layout.py lists no other); one with none
  // keeps the whole tile, whose scores are then all masked, as before the cut.
  if (any == 0) return cols;
  return std::min(cols, static_cast<size_t>(64 - __builtin_clzll(any)));
}

// The mask word of a tile's first n (<= 64) columns.
HWY_INLINE std::uint64_t LeadingColumns(size_t n) {
  return n >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << n) - 1;
}

// True when a visit's mask allows at most one key in each of its `rows` rows (false for a full
// visit, null words): the kernels then take each row's one key by itself (VisitSingleKeys,
// SingleKeyGrads) instead of a tile.
HWY_INLINE bool AtMostOneKeyARow(const std::uint64_t* words, size_t rows) {
  if (words == nullptr) return false;
  for (size_t r = 0; r < rows; ++r) {
    if ((words[r] & (words[r] - 1)) != 0) return false;
  }
  return true;
}

// Column c of a visit's one key a row: bit c of the row's word, bits past the tile's `count`
// keys ignored (MaskTileBits masks them too); -1 for a row that sees no key.
HWY_INLINE int SingleKeyColumn(std::uint64_t word, size_t count) {
  const std::uint64_t w = word & LeadingColumns(count);
  return w == 0 ? -1 : __builtin_ctzll(w);
}

// fn(e, v) for each whole vector v = (y[e * ys], ..., y[(e + L - 1) * ys]) of a strided row y
// (T elements); returns the elements done. DotRow and AxpyRow then sum or fuse exactly as for a
// contiguous row, so that results do not depend on the layout: the sparse backward reads some
// slices from row-major copies (cpu/row_staging-inl.h), and every schedule must give the same
// bits. Out of line: inlined, the gathers grew the contiguous rows' single-key visits.
template <typename T, class VectorFn>
HWY_NOINLINE size_t ForStridedVectors(const T* HWY_RESTRICT y, size_t n, std::int64_t ys,
                                      const VectorFn& fn) {
  const hn::ScalableTag<T> d;
  const size_t L = hn::Lanes(d);
  HWY_ALIGN T lanes[HWY_MAX_BYTES / sizeof(T)];
  size_t e = 0;
  for (; e + L <= n; e += L) {
    for (size_t i = 0; i < L; ++i) lanes[i] = y[static_cast<std::int64_t>(e + i) * ys];
    fn(e, hn::Load(d, lanes));
  }
  return e;
}

// sum over e < n of x[e] * y[e * ys]: x packed (T), y a tensor row (IO, stride ys in elements).
template <typename T, typename IO>
HWY_INLINE T DotRow(const T* HWY_RESTRICT x, const IO* HWY_RESTRICT y, size_t n,
                    std::int64_t ys) {
  size_t e = 0;
  T s = 0;
  if constexpr (std::is_same<IO, T>::value) {
    const hn::ScalableTag<T> d;
    const size_t L = hn::Lanes(d);
    auto dot = hn::Zero(d);
    if (ys == 1) {
      for (; e + L <= n; e += L) dot = hn::MulAdd(hn::LoadU(d, x + e), hn::LoadU(d, y + e), dot);
    } else {
      e = ForStridedVectors(y, n, ys, [&](size_t i, decltype(dot) yv) {
        dot = hn::MulAdd(hn::LoadU(d, x + i), yv, dot);
      });
    }
    s = hn::GetLane(hn::SumOfLanes(d, dot));
  }
  for (; e < n; ++e) s += x[e] * Load<T>(y[static_cast<std::int64_t>(e) * ys]);
  return s;
}

// Rows r0 .. r0 + n - 1 of a visit that allows at most one key a row, a vector's worth (lanes):
// key[i] = the key row that row r0 + i sees (-1: none, and for lanes i >= n), col[i] its column
// in the key tile, score[i] = x_i . k_key over E elements (x: packed rows, ldx apart; k: the
// slice's keys, ks_row and ks_col apart), -inf for rows without a key.
template <typename T, typename IO>
HWY_INLINE void SingleKeyScores(const std::uint64_t* words, const Rows& keys, size_t r0, size_t n,
                                size_t lanes, const T* x, size_t ldx, const IO* k,
                                std::int64_t ks_row, std::int64_t ks_col, size_t E, int* col,
                                std::int64_t* key, T* score) {
  for (size_t i = 0; i < lanes; ++i) {
    col[i] = i < n ? SingleKeyColumn(words[r0 + i], keys.count) : -1;
    key[i] = col[i] < 0 ? -1 : keys[static_cast<size_t>(col[i])];
    score[i] = col[i] < 0 ? -std::numeric_limits<T>::infinity()
                          : DotRow(x + (r0 + i) * ldx, k + key[i] * ks_row, E, ks_col);
  }
}

// x[e] += a * y[e * ys] for e < n: x packed (T), y a tensor row (IO, stride ys in elements).
template <typename T, typename IO>
HWY_INLINE void AxpyRow(T* HWY_RESTRICT x, T a, const IO* HWY_RESTRICT y, size_t n,
                        std::int64_t ys) {
  size_t e = 0;
  if constexpr (std::is_same<IO, T>::value) {
    const hn::ScalableTag<T> d;
    const size_t L = hn::Lanes(d);
    const auto va = hn::Set(d, a);
    if (ys == 1) {
      for (; e + L <= n; e += L) {
        hn::StoreU(hn::MulAdd(va, hn::LoadU(d, y + e), hn::LoadU(d, x + e)), d, x + e);
      }
    } else {
      e = ForStridedVectors(y, n, ys, [&](size_t i, decltype(va) yv) {
        hn::StoreU(hn::MulAdd(va, yv, hn::LoadU(d, x + i)), d, x + i);
      });
    }
  }
  for (; e < n; ++e) x[e] += a * Load<T>(y[static_cast<std::int64_t>(e) * ys]);
}

// One key tile's step of the online softmax for every row of the score tile s (rows x
// cols_pad, row stride ld), whose masked entries are -inf: updates the running max m and sum l,
// rescales the accumulator rows (ld_acc wide) and leaves the tile's probabilities in s.
// exp_row(s, cols_pad, shift) turns a row into its exps (ExpShiftSum; the bf16 forward's variant
// also rounds them to pairs) and returns their float sum.
template <typename T, class ExpRowFn>
HWY_INLINE void OnlineSoftmaxStep(T* HWY_RESTRICT s_tile, size_t rows, size_t cols_pad, size_t ld,
                                  T* HWY_RESTRICT m, T* HWY_RESTRICT l, T* HWY_RESTRICT acc,
                                  size_t ld_acc, const ExpRowFn& exp_row) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  for (size_t r = 0; r < rows; ++r) {
    T* s = s_tile + r * ld;
    const T tile_max = RowMax(s, cols_pad);
    T m_new = std::isnan(tile_max) ? tile_max : std::max(m[r], tile_max);
    if (m_new == kNegInf) {
      // SIMD max may skip NaN lanes (the scalar target does): an all-NaN row must not pass
      // for a fully masked one.
      if (RowHasNaN(s, cols_pad)) {
        m_new = std::numeric_limits<T>::quiet_NaN();
      } else {  // no visible key so far: contributes nothing
        ZeroRow(s, cols_pad);
        continue;
      }
    }
    // The running max rarely moves after the first tiles: skip the scalar exp then.
    const T alpha = m[r] == kNegInf ? T(0) : m[r] == m_new ? T(1) : std::exp(m[r] - m_new);
    const T tile_sum = exp_row(s, cols_pad, m_new);
    l[r] = l[r] * alpha + tile_sum;
    m[r] = m_new;
    if (alpha != T(1)) ScaleRow(acc + r * ld_acc, ld_acc, alpha);
  }
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// Lane r of the result: op over the 16 lanes of v[r] (v is overwritten). 15 pairings of 3
// instructions and a final permute for 16 rows, where reducing each row alone takes 8 dependent
// instructions a row; a sparse tile's 64-key row is only 4 vectors, and its two reductions (max
// and sum) with the scalar store after them were a fifth of the YLG forward's own samples.
template <class Op>
HWY_INLINE __m512 TransposeReduce16(__m512* v, const Op& op) {
  // v[i] = rows 2i, 2i + 1: each row's 512 bits folded to 256 (128-bit lanes 0-1 and 2-3).
  for (int i = 0; i < 8; ++i) {
    v[i] = op(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
              _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  }
  // v[i]: 128-bit lane k holds row 4i + k's four partial results.
  for (int i = 0; i < 4; ++i) {
    v[i] = op(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x88),
              _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xDD));
  }
  // v[i]: lane k holds rows 8i + k (elements 0, 1) and 8i + 4 + k (elements 2, 3).
  for (int i = 0; i < 2; ++i) {
    const __m512d a = _mm512_castps_pd(v[2 * i]), b = _mm512_castps_pd(v[2 * i + 1]);
    v[i] = op(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
              _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // Element j of lane k: row 4j + k; the permute puts row r at element r.
  const __m512 folded = op(_mm512_shuffle_ps(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0)),
                           _mm512_shuffle_ps(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i order =
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, folded);
}

// OnlineSoftmaxStep with ExpShiftSum for 16 rows at once (float, 512-bit vectors): the row
// maxima, the rescale factors alpha = exp(m_old - m_new) and the row sums as vectors of 16
// rows, where the row-by-row step reduces each row alone and calls a scalar exp for alpha.
HWY_INLINE void OnlineSoftmaxStep16(float* HWY_RESTRICT s_tile, size_t cols_pad, size_t ld,
                                    float* HWY_RESTRICT m, float* HWY_RESTRICT l,
                                    float* HWY_RESTRICT acc, size_t ld_acc) {
  const hn::Full512<float> d;
  const auto neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  __m512 v[16];
  for (size_t r = 0; r < 16; ++r) {
    const float* x = s_tile + r * ld;
    auto mx = hn::LoadU(d, x);
    for (size_t c = 16; c < cols_pad; c += 16) mx = hn::Max(mx, hn::LoadU(d, x + c));
    v[r] = mx.raw;
  }
  const auto m_old = hn::LoadU(d, m);
  // VMAXPS returns its second operand when either is NaN: a NaN tile maximum carries over.
  const __m512 tile_max =
      TransposeReduce16(v, [](__m512 a, __m512 b) { return _mm512_max_ps(a, b); });
  alignas(64) float m_new[16];
  hn::Store(hn::Vec512<float>{_mm512_max_ps(m_old.raw, tile_max)}, d, m_new);
  // Rows with no visible key so far contribute nothing, unless a NaN hid from the maximum
  // (as in OnlineSoftmaxStep): such a row goes on with a NaN maximum, which makes it NaN.
  std::uint32_t dead = hn::Eq(hn::Load(d, m_new), neg_inf).raw;  // __mmask16: bit r = row r
  for (std::uint32_t rest = dead; rest != 0; rest &= rest - 1) {
    const size_t r = static_cast<size_t>(__builtin_ctz(rest));
    if (RowHasNaN(s_tile + r * ld, cols_pad)) {
      m_new[r] = std::numeric_limits<float>::quiet_NaN();
      dead &= ~(1u << r);
    } else {
      ZeroRow(s_tile + r * ld, cols_pad);
    }
  }
  const auto vm_new = hn::Load(d, m_new);
  // 0 where nothing was visible before, exactly 1 where the maximum did not move.
  auto alpha = hn::IfThenElse(hn::Eq(m_old, vm_new), hn::Set(d, 1.0f),
                              SoftmaxExp(d, hn::Sub(m_old, vm_new)));
  alpha = hn::IfThenZeroElse(hn::Eq(m_old, neg_inf), alpha);
  for (size_t r = 0; r < 16; ++r) {
    v[r] = (dead >> r & 1) != 0 ? _mm512_setzero_ps()
                                : ExpShiftSumLanes(d, s_tile + r * ld, cols_pad,
                                                   hn::Set(d, m_new[r])).raw;
  }
  const __m512 tile_sum =
      TransposeReduce16(v, [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); });
  hn::StoreU(hn::MulAdd(hn::LoadU(d, l), alpha, hn::Vec512<float>{tile_sum}), d, l);
  hn::StoreU(vm_new, d, m);
  alignas(64) float scale[16];
  hn::Store(alpha, d, scale);
  for (size_t r = 0; r < 16; ++r) {
    if (scale[r] != 1.0f) ScaleRow(acc + r * ld_acc, ld_acc, scale[r]);
  }
}
#endif

// OnlineSoftmaxStep with ExpShiftSum: 16 rows at a time where the target has 16 float lanes.
template <typename T>
HWY_INLINE void OnlineSoftmaxStepExp(T* HWY_RESTRICT s_tile, size_t rows, size_t cols_pad,
                                     size_t ld, T* HWY_RESTRICT m, T* HWY_RESTRICT l,
                                     T* HWY_RESTRICT acc, size_t ld_acc) {
  size_t r0 = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (std::is_same<T, float>::value) {
    for (; r0 + 16 <= rows; r0 += 16) {
      OnlineSoftmaxStep16(s_tile + r0 * ld, cols_pad, ld, m + r0, l + r0, acc + r0 * ld_acc,
                          ld_acc);
    }
  }
#endif
  OnlineSoftmaxStep(s_tile + r0 * ld, rows - r0, cols_pad, ld, m + r0, l + r0,
                    acc + r0 * ld_acc, ld_acc,
                    [](T* x, size_t n, T shift) { return ExpShiftSum(x, n, shift); });
}

// Masks a gathered tile by its bit rows: key c of row r is allowed when bit c of words[r] is
// set (null words: all allowed); columns in [cols, cols_pad) are padding and always masked.
// One vector of lanes per step (LoadMaskBits of the shifted word): the bit-by-bit scalar loop
// cost about a cycle per score, as much as the Q*K^T product at E = 16.
template <typename T>
HWY_INLINE void MaskTileBits(T* HWY_RESTRICT S, size_t ld, size_t rows, size_t cols,
                             size_t cols_pad, const std::uint64_t* words) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const hn::ScalableTag<T> d;
  const size_t L = hn::Lanes(d);
  const auto neg_inf = hn::Set(d, kNegInf);
  const std::uint64_t all = LeadingColumns(cols);
  for (size_t r = 0; r < rows; ++r) {
    T* s = S + r * ld;
    for (size_t c = cols; c < cols_pad; ++c) s[c] = kNegInf;
    if (words == nullptr || (words[r] & all) == all) continue;
    const std::uint64_t w = words[r] & all;
    for (size_t c = 0; c < cols_pad; c += L) {
      const std::uint64_t bits = c < 64 ? w >> c : 0;  // cols_pad <= block_k = 64
      std::uint8_t bytes[8];
      std::memcpy(bytes, &bits, sizeof(bytes));
      const auto allowed = hn::LoadMaskBits(d, bytes);
      hn::StoreU(hn::IfThenElse(allowed, hn::LoadU(d, s + c), neg_inf), d, s + c);
    }
  }
}

// Applies the mask to a score tile whose top-left element is (query i0, key j0): columns in
// [cols, cols_pad) are padding past len_k and always masked.
template <typename T>
HWY_INLINE void MaskTile(T* HWY_RESTRICT S, size_t ld, size_t rows, size_t cols, size_t cols_pad,
                         std::int64_t i0, std::int64_t j0, const SliceMask<T>& mask) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  if (cols < cols_pad) {
    for (size_t r = 0; r < rows; ++r) {
      for (size_t c = cols; c < cols_pad; ++c) S[r * ld + c] = kNegInf;
    }
  }
  if (mask.kind == MaskKind::kNone) {
    // Causal: only tiles that straddle the diagonal need work.
    if (!mask.causal || j0 + static_cast<std::int64_t>(cols) - 1 <= i0) return;
    for (size_t r = 0; r < rows; ++r) {
      const std::int64_t first_masked = i0 + static_cast<std::int64_t>(r) + 1 - j0;
      for (std::int64_t c = first_masked < 0 ? 0 : first_masked;
           c < static_cast<std::int64_t>(cols); ++c) {
        S[r * ld + static_cast<size_t>(c)] = kNegInf;
      }
    }
    return;
  }
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) {
      S[r * ld + c] = mask.apply(S[r * ld + c], i0 + static_cast<std::int64_t>(r),
                                 j0 + static_cast<std::int64_t>(c));
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_TILE_OPS_INL_H_
