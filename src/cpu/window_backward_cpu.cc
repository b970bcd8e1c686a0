// Backward of a window given as offsets (attn2d/window_offsets.h), vectorised across queries as
// the forward is (window_forward_cpu.cc): per query vector and offset, with P recomputed from
// the forward's log-sum-exp,
//   S  = Q^T K^T(off)            P = exp(S - lse)           (E multiply-adds per pair)
//   dP = dO^T V^T(off)           dS = P (dP - D), D = rowsum(dO * O)     (Ev)
//   dQ^T          += dS K^T(off)   in registers across the offsets        (E)
//   dK^T(off)     += dS Q^T        read-modify-write of the shifted rows  (E)
//   dV^T(off)     += P dO^T                                               (Ev)
// 3E + 2Ev multiply-adds per allowed pair, as many as the dense backward spends per pair, where
// the tiled sparse backward computes every pair of each visited 8x8-pixel tile pair (2.5x the
// allowed pairs of a 15x15 square, 4.9x those of a diamond).
//
// dK and dV are scattered, so queries that reach the same keys must not run at once.
//
// Where the forward runs blocks (window_geometry.h: evenly spaced columns, width a multiple of
// L), the backward runs blocks of 4 query vectors one pixel row apart: S and dP by BlockDots
// (each key load shared by up to 4 multiply-adds), P and dS, dQ^T = dS K^T(off) in registers
// (BlockCombine), and dK^T, dV^T by BlockScatter, whose column walk shares each query row
// load across the column's offsets and keeps the overlapping stores of neighbouring columns a
// column's worth of rows apart. Until session 14 the blocked backward ran a second pass per
// block of 4 key vectors under the window turned around (S^T, dP^T and their exps recomputed:
// 4E + 3Ev multiply-adds and 2 exps a pair against 3E + 2Ev and 1).
//
// The blocked backward streams (StreamBackward): a task walks one segment of a head's bands of
// query rows in order on its thread's planes (GradStream), packing each band's queries and the
// keys it newly reaches, summing dK and dV in the planes, and writing each key out once no later
// band of the segment reaches it; keys around a segment boundary are summed by both segments
// apart and added by a last pass, so segments need no phases. Until session 22 it packed whole
// heads (7.2 MB at 128x128, E = Ev = 16: past L2) and ran runs of 4 blocks down every strip in
// two phases; against that (development VM, Intel AVX-512, 4 heads, E = Ev = 16, diamond 15, the
// builds alternated 3 rounds, lower quartiles of 10 calls, ns per query): two threads 128x128
// 207-209 -> 150-189, 256x256 221-226 -> 177-205; one thread 128x128 326-343 -> 277-288, 256x256
// 333-362 -> 348-365. Bands of one block row (the L2 rule's choice at 144 px and wider) made the
// scatter 1.7x slower at 144x144, for reasons not found (not the planes' row length, their
// alignment or the scratch's place); two block rows at least run as fast as the whole-head walk
// or faster at every width from 96 to 272.
//
// The unblocked backward (WholeHeadBackward: widths that neither are a multiple of L nor pitch
// to one within 4/3, window_geometry.h) packs whole heads and cuts each head's vectors into
// bands of B raster-consecutive vectors, (P - 1) B L >= max off - min off, so that band k reaches
// no key that band k + P reaches; the P phases run bands 0, P, 2P, ... in parallel, then bands
// 1, P + 1, ..., and so on. Either way every key's sum runs in one fixed order, whatever the
// thread count.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/window_backward_cpu.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "attn2d/attention_params.h"
#include "attn2d/host.h"
#include "attn2d/status.h"
#include "attn2d/window_offsets.h"
#include "core/strided.h"
#include "core/workspace.h"
#include "cpu/attention_cpu.h"
#include "cpu/dtype_dispatch.h"
#include "cpu/result_stores.h"
#include "cpu/scratch.h"
#include "cpu/tiling.h"
#include "cpu/tile_ops-inl.h"
#include "cpu/window_geometry.h"
#include "cpu/window_ops-inl.h"
#include "cpu/window_stream-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {

// Offsets per pass over a vector's arrays: S and dS of 32 offsets are 2 x 2 KiB of L1, where a
// whole 15x15 window's (225 offsets) would take 2 x 14 KiB of the 48 KiB that the shifted rows
// of K, V, dK and dV stream through. Within a chunk the scatter walks the offsets column-major
// (scatter_order): raster order puts offsets (dr, dc) and (dr, dc + 1) one after the other,
// and the second's load of dK^T overlaps 15 of the 16 lanes the first just stored, which a
// load cannot take from the store queue (1.1x slower at 128x128, 15x15, one thread).
constexpr size_t kOffsetChunk = 32;

template <typename T>
struct WindowBackwardPlan {
  const AttentionBackwardParams* bp;
  const WindowGeometry<T>* g;
  size_t e_pad, ev_pad;           // E and Ev rounded up to 4 (zero rows)
  std::int64_t band_vectors = 0;  // B
  std::int64_t bands;             // per head
  std::int64_t phases;            // P
  std::int64_t pack_tasks_per_head;
  std::int64_t group_first = 0;   // the (b, h) pairs packed now: group_first ..
  std::int64_t group_size = 0;
  std::int64_t phase = 0;         // the bands running now: phase, phase + P, ...
  bool stream_grads = false;      // dK and dV past the caches (cpu/result_stores.h)

  // Bands of one head in `phase`.
  std::int64_t bands_in(std::int64_t ph) const { return (bands - ph + phases - 1) / phases; }
  size_t head_elems;              // (3 e_pad + 3 ev_pad + 2) * ld
  const std::uint16_t* scatter_order;  // (count,) per chunk of kOffsetChunk, its walk order
  T* packed;
  size_t scratch_elems;  // per thread
  T* scratch;

  // Head `slot` of the group, each array (rows, ld) with column margin + n holding position n:
  // Q^T (scaled), K^T (e_pad rows), V^T, dO^T (ev_pad rows), one row of lse (+inf for a row
  // that saw no key and in the margins, so that P = exp(S - lse) is 0 there), one of
  // D = rowsum(dO * O), then the scatter's dK^T and dV^T.
  size_t ld() const { return static_cast<size_t>(g->ld); }
  T* qt(std::int64_t slot) const { return packed + static_cast<size_t>(slot) * head_elems; }
  T* kt(std::int64_t slot) const { return qt(slot) + e_pad * ld(); }
  T* vt(std::int64_t slot) const { return kt(slot) + e_pad * ld(); }
  T* dot(std::int64_t slot) const { return vt(slot) + ev_pad * ld(); }
  T* lse(std::int64_t slot) const { return dot(slot) + ev_pad * ld(); }
  T* delta(std::int64_t slot) const { return lse(slot) + ld(); }
  T* dkt(std::int64_t slot) const { return delta(slot) + ld(); }
  T* dvt(std::int64_t slot) const { return dkt(slot) + e_pad * ld(); }
};

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

template <typename T, typename IO>
void BackwardPackTask(void* ctx, std::int64_t task, int thread) {
  const WindowBackwardPlan<T>& plan = *static_cast<const WindowBackwardPlan<T>*>(ctx);
  const AttentionBackwardParams& bp = *plan.bp;
  const AttentionParams& p = bp.fwd;
  const WindowGeometry<T>& g = *plan.g;
  const PackChunk chunk(task, plan.pack_tasks_per_head, plan.group_first, p.heads, p.len_q);
  const std::int64_t slot = chunk.slot, b = chunk.b, h = chunk.h;
  const std::int64_t n0 = chunk.n0, count = chunk.count;
  const size_t E = static_cast<size_t>(p.dim_qk), Ev = static_cast<size_t>(p.dim_v);
  const size_t ld = plan.ld();
  auto head = [&](const void* base, const std::int64_t* stride) {
    return static_cast<const IO*>(base) + b * stride[0] + h * stride[1];
  };
  PackWindowRows(g, head(p.q, p.q_stride), p.q_stride, n0, count, E, plan.e_pad, plan.qt(slot),
                 static_cast<T>(p.scale));
  PackWindowRows(g, head(p.k, p.k_stride), p.k_stride, n0, count, E, plan.e_pad, plan.kt(slot));
  PackWindowRows(g, head(p.v, p.v_stride), p.v_stride, n0, count, Ev, plan.ev_pad, plan.vt(slot));
  PackWindowRows(g, head(bp.dout, bp.dout_stride), bp.dout_stride, n0, count, Ev, plan.ev_pad,
                 plan.dot(slot));
  // D = rowsum(dO * O), vectorised over positions from the chunk of O packed into this
  // thread's scratch as O^T (Ev, kPackChunk).
  T* ot = plan.scratch + static_cast<size_t>(thread) * plan.scratch_elems;
  const size_t n = static_cast<size_t>(count);
  if (Ev > 0) {
    PackTransposed(head(p.out, p.out_stride) + n0 * p.out_stride[2], Rows{nullptr, 0, n},
                   p.out_stride[2], p.out_stride[3], Ev, ot, static_cast<size_t>(kPackChunk), n);
  }
  const size_t c0 = static_cast<size_t>(g.margin + n0);
  RowsumOfProducts(plan.dot(slot) + c0, ld, ot, static_cast<size_t>(kPackChunk), Ev, n,
                   plan.delta(slot) + c0);
  FillWindowRows(g, n0, count, plan.e_pad, T(0), plan.dkt(slot));
  FillWindowRows(g, n0, count, plan.ev_pad, T(0), plan.dvt(slot));
  FillMargins(g, n0, count, 1, std::numeric_limits<T>::infinity(), plan.lse(slot));
  FillMargins(g, n0, count, 1, T(0), plan.delta(slot));
  PackLse(static_cast<const T*>(p.lse) + b * p.lse_stride[0] + h * p.lse_stride[1],
          p.lse_stride[2], n0, n0 + count, p.len_q, plan.lse(slot) + c0);
}

// One band of one head of the packed group: dQ of its queries, and their terms of dK and dV.
template <typename T, typename IO>
void BandTask(void* ctx, std::int64_t task, int thread) {
  const WindowBackwardPlan<T>& plan = *static_cast<const WindowBackwardPlan<T>*>(ctx);
  const AttentionBackwardParams& bp = *plan.bp;
  const AttentionParams& p = bp.fwd;
  const WindowGeometry<T>& g = *plan.g;
  const hn::ScalableTag<T> d;
  const size_t L = hn::Lanes(d);
  const std::int64_t per_head = plan.bands_in(plan.phase);
  const std::int64_t slot = task / per_head;
  const std::int64_t band = plan.phases * (task % per_head) + plan.phase;
  const std::int64_t bh = plan.group_first + slot;
  const std::int64_t b = bh / p.heads, h = bh % p.heads;
  const size_t count = static_cast<size_t>(g.count), ld = plan.ld();
  const size_t E = static_cast<size_t>(p.dim_qk);
  ScratchCarver<T> carve(plan.scratch + static_cast<size_t>(thread) * plan.scratch_elems);
  T* S = carve.take(kOffsetChunk * L);     // (chunk, L) scores, then P
  T* G = carve.take(kOffsetChunk * L);     // (chunk, L) dP, then dS
  T* acc = carve.take(plan.e_pad * L);     // (e_pad, L) dQ^T
  T* lanes_i = carve.take(L);              // (L,) each lane's pixel row
  T* lanes_j = carve.take(L);              // (L,) and column
  IO* dq = static_cast<IO*>(bp.dq) + offset4(bp.dq_stride, b, h, 0, 0);
  const T scale = static_cast<T>(p.scale);
  const T *qt = plan.qt(slot), *kt = plan.kt(slot), *vt = plan.vt(slot), *dot = plan.dot(slot);
  T *dkt = plan.dkt(slot), *dvt = plan.dvt(slot);
  const std::int64_t v_end = std::min(g.vectors, (band + 1) * plan.band_vectors);
  for (std::int64_t vec = band * plan.band_vectors; vec < v_end; ++vec) {
    const std::int64_t q0 = vec * static_cast<std::int64_t>(L);
    const size_t lanes = static_cast<size_t>(std::min<std::int64_t>(L, p.len_q - q0));
    const size_t col = static_cast<size_t>(g.margin + q0);
    const bool interior = g.interior(q0);
    if (!interior) LanePositions(d, g, q0, lanes_i, lanes_j);
    // Masked scores are -inf and the lse is +inf for lanes that saw no key: exp gives 0 either
    // way, never exp(-inf + inf).
    const auto lse = hn::Load(d, plan.lse(slot) + col);
    const auto D = hn::Load(d, plan.delta(slot) + col);
    for (size_t o0 = 0; o0 < count; o0 += kOffsetChunk) {
      const size_t n = std::min(kOffsetChunk, count - o0);
      const std::int64_t* off = g.off.data() + o0;
      VectorDots(d, g, off, n, qt + col, kt + col, plan.e_pad, S, false);
      VectorDots(d, g, off, n, dot + col, vt + col, plan.ev_pad, G, false);
      if (!interior) MaskOutside(d, g, g.dr.data() + o0, g.dc.data() + o0, n, lanes_i, lanes_j, S);
      for (size_t o = 0; o < n; ++o) {
        const auto pr = ExpOf(d, hn::Sub(hn::Load(d, S + o * L), lse));
        hn::Store(pr, d, S + o * L);
        hn::Store(hn::Mul(pr, hn::Sub(hn::Load(d, G + o * L), D)), d, G + o * L);
      }
      for (size_t e0 = 0; e0 < plan.e_pad; e0 += kRowsPerSweep) {
        const size_t quads = std::min(kMaxQuads, (plan.e_pad - e0) / 4);
        VectorCombine(d, g, off, n, G, kt + e0 * ld + col, quads, acc + e0 * L, false, o0 > 0,
                      hn::Zero(d), nullptr);
      }
      const std::uint16_t* order = plan.scatter_order + o0;
      VectorScatter(d, g, off, n, order, G, qt + col, plan.e_pad, dkt + col);
      VectorScatter(d, g, off, n, order, S, dot + col, plan.ev_pad, dvt + col);
    }
    for (size_t lane = 0; lane < lanes; ++lane) {
      IO* o = dq + (q0 + static_cast<std::int64_t>(lane)) * bp.dq_stride[2];
      for (size_t e = 0; e < E; ++e) {
        o[static_cast<std::int64_t>(e) * bp.dq_stride[3]] = Store<IO>(acc[e * L + lane] * scale);
      }
    }
  }
}

// dst[n * stride[2] + e * stride[3]] = src[e * ld + n - n0] for positions [n0, n1) and rows
// e < width: rows of positions, as the packed planes hold them, back into one head's (positions,
// width) slice of dK or dV (dst at (b, h, 0, 0)); stream: past the caches (cpu/result_stores.h).
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

// Writes positions [n0, n0 + kPackChunk) of one head's dK and dV.
template <typename T, typename IO>
void UnpackTask(void* ctx, std::int64_t task, int /*thread*/) {
  const WindowBackwardPlan<T>& plan = *static_cast<const WindowBackwardPlan<T>*>(ctx);
  const AttentionBackwardParams& bp = *plan.bp;
  const AttentionParams& p = bp.fwd;
  const PackChunk chunk(task, plan.pack_tasks_per_head, plan.group_first, p.heads, p.len_q);
  const size_t col = static_cast<size_t>(plan.g->margin + chunk.n0);
  const std::int64_t n1 = chunk.n0 + chunk.count;
  WriteRows(plan.dkt(chunk.slot) + col, plan.ld(), chunk.n0, n1, p.dim_qk,
            static_cast<IO*>(bp.dk) + offset4(bp.dk_stride, chunk.b, chunk.h, 0, 0), bp.dk_stride,
            plan.stream_grads);
  WriteRows(plan.dvt(chunk.slot) + col, plan.ld(), chunk.n0, n1, p.dim_v,
            static_cast<IO*>(bp.dv) + offset4(bp.dv_stride, chunk.b, chunk.h, 0, 0), bp.dv_stride,
            plan.stream_grads);
}

// The unblocked backward: whole heads packed (a group at a time), bands of vectors in phases,
// then dK and dV written out.
template <typename T, typename IO>
Status WholeHeadBackward(const AttentionBackwardParams& bp, const Host& host,
                         const WindowGeometry<T>& g, size_t e_pad, size_t ev_pad,
                         bool stream_grads) {
  const AttentionParams& p = bp.fwd;
  const std::int64_t L = g.lanes;
  WindowBackwardPlan<T> plan;
  plan.bp = &bp;
  plan.g = &g;
  plan.e_pad = e_pad;
  plan.ev_pad = ev_pad;
  std::vector<std::uint16_t> scatter_order(static_cast<size_t>(g.count));
  for (size_t o0 = 0; o0 < scatter_order.size(); o0 += kOffsetChunk) {
    const size_t n = std::min(kOffsetChunk, scatter_order.size() - o0);
    std::uint16_t* ord = scatter_order.data() + o0;
    std::iota(ord, ord + n, std::uint16_t{0});
    std::sort(ord, ord + n, [&](std::uint16_t x, std::uint16_t y) {
      const size_t a = o0 + x, b = o0 + y;
      return g.dc[a] != g.dc[b] ? g.dc[a] < g.dc[b] : g.dr[a] < g.dr[b];
    });
  }
  plan.scatter_order = scatter_order.data();
  plan.pack_tasks_per_head = (p.len_q + kPackChunk - 1) / kPackChunk;
  plan.head_elems = (3 * plan.e_pad + 3 * plan.ev_pad + 2) * plan.ld();
  // Bands r and r + P reach disjoint keys when (P - 1) bands span off_max - off_min. P depends
  // on the problem only, never on the thread count, so that every thread count sums each key's
  // terms in the same order. P = 3 phases: a 128x128 head under a 15x15 window then has 18
  // bands (6 per phase, 3 rounds of 2 threads each) where P = 2 gave 10 of twice the size (5 per
  // phase: a round with one thread idle).
  plan.phases = 3;
  plan.stream_grads = stream_grads;
  plan.band_vectors = std::max<std::int64_t>(
      1, (g.off_max - g.off_min + (plan.phases - 1) * L - 1) / ((plan.phases - 1) * L));
  plan.bands = (g.vectors + plan.band_vectors - 1) / plan.band_vectors;
  const size_t lanes = static_cast<size_t>(L);
  plan.scratch_elems = 2 * ScratchCarver<T>::padded(kOffsetChunk * lanes) +
                       ScratchCarver<T>::padded(plan.e_pad * lanes) +
                       2 * ScratchCarver<T>::padded(lanes);
  // The packing tasks' O^T chunk.
  plan.scratch_elems = std::max(plan.scratch_elems, plan.ev_pad * static_cast<size_t>(kPackChunk));
  return RunHeadGroups<T>(host, p.batch * p.heads, "attention_backward (window)", plan, [&] {
    run_tasks(host, plan.group_size * plan.pack_tasks_per_head, &plan, BackwardPackTask<T, IO>);
    for (plan.phase = 0; plan.phase < std::min(plan.phases, plan.bands); ++plan.phase) {
      run_tasks(host, plan.group_size * plan.bands_in(plan.phase), &plan, BandTask<T, IO>);
    }
    run_tasks(host, plan.group_size * plan.pack_tasks_per_head, &plan, UnpackTask<T, IO>);
  });
}

// Positions whose O^T a band packs at a time for D = rowsum(dO * O): 16 KiB at Ev = 16, where
// a band's whole O^T took 128 KiB at width 256 beside ~1.7 MB of planes in a 2 MB L2. Against
// the whole band (session 34, builds alternated 5-6 rounds, medians): the 1x1 window's backward
// (the fixed part) 9.49 -> 8.64 ms at 256x256 and 2.16 -> 2.05 ms at 128x128 on two threads,
// 18.2 -> 17.3 ms at 256x256 on one; the diamond 15 within noise (+1.2%, -2.5%, +2.5%).
constexpr std::int64_t kDeltaChunk = 256;

// A blocked task's arrays in its thread's scratch (base null: only counts them into `elems`):
// scores and their gradients for R = kBlockRows vectors at the window's `count` offsets, the R
// vectors' dQ^T, three lane vectors (a vector's pixel rows and columns for the border mask; the
// softmax scale), and O^T of kDeltaChunk queries for D = rowsum(dO * O).
template <typename T>
struct BlockScratch {
  T* S;        // (R, count, L) scores, then P
  T* G;        // (R, count, L) dP, then dS
  T* acc;      // (R, e_pad, L)
  T* lanes_i;  // (L,)
  T* lanes_j;  // (L,)
  T* scale;    // (L,)
  T* ot;       // (ev_pad, kDeltaChunk)
  size_t elems;
  BlockScratch(T* base, size_t count, size_t e_pad, size_t ev_pad, size_t L) {
    ScratchCarver<T> carve(base);
    S = carve.take(kBlockRows * count * L);
    G = carve.take(kBlockRows * count * L);
    acc = carve.take(kBlockRows * e_pad * L);
    lanes_i = carve.take(L);
    lanes_j = carve.take(L);
    scale = carve.take(L);
    ot = carve.take(ev_pad * static_cast<size_t>(kDeltaChunk));
    elems = carve.used();
  }
};

// One thread's planes for the blocked backward, each (rows, ld) with position n at column
// n - origin: the keys [lo, hi) that its walk down a head has reached and not yet written out,
// K^T, V^T and the sums dK^T, dV^T; and the band's queries Q^T (scaled), dO^T, the lse (+inf
// for a row that saw no key and past the last query, so that P = exp(S - lse) is 0 there) and
// D = rowsum(dO * O), in the same columns (the kernels read both at one column and ld).
template <typename T>
struct GradStream : StreamSpan {
  T *kt, *vt, *dkt, *dvt;      // (e_pad, ld), (ev_pad, ld), (e_pad, ld), (ev_pad, ld)
  T *qt, *dot, *lse, *delta;   // (e_pad, ld), (ev_pad, ld), (1, ld), (1, ld)

  static size_t Elems(size_t ld, size_t e_pad, size_t ev_pad) {
    return (3 * e_pad + 3 * ev_pad + 2) * ld;
  }
  // Carves the planes from base. The padding rows (E .. e_pad of Q^T and K^T, Ev .. ev_pad of
  // dO^T and V^T) enter every product as zeros and are never written after; those of dK^T and
  // dV^T only ever receive zeros times P and are never read.
  void Carve(T* base, size_t ld_, size_t E, size_t e_pad, size_t Ev, size_t ev_pad) {
    ld = ld_;
    kt = base;
    vt = kt + e_pad * ld;
    dkt = vt + ev_pad * ld;
    dvt = dkt + e_pad * ld;
    qt = dvt + ev_pad * ld;
    dot = qt + e_pad * ld;
    lse = dot + ev_pad * ld;
    delta = lse + ld;
    for (T* plane : {qt, kt}) std::fill(plane + E * ld, plane + e_pad * ld, T(0));
    for (T* plane : {dot, vt}) std::fill(plane + Ev * ld, plane + ev_pad * ld, T(0));
  }
  // Zeroes the sums of the keys at columns [c0, c1): E rows of dK^T and Ev of dV^T.
  void ZeroSums(size_t E, size_t Ev, size_t c0, size_t c1) {
    for (size_t r = 0; r < E; ++r) std::fill(dkt + r * ld + c0, dkt + r * ld + c1, T(0));
    for (size_t r = 0; r < Ev; ++r) std::fill(dvt + r * ld + c0, dvt + r * ld + c1, T(0));
  }
};

// The blocked backward's walk: each head cut into bands of blocks_per_band block rows (band
// positions), bands into segments of bands_per_segment. A task runs one segment's bands in
// order on its thread's planes, each band's dQ written out, and each key's dK and dV written
// out once no later band of the segment reaches it. Keys that two neighbouring segments reach
// (span positions around each boundary B: [B + min(off_min, 0), B + max(off_max, 0))) are
// summed by each segment apart, into the halo buffers, and added by a second pass: trailing sum
// of the segment before B, then leading sum of the one after. Segments depend on the problem
// only, so every thread count sums each key's terms in one order.
template <typename T>
struct StreamBackwardPlan {
  const AttentionBackwardParams* bp;
  const WindowGeometry<T>* g;  // ld: the planes' row length
  size_t e_pad, ev_pad;
  std::int64_t blocks_per_band, band;  // block rows, positions
  std::int64_t bands;                  // per head
  std::int64_t bands_per_segment, segments;
  std::int64_t span;
  bool stream_grads = false;  // dQ, dK and dV past the caches (cpu/result_stores.h)
  // Planes and scratch for the threads that run segments: at most one a task, however many
  // threads the host has (64 threads would otherwise hold 64 x 4.5 MB of planes at 256x256,
  // E = Ev = 16, for the 8 tasks of 4 heads). A thread claims its slot at its first task.
  GradStream<T>* streams;  // (slots,)
  T* scratch;              // (slots, scratch_elems) BlockScratch
  size_t scratch_elems;
  std::int64_t* slot_of;             // (threads,) the thread's slot, or -1
  std::atomic<std::int64_t>* slots_taken;
  T* halos;  // (pairs, segments - 1, 2, E + Ev, span): per boundary, the trailing then leading sums

  std::int64_t lo(std::int64_t p0) const { return StreamLo(*g, p0); }
  std::int64_t hi(std::int64_t p1) const { return StreamHi(*g, p1); }
  // Halo buffer `side` (0 trailing, 1 leading) of boundary k (after segment k) of head bh.
  T* halo(std::int64_t bh, std::int64_t k, int side) const {
    const std::int64_t rows = bp->fwd.dim_qk + bp->fwd.dim_v;
    return halos + static_cast<size_t>(((bh * (segments - 1) + k) * 2 + side) * rows * span);
  }
};

// dQ of the blocks of one strip's walk over the stream's band, and their terms of dK and dV
// added to the stream's dK^T and dV^T.
template <typename T, typename IO>
void ScatterBlocks(const StreamBackwardPlan<T>& plan, const GradStream<T>& s,
                   const BlockWalk& walk, const BlockScratch<T>& arrays) {
  const AttentionBackwardParams& bp = *plan.bp;
  const AttentionParams& p = bp.fwd;
  const WindowGeometry<T>& g = *plan.g;
  const hn::ScalableTag<T> d;
  const size_t L = hn::Lanes(d);
  constexpr size_t R = kBlockRows;
  const size_t count = static_cast<size_t>(g.count), ld = s.ld;
  T *S = arrays.S, *G = arrays.G, *acc = arrays.acc;
  const size_t acc_ld = plan.e_pad * L;  // between the block's R vectors of dQ^T
  IO* dq = static_cast<IO*>(bp.dq) + offset4(bp.dq_stride, walk.b, walk.h, 0, 0);
  for (std::int64_t a = walk.a_begin, v0; (v0 = walk.first(a)) >= 0; ++a) {
    const size_t col = static_cast<size_t>(v0 * walk.L - s.origin);
    BlockDots(d, g, s.qt + col, s.kt + col, plan.e_pad, S);
    BlockDots(d, g, s.dot + col, s.vt + col, plan.ev_pad, G);
    for (size_t k = 0; k < R; ++k) {
      // Vectors past the last query read zeros, where the lse is +inf and D is 0: their P and
      // dS are 0, and they scatter nothing (their dQ rows are not stored).
      T* Sk = S + k * count * L;
      T* Gk = G + k * count * L;
      MaskBlockVector(d, g, walk.position(v0, k), Sk, arrays.lanes_i, arrays.lanes_j, false);
      // Masked scores are -inf and the lse is +inf for lanes that saw no key: exp gives 0
      // either way, never exp(-inf + inf).
      const size_t ck = col + static_cast<size_t>(k) * static_cast<size_t>(g.block_stride);
      const auto lse_k = hn::Load(d, s.lse + ck), D_k = hn::Load(d, s.delta + ck);
      for (size_t o = 0; o < count; ++o) {
        const auto pr = ExpOf(d, hn::Sub(hn::Load(d, Sk + o * L), lse_k));
        hn::Store(pr, d, Sk + o * L);
        hn::Store(hn::Mul(pr, hn::Sub(hn::Load(d, Gk + o * L), D_k)), d, Gk + o * L);
      }
    }
    for (size_t e0 = 0; e0 < plan.e_pad; e0 += 4) {
      BlockCombine(d, g, G, s.kt + e0 * ld + col, acc + e0 * L, acc_ld);
    }
    for (size_t k = 0; k < R; ++k) {
      const std::int64_t q0 = walk.position(v0, k);
      if (q0 >= g.positions()) break;
      StoreLanes(d, acc + k * acc_ld, static_cast<size_t>(p.dim_qk), g.valid_lanes(q0),
                 arrays.scale, dq, g.tensor_position(q0), bp.dq_stride[2], bp.dq_stride[3],
                 plan.stream_grads);
    }
    BlockScatter(d, g, S, s.dot + col, plan.ev_pad, s.dvt + col);  // dV^T += P dO^T
    BlockScatter(d, g, G, s.qt + col, plan.e_pad, s.dkt + col);    // dK^T += dS Q^T (Q scaled)
  }
}

// Makes keys [lo, hi) of head bh packed in s, with zero sums: keeps those already there from the
// same head's walk (K^T and V^T, and the sums of keys not yet written out), moving them to the
// front when the planes would overflow, and packs the rest. Anything else starts over (every
// sum the planes held has been written out by then).
template <typename T, typename IO>
HWY_INLINE void StreamGradKeys(const AttentionParams& p, const WindowGeometry<T>& g,
                               std::int64_t bh, std::int64_t lo, std::int64_t hi,
                               GradStream<T>& s) {
  const std::int64_t b = bh / p.heads, h = bh % p.heads;
  const std::int64_t L = g.lanes;
  const size_t E = static_cast<size_t>(p.dim_qk), Ev = static_cast<size_t>(p.dim_v);
  const std::int64_t from =
      SlideStream<T>(s, L, bh, lo, hi, {{s.kt, E}, {s.dkt, E}, {s.vt, Ev}, {s.dvt, Ev}});
  StreamPixels(g, static_cast<const IO*>(p.k) + b * p.k_stride[0] + h * p.k_stride[1],
               p.k_stride, from, hi, E, s.kt, s.ld, s.origin);
  StreamPixels(g, static_cast<const IO*>(p.v) + b * p.v_stride[0] + h * p.v_stride[1],
               p.v_stride, from, hi, Ev, s.vt, s.ld, s.origin);
  s.ZeroSums(E, Ev, static_cast<size_t>(from - s.origin), static_cast<size_t>(hi - s.origin));
}

// Packs the queries [p0, p1) of head bh into s: Q^T (scaled), dO^T, the lse and D.
template <typename T, typename IO>
HWY_INLINE void StreamGradQueries(const AttentionBackwardParams& bp, const WindowGeometry<T>& g,
                                  std::int64_t bh, std::int64_t p0, std::int64_t p1,
                                  const GradStream<T>& s, T* ot) {
  const AttentionParams& p = bp.fwd;
  const std::int64_t b = bh / p.heads, h = bh % p.heads;
  const size_t E = static_cast<size_t>(p.dim_qk), Ev = static_cast<size_t>(p.dim_v);
  auto head = [&](const void* base, const std::int64_t* stride) {
    return static_cast<const IO*>(base) + b * stride[0] + h * stride[1];
  };
  StreamPixels(g, head(p.q, p.q_stride), p.q_stride, p0, p1, E, s.qt, s.ld, s.origin,
               static_cast<T>(p.scale));
  StreamPixels(g, head(bp.dout, bp.dout_stride), bp.dout_stride, p0, p1, Ev, s.dot, s.ld,
               s.origin);
  // D = rowsum(dO * O), vectorised over positions from O^T (Ev, kDeltaChunk) in the scratch.
  for (std::int64_t a = p0; a < p1; a += kDeltaChunk) {
    const std::int64_t a_end = std::min(p1, a + kDeltaChunk);
    const size_t n = static_cast<size_t>(a_end - a);
    StreamPixels(g, head(p.out, p.out_stride), p.out_stride, a, a_end, Ev, ot,
                 static_cast<size_t>(kDeltaChunk), a);
    RowsumOfProducts(s.dot + (a - s.origin), s.ld, ot, static_cast<size_t>(kDeltaChunk), Ev, n,
                     s.delta + (a - s.origin));
  }
  PackLse(g, static_cast<const T*>(p.lse) + b * p.lse_stride[0] + h * p.lse_stride[1],
          p.lse_stride[2], p0, p1, s.lse + (p0 - s.origin));
}

// dK and dV of head bh's positions [n0, n1) (those of pixels in the map) from sums laid out in
// rows ld apart, dK^T's at dk_sums and dV^T's at dv_sums (both at n0's column).
template <typename T, typename IO>
HWY_INLINE void WriteKeyGrads(const StreamBackwardPlan<T>& plan, std::int64_t bh,
                              const T* dk_sums, const T* dv_sums, size_t ld, std::int64_t n0,
                              std::int64_t n1) {
  const AttentionBackwardParams& bp = *plan.bp;
  const AttentionParams& p = bp.fwd;
  const std::int64_t b = bh / p.heads, h = bh % p.heads;
  WritePixels(*plan.g, dk_sums, ld, n0, n1, p.dim_qk,
              static_cast<IO*>(bp.dk) + offset4(bp.dk_stride, b, h, 0, 0), bp.dk_stride,
              plan.stream_grads);
  WritePixels(*plan.g, dv_sums, ld, n0, n1, p.dim_v,
              static_cast<IO*>(bp.dv) + offset4(bp.dv_stride, b, h, 0, 0), bp.dv_stride,
              plan.stream_grads);
}

// Writes the sums of keys [m0, m1) out of s: into the halo buffer `halo` (rows of `span`, its
// column 0 at position halo_lo) when one is given, else into dK and dV for those inside the map.
template <typename T, typename IO>
HWY_INLINE void WriteGradKeys(const StreamBackwardPlan<T>& plan, const GradStream<T>& s,
                              std::int64_t bh, std::int64_t m0, std::int64_t m1, T* halo,
                              std::int64_t halo_lo) {
  if (m0 >= m1) return;
  const AttentionParams& p = plan.bp->fwd;
  const size_t E = static_cast<size_t>(p.dim_qk), Ev = static_cast<size_t>(p.dim_v);
  const size_t c0 = static_cast<size_t>(m0 - s.origin), n = static_cast<size_t>(m1 - m0);
  if (halo != nullptr) {
    const size_t span = static_cast<size_t>(plan.span), h0 = static_cast<size_t>(m0 - halo_lo);
    for (size_t r = 0; r < E; ++r) {
      std::copy_n(s.dkt + r * s.ld + c0, n, halo + r * span + h0);
    }
    for (size_t r = 0; r < Ev; ++r) {
      std::copy_n(s.dvt + r * s.ld + c0, n, halo + (E + r) * span + h0);
    }
    return;
  }
  WriteKeyGrads<T, IO>(plan, bh, s.dkt + c0, s.dvt + c0, s.ld, m0, m1);
}

// One segment of one head: its bands in order on this thread's planes.
template <typename T, typename IO>
void SegmentTask(void* ctx, std::int64_t task, int thread) {
  const StreamBackwardPlan<T>& plan = *static_cast<const StreamBackwardPlan<T>*>(ctx);
  const AttentionBackwardParams& bp = *plan.bp;
  const AttentionParams& p = bp.fwd;
  const WindowGeometry<T>& g = *plan.g;
  const size_t L = VectorLanes<T>();
  const std::int64_t bh = task / plan.segments, seg = task % plan.segments;
  const std::int64_t first = seg * plan.bands_per_segment;
  const std::int64_t last = std::min(first + plan.bands_per_segment, plan.bands);  // exclusive
  const std::int64_t P0 = first * plan.band, P1 = last * plan.band;
  // Keys below lead_end (seg > 0) are also the segment before's; from trail_begin on (all but
  // the last segment) also the one after's.
  const std::int64_t lead_end = seg > 0 ? plan.hi(P0) : std::numeric_limits<std::int64_t>::min();
  const std::int64_t trail_begin =
      seg + 1 < plan.segments ? plan.lo(P1) : std::numeric_limits<std::int64_t>::max();
  std::int64_t& slot = plan.slot_of[thread];
  if (slot < 0) slot = (*plan.slots_taken)++;
  GradStream<T>& s = plan.streams[slot];
  const BlockScratch<T> arrays(plan.scratch + static_cast<size_t>(slot) * plan.scratch_elems,
                               static_cast<size_t>(g.count), plan.e_pad, plan.ev_pad, L);
  std::fill(arrays.scale, arrays.scale + L, static_cast<T>(p.scale));  // dQ = scale dS K
  std::int64_t written = plan.lo(P0);  // keys below are written out
  for (std::int64_t band = first; band < last; ++band) {
    const std::int64_t p0 = band * plan.band, p1 = p0 + plan.band;
    StreamGradKeys<T, IO>(p, g, bh, plan.lo(p0), plan.hi(p1), s);
    StreamGradQueries<T, IO>(bp, g, bh, p0, p1, s, arrays.ot);
    for (std::int64_t c = 0; c < g.block_stride / g.lanes; ++c) {
      const BlockWalk walk(g, 0, c, band * plan.blocks_per_band, plan.blocks_per_band, bh,
                           p.heads);
      ScatterBlocks<T, IO>(plan, s, walk, arrays);
    }
    // Keys below lo(p1) are past every later band's reach.
    const std::int64_t done = band + 1 < last ? plan.lo(p1) : plan.hi(P1);
    const std::int64_t to_lead = std::min(done, lead_end), to_out = std::min(done, trail_begin);
    if (written < to_lead) {
      WriteGradKeys<T, IO>(plan, s, bh, written, to_lead, plan.halo(bh, seg - 1, 1), plan.lo(P0));
      written = to_lead;
    }
    if (written < to_out) {
      WriteGradKeys<T, IO>(plan, s, bh, written, to_out, nullptr, 0);
      written = to_out;
    }
    if (written < done) {
      WriteGradKeys<T, IO>(plan, s, bh, written, done, plan.halo(bh, seg, 0), plan.lo(P1));
      written = done;
    }
  }
  // The next segment, should this thread run it, starts its sums of the shared keys from zero.
  if (seg + 1 < plan.segments) {
    s.ZeroSums(static_cast<size_t>(p.dim_qk), static_cast<size_t>(p.dim_v),
               static_cast<size_t>(trail_begin - s.origin),
               static_cast<size_t>(plan.hi(P1) - s.origin));
  }
}

// dK and dV of the keys around one boundary: the trailing sum plus the leading one.
template <typename T, typename IO>
void HaloTask(void* ctx, std::int64_t task, int /*thread*/) {
  const StreamBackwardPlan<T>& plan = *static_cast<const StreamBackwardPlan<T>*>(ctx);
  const AttentionParams& p = plan.bp->fwd;
  const std::int64_t bh = task / (plan.segments - 1), k = task % (plan.segments - 1);
  const std::int64_t B = (k + 1) * plan.bands_per_segment * plan.band;
  const std::int64_t lo = plan.lo(B);
  const std::int64_t n0 = std::max<std::int64_t>(lo, 0);
  const std::int64_t n1 = std::min(plan.hi(B), plan.g->positions());
  if (n0 >= n1) return;
  T* sum = plan.halo(bh, k, 0);
  const T* lead = plan.halo(bh, k, 1);
  const size_t span = static_cast<size_t>(plan.span), c0 = static_cast<size_t>(n0 - lo);
  const size_t c1 = static_cast<size_t>(n1 - lo);
  for (size_t r = 0; r < static_cast<size_t>(p.dim_qk + p.dim_v); ++r) {
    for (size_t c = c0; c < c1; ++c) sum[r * span + c] += lead[r * span + c];
  }
  WriteKeyGrads<T, IO>(plan, bh, sum + c0, sum + static_cast<size_t>(p.dim_qk) * span + c0,
                       span, n0, n1);
}

// Segments a head wants so that a problem of few heads still gives the threads work: 8 tasks
// at least, where the halo costs allow (a segment spans 2 halos' worth of keys at least).
constexpr std::int64_t kMinSegmentTasks = 8;

template <typename T, typename IO>
Status StreamBackward(const AttentionBackwardParams& bp, const Host& host,
                      const WindowGeometry<T>& g, size_t e_pad, size_t ev_pad,
                      bool stream_grads) {
  const AttentionParams& p = bp.fwd;
  const size_t L = VectorLanes<T>(), count = static_cast<size_t>(g.count);
  const int threads = std::max(host.num_threads, 1);
  const std::int64_t pairs = p.batch * p.heads;
  StreamBackwardPlan<T> plan;
  plan.bp = &bp;
  plan.e_pad = e_pad;
  plan.ev_pad = ev_pad;
  plan.stream_grads = stream_grads;
  // L2 holds the keys a band reaches, with their sums: 2 (e_pad + ev_pad) rows; two block rows at
  // least (the header says why).
  plan.blocks_per_band = std::max<std::int64_t>(
      2, StreamBlocksPerBand(g, static_cast<std::int64_t>(2 * (e_pad + ev_pad) * sizeof(T))));
  plan.band = plan.blocks_per_band * static_cast<std::int64_t>(kBlockRows) * g.block_stride;
  plan.bands = (BlocksPerStrip(g) + plan.blocks_per_band - 1) / plan.blocks_per_band;
  plan.span = StreamHi(g, 0) - StreamLo(g, 0);
  const std::int64_t min_bands =
      std::max<std::int64_t>(1, (2 * plan.span + plan.band - 1) / plan.band);
  const std::int64_t wanted = (kMinSegmentTasks + pairs - 1) / pairs;
  plan.bands_per_segment = std::max(min_bands, (plan.bands + wanted - 1) / wanted);
  plan.segments = (plan.bands + plan.bands_per_segment - 1) / plan.bands_per_segment;
  const size_t ld = KeyStream<T>::RowLength(g, plan.band);
  const size_t plane_elems = ScratchCarver<T>::padded(GradStream<T>::Elems(ld, e_pad, ev_pad));
  plan.scratch_elems = BlockScratch<T>(nullptr, count, e_pad, ev_pad, L).elems;
  const size_t halo_elems = static_cast<size_t>(pairs * (plan.segments - 1) * 2 *
                                                (p.dim_qk + p.dim_v) * plan.span);
  const std::int64_t slots = std::min<std::int64_t>(threads, pairs * plan.segments);
  const size_t elems = (plane_elems + plan.scratch_elems) * static_cast<size_t>(slots) +
                       halo_elems;
  Workspace ws(host);
  const Status reserved = ws.reserve(elems * sizeof(T), "attention_backward (window)");
  if (!reserved.ok()) return reserved;
  T* planes = reinterpret_cast<T*>(ws.data());
  plan.scratch = planes + plane_elems * static_cast<size_t>(slots);
  plan.halos = plan.scratch + plan.scratch_elems * static_cast<size_t>(slots);
  std::vector<GradStream<T>> streams(static_cast<size_t>(slots));
  std::vector<std::int64_t> slot_of(static_cast<size_t>(threads), -1);
  std::atomic<std::int64_t> slots_taken{0};
  plan.slot_of = slot_of.data();
  plan.slots_taken = &slots_taken;
  for (size_t t = 0; t < streams.size(); ++t) {
    streams[t].Carve(planes + t * plane_elems, ld, static_cast<size_t>(p.dim_qk), e_pad,
                     static_cast<size_t>(p.dim_v), ev_pad);
  }
  plan.streams = streams.data();
  // The kernels read rows ld apart from the geometry.
  WindowGeometry<T> gs = g;
  gs.ld = static_cast<std::int64_t>(ld);
  plan.g = &gs;
  run_tasks(host, pairs * plan.segments, &plan, SegmentTask<T, IO>);
  if (plan.segments > 1) run_tasks(host, pairs * (plan.segments - 1), &plan, HaloTask<T, IO>);
  return Status::Ok();
}

template <typename T, typename IO>
Status WindowBackward(const AttentionBackwardParams& bp, const Host& host) {
  const AttentionParams& p = bp.fwd;
  if (p.batch == 0 || p.heads == 0 || p.len_q == 0) return Status::Ok();
  const WindowGeometry<T> g(*p.window, static_cast<std::int64_t>(VectorLanes<T>()), kBlockRows,
                            kBlockOffsets);
  const size_t e_pad = static_cast<size_t>(round_up(std::max<std::int64_t>(p.dim_qk, 1), 4));
  const size_t ev_pad = static_cast<size_t>(round_up(std::max<std::int64_t>(p.dim_v, 1), 4));
  const bool stream_grads =
      stream_results(host, gradient_bytes(p, static_cast<std::int64_t>(sizeof(IO))));
  if (g.block_rows > 1) return StreamBackward<T, IO>(bp, host, g, e_pad, ev_pad, stream_grads);
  return WholeHeadBackward<T, IO>(bp, host, g, e_pad, ev_pad, stream_grads);
}

ATTN2D_DTYPE_INSTANCES(WindowBackward, WindowBackward, AttentionBackwardParams)

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn2d {
namespace cpu {

ATTN2D_DTYPE_DISPATCH(WindowBackward, window_backward, AttentionBackwardParams)

}  // namespace cpu
}  // namespace attn2d
#endif  // HWY_ONCE
