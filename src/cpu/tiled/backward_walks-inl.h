// The tiled backward's walks over one (batch, head) slice, per target: one key tile down the
// query tiles that see it (dense, or a sparse layout's visits with the query side gathered or
// staged first), a group of key tiles with its dQ share, and pass 2's walk of one query tile.
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_TILED_BACKWARD_WALKS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_TILED_BACKWARD_WALKS_INL_H_
#undef ATTN2D_SRC_CPU_TILED_BACKWARD_WALKS_INL_H_
#else
#define ATTN2D_SRC_CPU_TILED_BACKWARD_WALKS_INL_H_
#endif

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

#include "attn2d/attention_params.h"
#include "attn2d/sparse_layout.h"
#include "core/strided.h"
#include "cpu/common/masks-inl.h"
#include "cpu/common/pack-inl.h"
#include "cpu/common/row_ops-inl.h"
#include "cpu/tiled/backward_pair-inl.h"
#include "cpu/tiled/backward_plan.h"
#include "cpu/tiled/row_staging-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <typename T>
Rows KeyTileRows(const AttentionParams& p, const BackwardPlan<T>& plan, std::int64_t j0) {
  return Rows{nullptr, j0, static_cast<size_t>(std::min(plan.tiles.block_k, p.len_k - j0))};
}
template <typename T>
Rows QueryTileRows(const AttentionParams& p, const BackwardPlan<T>& plan, std::int64_t i0) {
  return Rows{nullptr, i0, static_cast<size_t>(std::min(plan.tiles.block_q, p.len_q - i0))};
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

// Requests the lines that packing the query side of tile `rows` (slice b, h) at a visit reads,
// a visit ahead: its rows of Q and dO, their log-sum-exps and deltas. A sparse tile's rows are
// scattered (a YLG tile's queries lie along Manhattan anti-diagonals, one line each), and
// without this their copies wait on memory.
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
// queries lie along Manhattan anti-diagonals, one cache line each), and PackQueryTile would
// gather them again at every visit of the slice's key tiles. Requesting the next tile's lines
// before each copy, or walking the rows in raster order to their slots, gathers slower.
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

// Key tiles of slice (b, h): the dense grid's, or the head's own layout tiles.
template <typename T>
std::int64_t KeyTilesOf(const BackwardPlan<T>& plan, std::int64_t h) {
  const SparseLayout* lay = plan.bp->fwd.layout;
  if (lay == nullptr) return plan.k_tiles;
  const std::int64_t layout = lay->head_layout[h];
  return lay->k_tile_begin[layout + 1] - lay->k_tile_begin[layout];
}

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

// dK, dV and the dQ share (into `share`, (share_rows, E_pad)) of key-tile group g of slice
// (b, h); a sparse slice's query side is first gathered into this thread's buffer, where the
// plan has one.
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

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_TILED_BACKWARD_WALKS_INL_H_
