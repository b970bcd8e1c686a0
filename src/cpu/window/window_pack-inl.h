// The window kernels' packing, per target: one head's (positions, width) rows transposed into
// planes of positions (whole heads with zero margins, or the streamed planes of a band), and
// rows of positions transposed back into (positions, width) tensors.
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_WINDOW_WINDOW_PACK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_WINDOW_WINDOW_PACK_INL_H_
#undef ATTN2D_SRC_CPU_WINDOW_WINDOW_PACK_INL_H_
#else
#define ATTN2D_SRC_CPU_WINDOW_WINDOW_PACK_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "attn2d/attention_params.h"
#include "cpu/common/half.h"
#include "cpu/common/pack-inl.h"
#include "cpu/window/window_geometry.h"
#include "cpu/window/window_plan-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// dst[(q0 + lane) * s_n + r * s_e] = src[r * L + lane] * scale[lane] for rows r < rows and
// lanes < lanes: rows of L positions, as the kernels keep them, back into a (positions, width)
// tensor; src is scaled in place; scale (L,), or null for none. A contiguous float output
// takes the packing's transpose rather than element-wise stores, with non-temporal stores when
// stream (common/result_stores.h).
template <class D, typename T, typename IO>
HWY_INLINE void StoreLanes(D d, T* src, size_t rows, size_t lanes, const T* scale, IO* dst,
                           std::int64_t q0, std::int64_t s_n, std::int64_t s_e, bool stream) {
  const size_t L = hn::Lanes(d);
  if (scale != nullptr) {
    const auto sv = hn::Load(d, scale);
    for (size_t r = 0; r < rows; ++r) {
      hn::Store(hn::Mul(hn::Load(d, src + r * L), sv), d, src + r * L);
    }
  }
  if constexpr (std::is_same<IO, T>::value) {
    if (s_e == 1) {
      PackTransposed<T, T>(src, Rows{nullptr, 0, rows}, static_cast<std::int64_t>(L), 1, lanes,
                           dst + q0 * s_n, static_cast<size_t>(s_n), rows, stream);
      return;
    }
  }
  for (size_t lane = 0; lane < lanes; ++lane) {
    IO* o = dst + (q0 + static_cast<std::int64_t>(lane)) * s_n;
    for (size_t r = 0; r < rows; ++r) {
      o[static_cast<std::int64_t>(r) * s_e] = Store<IO>(src[r * L + lane]);
    }
  }
}

// dst[r * ld + margin + n] = value for rows r < rows in the margins before and after the
// positions, written by the tasks holding the first and the last position.
template <typename T>
HWY_INLINE void FillMargins(const WindowGeometry<T>& g, std::int64_t n0, std::int64_t count,
                            size_t rows, T value, T* dst) {
  const size_t ld = static_cast<size_t>(g.ld);
  const std::int64_t N = g.height * g.width;
  for (size_t r = 0; r < rows; ++r) {
    T* row = dst + r * ld;
    if (n0 == 0) std::fill(row, row + g.margin, value);
    if (n0 + count == N) std::fill(row + g.margin + N, row + ld, value);
  }
}

// The same over the chunk's own columns too.
template <typename T>
HWY_INLINE void FillWindowRows(const WindowGeometry<T>& g, std::int64_t n0, std::int64_t count,
                               size_t rows, T value, T* dst) {
  const size_t ld = static_cast<size_t>(g.ld);
  for (size_t r = 0; r < rows; ++r) {
    std::fill(dst + r * ld + g.margin + n0, dst + r * ld + g.margin + n0 + count, value);
  }
  FillMargins(g, n0, count, rows, value, dst);
}

// Packs positions [n0, n1) of one head's (positions, width) rows from `base` (strides in
// elements, base at (b, h, 0, 0)) into dst (width rows of ld) transposed, at columns n - origin,
// times `scale`; positions outside [0, N) as zeros. Whole-head planes put position n at column
// margin + n (origin -margin, PackWindowRows); the forward's streamed planes at n - origin for
// the origin of the band they follow (window_plan-inl.h, KeyStream).
template <typename T, typename IO>
HWY_INLINE void StreamRows(const IO* base, const std::int64_t* stride, std::int64_t N,
                           std::int64_t n0, std::int64_t n1, size_t width, T* dst, size_t ld,
                           std::int64_t origin, T scale = T(1)) {
  if (n0 >= n1 || width == 0) return;
  const std::int64_t in0 = std::max<std::int64_t>(n0, 0), in1 = std::min(n1, N);  // in the map
  const std::int64_t before = std::min(n1, in0), after = std::max(n0, in1);
  for (size_t r = 0; r < width; ++r) {
    T* row = dst + r * ld;
    std::fill(row + (n0 - origin), row + (before - origin), T(0));
    std::fill(row + (after - origin), row + (n1 - origin), T(0));
  }
  if (in0 >= in1) return;
  const size_t n = static_cast<size_t>(in1 - in0);
  T* chunk = dst + (in0 - origin);
  PackTransposed(base + in0 * stride[2], Rows{nullptr, 0, n}, stride[2], stride[3], width, chunk,
                 ld, n);
  if (scale != T(1)) {
    for (size_t r = 0; r < width; ++r) {
      for (size_t c = 0; c < n; ++c) chunk[r * ld + c] *= scale;
    }
  }
}

// StreamRows for the positions [n0, n1) of g's raster: on a pitched raster a run of each pixel
// row's columns comes from the tensors, and pad columns and rows outside the map are zeros.
template <typename T, typename IO>
HWY_INLINE void StreamPixels(const WindowGeometry<T>& g, const IO* base,
                             const std::int64_t* stride, std::int64_t n0, std::int64_t n1,
                             size_t width, T* dst, size_t ld, std::int64_t origin,
                             T scale = T(1)) {
  if (g.pitch == g.width) {
    StreamRows(base, stride, g.height * g.width, n0, n1, width, dst, ld, origin, scale);
    return;
  }
  g.ForEachRowRun(n0, n1, [&](std::int64_t i, std::int64_t a, std::int64_t b) {
    // Row i's columns a .. b - 1, at plane columns i pitch + j - origin; a row outside the map
    // holds no pixel (N = 0: all zeros).
    const bool in_map = i >= 0 && i < g.height;
    StreamRows(in_map ? base + i * g.width * stride[2] : base, stride, in_map ? g.width : 0, a, b,
               width, dst, ld, origin - i * g.pitch, scale);
  });
}

// Packs positions [n0, n0 + count) of one head's (N, width) rows from `base` (strides in
// elements, base at (b, h, 0, 0)) into dst (rows_pad, ld) transposed and times `scale`, at
// columns margin + n; zeroes the padding rows and the margins.
template <typename T, typename IO>
HWY_INLINE void PackWindowRows(const WindowGeometry<T>& g, const IO* base,
                               const std::int64_t* stride, std::int64_t n0, std::int64_t count,
                               size_t width, size_t rows_pad, T* dst, T scale = T(1)) {
  StreamRows(base, stride, g.height * g.width, n0, n0 + count, width, dst,
             static_cast<size_t>(g.ld), -g.margin, scale);
  FillWindowRows(g, n0, count, rows_pad - width, T(0), dst + width * static_cast<size_t>(g.ld));
  FillMargins(g, n0, count, width, T(0), dst);
}

// Makes keys [lo, hi) of head bh (batch b, head h) packed in s: keeps those already there from
// the same head's last band, moving them to the front when the planes would overflow, and packs
// the rest. lo and hi only grow along a head's walk; anything else starts over.
template <typename T, typename IO>
HWY_INLINE void StreamKeys(const AttentionParams& p, const WindowGeometry<T>& g,
                           std::int64_t bh, std::int64_t lo, std::int64_t hi, KeyStream<T>& s) {
  const std::int64_t b = bh / p.heads, h = bh % p.heads;
  const std::int64_t L = g.lanes;
  const size_t E = static_cast<size_t>(p.dim_qk), Ev = static_cast<size_t>(p.dim_v);
  const IO* k = static_cast<const IO*>(p.k) + b * p.k_stride[0] + h * p.k_stride[1];
  const IO* v = static_cast<const IO*>(p.v) + b * p.v_stride[0] + h * p.v_stride[1];
  const std::int64_t from = SlideStream<T>(s, L, bh, lo, hi, {{s.kt, E}, {s.vt, Ev}});
  StreamPixels(g, k, p.k_stride, from, hi, E, s.kt, s.ld, s.origin);
  StreamPixels(g, v, p.v_stride, from, hi, Ev, s.vt, s.ld, s.origin);
}

// dst[n * stride[2] + e * stride[3]] = src[e * ld + n - n0] for positions [n0, n1) and rows
// e < width: rows of positions, as the packed planes hold them, back into one head's (positions,
// width) slice of dK or dV (dst at (b, h, 0, 0)); stream: past the caches
// (common/result_stores.h).
template <typename T, typename IO>
HWY_INLINE void WriteRows(const T* src, size_t ld, std::int64_t n0, std::int64_t n1,
                          std::int64_t width, IO* dst, const std::int64_t* stride, bool stream) {
  if (n0 >= n1 || width == 0) return;
  if constexpr (std::is_same<IO, T>::value) {
    if (stride[3] == 1) {
      // The packing transpose run backwards: (width, positions) -> (positions, width).
      PackTransposed<T, T>(src, Rows{nullptr, 0, static_cast<size_t>(width)},
                           static_cast<std::int64_t>(ld), 1, static_cast<size_t>(n1 - n0),
                           dst + n0 * stride[2], static_cast<size_t>(stride[2]),
                           static_cast<size_t>(width), stream);
      return;
    }
  }
  for (std::int64_t n = n0; n < n1; ++n) {
    for (std::int64_t e = 0; e < width; ++e) {
      dst[n * stride[2] + e * stride[3]] =
          Store<IO>(src[static_cast<size_t>(e) * ld + static_cast<size_t>(n - n0)]);
    }
  }
}

// WriteRows for the positions [n0, n1) of g's raster (src at n0's column): only those of
// pixels in the map are written.
template <typename T, typename IO>
HWY_INLINE void WritePixels(const WindowGeometry<T>& g, const T* src, size_t ld,
                            std::int64_t n0, std::int64_t n1, std::int64_t width, IO* dst,
                            const std::int64_t* stride, bool stream) {
  const std::int64_t lo = std::max<std::int64_t>(n0, 0), hi = std::min(n1, g.positions());
  if (g.pitch == g.width) {
    if (lo < hi) WriteRows(src + (lo - n0), ld, lo, hi, width, dst, stride, stream);
    return;
  }
  g.ForEachRowRun(lo, hi, [&](std::int64_t i, std::int64_t a, std::int64_t b) {
    b = std::min(b, g.width);  // pad columns hold no key
    if (a >= b) return;
    WriteRows(src + (i * g.pitch + a - n0), ld, i * g.width + a, i * g.width + b, width, dst,
              stride, stream);
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_WINDOW_WINDOW_PACK_INL_H_
