// The tiled forward's plan: tile sizes (common/tiling.h) and strides, each thread's arrays carved
// from the workspace, and each thread's cache of packed key tiles. Per target only because the
// arrays round their rows up to the target's vector length.
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_TILED_FORWARD_PLAN_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_TILED_FORWARD_PLAN_INL_H_
#undef ATTN2D_SRC_CPU_TILED_FORWARD_PLAN_INL_H_
#else
#define ATTN2D_SRC_CPU_TILED_FORWARD_PLAN_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "attn2d/attention_params.h"
#include "cpu/common/row_ops-inl.h"
#include "cpu/common/scratch.h"
#include "cpu/common/tiling.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <typename T>
struct ForwardPlan {
  const AttentionParams* p;
  TileSizes tiles;
  size_t dim_v_pad;  // Ev rounded up to the vector length
  // Row strides of the packed K^T (E rows), V (block_k rows) and score (block_q rows) tiles:
  // one vector past block_k and Ev_pad. At block_k = 256 floats (1 KiB) or Ev_pad = 64 (256 B)
  // a power-of-two stride puts the rows of a GEMM panel into a quarter or an eighth of the
  // 64-set L1, which then cannot hold the panel that every 12-row block re-reads.
  size_t ld_kt, ld_v, ld_s;
  std::int64_t q_tiles;
  size_t scratch_elems;  // per thread
  T* workspace;
  // bf16 tensors on a CPU with AVX512-BF16: q, K^T and V are packed as bf16 pairs (in the same
  // arrays, which are at least as large), S = Q K^T and acc += P V run on VDPBF16PS, and P is
  // rounded to bf16 once, as naive bf16 attention rounds it.
  bool native_bf16 = false;
  // A sparse layout over float heads up to 256 wide: its visits run with the queries along the
  // vector lanes (lanes/lane_query_task-inl.h, LaneQueryTask), where the kernel chooser says so.
  bool query_lanes = false;

  // More than one query tile a head (dense or sparse): each thread keeps packed K^T and V
  // tiles of the head it last worked on, so the next query tiles of that head (the binding's
  // threads take contiguous runs of tasks) skip the packing, which would re-run for every query
  // tile; a sparse layout's key tile is visited by
  // many query tiles (YLG's repetitive columns: all of them), in no set order, each visit
  // gathering its scattered rows again. Key tile t sits in slot t % cached_kv_tiles. Dense
  // attention holds every tile of a head or none (0): its query tiles walk all the key tiles in
  // order, which a smaller cache would evict before their reuse. A sparse layout's head whose
  // tiles exceed kKvCacheBytes holds as many as fit: a YLG query tile reuses its repetitive
  // columns (tiles 0 and 1 at 256x256 over 128x128, one of ~1000) and its neighbours' tiles.
  std::int64_t cached_kv_tiles = 0;
  std::int64_t* held_slice = nullptr;  // (threads,) b * heads + h of the thread's tiles, or -1
  std::int32_t* held = nullptr;  // (threads, cached_kv_tiles): the tile in each slot, or -1

  // The thread's slots for slice `slice` (emptied when the thread moves to another slice), or
  // null when the cache is off.
  std::int32_t* held_tiles(int thread, std::int64_t slice) const {
    if (cached_kv_tiles == 0) return nullptr;
    const size_t n = static_cast<size_t>(cached_kv_tiles);
    std::int32_t* slots = held + static_cast<size_t>(thread) * n;
    if (held_slice[thread] != slice) {
      held_slice[thread] = slice;
      std::fill(slots, slots + n, -1);
    }
    return slots;
  }
  // Whether the slots `slots` (null: the cache is off) hold key tile `tile` packed.
  bool holds(const std::int32_t* slots, std::int64_t tile) const {
    return slots != nullptr && slots[tile % cached_kv_tiles] == tile;
  }
  // Where key tile `tile` (local to the head) goes: its cache slot and whether it must be packed
  // there first (the slot then holds it); slot 0, always packed, when the cache is off.
  size_t slot_of(std::int32_t* slots, std::int64_t tile, bool* pack) const {
    *pack = !holds(slots, tile);
    if (slots == nullptr) return 0;
    const size_t slot = static_cast<size_t>(tile % cached_kv_tiles);
    slots[slot] = static_cast<std::int32_t>(tile);
    return slot;
  }

  struct Arrays {
    T *q, *kt, *v, *s, *acc, *m, *l;
    // The query-lanes path's (LaneArrays); empty when it is off, as kt, v and s are when on.
    T *qt, *st, *acct, *rows, *rows_t;
    size_t elems;
  };
  size_t kt_elems() const { return static_cast<size_t>(p->dim_qk) * ld_kt; }
  size_t v_elems() const { return static_cast<size_t>(tiles.block_k) * ld_v; }
  // Lays out one thread's arrays at base (null: only counts them into `elems`).
  Arrays carve(T* base) const {
    const size_t bq = tiles.block_q, bk = tiles.block_k;
    const size_t E = static_cast<size_t>(p->dim_qk);
    ScratchCarver<T> c(base);
    Arrays a;
    // Rows rounded up to whole vectors: the query-lanes path packs and transposes a vector of
    // rows at a time.
    const size_t L = VectorLanes<T>(), bq_vectors = (bq + L - 1) / L * L;
    a.q = c.take(bq_vectors * E);   // (block_q, E), pre-multiplied by scale
    // The query-lanes path forms no score tile and packs no key tile: none of these.
    const size_t tiles_on = query_lanes ? 0 : 1;
    const size_t kv_tiles =
        tiles_on * static_cast<size_t>(std::max<std::int64_t>(cached_kv_tiles, 1));
    a.kt = c.take(kv_tiles * E * ld_kt);  // kv_tiles x (E, block_k): keys along the vector
    a.v = c.take(kv_tiles * bk * ld_v);   // kv_tiles x (block_k, Ev_pad)
    a.s = c.take(tiles_on * bq * ld_s);   // (block_q, block_k) scores, then probabilities
    a.acc = c.take(bq_vectors * dim_v_pad); // (block_q, Ev_pad)
    // m and l padded to whole vectors: FinishQueryTile loads them a vector at a time.
    a.m = c.take(bq_vectors);
    a.l = c.take(bq_vectors);
    const size_t lanes_on = query_lanes ? 1 : 0;
    a.qt = c.take(lanes_on * E * L);                                  // (E, L)
    a.st = c.take(lanes_on * bk * L);                                 // (block_k, L)
    a.acct = c.take(lanes_on * static_cast<size_t>(p->dim_v) * L);  // (Ev, L)
    const size_t width = static_cast<size_t>(std::max(p->dim_qk, p->dim_v));
    a.rows = c.take(lanes_on * L * width);    // (L, max(E, Ev))
    a.rows_t = c.take(lanes_on * width * L);  // (max(E, Ev), L)
    a.elems = c.used();
    return a;
  }
  // This thread's arrays, allocated once per call.
  Arrays thread_arrays(int thread) const {
    return carve(workspace + static_cast<size_t>(thread) * scratch_elems);
  }
};

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_TILED_FORWARD_PLAN_INL_H_
