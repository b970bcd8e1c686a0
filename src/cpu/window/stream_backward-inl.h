// The blocked backward streams (StreamBackward): a task walks one segment of a head's bands of
// query rows in order on its thread's planes (GradStream), packing each band's queries and the
// keys it newly reaches, summing dK and dV in the planes, and writing each key out once no later
// band of the segment reaches it; keys around a segment boundary are summed by both segments
// apart and added by a last pass, so segments need no phases. Whole heads packed at once (7.2 MB
// at 128x128, E = Ev = 16) would not stay in L2 (on an Intel Xeon, two threads, streaming runs
// a 15-offset diamond's backward at 128x128 1.1-1.4x as fast). Bands of one block row (what the
// L2 rule picks at 144 px and wider) make the scatter slower, so bands hold two block rows at
// least.
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_WINDOW_STREAM_BACKWARD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_WINDOW_STREAM_BACKWARD_INL_H_
#undef ATTN2D_SRC_CPU_WINDOW_STREAM_BACKWARD_INL_H_
#else
#define ATTN2D_SRC_CPU_WINDOW_STREAM_BACKWARD_INL_H_
#endif

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "attn2d/attention_params.h"
#include "attn2d/host.h"
#include "attn2d/status.h"
#include "core/strided.h"
#include "core/workspace.h"
#include "cpu/common/exp-inl.h"
#include "cpu/common/row_ops-inl.h"
#include "cpu/common/scratch.h"
#include "cpu/window/backward_rows-inl.h"
#include "cpu/window/block_ops-inl.h"
#include "cpu/window/lane_scores-inl.h"
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
    if (const T* out_accum = OutAccumAt<T>(p, b, h)) {
      StreamPixels(g, out_accum, p.out_accum_stride, a, a_end, Ev, ot,
                   static_cast<size_t>(kDeltaChunk), a);
    } else {
      StreamPixels(g, head(p.out, p.out_stride), p.out_stride, a, a_end, Ev, ot,
                   static_cast<size_t>(kDeltaChunk), a);
    }
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

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_WINDOW_STREAM_BACKWARD_INL_H_
