// The window backward's plans: the whole-head schedule's bands in phases, the streamed schedule's
// segments and halos, and a thread's planes and scratch. Not SIMD; per target as
// window_plan-inl.h is.
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_WINDOW_WINDOW_BACKWARD_PLAN_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_WINDOW_WINDOW_BACKWARD_PLAN_INL_H_
#undef ATTN2D_SRC_CPU_WINDOW_WINDOW_BACKWARD_PLAN_INL_H_
#else
#define ATTN2D_SRC_CPU_WINDOW_WINDOW_BACKWARD_PLAN_INL_H_
#endif

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "attn2d/attention_params.h"
#include "cpu/common/scratch.h"
#include "cpu/window/window_geometry.h"
#include "cpu/window/window_plan-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Offsets per pass over a vector's arrays: S and dS of 32 offsets are 2 x 2 KiB of L1, where a
// whole 15x15 window's (225 offsets) would take 2 x 14 KiB of the 48 KiB that the shifted rows
// of K, V, dK and dV stream through. Within a chunk the scatter walks the offsets column-major
// (scatter_order): raster order puts offsets (dr, dc) and (dr, dc + 1) one after the other,
// and the second's load of dK^T overlaps 15 of the 16 lanes the first just stored, which a
// load cannot take from the store queue.
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
  bool stream_grads = false;      // dK and dV past the caches (common/result_stores.h)

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

// Positions whose O^T a band packs at a time for D = rowsum(dO * O): 16 KiB at Ev = 16, where
// a band's whole O^T would take 128 KiB at width 256 beside ~1.7 MB of planes in a 2 MB L2.
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
  bool stream_grads = false;  // dQ, dK and dV past the caches (common/result_stores.h)
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

// Segments a head wants so that a problem of few heads still gives the threads work: 8 tasks
// at least, where the halo costs allow (a segment spans 2 halos' worth of keys at least).
constexpr std::int64_t kMinSegmentTasks = 8;

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_WINDOW_WINDOW_BACKWARD_PLAN_INL_H_
