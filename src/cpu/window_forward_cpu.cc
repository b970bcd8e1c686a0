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
// K^T and V^T (and the scaled Q^T) of a group of heads are packed once per call, with zero
// margins on both sides so that every shifted load stays inside the buffer; lanes whose key
// falls outside the map are masked to -inf (only vectors near the border need the mask).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/window_forward_cpu.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
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
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {

// Offsets whose scores are summed in one sweep: 8 independent FMA chains cover the FMA latency
// (4 cycles) at two FMAs per cycle.
constexpr size_t kOffsetsPerSweep = 8;
// Rows of Q^T (or V^T) held in registers per sweep: 16 vectors + 8 accumulators of AVX-512's 32.
constexpr size_t kMaxQuads = 4;
// Packed heads share one buffer of at most this many bytes, or one head where a head is larger
// (13.3 MB at 256x256 with E = Ev = 16; 3.3 MB at 128x128): the packed copy is transient
// workspace of O(N (2E + Ev)), kept below the inputs' own size (50 MB there for 4 heads).
constexpr size_t kPackBudgetBytes = size_t{8} << 20;
constexpr std::int64_t kPackChunk = 1024;  // positions per packing task
constexpr std::int64_t kRowsPerTask = 32;  // vectors per task, one below the other

template <typename T>
struct WindowPlan {
  const AttentionParams* p;
  const WindowOffsets* w;
  size_t L;
  size_t e_pad, ev_pad;    // E and Ev rounded up to 4 (zero rows)
  std::int64_t N;          // queries = keys
  std::int64_t margin;     // zeros on each side of a packed row: max |off| + L
  std::int64_t ld;         // packed row length: margin + N rounded up to L + margin
  std::int64_t vectors;    // query vectors per head
  std::int64_t per_row;    // vectors per pixel row, ceil(width / L)
  std::int64_t tasks_per_head;
  std::int64_t pack_tasks_per_head;
  std::int64_t group_first = 0;  // the (b, h) pairs packed now: group_first ..
  std::int64_t group_size = 0;
  const std::int64_t* off;  // (count,) raster offsets, ascending
  const T* dr;              // (count,) their row offsets, as T
  const T* dc;              // (count,) column offsets
  T dr_min, dr_max, dc_min, dc_max;
  size_t head_elems;  // packed elements per head: (2 e_pad + ev_pad) * ld
  T* packed;
  size_t scratch_elems;  // per thread
  T* scratch;

  // Head `slot` of the group: Q^T (scaled), K^T, V^T, each (rows, ld) with column margin + n
  // holding position n.
  T* qt(std::int64_t slot) const { return packed + static_cast<size_t>(slot) * head_elems; }
  T* kt(std::int64_t slot) const { return qt(slot) + e_pad * static_cast<size_t>(ld); }
  T* vt(std::int64_t slot) const { return kt(slot) + e_pad * static_cast<size_t>(ld); }
};

// Packs positions [n0, n0 + count) of one head, and zeroes the margins and padding rows.
template <typename T, typename IO>
void PackTask(void* ctx, std::int64_t task, int /*thread*/) {
  const WindowPlan<T>& plan = *static_cast<const WindowPlan<T>*>(ctx);
  const AttentionParams& p = *plan.p;
  const std::int64_t slot = task / plan.pack_tasks_per_head;
  const std::int64_t bh = plan.group_first + slot;
  const std::int64_t b = bh / p.heads, h = bh % p.heads;
  const std::int64_t n0 = (task % plan.pack_tasks_per_head) * kPackChunk;
  const std::int64_t count = std::min(kPackChunk, plan.N - n0);
  const size_t E = static_cast<size_t>(p.dim_qk), Ev = static_cast<size_t>(p.dim_v);
  const size_t ld = static_cast<size_t>(plan.ld);
  const Rows rows{nullptr, 0, static_cast<size_t>(count)};
  const size_t col = static_cast<size_t>(plan.margin + n0);
  struct Part {
    const void* base;
    const std::int64_t* stride;
    size_t width, rows_pad;
    T* dst;
  } parts[] = {{p.q, p.q_stride, E, plan.e_pad, plan.qt(slot)},
               {p.k, p.k_stride, E, plan.e_pad, plan.kt(slot)},
               {p.v, p.v_stride, Ev, plan.ev_pad, plan.vt(slot)}};
  for (const Part& part : parts) {
    const IO* base = static_cast<const IO*>(part.base) + offset4(part.stride, b, h, n0, 0);
    PackTransposed(base, rows, part.stride[2], part.stride[3], part.width, part.dst + col, ld,
                   rows.count);
    for (size_t e = part.width; e < part.rows_pad; ++e) {
      std::fill(part.dst + e * ld + col, part.dst + e * ld + col + rows.count, T(0));
    }
    // The task holding position 0 zeroes the left margin, the last one everything past N.
    for (size_t e = 0; e < part.rows_pad; ++e) {
      T* row = part.dst + e * ld;
      if (n0 == 0) std::fill(row, row + plan.margin, T(0));
      if (n0 + count == plan.N) std::fill(row + plan.margin + plan.N, row + ld, T(0));
    }
  }
  // The softmax scale goes into Q^T once, as the tiled kernels pre-scale their query tile.
  const T scale = static_cast<T>(p.scale);
  T* q = plan.qt(slot);
  for (size_t e = 0; e < E; ++e) {
    for (size_t n = 0; n < rows.count; ++n) q[e * ld + col + n] *= scale;
  }
}

// S[o * L + lane] = sum over the 4 kQuads rows i of a[i * ld + lane] * b[i * ld + off[o] + lane]
// (plus S's old value when kAccumulate); returns the lane-wise max of the new S when kMax.
template <size_t kQuads, bool kAccumulate, bool kMax, class D, typename T>
HWY_INLINE hn::Vec<D> ShiftedDots(D d, const T* HWY_RESTRICT a, const T* HWY_RESTRICT b,
                                  size_t ld, const std::int64_t* HWY_RESTRICT off, size_t count,
                                  T* HWY_RESTRICT S, hn::Vec<D> vmax) {
  constexpr size_t kRows = 4 * kQuads, kG = kOffsetsPerSweep;
  const size_t L = hn::Lanes(d);
  hn::Vec<D> av[kRows];
  HWY_UNROLL(16)
  for (size_t i = 0; i < kRows; ++i) av[i] = hn::LoadU(d, a + i * ld);
  size_t o = 0;
  for (; o + kG <= count; o += kG) {
    hn::Vec<D> s[kG];
    HWY_UNROLL(8)
    for (size_t g = 0; g < kG; ++g) s[g] = kAccumulate ? hn::Load(d, S + (o + g) * L) : hn::Zero(d);
    HWY_UNROLL(16)
    for (size_t i = 0; i < kRows; ++i) {
      HWY_UNROLL(8)
      for (size_t g = 0; g < kG; ++g) {
        s[g] = hn::MulAdd(av[i], hn::LoadU(d, b + i * ld + off[o + g]), s[g]);
      }
    }
    HWY_UNROLL(8)
    for (size_t g = 0; g < kG; ++g) {
      hn::Store(s[g], d, S + (o + g) * L);
      if (kMax) vmax = hn::Max(vmax, s[g]);
    }
  }
  for (; o < count; ++o) {
    auto s = kAccumulate ? hn::Load(d, S + o * L) : hn::Zero(d);
    HWY_UNROLL(16)
    for (size_t i = 0; i < kRows; ++i) s = hn::MulAdd(av[i], hn::LoadU(d, b + i * ld + off[o]), s);
    hn::Store(s, d, S + o * L);
    if (kMax) vmax = hn::Max(vmax, s);
  }
  return vmax;
}

// out[i * L + lane] = sum over o of P[o * L + lane] * b[i * ld + off[o] + lane], i < 4 kQuads.
template <size_t kQuads, class D, typename T>
HWY_INLINE void ShiftedCombine(D d, const T* HWY_RESTRICT P, const T* HWY_RESTRICT b, size_t ld,
                               const std::int64_t* HWY_RESTRICT off, size_t count,
                               T* HWY_RESTRICT out) {
  constexpr size_t kRows = 4 * kQuads;
  const size_t L = hn::Lanes(d);
  hn::Vec<D> acc[kRows];
  HWY_UNROLL(16)
  for (size_t i = 0; i < kRows; ++i) acc[i] = hn::Zero(d);
  for (size_t o = 0; o < count; ++o) {
    const auto pv = hn::Load(d, P + o * L);
    const T* bo = b + off[o];
    HWY_UNROLL(16)
    for (size_t i = 0; i < kRows; ++i) acc[i] = hn::MulAdd(pv, hn::LoadU(d, bo + i * ld), acc[i]);
  }
  HWY_UNROLL(16)
  for (size_t i = 0; i < kRows; ++i) hn::Store(acc[i], d, out + i * L);
}

// S = scale * Q K^T for one query vector, every offset; returns the lane-wise max.
template <class D, typename T>
HWY_INLINE hn::Vec<D> VectorScores(D d, const WindowPlan<T>& plan, const T* qt, const T* kt,
                                   T* S, bool track_max) {
  const size_t ld = static_cast<size_t>(plan.ld), count = static_cast<size_t>(plan.w->count);
  auto vmax = hn::Set(d, -std::numeric_limits<T>::infinity());
  for (size_t e0 = 0; e0 < plan.e_pad; e0 += 4 * kMaxQuads) {
    const size_t quads = std::min(kMaxQuads, (plan.e_pad - e0) / 4);
    const bool first = e0 == 0, last = e0 + 4 * quads == plan.e_pad;
    const T* a = qt + e0 * ld;
    const T* b = kt + e0 * ld;
#define ATTN2D_SHIFTED_DOTS(Q)                                                              \
  if (first && last && track_max) {                                                          \
    vmax = ShiftedDots<Q, false, true>(d, a, b, ld, plan.off, count, S, vmax);              \
  } else if (first) {                                                                        \
    ShiftedDots<Q, false, false>(d, a, b, ld, plan.off, count, S, vmax);                    \
  } else if (last && track_max) {                                                            \
    vmax = ShiftedDots<Q, true, true>(d, a, b, ld, plan.off, count, S, vmax);               \
  } else {                                                                                   \
    ShiftedDots<Q, true, false>(d, a, b, ld, plan.off, count, S, vmax);                     \
  }
    switch (quads) {
      case 1:
        ATTN2D_SHIFTED_DOTS(1) break;
      case 2:
        ATTN2D_SHIFTED_DOTS(2) break;
      case 3:
        ATTN2D_SHIFTED_DOTS(3) break;
      default:
        ATTN2D_SHIFTED_DOTS(4) break;
    }
#undef ATTN2D_SHIFTED_DOTS
  }
  return vmax;
}

// Masks the scores of a vector whose lanes may see keys outside the map (or lie past N) and
// returns their lane-wise max. lanes_i / lanes_j: each lane's row and column (row -2H past N,
// so that no offset brings it inside).
template <class D, typename T>
HWY_INLINE hn::Vec<D> MaskOutside(D d, const WindowPlan<T>& plan, const T* lanes_i,
                                  const T* lanes_j, T* S) {
  const size_t L = hn::Lanes(d);
  const auto neg_inf = hn::Set(d, -std::numeric_limits<T>::infinity());
  const auto i_lo = hn::Sub(hn::Zero(d), hn::Load(d, lanes_i));  // dr >= -i
  const auto i_hi = hn::Sub(hn::Set(d, static_cast<T>(plan.w->height - 1)), hn::Load(d, lanes_i));
  const auto j_lo = hn::Sub(hn::Zero(d), hn::Load(d, lanes_j));
  const auto j_hi = hn::Sub(hn::Set(d, static_cast<T>(plan.w->width - 1)), hn::Load(d, lanes_j));
  auto vmax = neg_inf;
  for (size_t o = 0; o < static_cast<size_t>(plan.w->count); ++o) {
    const auto dr = hn::Set(d, plan.dr[o]), dc = hn::Set(d, plan.dc[o]);
    const auto inside = hn::And(hn::And(hn::Ge(dr, i_lo), hn::Le(dr, i_hi)),
                                hn::And(hn::Ge(dc, j_lo), hn::Le(dc, j_hi)));
    const auto s = hn::IfThenElse(inside, hn::Load(d, S + o * L), neg_inf);
    hn::Store(s, d, S + o * L);
    vmax = hn::Max(vmax, s);
  }
  return vmax;
}

// acc (4 kQuads rows of L) for the output rows [ev0, ev0 + 4 quads).
template <class D, typename T>
HWY_INLINE void VectorCombine(D d, const WindowPlan<T>& plan, const T* P, const T* vt,
                              size_t quads, T* out) {
  const size_t ld = static_cast<size_t>(plan.ld), count = static_cast<size_t>(plan.w->count);
  switch (quads) {
    case 1:
      return ShiftedCombine<1>(d, P, vt, ld, plan.off, count, out);
    case 2:
      return ShiftedCombine<2>(d, P, vt, ld, plan.off, count, out);
    case 3:
      return ShiftedCombine<3>(d, P, vt, ld, plan.off, count, out);
    default:
      return ShiftedCombine<4>(d, P, vt, ld, plan.off, count, out);
  }
}

// One task: up to kRowsPerTask query vectors of one head of the packed group.
template <typename T, typename IO>
void QueryTask(void* ctx, std::int64_t task, int thread) {
  const WindowPlan<T>& plan = *static_cast<const WindowPlan<T>*>(ctx);
  const AttentionParams& p = *plan.p;
  const WindowOffsets& w = *plan.w;
  const hn::ScalableTag<T> d;
  const size_t L = hn::Lanes(d);
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const std::int64_t slot = task / plan.tasks_per_head;
  const std::int64_t bh = plan.group_first + slot;
  const std::int64_t b = bh / p.heads, h = bh % p.heads;
  const size_t count = static_cast<size_t>(w.count), ld = static_cast<size_t>(plan.ld);
  const size_t Ev = static_cast<size_t>(p.dim_v);
  ScratchCarver<T> carve(plan.scratch + static_cast<size_t>(thread) * plan.scratch_elems);
  T* S = carve.take(count * L);                   // (count, L) scores, then probabilities
  T* acc = carve.take(4 * kMaxQuads * L);         // (16, L) output rows of one sweep
  T* lanes_i = carve.take(L);                     // (L,) each lane's pixel row
  T* lanes_j = carve.take(L);                     // (L,) and column
  T* inv_l = carve.take(L);                       // (L,) 1 / softmax sum, 0 for an empty row
  T* row_max = carve.take(L);                     // (L,) for the log-sum-exp
  T* row_sum = carve.take(L);
  IO* out = static_cast<IO*>(p.out) + offset4(p.out_stride, b, h, 0, 0);
  T* lse = static_cast<T*>(p.lse);
  // A strip of vectors one above the other (a step of `per_row` vectors is the next pixel row,
  // exactly when the width is a multiple of L): the next vector's keys are 14 of the 15 rows of
  // keys a 15-row window just read, where in raster order they are one vector further along
  // each of its E x 15 key rows. (Against raster order the measured difference was within the
  // development VM's run-to-run noise.)
  const std::int64_t strip = (task % plan.tasks_per_head) % plan.per_row;
  const std::int64_t r_begin = (task % plan.tasks_per_head) / plan.per_row * kRowsPerTask;
  for (std::int64_t r = r_begin; r < r_begin + kRowsPerTask; ++r) {
    const std::int64_t vec = strip + r * plan.per_row;
    if (vec >= plan.vectors) break;
    const std::int64_t q0 = vec * static_cast<std::int64_t>(L);
    const size_t lanes = static_cast<size_t>(std::min<std::int64_t>(L, plan.N - q0));
    const size_t col = static_cast<size_t>(plan.margin + q0);
    // Interior: every lane in one pixel row whose window lies inside the map.
    const std::int64_t i0 = q0 / w.width, j0 = q0 % w.width;
    const bool interior = lanes == L && j0 + static_cast<std::int64_t>(L) <= w.width &&
                          i0 + plan.dr_min >= 0 && i0 + plan.dr_max < w.height &&
                          j0 + plan.dc_min >= 0 &&
                          j0 + static_cast<std::int64_t>(L) - 1 + plan.dc_max < w.width;
    auto vmax = VectorScores(d, plan, plan.qt(slot) + col, plan.kt(slot) + col, S, interior);
    if (!interior) {
      for (size_t lane = 0; lane < L; ++lane) {
        const std::int64_t n = q0 + static_cast<std::int64_t>(lane);
        lanes_i[lane] = lane < lanes ? static_cast<T>(n / w.width) : static_cast<T>(-2 * w.height);
        lanes_j[lane] = static_cast<T>(n % w.width);
      }
      vmax = MaskOutside(d, plan, lanes_i, lanes_j, S);
    }
    // exp against the row max; a row that sees no key (max -inf) shifts by 0, so its exps are
    // exp(-inf) = 0 and its sum 0.
    const auto empty = hn::Eq(vmax, hn::Set(d, kNegInf));
    const auto shift = hn::IfThenZeroElse(empty, vmax);
    auto sum = hn::Zero(d);
    for (size_t o = 0; o < count; ++o) {
      const auto pr = ExpOf(d, hn::Sub(hn::Load(d, S + o * L), shift));
      hn::Store(pr, d, S + o * L);
      sum = hn::Add(sum, pr);
    }
    hn::Store(hn::IfThenZeroElse(empty, hn::Div(hn::Set(d, T(1)), sum)), d, inv_l);
    if (lse != nullptr) {
      hn::Store(vmax, d, row_max);
      hn::Store(sum, d, row_sum);
      for (size_t lane = 0; lane < lanes; ++lane) {
        const std::int64_t n = q0 + static_cast<std::int64_t>(lane);
        lse[b * p.lse_stride[0] + h * p.lse_stride[1] + n * p.lse_stride[2]] =
            row_max[lane] == kNegInf ? kNegInf : row_max[lane] + std::log(row_sum[lane]);
      }
    }
    for (size_t ev0 = 0; ev0 < plan.ev_pad; ev0 += 4 * kMaxQuads) {
      const size_t quads = std::min(kMaxQuads, (plan.ev_pad - ev0) / 4);
      VectorCombine(d, plan, S, plan.vt(slot) + ev0 * ld + col, quads, acc);
      const size_t ev_end = std::min(Ev, ev0 + 4 * quads);
      for (size_t lane = 0; lane < lanes; ++lane) {
        IO* o = out + (q0 + static_cast<std::int64_t>(lane)) * p.out_stride[2];
        for (size_t ev = ev0; ev < ev_end; ++ev) {
          o[static_cast<std::int64_t>(ev) * p.out_stride[3]] =
              Store<IO>(acc[(ev - ev0) * L + lane] * inv_l[lane]);
        }
      }
    }
  }
}

template <typename T, typename IO>
Status WindowForward(const AttentionParams& p, const Host& host) {
  if (p.batch == 0 || p.heads == 0 || p.len_q == 0) return Status::Ok();
  const WindowOffsets& w = *p.window;
  WindowPlan<T> plan;
  plan.p = &p;
  plan.w = &w;
  plan.L = VectorLanes<T>();
  const std::int64_t L = static_cast<std::int64_t>(plan.L);
  plan.e_pad = static_cast<size_t>(round_up(std::max<std::int64_t>(p.dim_qk, 1), 4));
  plan.ev_pad = static_cast<size_t>(round_up(std::max<std::int64_t>(p.dim_v, 1), 4));
  plan.N = p.len_q;
  // Offsets in ascending raster order: consecutive sweeps read nearby key columns.
  const size_t count = static_cast<size_t>(w.count);
  std::vector<size_t> order(count);
  std::iota(order.begin(), order.end(), size_t{0});
  auto raster = [&](size_t o) { return std::int64_t{w.dr[o]} * w.width + w.dc[o]; };
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return raster(x) < raster(y); });
  std::vector<std::int64_t> off(count);
  std::vector<T> dr(count), dc(count);
  std::int64_t reach = 0;
  for (size_t o = 0; o < count; ++o) {
    off[o] = raster(order[o]);
    dr[o] = static_cast<T>(w.dr[order[o]]);
    dc[o] = static_cast<T>(w.dc[order[o]]);
    reach = std::max(reach, std::abs(off[o]));
  }
  plan.off = off.data();
  plan.dr = dr.data();
  plan.dc = dc.data();
  plan.dr_min = *std::min_element(dr.begin(), dr.end());
  plan.dr_max = *std::max_element(dr.begin(), dr.end());
  plan.dc_min = *std::min_element(dc.begin(), dc.end());
  plan.dc_max = *std::max_element(dc.begin(), dc.end());
  plan.margin = round_up(reach + L, L);
  plan.vectors = (plan.N + L - 1) / L;
  plan.ld = 2 * plan.margin + plan.vectors * L;
  plan.per_row = (w.width + L - 1) / L;
  const std::int64_t rows = (plan.vectors + plan.per_row - 1) / plan.per_row;
  plan.tasks_per_head = plan.per_row * ((rows + kRowsPerTask - 1) / kRowsPerTask);
  plan.pack_tasks_per_head = (plan.N + kPackChunk - 1) / kPackChunk;
  plan.head_elems = (2 * plan.e_pad + plan.ev_pad) * static_cast<size_t>(plan.ld);
  const std::int64_t pairs = p.batch * p.heads;
  const std::int64_t group = std::clamp<std::int64_t>(
      static_cast<std::int64_t>(kPackBudgetBytes / (plan.head_elems * sizeof(T))), 1, pairs);
  plan.scratch_elems = ScratchCarver<T>::padded(count * plan.L) +
                       ScratchCarver<T>::padded(4 * kMaxQuads * plan.L) +
                       5 * ScratchCarver<T>::padded(plan.L);
  const int threads = std::max(host.num_threads, 1);
  const size_t elems = plan.head_elems * static_cast<size_t>(group) +
                       plan.scratch_elems * static_cast<size_t>(threads);
  Workspace ws(host);
  if (!ws.allocate(elems * sizeof(T))) {
    return Status::OutOfMemory("attention_forward (window): the host could not allocate " +
                               std::to_string(elems * sizeof(T)) + " bytes of workspace");
  }
  plan.packed = reinterpret_cast<T*>(ws.data());
  plan.scratch = plan.packed + plan.head_elems * static_cast<size_t>(group);
  for (plan.group_first = 0; plan.group_first < pairs; plan.group_first += group) {
    plan.group_size = std::min(group, pairs - plan.group_first);
    run_tasks(host, plan.group_size * plan.pack_tasks_per_head, &plan, PackTask<T, IO>);
    run_tasks(host, plan.group_size * plan.tasks_per_head, &plan, QueryTask<T, IO>);
  }
  return Status::Ok();
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
