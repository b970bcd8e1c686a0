// Per-thread packed planes that follow a walk down one head in bands of query rows, for the
// blocked window forward (window_forward_cpu.cc). Packing whole heads first wrote Q^T, K^T and
// V^T of a 128x128 head (3.3 MB at E = Ev = 16) past a 2 MB L2, and the query tasks read them
// back from L3. Here a thread packs the keys a band needs just before it runs the band, into
// planes that stay in its L2, and keeps the keys it packed for the previous band when that was
// the same head's (a 15x15 window's reach, 14 pixel rows, is the overlap of two bands): under
// PyTorch's parallel_for a thread runs consecutive tasks, so each key is packed about once; any
// other order only packs more. A 1x1 window's forward at 128x128 (4 heads, one thread), nearly
// all packing and memory traffic, fell from 2.0 to 1.7 ms.
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_WINDOW_STREAM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_WINDOW_STREAM_INL_H_
#undef ATTN2D_SRC_CPU_WINDOW_STREAM_INL_H_
#else
#define ATTN2D_SRC_CPU_WINDOW_STREAM_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "attn2d/attention_params.h"
#include "cpu/window_geometry.h"
#include "cpu/window_ops-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {

// Bytes of a band's planes that should stay in L2 (what the band reads: Q^T of its queries, K^T
// and V^T of their keys). Bands of whole block rows (R = kBlockRows vectors block_stride apart,
// over every strip; blocks [a0, a1) cover positions [a0 R V L, a1 R V L), V = block_stride / L)
// as many as fit, one at least: at E = Ev = 16 (192 bytes a position) and a 15x15 window, 16
// pixel rows at width 128 (2048 queries, 1806 more keys) and 4 at width 256. Against bands of
// 4096 queries (alternated, medians of 20-30): 128x128 diamond 15, 4 heads, one thread 7.3-7.6
// -> 6.6-7.0 ms, two threads 3.8-4.2 -> 3.4-3.5 ms; 256x256, two threads, 16.2-16.9 -> 14.9 ms.
// At 128x128, one thread, bands of 1024 and 2048 queries (0.74 MB read a band) ran 6.5 ms, of
// 3072 (0.94 MB) 7.3 ms, as 4096 (1.1 MB) did.
constexpr std::int64_t kStreamBandBytes = std::int64_t{768} << 10;

template <typename T>
std::int64_t StreamBlocksPerBand(const WindowGeometry<T>& g, std::int64_t bytes_per_position) {
  const std::int64_t row = static_cast<std::int64_t>(kBlockRows) * g.block_stride;
  const std::int64_t reach =
      std::max<std::int64_t>(g.off_max, 0) - std::min<std::int64_t>(g.off_min, 0);
  const std::int64_t fit = (kStreamBandBytes / bytes_per_position - reach) / row;
  // A head of 4 block rows or more has 4 bands at least, so that a small map (32x32: 8 block
  // rows) still gives two threads work and walks its planes as a large one does.
  return std::clamp<std::int64_t>(fit, 1, std::max<std::int64_t>(1, BlocksPerStrip(g) / 4));
}

// The positions a band [p0, p1) of queries reads in its planes: its keys, and itself (Q^T shares
// the planes' columns, and a window need not hold offset 0: off_min may be above 0).
template <typename T>
std::int64_t StreamLo(const WindowGeometry<T>& g, std::int64_t p0) {
  return p0 + std::min<std::int64_t>(g.off_min, 0);
}
template <typename T>
std::int64_t StreamHi(const WindowGeometry<T>& g, std::int64_t p1) {
  return p1 + std::max<std::int64_t>(g.off_max, 0);
}

// Which positions a thread's planes hold: [lo, hi) of head bh (batch * heads + head), at
// columns n - origin of rows ld long.
struct StreamSpan {
  size_t ld = 0;
  std::int64_t bh = -1, origin = 0, lo = 0, hi = 0;
};

// Readies planes spanned by s for positions [lo, hi) of head bh and returns the first position
// left to pack: keeps the positions already there from the same head's walk (lo and hi only
// grow along it), moving the rows of `planes` ({first row, rows}; each row ld long) to the front
// when hi would overflow them; anything else starts over (returns lo).
template <typename T>
HWY_INLINE std::int64_t SlideStream(StreamSpan& s, std::int64_t L, std::int64_t bh,
                                    std::int64_t lo, std::int64_t hi,
                                    std::initializer_list<std::pair<T*, size_t>> planes) {
  const std::int64_t aligned_lo = floor_div(lo, L) * L;
  std::int64_t from = lo;
  if (s.bh == bh && lo >= s.lo && lo <= s.hi && hi >= s.hi) {
    from = s.hi;
    if (hi - s.origin > static_cast<std::int64_t>(s.ld)) {
      // Move the kept positions [aligned_lo, s.hi) to the front.
      const size_t shift = static_cast<size_t>(aligned_lo - s.origin);
      const size_t keep = static_cast<size_t>(s.hi - aligned_lo);
      for (const auto& [first, rows] : planes) {
        for (size_t r = 0; r < rows; ++r) {
          T* row = first + r * s.ld;
          std::memmove(row, row + shift, keep * sizeof(T));
        }
      }
      s.origin = aligned_lo;
    }
  } else {
    s.origin = aligned_lo;
  }
  s.bh = bh;
  s.lo = lo;
  s.hi = hi;
  return from;
}

// One thread's planes: Q^T (scaled), K^T and V^T, each (rows, ld) with position n at local
// column n - origin. Positions [lo, hi) of head `bh`'s keys are packed; positions outside the
// map hold zeros, as the whole-head planes' margins do.
template <typename T>
struct KeyStream : StreamSpan {
  T* qt = nullptr;  // (e_pad, ld)
  T* kt = nullptr;  // (e_pad, ld)
  T* vt = nullptr;  // (ev_pad, ld)

  // Elements of one thread's planes, for bands of `band` positions under geometry g: the band,
  // its keys' reach and a vector on each side, twice over, so that the kept keys are moved to
  // the front only every few bands. An odd number of vectors a row, as WindowGeometry::ld.
  static size_t RowLength(const WindowGeometry<T>& g, std::int64_t band) {
    const std::int64_t L = g.lanes;
    std::int64_t ld = 2 * (StreamHi(g, band) - StreamLo(g, 0) + 2 * L);
    ld = (ld + L - 1) / L * L;
    if (ld / L % 2 == 0) ld += L;
    return static_cast<size_t>(ld);
  }
  static size_t Elems(size_t ld, size_t e_pad, size_t ev_pad) {
    return (2 * e_pad + ev_pad) * ld;
  }
  void Carve(T* base, size_t ld_, size_t e_pad) {
    ld = ld_;
    qt = base;
    kt = qt + e_pad * ld;
    vt = kt + e_pad * ld;
  }
};

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

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_WINDOW_STREAM_INL_H_
