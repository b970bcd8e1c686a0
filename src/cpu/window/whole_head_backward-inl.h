// The unblocked backward (WholeHeadBackward: widths that neither are a multiple of L nor pitch
// to one within 4/3, window_geometry.h) packs whole heads and cuts each head's vectors into
// bands of B raster-consecutive vectors, (P - 1) B L >= max off - min off, so that band k reaches
// no key that band k + P reaches; the P phases run bands 0, P, 2P, ... in parallel, then bands
// 1, P + 1, ..., and so on. Every key's sum runs in one fixed order, whatever the thread count.
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_WINDOW_WHOLE_HEAD_BACKWARD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_WINDOW_WHOLE_HEAD_BACKWARD_INL_H_
#undef ATTN2D_SRC_CPU_WINDOW_WHOLE_HEAD_BACKWARD_INL_H_
#else
#define ATTN2D_SRC_CPU_WINDOW_WHOLE_HEAD_BACKWARD_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "attn2d/attention_params.h"
#include "attn2d/host.h"
#include "attn2d/status.h"
#include "core/strided.h"
#include "core/workspace.h"
#include "cpu/common/exp-inl.h"
#include "cpu/common/half.h"
#include "cpu/common/pack-inl.h"
#include "cpu/common/scratch.h"
#include "cpu/window/backward_rows-inl.h"
#include "cpu/window/lane_scores-inl.h"
#include "cpu/window/shifted_ops-inl.h"
#include "cpu/window/window_backward_plan-inl.h"
#include "cpu/window/window_geometry.h"
#include "cpu/window/window_pack-inl.h"
#include "cpu/window/window_plan-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

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
    if (const T* out_accum = OutAccumAt<T>(p, b, h)) {
      PackTransposed(out_accum + n0 * p.out_accum_stride[2], Rows{nullptr, 0, n},
                     p.out_accum_stride[2], p.out_accum_stride[3], Ev, ot,
                     static_cast<size_t>(kPackChunk), n);
    } else {
      PackTransposed(head(p.out, p.out_stride) + n0 * p.out_stride[2], Rows{nullptr, 0, n},
                     p.out_stride[2], p.out_stride[3], Ev, ot, static_cast<size_t>(kPackChunk),
                     n);
    }
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
  // bands (6 per phase, 3 rounds of 2 threads each) where P = 2 would give 10 of twice the size
  // (5 per phase: a round with one thread idle).
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

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_WINDOW_WHOLE_HEAD_BACKWARD_INL_H_
