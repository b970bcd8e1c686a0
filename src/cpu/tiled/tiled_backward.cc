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
//
// The plan is in backward_plan.h (the schedule itself in common/tiling.h), one tile pair's work
// in backward_pair-inl.h and the walks over a slice's tiles in backward_walks-inl.h.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/tiled/tiled_backward.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "attn2d/attention_params.h"
#include "attn2d/host.h"
#include "attn2d/sparse_layout.h"
#include "attn2d/status.h"
#include "core/strided.h"
#include "core/workspace.h"
#include "cpu/common/bf16_pairs_avx512.h"
#include "cpu/common/dtype_dispatch.h"
#include "cpu/common/masks-inl.h"
#include "cpu/common/pack-inl.h"
#include "cpu/common/result_stores.h"
#include "cpu/common/row_ops-inl.h"
#include "cpu/common/tiling.h"
#include "cpu/common/x86_intrinsics-inl.h"
#include "cpu/tiled/backward_pair-inl.h"
#include "cpu/tiled/backward_plan.h"
#include "cpu/tiled/backward_tiling.h"
#include "cpu/tiled/backward_walks-inl.h"
#include "cpu/tiled/layout_scan.h"
#include "cpu/tiled/row_staging-inl.h"
#include "cpu/tiled/tiled_attention.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {

// delta = rowsum(dO * O) of the rows of one query tile of one slice (b, h), into plan.deltas:
// once per call, where computing it while packing each (query tile, key tile) pair would repeat
// a scalar chain over Ev (one dependent FMA per element) for every pair.
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
  // a.dout. O rows of the compute type (out_accum's among them) are read in place too (DotRow walks a strided row with
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
  const T* out_accum = OutAccumAt<T>(p, b, h);
  const IO* out = out_accum != nullptr
                      ? nullptr
                      : static_cast<const IO*>(p.out) + offset4(p.out_stride, b, h, 0, 0);
  for (size_t r = 0; r < rows.count; ++r) {
    const T* x = dout + static_cast<std::int64_t>(r) * dout_ld;
    T delta;
    if (out_accum != nullptr) {
      delta = DotRow(x, out_accum + rows[r] * p.out_accum_stride[2], Ev, p.out_accum_stride[3]);
    } else if constexpr (std::is_same<IO, T>::value) {
      delta = DotRow(x, out + rows[r] * p.out_stride[2], Ev, p.out_stride[3]);
    } else {
      PackRows(out, Rows{nullptr, rows[r], 1}, p.out_stride[2], p.out_stride[3], Ev, T(1),
               a.dv_part, Evp, 1);
      delta = DotRow(x, a.dv_part, Ev, 1);
    }
    plan.deltas[slice * p.len_q + rows[r]] = delta;
  }
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

// Sparse pass 1: dK and dV of one key tile of the head's layout.
template <typename T, typename IO>
void SparseKeyTileTask(void* ctx, std::int64_t task, int thread) {
  const BackwardPlan<T>& plan = *static_cast<const BackwardPlan<T>*>(ctx);
  const std::int64_t bh = task / plan.k_tiles;
  const std::int64_t heads = plan.bp->fwd.heads;
  SparseKeyTile<T, IO>(plan, bh / heads, bh % heads, task % plan.k_tiles, nullptr,
                       plan.thread_arrays(thread), nullptr);
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
Status Backward(const AttentionBackwardParams& bp, const Host& host, const KernelChoice& choice) {
  const AttentionParams& p = bp.fwd;
  if (p.batch == 0 || p.heads == 0) return Status::Ok();
  const size_t L = VectorLanes<T>();
  BackwardPlan<T> plan;
  plan.bp = &bp;
  plan.dim_qk_pad = static_cast<size_t>(round_up(p.dim_qk, static_cast<std::int64_t>(L)));
  plan.dim_v_pad = static_cast<size_t>(round_up(p.dim_v, static_cast<std::int64_t>(L)));
  const int threads = std::max(host.num_threads, 1);
  const BackwardTiling tiling = plan_backward_tiling(p, threads, L, sizeof(T));
  plan.tiles = tiling.tiles;
  plan.q_tiles = tiling.q_tiles;
  plan.k_tiles = tiling.k_tiles;
#if defined(ATTN2D_NATIVE_BF16)
  plan.native_bf16 =
      std::is_same<IO, BFloat16>::value && choice.products == Products::kBf16Pairs;
#endif
  plan.scratch_elems = plan.carve(nullptr).elems;
  const std::int64_t slices = p.batch * p.heads;
  plan.stream_grads =
      stream_results(host, gradient_bytes(p, static_cast<std::int64_t>(sizeof(IO))));
  plan.sum_chunks = (p.len_q + plan.tiles.block_q - 1) / plan.tiles.block_q;
  plan.share_rows = tiling.share_rows;
  const size_t share_elems = plan.share_rows * plan.dim_qk_pad;
  plan.dq_groups = tiling.dq_groups;
  // The kernel chooser's schedule (plan_backward_tiling's, reported by attn2d.explain); every
  // schedule gives the same bits.
  const Schedule schedule = choice.schedule;
  if (schedule != Schedule::kWholeHeads && schedule != Schedule::kKeyTileGroups &&
      schedule != Schedule::kTwoPasses) {
    return Status::Unsupported(std::string("the tiled backward has no schedule \"") +
                               schedule_name(schedule) + "\"");
  }
  size_t share_total = 0;
  if (schedule == Schedule::kWholeHeads) {
    share_total = static_cast<size_t>(threads) * (plan.dq_groups > 1 ? 2 : 1) * share_elems;
  } else if (schedule == Schedule::kKeyTileGroups) {
    share_total = static_cast<size_t>(slices * plan.dq_groups) * share_elems;
  }
  const bool sparse = p.layout != nullptr;
  // The one-pass schedules walk a slice's key tiles, each visited by several query tiles (YLG's
  // repetitive columns: by all of them), so its query side is gathered once per slice, within
  // the same 256 MiB as the shares (at 32 threads, len_q = 65536, E = 8, Ev = 32 it would take
  // 400 MiB on AVX-512); the bf16 products pack pairs at each visit instead.
  const size_t gather_elems = static_cast<size_t>(threads) * plan.share_rows *
                              (plan.dim_qk_pad + plan.dim_v_pad + 2);
  const bool gather = sparse && schedule != Schedule::kTwoPasses && !plan.native_bf16 &&
                      gather_elems * sizeof(T) <= kMaxShareBytes;
  const size_t gathered_elems = gather ? gather_elems : 0;
  // Channels-first views in those schedules: each thread copies its slice's rows first
  // (KeyTileGroup), O(threads (len_q + len_k) (E + Ev)) of workspace, where copies of the whole
  // tensors would hold every slice at once (row_staging-inl.h).
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
    case Schedule::kWholeHeads:
      run_tasks(host, slices, &plan, HeadTask<T, IO>);
      break;
    case Schedule::kKeyTileGroups:
      run_tasks(host, slices * plan.dq_groups, &plan, GroupTask<T, IO>);
      run_tasks(host, slices * plan.share_chunks(), &plan, GroupSumTask<T, IO>);
      break;
    case Schedule::kTwoPasses:
      run_tasks(host, slices * plan.k_tiles, &plan,
                sparse ? SparseKeyTileTask<T, IO> : KeyTileTask<T, IO>);
      run_tasks(host, slices * plan.q_tiles, &plan,
                sparse ? SparseQueryTileTask<T, IO> : QueryTileTask<T, IO>);
      break;
    default:  // refused above
      break;
  }
  return Status::Ok();
}

ATTN2D_DTYPE_INSTANCES(Backward, Backward, AttentionBackwardParams)

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn2d {
namespace cpu {

ATTN2D_DTYPE_DISPATCH(Backward, tiled_backward, AttentionBackwardParams)

}  // namespace cpu
}  // namespace attn2d
#endif  // HWY_ONCE
