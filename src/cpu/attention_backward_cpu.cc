// Fused backward that recomputes the probabilities tile by tile from q, k and the forward's
// log-sum-exp; no len_q x len_k buffer exists at any time.
//
// Deterministic without atomics. dQ sums over key tiles, which are split into a fixed number of
// contiguous groups (a function of the problem, never of the thread count): each group's sum
// runs over its key tiles in order from zero, and dQ = ((group 0 + group 1) + group 2) ...
// Every schedule keeps exactly that order, so they all give bitwise-equal results:
// - whole heads (one task per (batch, head)) when there are enough heads to keep every thread
//   busy: a task walks the head's key tiles and, for each, the query tiles that see it,
//   accumulating dK and dV in scratch and its group's dQ in a per-thread (len_q, E) buffer
//   (4 tile products per tile pair);
// - key-tile groups (one task per (batch, head, group)) when heads are fewer than threads:
//   the same walk over one group, its dQ share in a shared buffer, then one task per
//   (batch, head, query tile) adds the groups' shares in order;
// - two passes when neither keeps the threads busy: pass 1 gives each task one (batch, head,
//   key tile) for dK and dV, pass 2 one (batch, head, query tile) for dQ, recomputing Q*K^T and
//   dO*V^T (7 products).
// Each dK/dV sum runs over query tiles in order in all three. Sparse layouts take the same
// schedules over each head's own key tiles; their query rows are gathered, so each dQ term is
// formed apart and added (in every schedule alike).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/attention_backward_cpu.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "attn2d/attention_params.h"
#include "attn2d/host.h"
#include "attn2d/status.h"
#include "core/strided.h"
#include "core/workspace.h"
#include "cpu/attention_cpu.h"
#include "cpu/dtype_dispatch.h"
#include "cpu/bf16_pairs_avx512.h"
#include "cpu/result_stores.h"
#include "cpu/row_staging-inl.h"
#include "cpu/scratch.h"
#include "cpu/tile_ops-inl.h"
#include "cpu/tiling.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {

#if defined(ATTN2D_HAVE_AVX512_BF16) && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL)
#define ATTN2D_NATIVE_BF16 1
#endif

template <typename T>
struct BackwardPlan {
  const AttentionBackwardParams* bp;
  TileSizes tiles;
  size_t dim_qk_pad, dim_v_pad;  // E and Ev rounded up to the vector length
  std::int64_t q_tiles, k_tiles;
  std::int64_t dq_groups;  // key-tile groups of the dQ sum
  std::int64_t sum_chunks;  // runs of block_q raster rows (DeltaTask's tasks)
  // Rows of a dQ share: len_q in raster order, or for a sparse layout q_tiles * block_q in the
  // order of the head's layout tiles (tile t's rows from t * block_q), so that a visit adds its
  // dQ term to consecutive rows.
  size_t share_rows;
  size_t scratch_elems;  // per thread
  T* workspace;
  T* dq_shares = nullptr;  // whole heads: (threads, 1 or 2, share_rows, E_pad); key-tile
                           // groups: (batch * heads, dq_groups, share_rows, E_pad)
  // Sparse layouts in the one-pass schedules, float products: per thread, the query side of
  // the slice it walks, packed as PackQueryTile packs a tile, for every tile of the head's
  // layout in tile order: (share_rows, E_pad) scaled q, (share_rows, Ev_pad) dO, then
  // (share_rows,) lse and (share_rows,) delta.
  T* gathered = nullptr;
  // With `gathered`, where Q, K, V or dO is channels-first: per thread, room for one slice's
  // row-major copies of them (cpu/row_staging-inl.h), staging_elems T's each; null otherwise.
  T* staging = nullptr;
  size_t staging_elems = 0;
  bool q_tiles_apart = false, k_tiles_apart = false;  // ScatteredTiles of the layout
  T* deltas = nullptr;  // (batch * heads, len_q): rowsum(dO * O), computed once before the tiles
  // bf16 tensors on a CPU with AVX512-BF16: all five products (S = Q K^T, dP = dO V^T,
  // dV = P^T dO, dK = dS^T q, dQ = dS K) run on VDPBF16PS from bf16 pairs (K^T and V^T packed as
  // pairs in kt and vt, K in k; P and dS rounded to bf16 as naive bf16 attention rounds them).
  bool native_bf16 = false;
  bool stream_grads = false;  // dQ, dK and dV past the caches (cpu/result_stores.h)

  struct Arrays {
    T *kt, *vt, *k, *q, *dout, *s, *dp, *dk, *dv, *dk_part, *dv_part, *dq, *dq_group, *dq_term;
    T *q2, *dout2, *q_rp, *dout_rp, *ds2, *delta, *lse;
    size_t elems;
  };
  // Lays out one thread's arrays at base (null: only counts them into `elems`).
  Arrays carve(T* base) const {
    const size_t bq = tiles.block_q, bk = tiles.block_k;
    const size_t E = static_cast<size_t>(bp->fwd.dim_qk), Ev = static_cast<size_t>(bp->fwd.dim_v);
    ScratchCarver<T> c(base);
    Arrays a;
    a.kt = c.take(E * bk);             // (E, block_k): B of S = Q K^T
    a.vt = c.take(Ev * bk);            // (Ev, block_k): B of dP = dO V^T
    a.k = c.take(bk * dim_qk_pad);     // (block_k, E_pad): B of dQ += dS K (pass 2)
    a.q = c.take(bq * dim_qk_pad);     // (block_q, E_pad), times scale: A of S, B of dK
    a.dout = c.take(bq * dim_v_pad);   // (block_q, Ev_pad): A of dP, B of dV
    a.s = c.take(bq * bk);             // (block_q, block_k): scores, then P
    a.dp = c.take(bq * bk);            // (block_q, block_k): dP, then dS
    a.dk = c.take(bk * dim_qk_pad);    // (block_k, E_pad) accumulator (pass 1)
    a.dv = c.take(bk * dim_v_pad);     // (block_k, Ev_pad) accumulator (pass 1)
    a.dk_part = c.take(bk * dim_qk_pad);  // one query tile's share of dK, then added to a.dk
    a.dv_part = c.take(bk * dim_v_pad);
    a.dq = c.take(bq * dim_qk_pad);    // (block_q, E_pad): dQ's sum (pass 2)
    a.dq_group = c.take(bq * dim_qk_pad);  // (block_q, E_pad): one key-tile group's share
    a.dq_term = c.take(bq * dim_qk_pad);   // (block_q, E_pad): one sparse visit's dQ term
    a.q2 = c.take(bq * (E + 1) / 2);   // (block_q, ceil(E / 2)) bf16 pairs of q, unscaled
    a.dout2 = c.take(bq * (Ev + 1) / 2);  // (block_q, ceil(Ev / 2)) bf16 pairs of dO
    // bf16 pairs along the query rows, (block_q / 2, E_pad) and (block_q / 2, Ev_pad): row w
    // pairs rows 2w and 2w + 1; B of dK = dS^T q and dV = P^T dO.
    a.q_rp = c.take(bq / 2 * dim_qk_pad);
    a.dout_rp = c.take(bq / 2 * dim_v_pad);
    a.ds2 = c.take(bq / 2 * bk);  // (block_q / 2, block_k): scale dS paired along query rows
    a.delta = c.take(bq);              // rowsum(dO * O)
    a.lse = c.take(bq);
    a.elems = c.used();
    return a;
  }
  // This thread's arrays, allocated once per call.
  Arrays thread_arrays(int thread) const {
    return carve(workspace + static_cast<size_t>(thread) * scratch_elems);
  }
  // Runs of block_q share rows (a sparse layout's tiles) in which the groups' shares are summed.
  std::int64_t share_chunks() const {
    return static_cast<std::int64_t>((share_rows + tiles.block_q - 1) / tiles.block_q);
  }
  // This thread's gathered query side (null when the plan has none).
  T* gathered_side(int thread) const {
    if (gathered == nullptr) return nullptr;
    return gathered + static_cast<size_t>(thread) * share_rows * (dim_qk_pad + dim_v_pad + 2);
  }
  // a with its query side (q, dout, lse, delta) at share row `row` of the gathered side `side`.
  Arrays query_side_at(Arrays a, T* side, size_t row) const {
    const size_t n = share_rows;
    a.q = side + row * dim_qk_pad;
    a.dout = side + n * dim_qk_pad + row * dim_v_pad;
    a.lse = side + n * (dim_qk_pad + dim_v_pad) + row;
    a.delta = side + n * (dim_qk_pad + dim_v_pad + 1) + row;
    return a;
  }
};

// delta = rowsum(dO * O) of the rows of one query tile of one slice (b, h), into plan.deltas:
// once per call. Computed while packing each (query tile, key tile) pair, as a
// scalar chain over Ev (one dependent FMA per element, ~256 cycles a row at Ev = 64), it took 20%
// of the bf16 ViT-B N=1024 backward's key-tile task.
template <typename T, typename IO>
void DeltaTask(void* ctx, std::int64_t task, int thread) {
  const BackwardPlan<T>& plan = *static_cast<const BackwardPlan<T>*>(ctx);
  const AttentionBackwardParams& bp = *plan.bp;
  const AttentionParams& p = bp.fwd;
  const std::int64_t slice = task / plan.sum_chunks, b = slice / p.heads, h = slice % p.heads;
  const std::int64_t i0 = (task % plan.sum_chunks) * plan.tiles.block_q;
  const Rows rows{nullptr, i0, static_cast<size_t>(std::min(plan.tiles.block_q, p.len_q - i0))};
  const size_t Ev = static_cast<size_t>(p.dim_v), Evp = plan.dim_v_pad;
  const auto a = plan.thread_arrays(thread);
  // dO rows: row-major rows of the compute type are read where they lie, others packed into
  // a.dout (YLG(8) 128x128 over 64x64, E = Ev = 16, backward 20.1-20.9 -> 19.6-20.2 ms at one
  // thread, 10.6-10.7 -> 10.3-10.5 ms at two, against packing them always; builds alternated 3
  // rounds). O rows of the compute type are read in place too (DotRow walks a strided row with
  // a contiguous one's arithmetic, so every layout gives the same bits); 16-bit ones are widened
  // a row at a time into a.dv_part (both arrays are free before the tiles run).
  const T* dout = a.dout;
  std::int64_t dout_ld = static_cast<std::int64_t>(Evp);
  if constexpr (std::is_same<IO, T>::value) {
    if (bp.dout_stride[3] == 1) {
      dout = static_cast<const T*>(bp.dout) + offset4(bp.dout_stride, b, h, i0, 0);
      dout_ld = bp.dout_stride[2];
    }
  }
  if (dout == a.dout) {
    PackRows(static_cast<const IO*>(bp.dout) + offset4(bp.dout_stride, b, h, 0, 0), rows,
             bp.dout_stride[2], bp.dout_stride[3], Ev, T(1), a.dout, Evp, rows.count);
  }
  const IO* out = static_cast<const IO*>(p.out) + offset4(p.out_stride, b, h, 0, 0);
  for (size_t r = 0; r < rows.count; ++r) {
    const T* x = dout + static_cast<std::int64_t>(r) * dout_ld;
    T delta;
    if constexpr (std::is_same<IO, T>::value) {
      delta = DotRow(x, out + rows[r] * p.out_stride[2], Ev, p.out_stride[3]);
    } else {
      PackRows(out, Rows{nullptr, rows[r], 1}, p.out_stride[2], p.out_stride[3], Ev, T(1),
               a.dv_part, Evp, 1);
      delta = DotRow(x, a.dv_part, Ev, 1);
    }
    plan.deltas[slice * p.len_q + rows[r]] = delta;
  }
}

// Packs the query-side tile (rows of slice b, h): scaled q and dO (as floats, or as the pair
// tiles of the bf16 products), and each row's delta and lse.
template <typename T, typename IO>
HWY_INLINE void PackQueryTile(const AttentionBackwardParams& bp, const BackwardPlan<T>& plan,
                              std::int64_t b, std::int64_t h, const Rows& rows,
                              const typename BackwardPlan<T>::Arrays& a) {
  const AttentionParams& p = bp.fwd;
  const size_t E = static_cast<size_t>(p.dim_qk), Ev = static_cast<size_t>(p.dim_v);
#if defined(ATTN2D_NATIVE_BF16)
  if constexpr (std::is_same<IO, BFloat16>::value) {
    if (plan.native_bf16) {
      PackQueryPairs(static_cast<const IO*>(p.q) + offset4(p.q_stride, b, h, 0, 0), rows,
                     p.q_stride[2], p.q_stride[3], E, reinterpret_cast<std::uint32_t*>(a.q2));
      PackQueryPairs(static_cast<const IO*>(bp.dout) + offset4(bp.dout_stride, b, h, 0, 0), rows,
                     bp.dout_stride[2], bp.dout_stride[3], Ev,
                     reinterpret_cast<std::uint32_t*>(a.dout2));
      const size_t pairs = (rows.count + 1) / 2;
      PackRowPairs(static_cast<const IO*>(p.q) + offset4(p.q_stride, b, h, 0, 0), rows,
                   p.q_stride[2], p.q_stride[3], E, plan.dim_qk_pad, pairs,
                   reinterpret_cast<std::uint32_t*>(a.q_rp));
      PackRowPairs(static_cast<const IO*>(bp.dout) + offset4(bp.dout_stride, b, h, 0, 0), rows,
                   bp.dout_stride[2], bp.dout_stride[3], Ev, plan.dim_v_pad, pairs,
                   reinterpret_cast<std::uint32_t*>(a.dout_rp));
    }
  }
  if (!plan.native_bf16)
#endif
  {
    PackRows(static_cast<const IO*>(p.q) + offset4(p.q_stride, b, h, 0, 0), rows, p.q_stride[2],
             p.q_stride[3], E, static_cast<T>(p.scale), a.q, plan.dim_qk_pad, rows.count);
    PackRows(static_cast<const IO*>(bp.dout) + offset4(bp.dout_stride, b, h, 0, 0), rows,
             bp.dout_stride[2], bp.dout_stride[3], Ev, T(1), a.dout, plan.dim_v_pad, rows.count);
  }
  const T* lse = static_cast<const T*>(p.lse);
  const T* deltas = plan.deltas + (b * p.heads + h) * p.len_q;
  for (size_t r = 0; r < rows.count; ++r) {
    a.delta[r] = deltas[rows[r]];
    a.lse[r] = lse[b * p.lse_stride[0] + h * p.lse_stride[1] + rows[r] * p.lse_stride[2]];
  }
}

// Requests the lines that packing the query side of tile `rows` (slice b, h) at a visit reads,
// a visit ahead: its rows of Q and dO, their log-sum-exps and deltas. A sparse tile's rows are
// scattered (a YLG tile's queries lie along Manhattan anti-diagonals, one line each): without
// this, their copies were 14% of SparseKeyTile's own samples (YLG 256x256 backward, one
// thread).
template <typename T, typename IO>
HWY_INLINE void PrefetchQueryRows(const BackwardPlan<T>& plan, std::int64_t b, std::int64_t h,
                                  const Rows& rows) {
  const AttentionBackwardParams& bp = *plan.bp;
  const AttentionParams& p = bp.fwd;
  PrefetchRows<false>(static_cast<const IO*>(p.q) + offset4(p.q_stride, b, h, 0, 0), rows,
                      p.q_stride[2], p.q_stride[3], static_cast<size_t>(p.dim_qk));
  PrefetchRows<false>(static_cast<const IO*>(bp.dout) + offset4(bp.dout_stride, b, h, 0, 0),
                      rows, bp.dout_stride[2], bp.dout_stride[3], static_cast<size_t>(p.dim_v));
  PrefetchRows<false>(static_cast<const T*>(p.lse) + b * p.lse_stride[0] + h * p.lse_stride[1],
                      rows, p.lse_stride[2], 1, 1);
  PrefetchRows<false>(plan.deltas + (b * p.heads + h) * p.len_q, rows, 1, 1, 1);
}

// Packs the query side of slice (b, h) for every query tile of the head's layout into `side`
// (BackwardPlan::gathered), once per slice: a sparse tile's rows are scattered (a YLG tile's
// queries lie along Manhattan anti-diagonals, one cache line each), and PackQueryTile's gather
// of them at every visit, with its prefetches, was ~25% of SparseKeyTile's own samples (YLG
// 128x128, one thread).
// Tried and slower (perf samples over the same calls, against this gather's 0.32 of the
// forward task's): requesting the next tile's lines before each copy, 0.36; walking the rows
// in raster order and writing each to its slot, 0.35-0.37.
template <typename T, typename IO>
void GatherQuerySide(const BackwardPlan<T>& plan, std::int64_t b, std::int64_t h, T* side,
                     const typename BackwardPlan<T>::Arrays& a) {
  std::int64_t global;
  Rows rows;
  for (std::int64_t t = 0; LayoutTile(*plan.bp->fwd.layout, h, t, /*query=*/true, &global, &rows);
       ++t) {
    PackQueryTile<T, IO>(*plan.bp, plan, b, h, rows,
                         plan.query_side_at(a, side, static_cast<size_t>(t * plan.tiles.block_q)));
  }
}

#if defined(ATTN2D_NATIVE_BF16)
// The bf16 products' P and dS in one pass over the score tile s and dP tile dp (rows x cols_pad,
// row stride ld, cols_pad a multiple of 16), straight into the pair tiles the products read:
// - key_grads: P paired along the query rows (rows 2w and 2w + 1 -> pair row w, over float row w
//   of s) for dV = P^T dO, and scale * dS so paired into ds2 for dK = dS^T q;
// - query_grad: dS paired along the keys, over the start of each row of dp, for dQ = dS K.
// Row w is written after float rows 2w and 2w + 1 (and row w itself, read earlier) were read,
// and each 16 columns are read before they are written. Rounded to nearest even as before, when
// separate passes did the exp, dS = P (dP - D), and three conversions to pairs.
__attribute__((target("avx512bf16"))) inline void PairedProbabilitiesAndScoreGrad(
    size_t rows, size_t cols_pad, size_t ld, float* HWY_RESTRICT s, float* HWY_RESTRICT dp,
    const float* lse, const float* delta, float scale, std::uint32_t* HWY_RESTRICT ds2,
    bool key_grads, bool query_grad) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const hn::Full512<float> d;
  const auto vscale = hn::Set(d, scale);
  // P and dS of 16 columns of row r (zero for a fully masked row or a missing last row).
  auto row_terms = [&](size_t r, size_t c, hn::Vec<decltype(d)>* p, hn::Vec<decltype(d)>* ds) {
    if (r >= rows || lse[r] == kNegInf) {
      *p = hn::Zero(d), *ds = hn::Zero(d);
      return;
    }
    *p = Bf16SoftmaxExp(d, hn::Sub(hn::LoadU(d, s + r * ld + c), hn::Set(d, lse[r])));
    *ds = hn::Mul(*p, hn::Sub(hn::LoadU(d, dp + r * ld + c), hn::Set(d, delta[r])));
  };
  auto pair_rows = [](hn::Vec<decltype(d)> lo, hn::Vec<decltype(d)> hi) {
    const __m512i l = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(lo.raw)));
    const __m512i h = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(hi.raw)));
    return _mm512_or_si512(l, _mm512_slli_epi32(h, 16));
  };
  for (size_t w = 0; 2 * w < rows; ++w) {
    const size_t r0 = 2 * w, r1 = 2 * w + 1;
    for (size_t c = 0; c < cols_pad; c += 16) {
      hn::Vec<decltype(d)> p0, ds0, p1, ds1;
      row_terms(r0, c, &p0, &ds0);
      row_terms(r1, c, &p1, &ds1);
      if (query_grad) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dp + r0 * ld) + c / 16,
                            reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(ds0.raw)));
        if (r1 < rows) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(dp + r1 * ld) + c / 16,
                              reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(ds1.raw)));
        }
      }
      if (key_grads) {
        _mm512_storeu_si512(s + w * ld + c, pair_rows(p0, p1));
        _mm512_storeu_si512(ds2 + w * ld + c,
                            pair_rows(hn::Mul(ds0, vscale), hn::Mul(ds1, vscale)));
      }
    }
  }
}
#endif

// Recomputes P (into a.s) and dS (into a.dp) for one (query tile, key tile) pair whose query
// side is packed and whose key side is in a.kt and a.vt; mask(S, cols_pad) masks the scores.
// On the bf16 products they are left as the pair tiles that AccumulateKeyGrads (key_grads) and
// ScoreGradTimesKeys (query_grad) read.
template <typename T, class MaskFn>
HWY_INLINE void ProbabilitiesAndScoreGrad(const BackwardPlan<T>& plan, size_t rows,
                                          size_t cols_pad,
                                          const typename BackwardPlan<T>::Arrays& a,
                                          bool key_grads, bool query_grad, const MaskFn& mask) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const size_t bk = static_cast<size_t>(plan.tiles.block_k);
  const size_t E = static_cast<size_t>(plan.bp->fwd.dim_qk);
  const size_t Ev = static_cast<size_t>(plan.bp->fwd.dim_v);
  (void)key_grads, (void)query_grad;  // read by the bf16 products only
#if defined(ATTN2D_NATIVE_BF16)
  if constexpr (std::is_same<T, float>::value) {
    if (plan.native_bf16) {
      const size_t W = (E + 1) / 2, Wv = (Ev + 1) / 2;
      PairScores(rows, cols_pad, W, reinterpret_cast<const std::uint32_t*>(a.q2),
                 reinterpret_cast<const std::uint32_t*>(a.kt), bk,
                 static_cast<T>(plan.bp->fwd.scale), a.s, bk);
      mask(a.s, cols_pad);
      gemm_bf16_pairs(false, rows, cols_pad, Wv, reinterpret_cast<const std::uint32_t*>(a.dout2),
                      Wv, reinterpret_cast<const std::uint32_t*>(a.vt), bk, a.dp, bk);
      PairedProbabilitiesAndScoreGrad(rows, cols_pad, bk, a.s, a.dp, a.lse, a.delta,
                                      static_cast<float>(plan.bp->fwd.scale),
                                      reinterpret_cast<std::uint32_t*>(a.ds2), key_grads,
                                      query_grad);
      return;
    }
  }
#endif
  Gemm<false>(rows, cols_pad, E, a.q, plan.dim_qk_pad, 1, a.kt, bk, a.s, bk);
  mask(a.s, cols_pad);
  Gemm<false>(rows, cols_pad, Ev, a.dout, plan.dim_v_pad, 1, a.vt, bk, a.dp, bk);
  for (size_t r = 0; r < rows; ++r) {
    T* s = a.s + r * bk;
    if (a.lse[r] == kNegInf) {  // fully masked row: P = 0, so every gradient term is 0
      ZeroRow(s, cols_pad);
      ZeroRow(a.dp + r * bk, cols_pad);
    } else {
      ProbabilityGradRow(s, a.dp + r * bk, cols_pad, a.lse[r], a.delta[r]);
    }
  }
}

// A visit whose mask allows at most one key a row (a repetitive YLG pattern's own-position keys;
// the forward's VisitSingleKeys): per row r with key c, P = exp(q . k_c - lse) and
// dS = P (dO . v_c - D) from the row's packed query side and the key's rows read from the
// tensors, a vector of rows at a time for the exps; then dq_term (rows, E_pad) = dS k_c
// (unscaled; 0 in rows without a key) when dq_term is not null, and dk[c] += dS q (q scaled),
// dv[c] += P dO when dk is not null. Both passes form a row's terms here alike, so the dQ sums
// of all schedules stay bitwise equal. YLG(8) at 128x128 over 64x64, E = Ev = 16, backward
// alone, builds alternated 6 rounds: one thread 17.3-19.6 -> 16.6-19.0 ms (faster in all 6),
// two threads 8.1-9.1 -> 7.6-9.2 ms (faster in 5); with these visits skipped outright (a wrong
// result, as a bound) one thread ran 14.2-17.3 ms.
template <typename T, typename IO>
HWY_INLINE void SingleKeyGrads(const BackwardPlan<T>& plan, std::int64_t b, std::int64_t h,
                               size_t rows, const Rows& keys, const std::uint64_t* words,
                               const typename BackwardPlan<T>::Arrays& a, T* dq_term, T* dk,
                               T* dv) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const AttentionParams& p = plan.bp->fwd;
  const hn::ScalableTag<T> d;
  const size_t L = hn::Lanes(d);
  const size_t E = static_cast<size_t>(p.dim_qk), Ev = static_cast<size_t>(p.dim_v);
  const size_t Ep = plan.dim_qk_pad, Evp = plan.dim_v_pad;
  const auto [k, v] = slice_keys_values<IO>(p, b, h);
  constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(T);
  HWY_ALIGN T score[kMaxLanes];
  HWY_ALIGN T dp[kMaxLanes];
  HWY_ALIGN T lse[kMaxLanes];
  HWY_ALIGN T delta[kMaxLanes];
  HWY_ALIGN T prob[kMaxLanes];
  HWY_ALIGN T ds[kMaxLanes];
  int col[kMaxLanes];
  std::int64_t key[kMaxLanes];
  if (dq_term != nullptr) std::fill(dq_term, dq_term + rows * Ep, T(0));
  for (size_t r0 = 0; r0 < rows; r0 += L) {
    const size_t n = std::min(L, rows - r0);
    SingleKeyScores(words, keys, r0, n, L, a.q, Ep, k, p.k_stride[2], p.k_stride[3], E, col, key,
                    score);
    for (size_t i = 0; i < L; ++i) {
      dp[i] = lse[i] = delta[i] = T(0);
      if (col[i] < 0) continue;
      dp[i] = DotRow(a.dout + (r0 + i) * Evp, v + key[i] * p.v_stride[2], Ev, p.v_stride[3]);
      lse[i] = a.lse[r0 + i];
      delta[i] = a.delta[r0 + i];
    }
    // A row that saw no key in the forward (lse -inf) or none here (score -inf) gets P = 0.
    const auto vl = hn::Load(d, lse), vs = hn::Load(d, score);
    const auto none = hn::Or(hn::Eq(vl, hn::Set(d, kNegInf)), hn::Eq(vs, hn::Set(d, kNegInf)));
    const auto pr = hn::IfThenZeroElse(none, ExpOf(d, hn::Sub(vs, vl)));
    hn::Store(pr, d, prob);
    hn::Store(hn::Mul(pr, hn::Sub(hn::Load(d, dp), hn::Load(d, delta))), d, ds);
    for (size_t i = 0; i < n; ++i) {
      if (col[i] < 0 || prob[i] == T(0)) continue;
      const size_t r = r0 + i, c = static_cast<size_t>(col[i]);
      if (dq_term != nullptr) {
        AxpyRow(dq_term + r * Ep, ds[i], k + key[i] * p.k_stride[2], E, p.k_stride[3]);
      }
      if (dk != nullptr) {
        AxpyRow(dk + c * Ep, ds[i], a.q + r * Ep, Ep, 1);
        AxpyRow(dv + c * Evp, prob[i], a.dout + r * Evp, Evp, 1);
      }
    }
  }
}

// Packs the key-side tile: K^T, V^T and, for dQ, K row-major.
template <typename T, typename IO>
HWY_INLINE void PackKeyTile(const AttentionParams& p, const BackwardPlan<T>& plan,
                            std::int64_t b, std::int64_t h, const Rows& keys, size_t cols_pad,
                            bool row_major_k, const typename BackwardPlan<T>::Arrays& a) {
  const size_t bk = static_cast<size_t>(plan.tiles.block_k);
  const size_t E = static_cast<size_t>(p.dim_qk), Ev = static_cast<size_t>(p.dim_v);
  const auto [k, v] = slice_keys_values<IO>(p, b, h);
#if defined(ATTN2D_NATIVE_BF16)
  if constexpr (std::is_same<IO, BFloat16>::value) {
    if (plan.native_bf16) {
      PackKeyPairsTransposed(k, keys, p.k_stride[2], p.k_stride[3], E,
                             reinterpret_cast<std::uint32_t*>(a.kt), bk, cols_pad);
      PackKeyPairsTransposed(v, keys, p.v_stride[2], p.v_stride[3], Ev,
                             reinterpret_cast<std::uint32_t*>(a.vt), bk, cols_pad);
    }
  }
  if (!plan.native_bf16)
#endif
  {
    PackTransposed(k, keys, p.k_stride[2], p.k_stride[3], E, a.kt, bk, cols_pad);
    PackTransposed(v, keys, p.v_stride[2], p.v_stride[3], Ev, a.vt, bk, cols_pad);
  }
  if (row_major_k) {
#if defined(ATTN2D_NATIVE_BF16)
    if constexpr (std::is_same<IO, BFloat16>::value) {
      if (plan.native_bf16) {  // K paired along the keys: B of dQ = dS K on pairs
        PackRowPairs(k, keys, p.k_stride[2], p.k_stride[3], E, plan.dim_qk_pad,
                     (keys.count + 1) / 2, reinterpret_cast<std::uint32_t*>(a.k));
        return;
      }
    }
#endif
    PackRows(k, keys, p.k_stride[2], p.k_stride[3], E, T(1), a.k, plan.dim_qk_pad, keys.count);
  }
}

// dV += P^T dO and dK += dS^T (scale q) for the pair just recomputed: A is the transposed tile
// (a_rs = 1, a_ks = bk). Each query tile's share is summed apart and then added, so a key seen
// by many query tiles (YLG's repetitive columns: every query) sums block_q-long chains plus one
// add per tile instead of one chain over every query; with one chain, float32 dV of 576 queries
// was 2.3x as far off as naive attention's, with two levels it is within it.
template <typename T>
HWY_INLINE void AccumulateKeyGrads(const BackwardPlan<T>& plan, size_t rows, size_t cols,
                                   const typename BackwardPlan<T>::Arrays& a) {
  const size_t bk = static_cast<size_t>(plan.tiles.block_k);
  bool native = false;
#if defined(ATTN2D_NATIVE_BF16)
  if constexpr (std::is_same<T, float>::value) {
    if (plan.native_bf16) {
      // P and scale * dS as bf16 pairs along the query rows, from
      // PairedProbabilitiesAndScoreGrad (P over a.s, dS in a.ds2).
      const size_t pairs = (rows + 1) / 2;
      auto* p2 = reinterpret_cast<const std::uint32_t*>(a.s);
      auto* ds2 = reinterpret_cast<const std::uint32_t*>(a.ds2);
      // Accumulating pair products are summed apart and then added: no share to add.
      gemm_bf16_pairs_strided(true, cols, plan.dim_v_pad, pairs, p2, 1, bk,
                              reinterpret_cast<const std::uint32_t*>(a.dout_rp), plan.dim_v_pad,
                              a.dv, plan.dim_v_pad);
      gemm_bf16_pairs_strided(true, cols, plan.dim_qk_pad, pairs, ds2, 1, bk,
                              reinterpret_cast<const std::uint32_t*>(a.q_rp), plan.dim_qk_pad,
                              a.dk, plan.dim_qk_pad);
      native = true;
    }
  }
#endif
  if (!native) {
    Gemm<false>(cols, plan.dim_v_pad, rows, a.s, 1, bk, a.dout, plan.dim_v_pad, a.dv_part,
                plan.dim_v_pad);
    Gemm<false>(cols, plan.dim_qk_pad, rows, a.dp, 1, bk, a.q, plan.dim_qk_pad, a.dk_part,
                plan.dim_qk_pad);
    AddRow(a.dv, a.dv_part, cols * plan.dim_v_pad);
    AddRow(a.dk, a.dk_part, cols * plan.dim_qk_pad);
  }
}

// dst (rows, E_pad) = [dst +] dS K (unscaled); on bf16 pairs, dS is paired along the keys at the
// start of each row of a.dp (PairedProbabilitiesAndScoreGrad with query_grad).
template <bool kAccumulate, typename T>
HWY_INLINE void ScoreGradTimesKeys(const BackwardPlan<T>& plan, size_t rows, size_t cols,
                                   const typename BackwardPlan<T>::Arrays& a, T* dst) {
  const size_t bk = static_cast<size_t>(plan.tiles.block_k);
#if defined(ATTN2D_NATIVE_BF16)
  if constexpr (std::is_same<T, float>::value) {
    if (plan.native_bf16) {
      gemm_bf16_pairs(kAccumulate, rows, plan.dim_qk_pad, (cols + 1) / 2,
                      reinterpret_cast<const std::uint32_t*>(a.dp), bk,
                      reinterpret_cast<const std::uint32_t*>(a.k), plan.dim_qk_pad, dst,
                      plan.dim_qk_pad);
      return;
    }
  }
#endif
  Gemm<kAccumulate>(rows, plan.dim_qk_pad, cols, a.dp, bk, 1, a.k, plan.dim_qk_pad, dst,
                    plan.dim_qk_pad);
}

template <typename T, typename IO>
HWY_INLINE void StoreKeyGrads(const AttentionBackwardParams& bp, const BackwardPlan<T>& plan,
                              std::int64_t b, std::int64_t h, const Rows& keys,
                              const typename BackwardPlan<T>::Arrays& a) {
  const AttentionParams& p = bp.fwd;
  StoreTile(a.dk, plan.dim_qk_pad, keys, static_cast<size_t>(p.dim_qk), T(1),
            static_cast<IO*>(bp.dk) + offset4(bp.dk_stride, b, h, 0, 0), bp.dk_stride[2],
            bp.dk_stride[3], plan.stream_grads);
  StoreTile(a.dv, plan.dim_v_pad, keys, static_cast<size_t>(p.dim_v), T(1),
            static_cast<IO*>(bp.dv) + offset4(bp.dv_stride, b, h, 0, 0), bp.dv_stride[2],
            bp.dv_stride[3], plan.stream_grads);
}

// Query tiles that see key tile j0: all of them, or under causality those holding a query
// i >= j0. dQ of a query tile takes this key tile only when j0 < i0 + rows, the rule pass 2
// uses: the extra (all-masked) pairs add exact zeros to dK and dV but must not touch dQ.
inline std::int64_t FirstQueryTile(const AttentionParams& p, std::int64_t j0, std::int64_t bq) {
  return p.is_causal ? j0 / bq * bq : 0;
}
inline std::int64_t KeyEnd(const AttentionParams& p, std::int64_t i0, std::int64_t rows) {
  return p.is_causal ? std::min<std::int64_t>(p.len_k, i0 + rows) : p.len_k;
}

template <typename T>
Rows KeyTileRows(const AttentionParams& p, const BackwardPlan<T>& plan, std::int64_t j0) {
  return Rows{nullptr, j0, static_cast<size_t>(std::min(plan.tiles.block_k, p.len_k - j0))};
}
template <typename T>
Rows QueryTileRows(const AttentionParams& p, const BackwardPlan<T>& plan, std::int64_t i0) {
  return Rows{nullptr, i0, static_cast<size_t>(std::min(plan.tiles.block_q, p.len_q - i0))};
}

// Key tiles [first, last) of key-tile group g out of `groups` over `tiles` tiles.
inline void GroupTiles(std::int64_t tiles, std::int64_t groups, std::int64_t g,
                       std::int64_t* first, std::int64_t* last) {
  *first = tiles * g / groups;
  *last = tiles * (g + 1) / groups;
}

// The key-tile group that tile t falls in.
inline std::int64_t GroupOf(std::int64_t tiles, std::int64_t groups, std::int64_t t) {
  std::int64_t g = 0;
  while (g + 1 < groups && tiles * (g + 1) / groups <= t) ++g;
  return g;
}

// dK and dV of key tile j0 (slice b, h), and when dq_share is not null its term of dQ, added
// into dq_share ((len_q, E_pad), unscaled).
template <typename T, typename IO>
void KeyTile(const BackwardPlan<T>& plan, std::int64_t b, std::int64_t h, std::int64_t j0,
             T* dq_share, const typename BackwardPlan<T>::Arrays& a) {
  const AttentionBackwardParams& bp = *plan.bp;
  const AttentionParams& p = bp.fwd;
  const size_t L = VectorLanes<T>();
  const size_t bk = static_cast<size_t>(plan.tiles.block_k);
  const Rows keys = KeyTileRows(p, plan, j0);
  const size_t cols = keys.count, cols_pad = (cols + L - 1) / L * L;
  const SliceMask<T> mask = slice_mask<T>(p, b, h);

  PackKeyTile<T, IO>(p, plan, b, h, keys, cols_pad, /*row_major_k=*/dq_share != nullptr, a);
  std::fill(a.dk, a.dk + cols * plan.dim_qk_pad, T(0));
  std::fill(a.dv, a.dv + cols * plan.dim_v_pad, T(0));
  for (std::int64_t i0 = FirstQueryTile(p, j0, plan.tiles.block_q); i0 < p.len_q;
       i0 += plan.tiles.block_q) {
    const Rows rows = QueryTileRows(p, plan, i0);
    PackQueryTile<T, IO>(bp, plan, b, h, rows, a);
    const bool with_dq =
        dq_share != nullptr && j0 < KeyEnd(p, i0, static_cast<std::int64_t>(rows.count));
    ProbabilitiesAndScoreGrad(plan, rows.count, cols_pad, a, /*key_grads=*/true, with_dq,
                              [&](T* S, size_t pad) {
                                MaskTile(S, bk, rows.count, cols, pad, i0, j0, mask);
                              });
    AccumulateKeyGrads(plan, rows.count, cols, a);
    if (with_dq) {
      ScoreGradTimesKeys<true>(plan, rows.count, cols, a,
                               dq_share + static_cast<size_t>(i0) * plan.dim_qk_pad);
    }
  }
  StoreKeyGrads<T, IO>(bp, plan, b, h, keys, a);
}

// dK and dV of key tile `local` of head h's layout, over the query tiles that visit it, and
// when dq_share is not null its terms of dQ, added into dq_share ((share_rows, E_pad) in layout
// tile order, unscaled). The query side comes from `gathered` (GatherQuerySide) when not null,
// else is packed at each visit. A visit's dQ term is formed apart and then added to its tile's
// rows, as pass 2 adds its terms (bitwise-equal schedules).
template <typename T, typename IO>
void SparseKeyTile(const BackwardPlan<T>& plan, std::int64_t b, std::int64_t h,
                   std::int64_t local, T* dq_share, const typename BackwardPlan<T>::Arrays& a,
                   T* gathered) {
  const AttentionBackwardParams& bp = *plan.bp;
  const AttentionParams& p = bp.fwd;
  const SparseLayout& lay = *p.layout;
  const size_t L = VectorLanes<T>();
  const size_t bq = static_cast<size_t>(plan.tiles.block_q);
  const size_t bk = static_cast<size_t>(plan.tiles.block_k);
  const std::int64_t first_q_tile = lay.q_tile_begin[lay.head_layout[h]];
  std::int64_t g;
  Rows keys;
  if (!LayoutTile(lay, h, local, /*query=*/false, &g, &keys)) return;
  const size_t cols = keys.count, cols_pad = (cols + L - 1) / L * L;
  // Visits that allow at most one key a row read the key's rows from the tensors
  // (SingleKeyGrads); a tile that only they visit (a repetitive YLG pattern's own-position run:
  // 256 of a 128x128 head's 257 tiles) is not packed.
  auto by_rows = [&](std::int64_t visit, size_t rows) {
    return !plan.native_bf16 && AtMostOneKeyARow(MaskWords(lay, lay.bwd_mask[visit]), rows);
  };
  for (std::int64_t visit = lay.bwd_begin[g]; visit < lay.bwd_begin[g + 1]; ++visit) {
    if (!by_rows(visit, LayoutTileRows(lay, lay.bwd_q_tile[visit], /*query=*/true).count)) {
      PackKeyTile<T, IO>(p, plan, b, h, keys, cols_pad, /*row_major_k=*/dq_share != nullptr, a);
      break;
    }
  }
  std::fill(a.dk, a.dk + cols * plan.dim_qk_pad, T(0));
  std::fill(a.dv, a.dv + cols * plan.dim_v_pad, T(0));
  auto visit_arrays = a;  // a, or a with its query side in `gathered`
  for (std::int64_t visit = lay.bwd_begin[g]; visit < lay.bwd_begin[g + 1]; ++visit) {
    const Rows rows = LayoutTileRows(lay, lay.bwd_q_tile[visit], /*query=*/true);
    const size_t r0 = static_cast<size_t>(lay.bwd_q_tile[visit] - first_q_tile) * bq;
    const std::uint64_t* words = MaskWords(lay, lay.bwd_mask[visit]);
    if (gathered != nullptr) {
      visit_arrays = plan.query_side_at(a, gathered, r0);
    } else {
      // The next visit's rows; at the last visit, those of the first visit of the head's next
      // key tile (the one this thread takes next, in every schedule that calls this).
      std::int64_t next = visit + 1, next_g = g;
      Rows next_keys;
      if (next == lay.bwd_begin[g + 1]) {
        next = LayoutTile(lay, h, local + 1, /*query=*/false, &next_g, &next_keys)
                   ? lay.bwd_begin[next_g]
                   : -1;
      }
      if (next >= 0 && next < lay.bwd_begin[next_g + 1]) {
        PrefetchQueryRows<T, IO>(plan, b, h,
                                 LayoutTileRows(lay, lay.bwd_q_tile[next], /*query=*/true));
      }
      PackQueryTile<T, IO>(bp, plan, b, h, rows, a);
    }
    if (by_rows(visit, rows.count)) {
      SingleKeyGrads<T, IO>(plan, b, h, rows.count, keys, words, visit_arrays,
                            dq_share != nullptr ? a.dq_term : nullptr, a.dk, a.dv);
      if (dq_share != nullptr) {
        AddRow(dq_share + r0 * plan.dim_qk_pad, a.dq_term, rows.count * plan.dim_qk_pad);
      }
      continue;
    }
    // The visit's leading columns (VisitColumns); the keys past them get no term from it, and
    // pass 2 cuts the same columns, so every schedule sums the same terms.
    const size_t visit_cols = VisitColumns(words, rows.count, cols);
    const size_t visit_pad = (visit_cols + L - 1) / L * L;
    ProbabilitiesAndScoreGrad(plan, rows.count, visit_pad, visit_arrays, /*key_grads=*/true,
                              /*query_grad=*/dq_share != nullptr, [&](T* S, size_t pad) {
                                MaskTileBits(S, bk, rows.count, visit_cols, pad, words);
                              });
    AccumulateKeyGrads(plan, rows.count, visit_cols, visit_arrays);
    if (dq_share != nullptr) {
      ScoreGradTimesKeys<false>(plan, rows.count, visit_cols, visit_arrays, a.dq_term);
      AddRow(dq_share + r0 * plan.dim_qk_pad, a.dq_term, rows.count * plan.dim_qk_pad);
    }
  }
  StoreKeyGrads<T, IO>(bp, plan, b, h, keys, a);
}

// Sparse pass 1: dK and dV of one key tile of the head's layout.
template <typename T, typename IO>
void SparseKeyTileTask(void* ctx, std::int64_t task, int thread) {
  const BackwardPlan<T>& plan = *static_cast<const BackwardPlan<T>*>(ctx);
  const std::int64_t bh = task / plan.k_tiles;
  const std::int64_t heads = plan.bp->fwd.heads;
  SparseKeyTile<T, IO>(plan, bh / heads, bh % heads, task % plan.k_tiles, nullptr,
                       plan.thread_arrays(thread), nullptr);
}

// Key tiles of slice (b, h): the dense grid's, or the head's own layout tiles.
template <typename T>
std::int64_t KeyTilesOf(const BackwardPlan<T>& plan, std::int64_t h) {
  const SparseLayout* lay = plan.bp->fwd.layout;
  if (lay == nullptr) return plan.k_tiles;
  const std::int64_t layout = lay->head_layout[h];
  return lay->k_tile_begin[layout + 1] - lay->k_tile_begin[layout];
}

// dK, dV and the dQ share (into `share`, (share_rows, E_pad)) of key-tile group g of slice
// (b, h); a sparse slice's query side is first gathered into this thread's buffer, where the
// plan has one.
// The views of bp that the backward's one-pass schedules copy to rows (KeyTileGroup): Q and dO
// over the query tiles, K and V over the key tiles.
inline std::array<StagedView, 4> StagedViews(AttentionBackwardParams& bp, bool q_apart,
                                             bool k_apart) {
  AttentionParams& f = bp.fwd;
  return {{{&f.q, f.q_stride, f.len_q, f.dim_qk, q_apart},
           {&f.k, f.k_stride, f.len_k, f.dim_qk, k_apart},
           {&f.v, f.v_stride, f.len_k, f.dim_v, k_apart},
           {&bp.dout, bp.dout_stride, f.len_q, f.dim_v, q_apart}}};
}

template <typename T, typename IO>
void KeyTileGroup(const BackwardPlan<T>& plan, std::int64_t b, std::int64_t h, std::int64_t g,
                  T* share, int thread) {
  const AttentionParams& p = plan.bp->fwd;
  const auto a = plan.thread_arrays(thread);
  std::fill(share, share + plan.share_rows * plan.dim_qk_pad, T(0));
  std::int64_t first, last;
  GroupTiles(KeyTilesOf(plan, h), plan.dq_groups, g, &first, &last);
  if (p.layout != nullptr) {
    if (plan.staging != nullptr) {
      // Channels-first views: this slice's rows copied first, and the walk reads the copies.
      AttentionBackwardParams rows_bp = *plan.bp;
      BackwardPlan<T> rows_plan = plan;
      rows_plan.bp = &rows_bp;
      rows_plan.staging = nullptr;
      IO* dst = reinterpret_cast<IO*>(plan.staging + static_cast<size_t>(thread) *
                                                         plan.staging_elems);
      for (const StagedView& v : StagedViews(rows_bp, plan.q_tiles_apart, plan.k_tiles_apart)) {
        dst += StageSlice<IO>(v, b, h, dst);
      }
      KeyTileGroup<T, IO>(rows_plan, b, h, g, share, thread);
      return;
    }
    T* side = plan.gathered_side(thread);
    if (side != nullptr) GatherQuerySide<T, IO>(plan, b, h, side, a);
    for (std::int64_t t = first; t < last; ++t) SparseKeyTile<T, IO>(plan, b, h, t, share, a, side);
    return;
  }
  for (std::int64_t t = first; t < last; ++t) {
    KeyTile<T, IO>(plan, b, h, t * plan.tiles.block_k, share, a);
  }
}

// Writes dQ of slice (b, h) = scale * sum: the one rounding to the storage type.
template <typename T, typename IO>
void StoreQueryGrad(const BackwardPlan<T>& plan, std::int64_t b, std::int64_t h,
                    const Rows& rows, const T* sum) {
  const AttentionBackwardParams& bp = *plan.bp;
  const AttentionParams& p = bp.fwd;
  StoreTile(sum, plan.dim_qk_pad, rows, static_cast<size_t>(p.dim_qk), static_cast<T>(p.scale),
            static_cast<IO*>(bp.dq) + offset4(bp.dq_stride, b, h, 0, 0), bp.dq_stride[2],
            bp.dq_stride[3], plan.stream_grads);
}

// The rows of sum's tile `chunk` (share_rows in chunks of block_q): raster rows, or the rows of
// the head's layout tile `chunk`; false past the head's last tile.
template <typename T>
bool ShareChunkRows(const BackwardPlan<T>& plan, std::int64_t h, std::int64_t chunk,
                    Rows* rows) {
  const AttentionParams& p = plan.bp->fwd;
  if (p.layout == nullptr) {
    if (chunk * plan.tiles.block_q >= p.len_q) return false;
    *rows = QueryTileRows(p, plan, chunk * plan.tiles.block_q);
    return true;
  }
  std::int64_t global;
  return LayoutTile(*p.layout, h, chunk, /*query=*/true, &global, rows);
}

// Whole heads: every gradient of one (batch, head) slice.
template <typename T, typename IO>
void HeadTask(void* ctx, std::int64_t task, int thread) {
  const BackwardPlan<T>& plan = *static_cast<const BackwardPlan<T>*>(ctx);
  const AttentionParams& p = plan.bp->fwd;
  const std::int64_t b = task / p.heads, h = task % p.heads;
  const size_t n = plan.share_rows * plan.dim_qk_pad;
  T* sum = plan.dq_shares + static_cast<size_t>(thread) * (plan.dq_groups > 1 ? 2 : 1) * n;
  KeyTileGroup<T, IO>(plan, b, h, 0, sum, thread);
  for (std::int64_t g = 1; g < plan.dq_groups; ++g) {
    KeyTileGroup<T, IO>(plan, b, h, g, sum + n, thread);
    AddRow(sum, sum + n, n);
  }
  Rows rows;
  for (std::int64_t t = 0; ShareChunkRows(plan, h, t, &rows); ++t) {
    StoreQueryGrad<T, IO>(plan, b, h, rows,
                          sum + static_cast<size_t>(t * plan.tiles.block_q) * plan.dim_qk_pad);
  }
}

// Key-tile groups, step 1: dK and dV of one group's key tiles and the group's dQ share.
template <typename T, typename IO>
void GroupTask(void* ctx, std::int64_t task, int thread) {
  const BackwardPlan<T>& plan = *static_cast<const BackwardPlan<T>*>(ctx);
  const AttentionParams& p = plan.bp->fwd;
  const std::int64_t bh = task / plan.dq_groups, g = task % plan.dq_groups;
  const size_t n = plan.share_rows * plan.dim_qk_pad;
  KeyTileGroup<T, IO>(plan, bh / p.heads, bh % p.heads, g,
                      plan.dq_shares + static_cast<size_t>(task) * n, thread);
}

// Key-tile groups, step 2: dQ of one chunk of block_q share rows, the groups' shares added in
// order.
template <typename T, typename IO>
void GroupSumTask(void* ctx, std::int64_t task, int /*thread*/) {
  const BackwardPlan<T>& plan = *static_cast<const BackwardPlan<T>*>(ctx);
  const AttentionParams& p = plan.bp->fwd;
  const std::int64_t bh = task / plan.share_chunks(), chunk = task % plan.share_chunks();
  Rows rows;
  if (!ShareChunkRows(plan, bh % p.heads, chunk, &rows)) return;
  const size_t n = plan.share_rows * plan.dim_qk_pad;
  const size_t offset = static_cast<size_t>(chunk * plan.tiles.block_q) * plan.dim_qk_pad;
  T* sum = plan.dq_shares + static_cast<size_t>(bh * plan.dq_groups) * n + offset;
  for (std::int64_t g = 1; g < plan.dq_groups; ++g) {
    AddRow(sum, sum + static_cast<size_t>(g) * n, rows.count * plan.dim_qk_pad);
  }
  StoreQueryGrad<T, IO>(plan, bh / p.heads, bh % p.heads, rows, sum);
}

// Pass 1: dK and dV of one key tile.
template <typename T, typename IO>
void KeyTileTask(void* ctx, std::int64_t task, int thread) {
  const BackwardPlan<T>& plan = *static_cast<const BackwardPlan<T>*>(ctx);
  const AttentionParams& p = plan.bp->fwd;
  const std::int64_t bh = task / plan.k_tiles;
  const std::int64_t b = bh / p.heads, h = bh % p.heads;
  const std::int64_t j0 = (task % plan.k_tiles) * plan.tiles.block_k;
  const auto a = plan.thread_arrays(thread);
  KeyTile<T, IO>(plan, b, h, j0, nullptr, a);
}

// Pass 2: dQ of one query tile, over `visits` key tiles: visit(keys, mask_fn, group, words) for
// each, group being the key tile's key-tile group (ascending), words a sparse visit's mask words
// (null: the dense mask_fn alone).
template <typename T, typename IO, class Visits>
HWY_INLINE void QueryTileGrad(const BackwardPlan<T>& plan, std::int64_t b, std::int64_t h,
                              const Rows& rows, const typename BackwardPlan<T>::Arrays& a,
                              const Visits& visits) {
  const AttentionBackwardParams& bp = *plan.bp;
  const AttentionParams& p = bp.fwd;
  const size_t L = VectorLanes<T>();
  const size_t n = rows.count * plan.dim_qk_pad;
  PackQueryTile<T, IO>(bp, plan, b, h, rows, a);
  std::fill(a.dq, a.dq + n, T(0));
  // The first group sums into a.dq; each later one into a.dq_group, then added, so the order
  // is the one-pass schedules': ((group 0 + group 1) + group 2) ... A sparse visit forms its
  // term apart and adds it, as the one-pass walk must for its gathered rows.
  std::int64_t groups_seen = 0, current = -1;
  visits([&](const Rows& keys, const auto& mask, std::int64_t group, const std::uint64_t* words) {
    if (group != current) {
      if (groups_seen >= 2) AddRow(a.dq, a.dq_group, n);
      if (groups_seen >= 1) std::fill(a.dq_group, a.dq_group + n, T(0));
      ++groups_seen;
      current = group;
    }
    T* sum = groups_seen == 1 ? a.dq : a.dq_group;
    if (!plan.native_bf16 && AtMostOneKeyARow(words, rows.count)) {
      SingleKeyGrads<T, IO>(plan, b, h, rows.count, keys, words, a, a.dq_term, nullptr, nullptr);
      AddRow(sum, a.dq_term, n);
      return;
    }
    const size_t cols_pad = (keys.count + L - 1) / L * L;
    PackKeyTile<T, IO>(p, plan, b, h, keys, cols_pad, /*row_major_k=*/true, a);
    ProbabilitiesAndScoreGrad(plan, rows.count, cols_pad, a, /*key_grads=*/false,
                              /*query_grad=*/true, mask);
    if (p.layout != nullptr) {
      ScoreGradTimesKeys<false>(plan, rows.count, keys.count, a, a.dq_term);
      AddRow(sum, a.dq_term, n);
    } else {
      ScoreGradTimesKeys<true>(plan, rows.count, keys.count, a, sum);
    }
  });
  if (groups_seen >= 2) AddRow(a.dq, a.dq_group, n);
  StoreQueryGrad<T, IO>(plan, b, h, rows, a.dq);
}

template <typename T, typename IO>
void QueryTileTask(void* ctx, std::int64_t task, int thread) {
  const BackwardPlan<T>& plan = *static_cast<const BackwardPlan<T>*>(ctx);
  const AttentionParams& p = plan.bp->fwd;
  const size_t bk = static_cast<size_t>(plan.tiles.block_k);
  const std::int64_t bh = task / plan.q_tiles;
  const std::int64_t b = bh / p.heads, h = bh % p.heads;
  const std::int64_t i0 = (task % plan.q_tiles) * plan.tiles.block_q;
  const Rows rows = QueryTileRows(p, plan, i0);
  const auto a = plan.thread_arrays(thread);
  const SliceMask<T> mask = slice_mask<T>(p, b, h);
  const std::int64_t key_end = KeyEnd(p, i0, static_cast<std::int64_t>(rows.count));
  QueryTileGrad<T, IO>(plan, b, h, rows, a, [&](const auto& visit) {
    for (std::int64_t j0 = 0; j0 < key_end; j0 += plan.tiles.block_k) {
      const Rows keys = KeyTileRows(p, plan, j0);
      visit(
          keys,
          [&](T* S, size_t pad) { MaskTile(S, bk, rows.count, keys.count, pad, i0, j0, mask); },
          GroupOf(plan.k_tiles, plan.dq_groups, j0 / plan.tiles.block_k), nullptr);
    }
  });
}

// Sparse pass 2: dQ of one query tile of the head's layout, over its visit list.
template <typename T, typename IO>
void SparseQueryTileTask(void* ctx, std::int64_t task, int thread) {
  const BackwardPlan<T>& plan = *static_cast<const BackwardPlan<T>*>(ctx);
  const AttentionParams& p = plan.bp->fwd;
  const SparseLayout& lay = *p.layout;
  const size_t bk = static_cast<size_t>(plan.tiles.block_k);
  std::int64_t b, h, g;
  Rows rows;
  if (!SparseTaskTile(lay, p.heads, plan.q_tiles, task, /*query=*/true, &b, &h, &g,
                      &rows)) {
    return;
  }
  const auto a = plan.thread_arrays(thread);
  const std::int64_t first_key_tile = lay.k_tile_begin[lay.head_layout[h]];
  const std::int64_t key_tiles = KeyTilesOf(plan, h);
  QueryTileGrad<T, IO>(plan, b, h, rows, a, [&](const auto& visit) {
    for (std::int64_t v = lay.fwd_begin[g]; v < lay.fwd_begin[g + 1]; ++v) {
      const Rows tile = LayoutTileRows(lay, lay.fwd_k_tile[v], /*query=*/false);
      const std::uint64_t* words = MaskWords(lay, lay.fwd_mask[v]);
      const Rows keys{tile.index, tile.first, VisitColumns(words, rows.count, tile.count)};
      visit(
          keys,
          [&](T* S, size_t pad) { MaskTileBits(S, bk, rows.count, keys.count, pad, words); },
          GroupOf(key_tiles, plan.dq_groups, lay.fwd_k_tile[v] - first_key_tile), words);
    }
  });
}

// T: the compute type; IO: the tensors' element type (T, or a 16-bit type).
template <typename T, typename IO>
Status Backward(const AttentionBackwardParams& bp, const Host& host) {
  const AttentionParams& p = bp.fwd;
  if (p.batch == 0 || p.heads == 0) return Status::Ok();
  const size_t L = VectorLanes<T>();
  BackwardPlan<T> plan;
  plan.bp = &bp;
  plan.dim_qk_pad = static_cast<size_t>(round_up(p.dim_qk, static_cast<std::int64_t>(L)));
  plan.dim_v_pad = static_cast<size_t>(round_up(p.dim_v, static_cast<std::int64_t>(L)));
  if (p.layout != nullptr) {
    const SparseLayout& lay = *p.layout;
    plan.tiles = TileSizes{lay.block_q, lay.block_k};
    plan.q_tiles = MostLayoutTiles(lay, /*query=*/true);
    plan.k_tiles = MostLayoutTiles(lay, /*query=*/false);
  } else {
    plan.tiles =
        choose_tiles(p.len_q, p.len_k, p.dim_qk, p.dim_v, sizeof(T), std::max<size_t>(L, 16));
    plan.q_tiles = (p.len_q + plan.tiles.block_q - 1) / plan.tiles.block_q;
    plan.k_tiles = (p.len_k + plan.tiles.block_k - 1) / plan.tiles.block_k;
  }
#if defined(ATTN2D_NATIVE_BF16)
  plan.native_bf16 = std::is_same<IO, BFloat16>::value && use_bf16_pairs();
#endif
  plan.scratch_elems = plan.carve(nullptr).elems;
  const int threads = std::max(host.num_threads, 1);
  const std::int64_t slices = p.batch * p.heads;
  plan.stream_grads =
      stream_results(host, gradient_bytes(p, static_cast<std::int64_t>(sizeof(IO))));
  plan.sum_chunks = (p.len_q + plan.tiles.block_q - 1) / plan.tiles.block_q;
  plan.share_rows = p.layout != nullptr
                        ? static_cast<size_t>(plan.q_tiles * plan.tiles.block_q)
                        : static_cast<size_t>(p.len_q);
  const size_t share_elems = plan.share_rows * plan.dim_qk_pad;
  // A sparse layout's query tile sees few key tiles (YLG at 128x128 over 64x64: 1.5 visits on
  // average), and each group costs a zeroed (len_q, E_pad) share and its add, whichever rows it
  // touches (for YLG, 9% of the backward's samples; the backward ran 15-20% faster without).
  // One group: one chain per dQ row, in key-tile order, in every schedule (two passes where
  // whole heads would leave threads idle).
  plan.dq_groups = p.layout != nullptr ? 1 : backward_dq_groups(plan.k_tiles);
  // dQ shares stay under 256 MiB (at 64 threads, whole heads of len_q = 65536, E = 64 would
  // want 2 GiB; two passes need none).
  constexpr size_t kMaxShareBytes = size_t{256} << 20;
  const BackwardSchedule schedule =
      choose_backward_schedule(slices, threads, p.dim_qk, p.dim_v, plan.dq_groups, share_elems,
                               sizeof(T), kMaxShareBytes);
  size_t share_total = 0;
  if (schedule == BackwardSchedule::kWholeHeads) {
    share_total = static_cast<size_t>(threads) * (plan.dq_groups > 1 ? 2 : 1) * share_elems;
  } else if (schedule == BackwardSchedule::kKeyTileGroups) {
    share_total = static_cast<size_t>(slices * plan.dq_groups) * share_elems;
  }
  const bool sparse = p.layout != nullptr;
  // The one-pass schedules walk a slice's key tiles, each visited by several query tiles (YLG's
  // repetitive columns: by all of them), so its query side is gathered once per slice, within
  // the same 256 MiB as the shares (at 32 threads, len_q = 65536, E = 8, Ev = 32 it would take
  // 400 MiB on AVX-512); the bf16 products pack pairs at each visit instead.
  const size_t gather_elems = static_cast<size_t>(threads) * plan.share_rows *
                              (plan.dim_qk_pad + plan.dim_v_pad + 2);
  const bool gather = sparse && schedule != BackwardSchedule::kTwoPasses && !plan.native_bf16 &&
                      gather_elems * sizeof(T) <= kMaxShareBytes;
  const size_t gathered_elems = gather ? gather_elems : 0;
  // Channels-first views in those schedules: each thread copies its slice's rows first
  // (KeyTileGroup), O(threads (len_q + len_k) (E + Ev)) of workspace. Copies of the whole tensors
  // raised a step's peak (YLG(8) 128x128 over 64x64, E = Ev = 16) from 27.8 to 47.8 MiB; these
  // to 32.7, the forward's runs included.
  size_t staging_total = 0;
  AttentionBackwardParams probe = bp;  // a copy: StagedViews hands out its pointers to repoint
  // Whether the tiles' rows lie apart is asked (a walk over the layout) only where some view is
  // channels-first.
  if (gather && StagedElemsPerHead(StagedViews(probe, true, true)) > 0) {
    plan.q_tiles_apart = ScatteredTiles(*p.layout, /*query=*/true);
    plan.k_tiles_apart = ScatteredTiles(*p.layout, /*query=*/false);
    const size_t per_slice =
        StagedElemsPerHead(StagedViews(probe, plan.q_tiles_apart, plan.k_tiles_apart));
    plan.staging_elems = (per_slice * sizeof(IO) + sizeof(T) - 1) / sizeof(T);
    staging_total = plan.staging_elems * static_cast<size_t>(threads);
  }
  const size_t delta_elems = static_cast<size_t>(slices * p.len_q);
  const size_t elems = plan.scratch_elems * static_cast<size_t>(threads) + share_total +
                       gathered_elems + delta_elems + staging_total;
  const size_t bytes = elems * sizeof(T);
  Workspace ws(host);
  const Status reserved = ws.reserve(bytes, "attention_backward");
  if (!reserved.ok()) return reserved;
  plan.workspace = reinterpret_cast<T*>(ws.data());
  plan.dq_shares = plan.workspace + plan.scratch_elems * static_cast<size_t>(threads);
  if (gather) plan.gathered = plan.dq_shares + share_total;
  plan.deltas = plan.dq_shares + share_total + gathered_elems;
  if (staging_total > 0) plan.staging = plan.deltas + delta_elems;
  run_tasks(host, slices * plan.sum_chunks, &plan, DeltaTask<T, IO>);
  switch (schedule) {
    case BackwardSchedule::kWholeHeads:
      run_tasks(host, slices, &plan, HeadTask<T, IO>);
      break;
    case BackwardSchedule::kKeyTileGroups:
      run_tasks(host, slices * plan.dq_groups, &plan, GroupTask<T, IO>);
      run_tasks(host, slices * plan.share_chunks(), &plan, GroupSumTask<T, IO>);
      break;
    case BackwardSchedule::kTwoPasses:
      run_tasks(host, slices * plan.k_tiles, &plan,
                sparse ? SparseKeyTileTask<T, IO> : KeyTileTask<T, IO>);
      run_tasks(host, slices * plan.q_tiles, &plan,
                sparse ? SparseQueryTileTask<T, IO> : QueryTileTask<T, IO>);
      break;
  }
  return Status::Ok();
}

ATTN2D_DTYPE_INSTANCES(Backward, Backward, AttentionBackwardParams)

#undef ATTN2D_NATIVE_BF16  // this file is compiled once per target

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn2d {
namespace cpu {

ATTN2D_DTYPE_DISPATCH(Backward, tiled_backward, AttentionBackwardParams)

Status attention_backward(const AttentionBackwardParams& params, const Host& host) {
  if (params.fwd.window != nullptr) return window_backward(params, host);
  return tiled_backward(params, host);
}

}  // namespace cpu
}  // namespace attn2d
#endif  // HWY_ONCE
