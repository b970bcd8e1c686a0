// The tiled backward's plan, the same on every target: tile counts, the dQ shares of the
// schedule that common/tiling.h picks, each thread's arrays carved from the workspace, and the
// key-tile groups and causal tile ranges that fix the order of every sum.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "attn2d/attention_params.h"
#include "cpu/common/scratch.h"
#include "cpu/common/tiling.h"

namespace attn2d {
namespace cpu {

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
  // row-major copies of them (tiled/row_staging-inl.h), staging_elems T's each; null otherwise.
  T* staging = nullptr;
  size_t staging_elems = 0;
  bool q_tiles_apart = false, k_tiles_apart = false;  // ScatteredTiles of the layout
  T* deltas = nullptr;  // (batch * heads, len_q): rowsum(dO * O), computed once before the tiles
  // bf16 tensors on a CPU with AVX512-BF16: all five products (S = Q K^T, dP = dO V^T,
  // dV = P^T dO, dK = dS^T q, dQ = dS K) run on VDPBF16PS from bf16 pairs (K^T and V^T packed as
  // pairs in kt and vt, K in k; P and dS rounded to bf16 as naive bf16 attention rounds them).
  bool native_bf16 = false;
  bool stream_grads = false;  // dQ, dK and dV past the caches (common/result_stores.h)

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

// Query tiles that see key tile j0: all of them, or under causality those holding a query
// i >= j0. dQ of a query tile takes this key tile only when j0 < i0 + rows, the rule pass 2
// uses: the extra (all-masked) pairs add exact zeros to dK and dV but must not touch dQ.
inline std::int64_t FirstQueryTile(const AttentionParams& p, std::int64_t j0, std::int64_t bq) {
  return p.is_causal ? j0 / bq * bq : 0;
}
inline std::int64_t KeyEnd(const AttentionParams& p, std::int64_t i0, std::int64_t rows) {
  return p.is_causal ? std::min<std::int64_t>(p.len_k, i0 + rows) : p.len_k;
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

}  // namespace cpu
}  // namespace attn2d
