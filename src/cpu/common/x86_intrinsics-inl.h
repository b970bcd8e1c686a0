// The kernels' raw x86 intrinsics, each under its HWY_TARGET guard: register transposes (8 x 8 on
// AVX2, 16 x 16 on AVX-512), the 16-row online-softmax step of AVX-512, and the AVX512-BF16
// conversions of the bf16 products' probabilities. The rest of the kernels is Highway code, but
// for TimesPow2's VSCALEFPS (exp-inl.h) and the query lanes' direct rows (lanes/), which are
// built on the transposes here.
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_COMMON_X86_INTRINSICS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_COMMON_X86_INTRINSICS_INL_H_
#undef ATTN2D_SRC_CPU_COMMON_X86_INTRINSICS_INL_H_
#else
#define ATTN2D_SRC_CPU_COMMON_X86_INTRINSICS_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <limits>

#include "cpu/common/exp-inl.h"
#include "cpu/common/row_ops-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ATTN2D_NATIVE_BF16: the AVX512-BF16 products (bf16_pairs_avx512.h) are built for this target,
// the AVX-512 ones where the compiler has the instruction; the kernels use them only where the
// CPU does (use_bf16_pairs).
#undef ATTN2D_NATIVE_BF16
#if defined(ATTN2D_HAVE_AVX512_BF16) && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL)
#define ATTN2D_NATIVE_BF16 1
#endif

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
// dst[c * ld + r] = src[r][c0 + c] for an 8 x 8 block of floats, in registers (AVX2 and
// AVX-512 targets), where a scalar walk stores one element at a time.
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
// dQ, dK, dV out of them.
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
// array of 16 row pointers, as the 8 x 8 block takes, makes GCC 12 spill the pointers.
HWY_INLINE void Transpose16x16ToRegisters(const float* HWY_RESTRICT src, std::int64_t rs,
                                          __m512 out[16]) {
  __m512 r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * rs);
  Transpose16x16InRegisters(r, out);
}

// dst[c * ld + r] = src[r * rs + c]: Transpose16x16ToRegisters, each column stored as a row.
// stream: non-temporal stores to 64-byte aligned rows (result_stores.h).
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

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// Lane r of the result: op over the 16 lanes of v[r] (v is overwritten). 15 pairings of 3
// instructions and a final permute for 16 rows, where reducing each row alone takes 8 dependent
// instructions a row; a sparse tile's 64-key row is only 4 vectors, too few to hide a row's two
// reductions (max and sum) and the scalar store after them.
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

#if defined(ATTN2D_NATIVE_BF16)
// x = exp(x - shift) over a row of n floats (n a multiple of 16; Bf16SoftmaxExp), left as n / 2
// bf16 pair words at the row's start (rounded to nearest even, as VCVTNE2PS2BF16 rounds); returns
// the float sum of the exps, in one pass for the exp and the rounding to pairs. The target
// attribute adds AVX512-BF16 to the AVX3 target's set for this one function.
__attribute__((target("avx512bf16"))) inline float ExpShiftSumToPairs(float* HWY_RESTRICT x,
                                                                       size_t n, float shift) {
  const hn::Full512<float> d;
  const auto vshift = hn::Set(d, shift);
  auto sum = hn::Zero(d);
  auto* out = reinterpret_cast<std::uint32_t*>(x);
  size_t j = 0;
  // Words j/2 .. j/2 + 15 are written after floats j .. j + 31 were read: in place is safe.
  for (; j + 32 <= n; j += 32) {
    const auto lo = Bf16SoftmaxExp(d, hn::Sub(hn::LoadU(d, x + j), vshift));
    const auto hi = Bf16SoftmaxExp(d, hn::Sub(hn::LoadU(d, x + j + 16), vshift));
    sum = hn::Add(sum, hn::Add(lo, hi));
    _mm512_storeu_si512(out + j / 2,
                        reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi.raw, lo.raw)));
  }
  if (j < n) {  // 16 left
    const auto lo = Bf16SoftmaxExp(d, hn::Sub(hn::LoadU(d, x + j), vshift));
    sum = hn::Add(sum, lo);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j / 2),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(lo.raw)));
  }
  return hn::GetLane(hn::SumOfLanes(d, sum));
}
#endif

#if defined(ATTN2D_NATIVE_BF16)
// The bf16 products' P and dS in one pass over the score tile s and dP tile dp (rows x cols_pad,
// row stride ld, cols_pad a multiple of 16), straight into the pair tiles the products read:
// - key_grads: P paired along the query rows (rows 2w and 2w + 1 -> pair row w, over float row w
//   of s) for dV = P^T dO, and scale * dS so paired into ds2 for dK = dS^T q;
// - query_grad: dS paired along the keys, over the start of each row of dp, for dQ = dS K.
// Row w is written after float rows 2w and 2w + 1 (and row w itself, read earlier) were read,
// and each 16 columns are read before they are written. Rounded to nearest even, one pass where
// the exp, dS = P (dP - D) and three conversions to pairs would each read the tiles again.
// Two rows of 16 floats rounded to bf16 and interleaved into 16 pair words, lo in the low halves.
// A function of its own, not a lambda: Clang does not extend a function's target attribute to
// the lambdas inside it, and a target without AVX512-BF16 then cannot inline the conversion.
__attribute__((target("avx512bf16"))) inline __m512i PairRows(__m512 lo, __m512 hi) {
  const __m512i l = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(lo)));
  const __m512i h = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(hi)));
  return _mm512_or_si512(l, _mm512_slli_epi32(h, 16));
}

__attribute__((target("avx512bf16"))) inline void PairedProbabilitiesAndScoreGrad(
    size_t rows, size_t cols_pad, size_t ld, float* HWY_RESTRICT s, float* HWY_RESTRICT dp,
    const float* lse, const float* delta, float scale, std::uint32_t* HWY_RESTRICT ds2,
    bool key_grads, bool query_grad) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const hn::Full512<float> d;
  const auto vscale = hn::Set(d, scale);
  // P and dS of 16 columns of row r (zero for a fully masked row or a missing last row).
  auto row_terms = [&](size_t r, size_t c, hn::Vec<decltype(d)>* p, hn::Vec<decltype(d)>* ds) {
    if (r >= rows || lse[r] == kNegInf) {
      *p = hn::Zero(d), *ds = hn::Zero(d);
      return;
    }
    *p = Bf16SoftmaxExp(d, hn::Sub(hn::LoadU(d, s + r * ld + c), hn::Set(d, lse[r])));
    *ds = hn::Mul(*p, hn::Sub(hn::LoadU(d, dp + r * ld + c), hn::Set(d, delta[r])));
  };
  for (size_t w = 0; 2 * w < rows; ++w) {
    const size_t r0 = 2 * w, r1 = 2 * w + 1;
    for (size_t c = 0; c < cols_pad; c += 16) {
      hn::Vec<decltype(d)> p0, ds0, p1, ds1;
      row_terms(r0, c, &p0, &ds0);
      row_terms(r1, c, &p1, &ds1);
      if (query_grad) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dp + r0 * ld) + c / 16,
                            reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(ds0.raw)));
        if (r1 < rows) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(dp + r1 * ld) + c / 16,
                              reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(ds1.raw)));
        }
      }
      if (key_grads) {
        _mm512_storeu_si512(s + w * ld + c, PairRows(p0.raw, p1.raw));
        _mm512_storeu_si512(ds2 + w * ld + c,
                            PairRows(hn::Mul(ds0, vscale).raw, hn::Mul(ds1, vscale).raw));
      }
    }
  }
}
#endif

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_COMMON_X86_INTRINSICS_INL_H_
