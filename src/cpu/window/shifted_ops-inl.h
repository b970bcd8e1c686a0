// The window kernels' products of one query vector with the window's offsets, per target. One
// vector holds L consecutive raster queries; for an offset o their keys sit at the same raster
// distance off[o], so every product below is a contiguous load shifted by off[o] from a packed
// (rows, ld) buffer (window_geometry.h), with no gather.
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_WINDOW_SHIFTED_OPS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_WINDOW_SHIFTED_OPS_INL_H_
#undef ATTN2D_SRC_CPU_WINDOW_SHIFTED_OPS_INL_H_
#else
#define ATTN2D_SRC_CPU_WINDOW_SHIFTED_OPS_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "cpu/common/exp-inl.h"
#include "cpu/window/window_geometry.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Offsets whose scores are summed in one sweep: 8 independent FMA chains cover the FMA latency
// (4 cycles) at two FMAs per cycle.
constexpr size_t kOffsetsPerSweep = 8;
// Rows (of Q^T, V^T, ...) held in registers per sweep: 16 vectors + 8 accumulators of AVX-512's
// 32. Packed buffers round their rows up to a multiple of 4 (zero rows).
constexpr size_t kMaxQuads = 4;
constexpr size_t kRowsPerSweep = 4 * kMaxQuads;

// S[o * L + lane] = sum over the 4 kQuads rows i of a[i * ld + lane] * b[i * ld + off[o] + lane]
// (plus S's old value when kAccumulate); returns the lane-wise max of the new S when kMax.
template <size_t kQuads, bool kAccumulate, bool kMax, class D, typename T>
HWY_INLINE hn::Vec<D> ShiftedDots(D d, const T* HWY_RESTRICT a, const T* HWY_RESTRICT b,
                                  size_t ld, const std::int64_t* HWY_RESTRICT off, size_t count,
                                  T* HWY_RESTRICT S, hn::Vec<D> vmax) {
  constexpr size_t kRows = 4 * kQuads, kG = kOffsetsPerSweep;
  const size_t L = hn::Lanes(d);
  hn::Vec<D> av[kRows];
  HWY_UNROLL(16)
  for (size_t i = 0; i < kRows; ++i) av[i] = hn::LoadU(d, a + i * ld);
  size_t o = 0;
  for (; o + kG <= count; o += kG) {
    hn::Vec<D> s[kG];
    HWY_UNROLL(8)
    for (size_t g = 0; g < kG; ++g) s[g] = kAccumulate ? hn::Load(d, S + (o + g) * L) : hn::Zero(d);
    HWY_UNROLL(16)
    for (size_t i = 0; i < kRows; ++i) {
      HWY_UNROLL(8)
      for (size_t g = 0; g < kG; ++g) {
        s[g] = hn::MulAdd(av[i], hn::LoadU(d, b + i * ld + off[o + g]), s[g]);
      }
    }
    HWY_UNROLL(8)
    for (size_t g = 0; g < kG; ++g) {
      hn::Store(s[g], d, S + (o + g) * L);
      if (kMax) vmax = hn::Max(vmax, s[g]);
    }
  }
  for (; o < count; ++o) {
    auto s = kAccumulate ? hn::Load(d, S + o * L) : hn::Zero(d);
    HWY_UNROLL(16)
    for (size_t i = 0; i < kRows; ++i) s = hn::MulAdd(av[i], hn::LoadU(d, b + i * ld + off[o]), s);
    hn::Store(s, d, S + o * L);
    if (kMax) vmax = hn::Max(vmax, s);
  }
  return vmax;
}

// S[o * L + lane] = sum over rows r < rows (a multiple of 4) of a[r * ld + lane] *
// b[r * ld + off[o] + lane], for the `count` offsets from off; returns the lane-wise max when
// track_max.
template <class D, typename T>
HWY_INLINE hn::Vec<D> VectorDots(D d, const WindowGeometry<T>& g, const std::int64_t* off,
                                 size_t count, const T* a, const T* b, size_t rows, T* S,
                                 bool track_max) {
  const size_t ld = static_cast<size_t>(g.ld);
  auto vmax = hn::Set(d, -std::numeric_limits<T>::infinity());
  for (size_t r0 = 0; r0 < rows; r0 += kRowsPerSweep) {
    const size_t quads = std::min(kMaxQuads, (rows - r0) / 4);
    const bool first = r0 == 0, last = r0 + 4 * quads == rows;
    const T* ar = a + r0 * ld;
    const T* br = b + r0 * ld;
#define ATTN2D_SHIFTED_DOTS(Q)                                                   \
  if (first && last && track_max) {                                               \
    vmax = ShiftedDots<Q, false, true>(d, ar, br, ld, off, count, S, vmax);      \
  } else if (first) {                                                             \
    ShiftedDots<Q, false, false>(d, ar, br, ld, off, count, S, vmax);            \
  } else if (last && track_max) {                                                 \
    vmax = ShiftedDots<Q, true, true>(d, ar, br, ld, off, count, S, vmax);       \
  } else {                                                                        \
    ShiftedDots<Q, true, false>(d, ar, br, ld, off, count, S, vmax);             \
  }
    switch (quads) {
      case 1:
        ATTN2D_SHIFTED_DOTS(1) break;
      case 2:
        ATTN2D_SHIFTED_DOTS(2) break;
      case 3:
        ATTN2D_SHIFTED_DOTS(3) break;
      default:
        ATTN2D_SHIFTED_DOTS(4) break;
    }
#undef ATTN2D_SHIFTED_DOTS
  }
  return vmax;
}

// out[i * L + lane] = sum over o of P[o * L + lane] * b[i * ld + off[o] + lane], i < 4 kQuads.
// kExp: P holds the scores S on entry, and P = exp(S - shift) is formed here, stored back for
// the later sweeps of a wider Ev, and summed into *sum: the exp's ~26 float instructions then
// overlap this loop's loads, where a separate pass over P would load and store it again.
// kAccumulate: out's old value is added to.
template <size_t kQuads, bool kExp, bool kAccumulate, class D, typename T>
HWY_INLINE void ShiftedCombine(D d, T* HWY_RESTRICT P, const T* HWY_RESTRICT b, size_t ld,
                               const std::int64_t* HWY_RESTRICT off, size_t count,
                               T* HWY_RESTRICT out, hn::Vec<D> shift, hn::Vec<D>* sum) {
  constexpr size_t kRows = 4 * kQuads;
  const size_t L = hn::Lanes(d);
  hn::Vec<D> acc[kRows];
  HWY_UNROLL(16)
  for (size_t i = 0; i < kRows; ++i) acc[i] = kAccumulate ? hn::Load(d, out + i * L) : hn::Zero(d);
  auto total = hn::Zero(d);
  for (size_t o = 0; o < count; ++o) {
    auto pv = hn::Load(d, P + o * L);
    if (kExp) {
      pv = ExpOf(d, hn::Sub(pv, shift));
      hn::Store(pv, d, P + o * L);
      total = hn::Add(total, pv);
    }
    const T* bo = b + off[o];
    HWY_UNROLL(16)
    for (size_t i = 0; i < kRows; ++i) acc[i] = hn::MulAdd(pv, hn::LoadU(d, bo + i * ld), acc[i]);
  }
  HWY_UNROLL(16)
  for (size_t i = 0; i < kRows; ++i) hn::Store(acc[i], d, out + i * L);
  if (kExp) *sum = total;
}

// ShiftedCombine over `quads` (1..4) quads of rows and the `count` offsets from off; with
// `exp` (forward), P holds scores and becomes exp(S - shift), their sum going to *sum; with
// `accumulate` (backward), out is added to.
template <class D, typename T>
HWY_INLINE void VectorCombine(D d, const WindowGeometry<T>& g, const std::int64_t* off,
                              size_t count, T* P, const T* b, size_t quads, T* out, bool exp,
                              bool accumulate, hn::Vec<D> shift, hn::Vec<D>* sum) {
  const size_t ld = static_cast<size_t>(g.ld);
#define ATTN2D_SHIFTED_COMBINE(Q)                                                            \
  return exp ? ShiftedCombine<Q, true, false>(d, P, b, ld, off, count, out, shift, sum)     \
             : accumulate                                                                    \
                   ? ShiftedCombine<Q, false, true>(d, P, b, ld, off, count, out, shift, sum) \
                   : ShiftedCombine<Q, false, false>(d, P, b, ld, off, count, out, shift, sum)
  switch (quads) {
    case 1:
      ATTN2D_SHIFTED_COMBINE(1);
    case 2:
      ATTN2D_SHIFTED_COMBINE(2);
    case 3:
      ATTN2D_SHIFTED_COMBINE(3);
    default:
      ATTN2D_SHIFTED_COMBINE(4);
  }
#undef ATTN2D_SHIFTED_COMBINE
}

// dst[i * ld + off[o] + lane] += P[o * L + lane] * a[i * ld + lane] for every offset and the
// 4 kQuads rows i: the transpose of ShiftedCombine, scattering a query vector's terms onto the
// keys it sees (dK^T += dS q, dV^T += P dO).
template <size_t kQuads, class D, typename T>
HWY_INLINE void ShiftedScatter(D d, const T* HWY_RESTRICT P, const T* HWY_RESTRICT a, size_t ld,
                               const std::int64_t* HWY_RESTRICT off, size_t count,
                               const std::uint16_t* HWY_RESTRICT order, T* HWY_RESTRICT dst) {
  constexpr size_t kRows = 4 * kQuads;
  const size_t L = hn::Lanes(d);
  hn::Vec<D> av[kRows];
  HWY_UNROLL(16)
  for (size_t i = 0; i < kRows; ++i) av[i] = hn::Load(d, a + i * ld);
  for (size_t t = 0; t < count; ++t) {
    const size_t o = order[t];
    const auto pv = hn::Load(d, P + o * L);
    T* to = dst + off[o];
    HWY_UNROLL(16)
    for (size_t i = 0; i < kRows; ++i) {
      hn::StoreU(hn::MulAdd(pv, av[i], hn::LoadU(d, to + i * ld)), d, to + i * ld);
    }
  }
}

// ShiftedScatter over rows r < rows (a multiple of 4) and the `count` offsets from off.
template <class D, typename T>
HWY_INLINE void VectorScatter(D d, const WindowGeometry<T>& g, const std::int64_t* off,
                              size_t count, const std::uint16_t* order, const T* P, const T* a,
                              size_t rows, T* dst) {
  const size_t ld = static_cast<size_t>(g.ld);
  for (size_t r0 = 0; r0 < rows; r0 += kRowsPerSweep) {
    const T* ar = a + r0 * ld;
    T* dr = dst + r0 * ld;
    switch (std::min(kMaxQuads, (rows - r0) / 4)) {
      case 1:
        ShiftedScatter<1>(d, P, ar, ld, off, count, order, dr);
        break;
      case 2:
        ShiftedScatter<2>(d, P, ar, ld, off, count, order, dr);
        break;
      case 3:
        ShiftedScatter<3>(d, P, ar, ld, off, count, order, dr);
        break;
      default:
        ShiftedScatter<4>(d, P, ar, ld, off, count, order, dr);
        break;
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_WINDOW_SHIFTED_OPS_INL_H_
