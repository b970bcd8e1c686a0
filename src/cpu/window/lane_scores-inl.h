// A query vector's scores over the window's offsets, per target: their lane-wise max, their exps
// in place, and the mask of the lanes whose key falls outside the map (only vectors near the
// border need it).
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_WINDOW_LANE_SCORES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_WINDOW_LANE_SCORES_INL_H_
#undef ATTN2D_SRC_CPU_WINDOW_LANE_SCORES_INL_H_
#else
#define ATTN2D_SRC_CPU_WINDOW_LANE_SCORES_INL_H_
#endif

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

// P = exp(S - shift) over the (count, L) scores S in place; returns their lane-wise sum.
template <class D, typename T>
HWY_INLINE hn::Vec<D> ExpInPlace(D d, T* S, size_t count, hn::Vec<D> shift) {
  const size_t L = hn::Lanes(d);
  auto sum0 = hn::Zero(d), sum1 = hn::Zero(d);
  size_t o = 0;
  for (; o + 2 <= count; o += 2) {
    const auto p0 = ExpOf(d, hn::Sub(hn::Load(d, S + o * L), shift));
    const auto p1 = ExpOf(d, hn::Sub(hn::Load(d, S + (o + 1) * L), shift));
    hn::Store(p0, d, S + o * L);
    hn::Store(p1, d, S + (o + 1) * L);
    sum0 = hn::Add(sum0, p0);
    sum1 = hn::Add(sum1, p1);
  }
  if (o < count) {
    const auto p0 = ExpOf(d, hn::Sub(hn::Load(d, S + o * L), shift));
    hn::Store(p0, d, S + o * L);
    sum0 = hn::Add(sum0, p0);
  }
  return hn::Add(sum0, sum1);
}

// The lane-wise max of the (count, L) scores S.
template <class D, typename T>
HWY_INLINE hn::Vec<D> RowMax(D d, const T* S, size_t count) {
  const size_t L = hn::Lanes(d);
  auto m0 = hn::Set(d, -std::numeric_limits<T>::infinity()), m1 = m0;
  size_t o = 0;
  for (; o + 2 <= count; o += 2) {
    m0 = hn::Max(m0, hn::Load(d, S + o * L));
    m1 = hn::Max(m1, hn::Load(d, S + (o + 1) * L));
  }
  if (o < count) m0 = hn::Max(m0, hn::Load(d, S + o * L));
  return hn::Max(m0, m1);
}

// lanes_i, lanes_j (L,) = the pixel row and column of each lane of the vector from query q0; a
// row of -2 * height for lanes past the last query or on a pad column puts them out of reach
// of every offset.
template <class D, typename T>
HWY_INLINE void LanePositions(D d, const WindowGeometry<T>& g, std::int64_t q0, T* lanes_i,
                              T* lanes_j) {
  const std::int64_t N = g.positions();
  // One division, then a walk along the raster, where each lane divided: 16 64-bit divisions
  // per border vector, and a third of a 15x15 window's vectors at 128x128 are border vectors.
  std::int64_t i = q0 / g.pitch, j = q0 % g.pitch;
  for (size_t lane = 0; lane < hn::Lanes(d); ++lane) {
    const std::int64_t n = q0 + static_cast<std::int64_t>(lane);
    lanes_i[lane] = n < N && j < g.width ? static_cast<T>(i) : static_cast<T>(-2 * g.height);
    lanes_j[lane] = static_cast<T>(j);
    if (++j == g.pitch) {
      j = 0;
      ++i;
    }
  }
}

// Sets to -inf the scores S (count, L) of the offsets (dr_of[o], dc_of[o]), o < count, in the
// lanes (positions from LanePositions) whose key at that offset falls outside the map; returns
// their lane-wise max.
template <class D, typename T>
HWY_INLINE hn::Vec<D> MaskOutside(D d, const WindowGeometry<T>& g, const T* dr_of,
                                  const T* dc_of, size_t count, const T* lanes_i,
                                  const T* lanes_j, T* S) {
  const size_t L = hn::Lanes(d);
  const auto neg_inf = hn::Set(d, -std::numeric_limits<T>::infinity());
  const auto i_lo = hn::Sub(hn::Zero(d), hn::Load(d, lanes_i));  // dr >= -i
  const auto i_hi = hn::Sub(hn::Set(d, static_cast<T>(g.height - 1)), hn::Load(d, lanes_i));
  const auto j_lo = hn::Sub(hn::Zero(d), hn::Load(d, lanes_j));
  const auto j_hi = hn::Sub(hn::Set(d, static_cast<T>(g.width - 1)), hn::Load(d, lanes_j));
  auto vmax = neg_inf;
  for (size_t o = 0; o < count; ++o) {
    const auto dr = hn::Set(d, dr_of[o]), dc = hn::Set(d, dc_of[o]);
    const auto inside = hn::And(hn::And(hn::Ge(dr, i_lo), hn::Le(dr, i_hi)),
                                hn::And(hn::Ge(dc, j_lo), hn::Le(dc, j_hi)));
    const auto s = hn::IfThenElse(inside, hn::Load(d, S + o * L), neg_inf);
    hn::Store(s, d, S + o * L);
    vmax = hn::Max(vmax, s);
  }
  return vmax;
}

// Masks the scores Sk (count, L) of the vector from q0, offsets in column order (a blocked
// kernel's), where its keys fall outside the map; returns their lane-wise max when track_max
// (else -inf). Interior vectors need no mask.
template <class D, typename T>
HWY_INLINE hn::Vec<D> MaskBlockVector(D d, const WindowGeometry<T>& g, std::int64_t q0, T* Sk,
                                      T* lanes_i, T* lanes_j, bool track_max) {
  const size_t count = static_cast<size_t>(g.count);
  if (g.interior(q0)) {
    return track_max ? RowMax(d, Sk, count) : hn::Set(d, -std::numeric_limits<T>::infinity());
  }
  LanePositions(d, g, q0, lanes_i, lanes_j);
  return MaskOutside(d, g, g.col_dr.data(), g.col_dc.data(), count, lanes_i, lanes_j, Sk);
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_WINDOW_LANE_SCORES_INL_H_
