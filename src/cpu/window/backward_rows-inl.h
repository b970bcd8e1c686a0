// The window backward's rows of one value per query, per target: the forward's log-sum-exps
// packed for P = exp(S - lse), and D = rowsum(dO * O) from the packed dO^T and O^T.
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_WINDOW_BACKWARD_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_WINDOW_BACKWARD_ROWS_INL_H_
#undef ATTN2D_SRC_CPU_WINDOW_BACKWARD_ROWS_INL_H_
#else
#define ATTN2D_SRC_CPU_WINDOW_BACKWARD_ROWS_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <limits>

#include "cpu/window/window_geometry.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// delta[c] = sum over rows ev < Ev of dot[ev * dot_ld + c] * ot[ev * ot_ld + c] for c < n:
// D = rowsum(dO * O), a vector of positions at a time, from the packed dO^T and O^T.
template <typename T>
HWY_INLINE void RowsumOfProducts(const T* dot, size_t dot_ld, const T* ot, size_t ot_ld,
                                 size_t Ev, size_t n, T* delta) {
  const hn::ScalableTag<T> d;
  const size_t L = hn::Lanes(d), n_end = n / L * L;
  for (size_t c = 0; c < n_end; c += L) {
    auto acc = hn::Zero(d);
    for (size_t ev = 0; ev < Ev; ++ev) {
      acc = hn::MulAdd(hn::LoadU(d, dot + ev * dot_ld + c), hn::LoadU(d, ot + ev * ot_ld + c), acc);
    }
    hn::StoreU(acc, d, delta + c);
  }
  for (size_t c = n_end; c < n; ++c) {
    T D = 0;
    for (size_t ev = 0; ev < Ev; ++ev) D += dot[ev * dot_ld + c] * ot[ev * ot_ld + c];
    delta[c] = D;
  }
}

// dst[q - p0] = the lse of query q (lse at q * stride) for q in [p0, p1): +inf for a row that
// saw no key (lse -inf) and for q >= N, so that P = exp(S - lse) is 0 there.
template <typename T>
HWY_INLINE void PackLse(const T* lse, std::int64_t stride, std::int64_t p0, std::int64_t p1,
                        std::int64_t N, T* dst) {
  constexpr T kInf = std::numeric_limits<T>::infinity();
  for (std::int64_t q = p0; q < p1; ++q) {
    const T l = q < N ? lse[q * stride] : -kInf;
    dst[q - p0] = l == -kInf ? kInf : l;
  }
}

// PackLse for the positions [p0, p1) of g's raster (p0 >= 0): pad columns and positions past
// the map get +inf.
template <typename T>
HWY_INLINE void PackLse(const WindowGeometry<T>& g, const T* lse, std::int64_t stride,
                        std::int64_t p0, std::int64_t p1, T* dst) {
  if (g.pitch == g.width) {
    PackLse(lse, stride, p0, p1, g.height * g.width, dst);
    return;
  }
  g.ForEachRowRun(p0, p1, [&](std::int64_t i, std::int64_t a, std::int64_t b) {
    const std::int64_t pixels = i < g.height ? g.width : 0;  // row i's columns held by lse
    PackLse(lse + i * g.width * stride, stride, a, b, pixels, dst + (i * g.pitch + a - p0));
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_WINDOW_BACKWARD_ROWS_INL_H_
