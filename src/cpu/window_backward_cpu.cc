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
// dK and dV are scattered, so queries that reach the same keys must not run at once: each head's
// vectors are cut into bands of B raster-consecutive vectors, (P - 1) B L >= max off - min off,
// so that band k reaches no key that band k + P reaches; the P phases run bands 0, P, 2P, ...
// in parallel, then bands 1, P + 1, ..., and so on. Every key's sum thus runs in one fixed
// order (by phase, then each band's vectors in raster order, offsets in walk order), whatever
// the thread count.
//
// Where the forward runs blocks (window_geometry.h: evenly spaced columns, width a multiple of
// L), the backward runs blocks of 4 query vectors one pixel row apart: S and dP by BlockDots
// (each key load shared by up to 4 multiply-adds), P and dS, dQ^T = dS K^T(off) in registers
// (BlockCombine), and dK^T, dV^T by BlockScatter, whose column walk shares each query row
// load across the column's offsets and keeps the overlapping stores of neighbouring columns a
// column's worth of rows apart. Bands again keep scattering tasks apart: a task holds a run of
// kScatterBlocks blocks down every strip of the map, and runs r and r + P reach disjoint keys.
// Until session 14 the blocked backward ran a second pass per block of 4 key vectors under the
// window turned around (S^T, dP^T and their exps recomputed: 4E + 3Ev multiply-adds and 2 exps
// a pair against 3E + 2Ev and 1). With the scatter (development VM, Intel AVX-512, 4 heads,
// E = Ev = 16, the two builds alternated 3 rounds, medians of 15-20 calls): 128x128 square 15,
// one thread, 58.9 -> 49.8 ms; two threads 32.3 -> 28.8 ms; diamond 15, one thread 36.0 ->
// 32.0 ms, two threads 24.4 -> 23.4 ms; 256x256 square 15, two threads, 141.6 -> 126.4 ms.
// Runs of 2 blocks (3 phases, 16 runs a 128x128 head) were 3-7% slower than 4 (2 phases).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/window_backward_cpu.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
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
#include "cpu/scratch.h"
#include "cpu/tiling.h"
#include "cpu/tile_ops-inl.h"
#include "cpu/window_geometry.h"
#include "cpu/window_ops-inl.h"
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
  std::int64_t band_vectors = 0;  // B (one vector at a time)
  std::int64_t bands;             // per head: of B vectors, or blocked: runs of kScatterBlocks
  std::int64_t phases;            // P
  std::int64_t pack_tasks_per_head;
  std::int64_t group_first = 0;   // the (b, h) pairs packed now: group_first ..
  std::int64_t group_size = 0;
  std::int64_t phase = 0;         // the bands running now: phase, phase + P, ...

  // Bands of one head in `phase`.
  std::int64_t bands_in(std::int64_t ph) const { return (bands - ph + phases - 1) / phases; }
  bool blocked;                   // blocks of kBlockRows vectors, else one vector at a time
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
  // The planes a block reads, of one head.
  struct Planes {
    const T *qt, *kt, *vt, *dot, *lse, *delta;
  };
  Planes planes(std::int64_t slot) const {
    return {qt(slot), kt(slot), vt(slot), dot(slot), lse(slot), delta(slot)};
  }
};

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
  const hn::ScalableTag<T> d;
  const size_t L = hn::Lanes(d);
  const size_t c0 = static_cast<size_t>(g.margin + n0), n_end = n / L * L;
  T* delta = plan.delta(slot) + c0;
  const T* dot = plan.dot(slot) + c0;
  for (size_t c = 0; c < n_end; c += L) {
    auto acc = hn::Zero(d);
    for (size_t ev = 0; ev < Ev; ++ev) {
      acc = hn::MulAdd(hn::LoadU(d, dot + ev * ld + c),
                       hn::LoadU(d, ot + ev * static_cast<size_t>(kPackChunk) + c), acc);
    }
    hn::StoreU(acc, d, delta + c);
  }
  for (size_t c = n_end; c < n; ++c) {
    T D = 0;
    for (size_t ev = 0; ev < Ev; ++ev) {
      D += dot[ev * ld + c] * ot[ev * static_cast<size_t>(kPackChunk) + c];
    }
    delta[c] = D;
  }
  FillWindowRows(g, n0, count, plan.e_pad, T(0), plan.dkt(slot));
  FillWindowRows(g, n0, count, plan.ev_pad, T(0), plan.dvt(slot));
  FillWindowRows(g, n0, count, 1, std::numeric_limits<T>::infinity(), plan.lse(slot));
  FillMargins(g, n0, count, 1, T(0), plan.delta(slot));
  const T* lse = static_cast<const T*>(p.lse) + b * p.lse_stride[0] + h * p.lse_stride[1];
  T* lse_row = plan.lse(slot) + g.margin;
  for (std::int64_t n = n0; n < n0 + count; ++n) {
    const T l = lse[n * p.lse_stride[2]];
    if (l != -std::numeric_limits<T>::infinity()) lse_row[n] = l;
  }
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

// A blocked task's arrays in its thread's scratch (base null: only counts them into `elems`):
// scores and their gradients for R = kBlockRows vectors at the window's `count` offsets, the R
// vectors' dQ^T, and three lane vectors (a vector's pixel rows and columns for the border
// mask; the softmax scale).
template <typename T>
struct BlockScratch {
  T* S;        // (R, count, L) scores, then P
  T* G;        // (R, count, L) dP, then dS
  T* acc;      // (R, e_pad, L)
  T* lanes_i;  // (L,)
  T* lanes_j;  // (L,)
  T* scale;    // (L,)
  size_t elems;
  BlockScratch(T* base, size_t count, size_t e_pad, size_t L) {
    ScratchCarver<T> carve(base);
    S = carve.take(kBlockRows * count * L);
    G = carve.take(kBlockRows * count * L);
    acc = carve.take(kBlockRows * e_pad * L);
    lanes_i = carve.take(L);
    lanes_j = carve.take(L);
    scale = carve.take(L);
    elems = carve.used();
  }
};

// Blocks per strip in a scattering task: runs of 4 blocks (16 pixel rows at dilation 1) give a
// 128x128 head 8 runs, 4 per phase, where runs of 8 gave 2.
constexpr std::int64_t kScatterBlocks = 4;

// The blocks of one strip's walk: dQ of their queries, and their terms of dK and dV added to
// the packed dK^T and dV^T.
template <typename T, typename IO>
void ScatterBlocks(const WindowBackwardPlan<T>& plan, const BlockWalk& walk,
                   const BlockScratch<T>& arrays) {
  const AttentionBackwardParams& bp = *plan.bp;
  const AttentionParams& p = bp.fwd;
  const WindowGeometry<T>& g = *plan.g;
  const hn::ScalableTag<T> d;
  const size_t L = hn::Lanes(d);
  constexpr size_t R = kBlockRows;
  const size_t count = static_cast<size_t>(g.count), ld = plan.ld();
  T *S = arrays.S, *G = arrays.G, *acc = arrays.acc;
  const size_t acc_ld = plan.e_pad * L;  // between the block's R vectors of dQ^T
  IO* dq = static_cast<IO*>(bp.dq) + offset4(bp.dq_stride, walk.b, walk.h, 0, 0);
  const auto [qt, kt, vt, dot, lse, delta] = plan.planes(walk.slot);
  T *dkt = plan.dkt(walk.slot), *dvt = plan.dvt(walk.slot);
  for (std::int64_t a = walk.a_begin, v0; (v0 = walk.first(a)) >= 0; ++a) {
    const size_t col = static_cast<size_t>(g.margin + v0 * walk.L);
    BlockDots(d, g, qt + col, kt + col, plan.e_pad, S);
    BlockDots(d, g, dot + col, vt + col, plan.ev_pad, G);
    for (size_t k = 0; k < R; ++k) {
      // Vectors past the last query read the zero margins, where the lse is +inf and D is 0:
      // their P and dS are 0, and they scatter nothing (their dQ rows are not stored).
      T* Sk = S + k * count * L;
      T* Gk = G + k * count * L;
      MaskBlockVector(d, g, walk.position(v0, k), Sk, arrays.lanes_i, arrays.lanes_j, false);
      // Masked scores are -inf and the lse is +inf for lanes that saw no key: exp gives 0
      // either way, never exp(-inf + inf).
      const size_t ck = col + static_cast<size_t>(k) * static_cast<size_t>(g.block_stride);
      const auto lse_k = hn::Load(d, lse + ck), D_k = hn::Load(d, delta + ck);
      for (size_t o = 0; o < count; ++o) {
        const auto pr = ExpOf(d, hn::Sub(hn::Load(d, Sk + o * L), lse_k));
        hn::Store(pr, d, Sk + o * L);
        hn::Store(hn::Mul(pr, hn::Sub(hn::Load(d, Gk + o * L), D_k)), d, Gk + o * L);
      }
    }
    for (size_t e0 = 0; e0 < plan.e_pad; e0 += 4) {
      BlockCombine(d, g, G, kt + e0 * ld + col, acc + e0 * L, acc_ld);
    }
    for (size_t k = 0; k < R; ++k) {
      const std::int64_t q0 = walk.position(v0, k);
      if (q0 >= p.len_q) break;
      StoreLanes(d, acc + k * acc_ld, static_cast<size_t>(p.dim_qk),
                 std::min<size_t>(L, static_cast<size_t>(p.len_q - q0)), arrays.scale, dq, q0,
                 bp.dq_stride[2], bp.dq_stride[3]);
    }
    BlockScatter(d, g, S, dot + col, plan.ev_pad, dvt + col);  // dV^T += P dO^T
    BlockScatter(d, g, G, qt + col, plan.e_pad, dkt + col);    // dK^T += dS Q^T (Q scaled)
  }
}

// One run (kScatterBlocks blocks down every strip) of one head of the packed group, in
// `phase`: runs phase, phase + P, ... of a head run at once.
template <typename T, typename IO>
void ScatterRunTask(void* ctx, std::int64_t task, int thread) {
  const WindowBackwardPlan<T>& plan = *static_cast<const WindowBackwardPlan<T>*>(ctx);
  const AttentionParams& p = plan.bp->fwd;
  const WindowGeometry<T>& g = *plan.g;
  const size_t L = VectorLanes<T>();
  const std::int64_t per_head = plan.bands_in(plan.phase);
  const std::int64_t slot = task / per_head;
  const std::int64_t run = plan.phases * (task % per_head) + plan.phase;
  const BlockScratch<T> arrays(plan.scratch + static_cast<size_t>(thread) * plan.scratch_elems,
                               static_cast<size_t>(g.count), plan.e_pad, L);
  std::fill(arrays.scale, arrays.scale + L, static_cast<T>(p.scale));  // dQ = scale dS K
  for (std::int64_t c = 0; c < g.block_stride / g.lanes; ++c) {
    const BlockWalk walk(g, slot, c, run * kScatterBlocks, kScatterBlocks, plan.group_first,
                         p.heads);
    ScatterBlocks<T, IO>(plan, walk, arrays);
  }
}

// Writes positions [n0, n0 + kPackChunk) of one head's dK and dV.
template <typename T, typename IO>
void UnpackTask(void* ctx, std::int64_t task, int /*thread*/) {
  const WindowBackwardPlan<T>& plan = *static_cast<const WindowBackwardPlan<T>*>(ctx);
  const AttentionBackwardParams& bp = *plan.bp;
  const AttentionParams& p = bp.fwd;
  const PackChunk chunk(task, plan.pack_tasks_per_head, plan.group_first, p.heads, p.len_q);
  const std::int64_t slot = chunk.slot, b = chunk.b, h = chunk.h;
  const std::int64_t n0 = chunk.n0, n1 = chunk.n0 + chunk.count;
  const size_t ld = plan.ld();
  const std::int64_t margin = plan.g->margin;
  const struct {
    const T* src;
    void* dst;
    const std::int64_t* stride;
    std::int64_t width;
  } parts[] = {{plan.dkt(slot), bp.dk, bp.dk_stride, p.dim_qk},
               {plan.dvt(slot), bp.dv, bp.dv_stride, p.dim_v}};
  for (const auto& part : parts) {
    IO* dst = static_cast<IO*>(part.dst) + offset4(part.stride, b, h, 0, 0);
    const T* src = part.src + static_cast<size_t>(margin);
    if constexpr (std::is_same<IO, T>::value) {
      if (part.stride[3] == 1) {
        // The packing transpose run backwards: (width, positions) -> (positions, width).
        PackTransposed<T, T>(src + n0, Rows{nullptr, 0, static_cast<size_t>(part.width)},
                             static_cast<std::int64_t>(ld), 1, static_cast<size_t>(n1 - n0),
                             dst + n0 * part.stride[2], static_cast<size_t>(part.stride[2]),
                             static_cast<size_t>(part.width));
        continue;
      }
    }
    for (std::int64_t n = n0; n < n1; ++n) {
      for (std::int64_t e = 0; e < part.width; ++e) {
        dst[n * part.stride[2] + e * part.stride[3]] =
            Store<IO>(src[static_cast<size_t>(e) * ld + static_cast<size_t>(n)]);
      }
    }
  }
}

template <typename T, typename IO>
Status WindowBackward(const AttentionBackwardParams& bp, const Host& host) {
  const AttentionParams& p = bp.fwd;
  if (p.batch == 0 || p.heads == 0 || p.len_q == 0) return Status::Ok();
  const std::int64_t L = static_cast<std::int64_t>(VectorLanes<T>());
  const WindowOffsets& w = *p.window;
  const WindowGeometry<T> g(w, L, kBlockRows, kBlockOffsets);
  WindowBackwardPlan<T> plan;
  plan.bp = &bp;
  plan.g = &g;
  plan.blocked = g.block_rows > 1;
  plan.e_pad = static_cast<size_t>(round_up(std::max<std::int64_t>(p.dim_qk, 1), 4));
  plan.ev_pad = static_cast<size_t>(round_up(std::max<std::int64_t>(p.dim_v, 1), 4));
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
  const std::int64_t pairs = p.batch * p.heads;
  const std::int64_t threads = std::max(host.num_threads, 1);
  const std::int64_t group = HeadsPerGroup(plan.head_elems * sizeof(T), pairs);
  // Bands (runs of blocks) r and r + P reach disjoint keys when (P - 1) band positions span
  // off_max - off_min. P depends on the problem only, never on the thread count, so that every
  // thread count sums each key's terms in the same order.
  if (plan.blocked) {
    const std::int64_t run = kScatterBlocks * static_cast<std::int64_t>(kBlockRows) *
                             g.block_stride;  // positions
    plan.phases = 1 + (g.off_max - g.off_min + run - 1) / run;
    plan.bands = (BlocksPerStrip(g) + kScatterBlocks - 1) / kScatterBlocks;
  } else {
    // P = 3 phases: a 128x128 head under a 15x15 window then has 18 bands (6 per phase, 3
    // rounds of 2 threads each) where P = 2 gave 10 of twice the size (5 per phase: a round
    // with one thread idle).
    plan.phases = 3;
    plan.band_vectors =
        std::max<std::int64_t>(1, (g.off_max - g.off_min + (plan.phases - 1) * L - 1) /
                                      ((plan.phases - 1) * L));
    plan.bands = (g.vectors + plan.band_vectors - 1) / plan.band_vectors;
  }
  const size_t lanes = static_cast<size_t>(L);
  const size_t count = static_cast<size_t>(g.count);
  plan.scratch_elems =
      plan.blocked
          ? BlockScratch<T>(nullptr, count, plan.e_pad, lanes).elems
          : 2 * ScratchCarver<T>::padded(kOffsetChunk * lanes) +
                ScratchCarver<T>::padded(plan.e_pad * lanes) + 2 * ScratchCarver<T>::padded(lanes);
  // The packing tasks' O^T chunk.
  plan.scratch_elems = std::max(plan.scratch_elems,
                                plan.ev_pad * static_cast<size_t>(kPackChunk));
  const size_t elems = plan.head_elems * static_cast<size_t>(group) +
                       plan.scratch_elems * static_cast<size_t>(threads);
  Workspace ws(host);
  if (!ws.allocate(elems * sizeof(T))) {
    return Status::OutOfMemory("attention_backward (window): the host could not allocate " +
                               std::to_string(elems * sizeof(T)) + " bytes of workspace");
  }
  plan.packed = reinterpret_cast<T*>(ws.data());
  plan.scratch = plan.packed + plan.head_elems * static_cast<size_t>(group);
  const TaskFn band_task = plan.blocked ? ScatterRunTask<T, IO> : BandTask<T, IO>;
  for (plan.group_first = 0; plan.group_first < pairs; plan.group_first += group) {
    plan.group_size = std::min(group, pairs - plan.group_first);
    run_tasks(host, plan.group_size * plan.pack_tasks_per_head, &plan, BackwardPackTask<T, IO>);
    for (plan.phase = 0; plan.phase < std::min(plan.phases, plan.bands); ++plan.phase) {
      run_tasks(host, plan.group_size * plan.bands_in(plan.phase), &plan, band_task);
    }
    run_tasks(host, plan.group_size * plan.pack_tasks_per_head, &plan, UnpackTask<T, IO>);
  }
  return Status::Ok();
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
