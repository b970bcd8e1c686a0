// Per-target operations on rows: of score tiles (max, NaN test, exp and sum, scale, add, the
// backward's recomputed row) and of tensors of any stride (dot and axpy with a packed row).
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_COMMON_ROW_OPS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_COMMON_ROW_OPS_INL_H_
#undef ATTN2D_SRC_CPU_COMMON_ROW_OPS_INL_H_
#else
#define ATTN2D_SRC_CPU_COMMON_ROW_OPS_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "cpu/common/exp-inl.h"
#include "cpu/common/half.h"
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
// one pass, where an exp pass and then a pass over P would read P twice.
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

// fn(e, v) for each whole vector v = (y[e * ys], ..., y[(e + L - 1) * ys]) of a strided row y
// (T elements); returns the elements done. DotRow and AxpyRow then sum or fuse exactly as for a
// contiguous row, so that results do not depend on the layout: the sparse backward reads some
// slices from row-major copies (tiled/row_staging-inl.h), and every schedule must give the same
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

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_COMMON_ROW_OPS_INL_H_
