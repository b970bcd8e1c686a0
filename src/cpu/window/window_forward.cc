// Forward of a window given as offsets (attn2d/window_offsets.h), vectorised across queries.
//
// One vector holds L consecutive raster queries q0..q0+L-1. For offset o = (dr, dc) their keys
// sit at the same raster distance off = dr * W + dc, so the L scores of that offset are
//   S(o) = sum_e Q^T[e, q0 : q0+L] * K^T[e, q0+off : q0+off+L],
// one contiguous load per e, and the output is
//   O^T[ev, q0 : q0+L] = sum_o P(o) * V^T[ev, q0+off : q0+off+L].
// That is E + Ev multiply-adds per (query, offset) pair, as many as a dense GEMM spends per
// pair, with no tile padding, no gather per visit and no horizontal reduction: each lane keeps
// its own row's max and sum. The tiled sparse kernel instead computes every pair of each visited
// 8x8-pixel tile pair: 2.5x the allowed pairs of a 15x15 square, 4.9x those of a diamond.
//
// Lanes whose key falls outside the map are masked to -inf (only vectors near the border need
// the mask). Where the window's columns are evenly spaced and the grid's width a multiple of L
// (every common image size; other widths within 4/3 of one on pitched rows, window_geometry.h),
// StreamBandTask computes 4 vectors one pixel row apart together, so each key and value load
// feeds up to 4 multiply-adds (block_ops-inl.h, BlockDots, BlockCombine); other widths take one
// vector at a time (QueryTask). Each thread packs the Q^T, K^T and V^T of the bands of query
// rows it runs just before it runs them, into planes that stay in its L2 (window_plan-inl.h,
// KeyStream); the other widths pack whole heads first, with zero margins on both sides so that
// every shifted load stays inside the buffer.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/window/window_forward.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attn2d/attention_params.h"
#include "attn2d/host.h"
#include "attn2d/status.h"
#include "attn2d/window_offsets.h"
#include "core/strided.h"
#include "core/workspace.h"
#include "cpu/attention_cpu.h"
#include "cpu/common/dtype_dispatch.h"
#include "cpu/common/exp-inl.h"
#include "cpu/common/row_ops-inl.h"
#include "cpu/common/scratch.h"
#include "cpu/common/tiling.h"
#include "cpu/window/block_ops-inl.h"
#include "cpu/window/lane_scores-inl.h"
#include "cpu/window/shifted_ops-inl.h"
#include "cpu/window/window_geometry.h"
#include "cpu/window/window_pack-inl.h"
#include "cpu/window/window_plan-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {

// Packs positions [n0, n0 + kPackChunk) of one head.
template <typename T, typename IO>
void PackTask(void* ctx, std::int64_t task, int /*thread*/) {
  const WindowPlan<T>& plan = *static_cast<const WindowPlan<T>*>(ctx);
  const AttentionParams& p = *plan.p;
  const WindowGeometry<T>& g = *plan.g;
  const PackChunk c(task, plan.pack_tasks_per_head, plan.group_first, p.heads, p.len_q);
  const size_t E = static_cast<size_t>(p.dim_qk), Ev = static_cast<size_t>(p.dim_v);
  auto head = [&](const void* base, const std::int64_t* stride) {
    return static_cast<const IO*>(base) + c.b * stride[0] + c.h * stride[1];
  };
  // The softmax scale goes into Q^T once, as the tiled kernels pre-scale their query tile.
  PackWindowRows(g, head(p.q, p.q_stride), p.q_stride, c.n0, c.count, E, plan.e_pad,
                 plan.qt(c.slot), static_cast<T>(p.scale));
  PackWindowRows(g, head(p.k, p.k_stride), p.k_stride, c.n0, c.count, E, plan.e_pad,
                 plan.kt(c.slot));
  PackWindowRows(g, head(p.v, p.v_stride), p.v_stride, c.n0, c.count, Ev, plan.ev_pad,
                 plan.vt(c.slot));
}

// The log-sum-exp of queries q0 .. q0 + lanes - 1 from their row max and exp sum (LogSumExp),
// a vector at a time rather than a libm log call a lane.
template <class D, typename T = hn::TFromD<D>>
HWY_INLINE void StoreLse(D d, const AttentionParams& p, std::int64_t b, std::int64_t h,
                         std::int64_t q0, size_t lanes, hn::Vec<D> row_max, hn::Vec<D> row_sum) {
  const auto lse = LogSumExp(d, row_max, row_sum);
  T* dst = static_cast<T*>(p.lse) + b * p.lse_stride[0] + h * p.lse_stride[1] +
           q0 * p.lse_stride[2];
  if (p.lse_stride[2] == 1) {
    hn::BlendedStore(lse, hn::FirstN(d, lanes), d, dst);
    return;
  }
  HWY_ALIGN T buf[HWY_MAX_BYTES / sizeof(T)];
  hn::Store(lse, d, buf);
  // lanes <= Lanes(d) (valid_lanes); the bound says so to GCC 12, which otherwise warns that
  // buf's lanes past a narrow target's vector may be read uninitialised.
  for (size_t lane = 0; lane < std::min(lanes, hn::Lanes(d)); ++lane) {
    dst[static_cast<std::int64_t>(lane) * p.lse_stride[2]] = buf[lane];
  }
}

// One task: up to kRowsPerTask query vectors of one head of the packed group.
template <typename T, typename IO>
void QueryTask(void* ctx, std::int64_t task, int thread) {
  const WindowPlan<T>& plan = *static_cast<const WindowPlan<T>*>(ctx);
  const AttentionParams& p = *plan.p;
  const WindowGeometry<T>& g = *plan.g;
  const hn::ScalableTag<T> d;
  const size_t L = hn::Lanes(d);
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const std::int64_t slot = task / plan.tasks_per_head;
  const std::int64_t bh = plan.group_first + slot;
  const std::int64_t b = bh / p.heads, h = bh % p.heads;
  const size_t count = static_cast<size_t>(g.count), ld = plan.ld();
  const size_t Ev = static_cast<size_t>(p.dim_v);
  ScratchCarver<T> carve(plan.scratch + static_cast<size_t>(thread) * plan.scratch_elems);
  T* S = carve.take(count * L);              // (count, L) scores, then probabilities
  T* acc = carve.take(kRowsPerSweep * L);    // (16, L) output rows of one sweep
  T* lanes_i = carve.take(L);                // (L,) each lane's pixel row
  T* lanes_j = carve.take(L);                // (L,) and column
  T* inv_l = carve.take(L);                  // (L,) 1 / softmax sum, 0 for an empty row
  IO* out = static_cast<IO*>(p.out) + offset4(p.out_stride, b, h, 0, 0);
  T* out_accum = OutAccumAt<T>(p, b, h);
  // A strip of vectors one above the other (a step of `per_row` vectors is the next pixel row,
  // exactly when the width is a multiple of L): the next vector's keys are 14 of the 15 rows of
  // keys a 15-row window just read, where in raster order they are one vector further along
  // each of its E x 15 key rows.
  const std::int64_t strip = (task % plan.tasks_per_head) % g.per_row;
  const std::int64_t r_begin = (task % plan.tasks_per_head) / g.per_row * kRowsPerTask;
  for (std::int64_t r = r_begin; r < r_begin + kRowsPerTask; ++r) {
    const std::int64_t vec = strip + r * g.per_row;
    if (vec >= g.vectors) break;
    const std::int64_t q0 = vec * static_cast<std::int64_t>(L);
    const size_t lanes = static_cast<size_t>(std::min<std::int64_t>(L, p.len_q - q0));
    const size_t col = static_cast<size_t>(g.margin + q0);
    const bool interior = g.interior(q0);
    auto vmax = VectorDots(d, g, g.off.data(), count, plan.qt(slot) + col, plan.kt(slot) + col,
                           plan.e_pad, S, interior);
    if (!interior) {
      LanePositions(d, g, q0, lanes_i, lanes_j);
      vmax = MaskOutside(d, g, g.dr.data(), g.dc.data(), count, lanes_i, lanes_j, S);
    }
    // exp against the row max (in the first output sweep); a row that sees no key (max -inf)
    // shifts by 0, so its exps are exp(-inf) = 0 and its sum 0.
    const auto empty = hn::Eq(vmax, hn::Set(d, kNegInf));
    const auto shift = hn::IfThenZeroElse(empty, vmax);
    auto sum = hn::Zero(d);
    for (size_t ev0 = 0; ev0 < plan.ev_pad; ev0 += kRowsPerSweep) {
      const size_t quads = std::min(kMaxQuads, (plan.ev_pad - ev0) / 4);
      VectorCombine(d, g, g.off.data(), count, S, plan.vt(slot) + ev0 * ld + col, quads, acc,
                    ev0 == 0, false, shift, &sum);
      if (ev0 == 0) {
        hn::Store(hn::IfThenZeroElse(empty, hn::Div(hn::Set(d, T(1)), sum)), d, inv_l);
        if (p.lse != nullptr) StoreLse(d, p, b, h, q0, lanes, vmax, sum);
      }
      const size_t rows = std::min(Ev, ev0 + 4 * quads) - ev0;
      const T* scale = inv_l;
      if (out_accum != nullptr) {  // StoreLanes scales acc in place: once
        StoreLanes(d, acc, rows, lanes, scale,
                   out_accum + static_cast<std::int64_t>(ev0) * p.out_accum_stride[3], q0,
                   p.out_accum_stride[2], p.out_accum_stride[3], /*stream=*/false);
        scale = nullptr;
      }
      StoreLanes(d, acc, rows, lanes, scale,
                 out + static_cast<std::int64_t>(ev0) * p.out_stride[3], q0, p.out_stride[2],
                 p.out_stride[3], /*stream=*/false);
    }
  }
}

// One task: band `task % tasks_per_head` (blocks_per_band block rows, window_plan-inl.h) of
// (batch, head) pair `task / tasks_per_head`, on the planes of this thread's stream.
template <typename T, typename IO>
void StreamBandTask(void* ctx, std::int64_t task, int thread) {
  const WindowPlan<T>& plan = *static_cast<const WindowPlan<T>*>(ctx);
  const AttentionParams& p = *plan.p;
  const WindowGeometry<T>& g = *plan.g;
  const hn::ScalableTag<T> d;
  const size_t L = hn::Lanes(d);
  constexpr size_t R = kBlockRows;
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const std::int64_t bh = task / plan.tasks_per_head, band = task % plan.tasks_per_head;
  const std::int64_t a0 = band * plan.blocks_per_band;
  const std::int64_t row = static_cast<std::int64_t>(R) * g.block_stride;  // a block row
  const std::int64_t p0 = a0 * row, p1 = p0 + plan.blocks_per_band * row;
  KeyStream<T>& s = plan.streams[thread];
  StreamKeys<T, IO>(p, g, bh, StreamLo(g, p0), StreamHi(g, p1), s);
  const std::int64_t b = bh / p.heads, h = bh % p.heads;
  // The softmax scale goes into Q^T once, as the tiled kernels pre-scale their query tile.
  StreamPixels(g, static_cast<const IO*>(p.q) + b * p.q_stride[0] + h * p.q_stride[1],
               p.q_stride, p0, p1, static_cast<size_t>(p.dim_qk), s.qt, s.ld, s.origin,
               static_cast<T>(p.scale));
  const size_t count = static_cast<size_t>(g.count), ld = s.ld;
  const size_t Ev = static_cast<size_t>(p.dim_v);
  ScratchCarver<T> carve(plan.scratch + static_cast<size_t>(thread) * plan.scratch_elems);
  T* S = carve.take(R * count * L);          // (R, count, L) scores, then probabilities
  T* acc = carve.take(R * plan.ev_pad * L);  // (R, ev_pad, L) unnormalised outputs
  T* lanes_i = carve.take(L);                // (L,) a vector's pixel rows
  T* lanes_j = carve.take(L);                // (L,) and columns
  T* inv_l = carve.take(R * L);              // (R, L) 1 / softmax sum, 0 for an empty row
  IO* out = static_cast<IO*>(p.out) + offset4(p.out_stride, b, h, 0, 0);
  T* out_accum = OutAccumAt<T>(p, b, h);
  const std::int64_t strips = g.block_stride / g.lanes;
  for (std::int64_t c = 0; c < strips; ++c) {
    const BlockWalk walk(g, 0, c, a0, plan.blocks_per_band, bh, p.heads);
    for (std::int64_t a = walk.a_begin, v0; (v0 = walk.first(a)) >= 0; ++a) {
      const size_t col = static_cast<size_t>(v0 * walk.L - s.origin);
      // Vectors past the last query read zeros; their rows are not stored.
      BlockDots(d, g, s.qt + col, s.kt + col, plan.e_pad, S);
      for (size_t k = 0; k < R; ++k) {
        const std::int64_t q0 = walk.position(v0, k);
        if (q0 >= g.positions()) break;
        T* Sk = S + k * count * L;
        const auto vmax = MaskBlockVector(d, g, q0, Sk, lanes_i, lanes_j, true);
        // A row that sees no key (max -inf) shifts by 0: its exps are exp(-inf) = 0, its sum 0.
        const auto empty = hn::Eq(vmax, hn::Set(d, kNegInf));
        const auto sum = ExpInPlace(d, Sk, count, hn::IfThenZeroElse(empty, vmax));
        hn::Store(hn::IfThenZeroElse(empty, hn::Div(hn::Set(d, T(1)), sum)), d, inv_l + k * L);
        if (p.lse != nullptr) {
          StoreLse(d, p, b, h, g.tensor_position(q0), g.valid_lanes(q0), vmax, sum);
        }
      }
      for (size_t ev0 = 0; ev0 < plan.ev_pad; ev0 += 4) {
        BlockCombine(d, g, S, s.vt + ev0 * ld + col, acc + ev0 * L, plan.ev_pad * L);
      }
      for (size_t k = 0; k < R; ++k) {
        const std::int64_t q0 = walk.position(v0, k);
        if (q0 >= g.positions()) break;
        const T* scale = inv_l + k * L;
        if (out_accum != nullptr) {  // StoreLanes scales acc in place: once
          StoreLanes(d, acc + k * plan.ev_pad * L, Ev, g.valid_lanes(q0), scale, out_accum,
                     g.tensor_position(q0), p.out_accum_stride[2], p.out_accum_stride[3],
                     /*stream=*/false);
          scale = nullptr;
        }
        StoreLanes(d, acc + k * plan.ev_pad * L, Ev, g.valid_lanes(q0), scale, out,
                   g.tensor_position(q0), p.out_stride[2], p.out_stride[3], /*stream=*/false);
      }
    }
  }
}

// The blocked forward on streamed planes: one task a band of a head, each thread's planes
// following the bands it runs.
template <typename T, typename IO>
Status StreamForward(const AttentionParams& p, const Host& host, const WindowGeometry<T>& g,
                     WindowPlan<T>& plan) {
  const size_t L = VectorLanes<T>(), count = static_cast<size_t>(g.count);
  const int threads = std::max(host.num_threads, 1);
  plan.blocks_per_band = StreamBlocksPerBand(
      g, static_cast<std::int64_t>((2 * plan.e_pad + plan.ev_pad) * sizeof(T)));
  plan.tasks_per_head = (BlocksPerStrip(g) + plan.blocks_per_band - 1) / plan.blocks_per_band;
  const std::int64_t band = plan.blocks_per_band * static_cast<std::int64_t>(kBlockRows) *
                            g.block_stride;
  const size_t ld = KeyStream<T>::RowLength(g, band);
  // Whole cache lines a thread, so that every thread's planes and scratch start aligned.
  const size_t plane_elems =
      ScratchCarver<T>::padded(KeyStream<T>::Elems(ld, plan.e_pad, plan.ev_pad));
  plan.scratch_elems = ScratchCarver<T>::padded(kBlockRows * count * L) +
                       ScratchCarver<T>::padded(kBlockRows * plan.ev_pad * L) +
                       ScratchCarver<T>::padded(kBlockRows * L) + 2 * ScratchCarver<T>::padded(L);
  const size_t elems = (plane_elems + plan.scratch_elems) * static_cast<size_t>(threads);
  Workspace ws(host);
  const Status reserved = ws.reserve(elems * sizeof(T), "attention_forward (window)");
  if (!reserved.ok()) return reserved;
  T* planes = reinterpret_cast<T*>(ws.data());
  plan.scratch = planes + plane_elems * static_cast<size_t>(threads);
  std::vector<KeyStream<T>> streams(static_cast<size_t>(threads));
  const size_t E = static_cast<size_t>(p.dim_qk);
  for (size_t t = 0; t < streams.size(); ++t) {
    streams[t].Carve(planes + t * plane_elems, ld, plan.e_pad);
    // Q^T's and K^T's padding rows enter every score, V^T's the unstored output rows: zeros,
    // never written after.
    std::fill(streams[t].qt + E * ld, streams[t].qt + plan.e_pad * ld, T(0));
    std::fill(streams[t].kt + E * ld, streams[t].kt + plan.e_pad * ld, T(0));
    std::fill(streams[t].vt + static_cast<size_t>(p.dim_v) * ld,
              streams[t].vt + plan.ev_pad * ld, T(0));
  }
  plan.streams = streams.data();
  // The kernels read rows ld apart from the geometry.
  WindowGeometry<T> gs = g;
  gs.ld = static_cast<std::int64_t>(ld);
  plan.g = &gs;
  run_tasks(host, p.batch * p.heads * plan.tasks_per_head, &plan, StreamBandTask<T, IO>);
  return Status::Ok();
}

template <typename T, typename IO>
Status WindowForward(const AttentionParams& p, const Host& host, const KernelChoice& choice) {
  if (p.batch == 0 || p.heads == 0 || p.len_q == 0) return Status::Ok();
  const WindowGeometry<T> g(*p.window, static_cast<std::int64_t>(VectorLanes<T>()), kBlockRows,
                            kBlockOffsets);
  WindowPlan<T> plan;
  plan.p = &p;
  plan.g = &g;
  const size_t L = VectorLanes<T>();
  plan.e_pad = static_cast<size_t>(round_up(std::max<std::int64_t>(p.dim_qk, 1), 4));
  plan.ev_pad = static_cast<size_t>(round_up(std::max<std::int64_t>(p.dim_v, 1), 4));
  const size_t count = static_cast<size_t>(g.count);
  const bool blocked = choice.schedule == Schedule::kWindowBlocked;
  if (blocked != (g.block_rows > 1)) return WindowChoiceDisagrees();
  if (blocked) return StreamForward<T, IO>(p, host, g, plan);
  const std::int64_t rows = (g.vectors + g.per_row - 1) / g.per_row;
  plan.tasks_per_head = g.per_row * ((rows + kRowsPerTask - 1) / kRowsPerTask);
  plan.pack_tasks_per_head = (p.len_q + kPackChunk - 1) / kPackChunk;
  plan.head_elems = (2 * plan.e_pad + plan.ev_pad) * plan.ld();
  plan.scratch_elems = ScratchCarver<T>::padded(count * L) +
                       ScratchCarver<T>::padded(kRowsPerSweep * L) +
                       3 * ScratchCarver<T>::padded(L);
  return RunHeadGroups<T>(host, p.batch * p.heads, "attention_forward (window)", plan, [&] {
    run_tasks(host, plan.group_size * plan.pack_tasks_per_head, &plan, PackTask<T, IO>);
    run_tasks(host, plan.group_size * plan.tasks_per_head, &plan, QueryTask<T, IO>);
  });
}

ATTN2D_DTYPE_INSTANCES(WindowForward, WindowForward, AttentionParams)

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn2d {
namespace cpu {

ATTN2D_DTYPE_DISPATCH(WindowForward, window_forward, AttentionParams)

}  // namespace cpu
}  // namespace attn2d
#endif  // HWY_ONCE
