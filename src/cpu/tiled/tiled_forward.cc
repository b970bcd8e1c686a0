// Tiled forward: one task per (batch, head, query tile); each task walks the key tiles it can
// see with an online softmax (running max m, running sum l, accumulator acc) and writes the
// output rows and their log-sum-exp. Scratch per thread: O(block_q * block_k + tiles of q, k, v).
// The plan is in forward_plan-inl.h and a query tile's work in forward_visits-inl.h; a sparse
// layout over float32 heads up to 256 wide goes on to the query lanes (lanes/), where the kernel
// chooser sends it.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/tiled/tiled_forward.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

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
#include "cpu/common/row_ops-inl.h"
#include "cpu/common/scratch.h"
#include "cpu/common/tiling.h"
#include "cpu/common/x86_intrinsics-inl.h"
#include "cpu/lanes/lane_query_task-inl.h"
#include "cpu/lanes/query_lanes-inl.h"
#include "cpu/tiled/forward_plan-inl.h"
#include "cpu/tiled/forward_visits-inl.h"
#include "cpu/tiled/layout_scan.h"
#include "cpu/tiled/row_staging-inl.h"
#include "cpu/tiled/tiled_attention.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {

// Dense: one (batch, head, query tile); walks the key tiles it can see.
template <typename T, typename IO>
void ForwardTask(void* ctx, std::int64_t task, int thread) {
  const ForwardPlan<T>& plan = *static_cast<const ForwardPlan<T>*>(ctx);
  const AttentionParams& p = *plan.p;
  const size_t ld_s = plan.ld_s;
  const std::int64_t bh = task / plan.q_tiles;
  const std::int64_t b = bh / p.heads, h = bh % p.heads;
  const std::int64_t i0 = (task % plan.q_tiles) * plan.tiles.block_q;
  const Rows rows{nullptr, i0, static_cast<size_t>(std::min(plan.tiles.block_q, p.len_q - i0))};
  const auto a = plan.thread_arrays(thread);
  const SliceMask<T> mask = slice_mask<T>(p, b, h);
  StartQueryTile<T, IO>(p, plan, b, h, rows, a);
  // Causal: keys after the tile's last query are never visible.
  const std::int64_t key_end =
      p.is_causal ? std::min<std::int64_t>(p.len_k, i0 + static_cast<std::int64_t>(rows.count))
                  : p.len_k;
  std::int32_t* held = plan.held_tiles(thread, bh);
  for (std::int64_t j0 = 0; j0 < key_end; j0 += plan.tiles.block_k) {
    const Rows keys{nullptr, j0, static_cast<size_t>(std::min(plan.tiles.block_k, p.len_k - j0))};
    bool pack;
    const size_t slot = plan.slot_of(held, j0 / plan.tiles.block_k, &pack);
    VisitKeyTile<T, IO>(p, plan, b, h, rows.count, keys, keys.count, a,
                        a.kt + slot * plan.kt_elems(), a.v + slot * plan.v_elems(), pack,
                        [&](T* S, size_t cols_pad) {
                          MaskTile(S, ld_s, rows.count, keys.count, cols_pad, i0, j0, mask);
                        });
  }
  FinishQueryTile<T, IO>(p, plan, b, h, rows, a);
}

// Requests the query rows, output rows and log-sum-exps of sparse task `task`, the next one of
// this thread but at the end of a run (run_task_chunks hands a thread runs of consecutive
// tasks), while this task computes. A sparse tile's rows are scattered (a YLG tile's queries
// lie along Manhattan anti-diagonals, one cache line each), and the copy of a tile's rows and
// the stores of its outputs wait on memory. The lines go to L2, not L1, where they would evict
// this task's arrays (PrefetchTo; on an AMD EPYC Zen 4, two threads, YLG(8)'s forward at 128x128
// over 64x64 ran 1.1x as fast).
template <typename T, typename IO>
HWY_INLINE void PrefetchQueryTile(const AttentionParams& p, const ForwardPlan<T>& plan,
                                  std::int64_t task, const std::int32_t* held,
                                  std::int64_t held_slice, std::int64_t current_tile) {
  std::int64_t b, h, g;
  Rows rows;
  if (task >= p.batch * p.heads * plan.q_tiles ||
      !SparseTaskTile(*p.layout, p.heads, plan.q_tiles, task, /*query=*/true, &b, &h, &g,
                      &rows)) {
    return;
  }
  // Its first key tile's rows too, unless this thread's cache holds that tile packed (`held`:
  // the slots of slice `held_slice`, this task's; a task of another slice finds them emptied) or
  // this task reads that tile first (`current_tile`, global; -1: none): a YLG floor head packs a
  // gathered tile every 4 tasks. The query-lanes path packs no tile, and its floor heads' next
  // task reads this task's tile 3 times in 4, a repetitive head's always (its special keys), so
  // requests for the lines it has just read would only take issue slots.
  const SparseLayout& lay = *p.layout;
  const std::int64_t first_visit = lay.fwd_begin[g];
  if (first_visit < lay.fwd_begin[g + 1]) {
    const std::int64_t tile = lay.fwd_k_tile[first_visit] - lay.k_tile_begin[lay.head_layout[h]];
    const bool in_cache = b * p.heads + h == held_slice &&
                          (lay.fwd_k_tile[first_visit] == current_tile || plan.holds(held, tile));
    if (!in_cache) {
      const Rows keys = LayoutTileRows(lay, lay.fwd_k_tile[first_visit], /*query=*/false);
      PrefetchRows<false, PrefetchTo::kL2>(
          static_cast<const IO*>(p.k) + offset4(p.k_stride, b, h, 0, 0), keys, p.k_stride[2],
          p.k_stride[3], static_cast<size_t>(p.dim_qk));
      PrefetchRows<false, PrefetchTo::kL2>(
          static_cast<const IO*>(p.v) + offset4(p.v_stride, b, h, 0, 0), keys, p.v_stride[2],
          p.v_stride[3], static_cast<size_t>(p.dim_v));
    }
  }
  PrefetchRows<false, PrefetchTo::kL2>(static_cast<const IO*>(p.q) +
                                           offset4(p.q_stride, b, h, 0, 0),
                                       rows, p.q_stride[2], p.q_stride[3],
                                       static_cast<size_t>(p.dim_qk));
  PrefetchRows<true, PrefetchTo::kL2>(static_cast<const IO*>(p.out) +
                                          offset4(p.out_stride, b, h, 0, 0),
                                      rows, p.out_stride[2], p.out_stride[3],
                                      static_cast<size_t>(p.dim_v));
  if (p.lse != nullptr) {
    PrefetchRows<true, PrefetchTo::kL2>(
        static_cast<const T*>(p.lse) + b * p.lse_stride[0] + h * p.lse_stride[1], rows,
        p.lse_stride[2], 1, 1);
  }
}

// Sparse: one (batch, head, query tile of the head's layout); walks the tile's visit list.
template <typename T, typename IO>
void SparseForwardTask(void* ctx, std::int64_t task, int thread) {
  const ForwardPlan<T>& plan = *static_cast<const ForwardPlan<T>*>(ctx);
  const AttentionParams& p = *plan.p;
  const SparseLayout& lay = *p.layout;
  const size_t ld_s = plan.ld_s;
  std::int64_t b, h, g;
  Rows rows;
  if (!SparseTaskTile(lay, p.heads, plan.q_tiles, task, /*query=*/true, &b, &h, &g,
                      &rows)) {
    return;
  }
  const auto a = plan.thread_arrays(thread);
  const std::int64_t slice = b * p.heads + h;
  std::int32_t* held = plan.held_tiles(thread, slice);
  const std::int64_t first_key_tile =
      lay.fwd_begin[g] < lay.fwd_begin[g + 1] ? lay.fwd_k_tile[lay.fwd_begin[g]] : -1;
  if constexpr (std::is_same<T, float>::value && std::is_same<IO, float>::value) {
    if (plan.query_lanes) {
      PrefetchQueryTile<T, IO>(p, plan, task + 1, held, slice, first_key_tile);
      if (!LaneQueryTask<T, IO>(p, plan, b, h, g, rows, a)) {
        FinishQueryTile<T, IO>(p, plan, b, h, rows, a);
      }
      return;
    }
  }
  StartQueryTile<T, IO>(p, plan, b, h, rows, a);
  PrefetchQueryTile<T, IO>(p, plan, task + 1, held, slice, first_key_tile);
  const std::int64_t first_tile = lay.k_tile_begin[lay.head_layout[h]];
  for (std::int64_t visit = lay.fwd_begin[g]; visit < lay.fwd_begin[g + 1]; ++visit) {
    const Rows keys = LayoutTileRows(lay, lay.fwd_k_tile[visit], /*query=*/false);
    const std::uint64_t* words = MaskWords(lay, lay.fwd_mask[visit]);
    if (!plan.native_bf16 && AtMostOneKeyARow(words, rows.count)) {
      VisitSingleKeys<T, IO>(p, plan, b, h, rows.count, keys, words, a);
      continue;
    }
    bool pack;
    const size_t slot = plan.slot_of(held, lay.fwd_k_tile[visit] - first_tile, &pack);
    const size_t cols = VisitColumns(words, rows.count, keys.count);
    VisitKeyTile<T, IO>(p, plan, b, h, rows.count, keys, cols, a, a.kt + slot * plan.kt_elems(),
                        a.v + slot * plan.v_elems(), pack, [&](T* S, size_t cols_pad) {
                          MaskTileBits(S, ld_s, rows.count, cols, cols_pad, words);
                        });
  }
  FinishQueryTile<T, IO>(p, plan, b, h, rows, a);
}

// T: the compute type (float for float32 and the 16-bit types); IO: the tensors' element type.
template <typename T, typename IO>
Status ForwardOn(const AttentionParams& p, const Host& host, const KernelChoice& choice) {
  if (p.batch == 0 || p.heads == 0 || p.len_q == 0) return Status::Ok();
  const size_t L = VectorLanes<T>();
  ForwardPlan<T> plan;
  plan.p = &p;
  if (p.layout != nullptr) {
    plan.tiles = TileSizes{p.layout->block_q, p.layout->block_k};
    plan.q_tiles = MostLayoutTiles(*p.layout, /*query=*/true);
  } else {
    plan.tiles = choose_tiles(p.len_q, p.len_k, p.dim_qk, p.dim_v, sizeof(T),
                              std::max<size_t>(L, 16));
    plan.q_tiles = (p.len_q + plan.tiles.block_q - 1) / plan.tiles.block_q;
  }
  plan.dim_v_pad = static_cast<size_t>(round_up(p.dim_v, static_cast<std::int64_t>(L)));
  plan.ld_kt = plan.ld_s = static_cast<size_t>(plan.tiles.block_k) + L;
  plan.ld_v = plan.dim_v_pad + L;
  const int threads = std::max(host.num_threads, 1);
  std::vector<std::int64_t> held_slice(static_cast<size_t>(threads), -1);
  std::vector<std::int32_t> held;
  // The kernel chooser (core/kernel_choice.cc) sends float heads up to 256 wide on a layout to
  // the query lanes (lanes/query_lanes-inl.h).
  plan.query_lanes = std::is_same<T, float>::value && std::is_same<IO, float>::value &&
                     p.layout != nullptr && choice.kernel == Kernel::kQueryLanes;
  // The query-lanes path reads keys and values from their rows and packs no key tile.
  if (plan.q_tiles > 1 && !plan.query_lanes) {
    // 4 MiB a thread: every key tile of a ViT-B head (d = 64, 148 KiB a tile of 256 keys in
    // float32) up to 6912 keys; 315 tiles of a YLG head at E = Ev = 16 (13 KiB a tile of up to
    // 64 keys), every one at 128x128 over 64x64 (at most 253 a head).
    constexpr size_t kKvCacheBytes = size_t{4} << 20;
    const std::int64_t k_tiles =
        p.layout != nullptr ? MostLayoutTiles(*p.layout, /*query=*/false)
                            : (p.len_k + plan.tiles.block_k - 1) / plan.tiles.block_k;
    const std::int64_t fit = static_cast<std::int64_t>(
        kKvCacheBytes / ((plan.kt_elems() + plan.v_elems()) * sizeof(T)));
    const std::int64_t slots =
        k_tiles <= fit ? k_tiles : (p.layout != nullptr ? fit : std::int64_t{0});
    if (slots > 0) {
      plan.cached_kv_tiles = slots;
      held.assign(static_cast<size_t>(threads * slots), -1);
      plan.held_slice = held_slice.data();
      plan.held = held.data();
    }
  }
#if defined(ATTN2D_NATIVE_BF16)
  plan.native_bf16 =
      std::is_same<IO, BFloat16>::value && choice.products == Products::kBf16Pairs;
#endif
  plan.scratch_elems = plan.carve(nullptr).elems;
  Workspace ws(host);
  const Status reserved = ws.reserve(plan.scratch_elems * sizeof(T) * static_cast<size_t>(threads),
                                     "attention_forward");
  if (!reserved.ok()) return reserved;
  plan.workspace = reinterpret_cast<T*>(ws.data());
  const std::int64_t tasks = p.batch * p.heads * plan.q_tiles;
  if (p.layout == nullptr) {
    run_tasks(host, tasks, &plan, ForwardTask<T, IO>);
  } else {
    // 8 runs a thread: YLG's floor and repetitive heads cost differently, and one contiguous
    // range a thread would leave one thread the costlier heads of a staged run
    // (row_staging-inl.h).
    run_task_chunks(host, tasks, tasks / (8 * threads), &plan, SparseForwardTask<T, IO>);
  }
  return Status::Ok();
}

// A sparse layout over views whose gathered rows would touch a line per element: runs of heads
// of one batch element copied to rows (row_staging-inl.h), each run a problem of its own.
template <typename T, typename IO>
Status Forward(const AttentionParams& p, const Host& host, const KernelChoice& choice) {
  if (p.layout == nullptr) return ForwardOn<T, IO>(p, host, choice);
  AttentionParams sub = p;
  // Views of sub's tensors: each run's staging repoints them. Whether the tiles' rows lie apart
  // is asked (a walk over the layout) only where some view is channels-first.
  std::array<StagedView, 3> views{{{&sub.q, sub.q_stride, sub.len_q, sub.dim_qk, true},
                                   {&sub.k, sub.k_stride, sub.len_k, sub.dim_qk, true},
                                   {&sub.v, sub.v_stride, sub.len_k, sub.dim_v, true}}};
  if (StagedElemsPerHead(views) == 0) return ForwardOn<T, IO>(p, host, choice);
  views[0].scattered = ScatteredTiles(*p.layout, /*query=*/true);
  views[1].scattered = views[2].scattered = ScatteredTiles(*p.layout, /*query=*/false);
  const size_t per_head = StagedElemsPerHead(views);
  if (per_head == 0) return ForwardOn<T, IO>(p, host, choice);
  const std::int64_t run = HeadsPerStage(per_head * sizeof(IO), p.heads, host.num_threads);
  Workspace ws(host);
  const Status reserved =
      ws.reserve(static_cast<size_t>(run) * per_head * sizeof(IO), "attention_forward");
  if (!reserved.ok()) return reserved;
  SparseLayout lay = *p.layout;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h0 = 0; h0 < p.heads; h0 += run) {
      sub = p;
      lay.head_layout = p.layout->head_layout + h0;
      sub.layout = &lay;
      sub.batch = 1;
      sub.heads = std::min(run, p.heads - h0);
      sub.q = AtHead(static_cast<const IO*>(p.q), p.q_stride, b, h0);
      sub.k = AtHead(static_cast<const IO*>(p.k), p.k_stride, b, h0);
      sub.v = AtHead(static_cast<const IO*>(p.v), p.v_stride, b, h0);
      sub.out = AtHead(static_cast<IO*>(p.out), p.out_stride, b, h0);
      sub.lse = AtHead(static_cast<T*>(p.lse), p.lse_stride, b, h0);
      sub.out_accum = AtHead(static_cast<T*>(p.out_accum), p.out_accum_stride, b, h0);
      StageRows<IO>(host, sub.heads, views, reinterpret_cast<IO*>(ws.data()));
      const Status s = ForwardOn<T, IO>(sub, host, choice);
      if (!s.ok()) return s;
    }
  }
  return Status::Ok();
}

ATTN2D_DTYPE_INSTANCES(Forward, Forward, AttentionParams)

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn2d {
namespace cpu {

ATTN2D_DTYPE_DISPATCH(Forward, tiled_forward, AttentionParams)

}  // namespace cpu
}  // namespace attn2d
#endif  // HWY_ONCE
