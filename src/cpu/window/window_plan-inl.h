// The window kernels' plan: blocks of query vectors and their walk, the groups of whole heads
// packed at once, the bands of the streamed planes, and the forward's plan. None of it is SIMD,
// but it is compiled per target: GCC inlines its templates into a target's kernels only when
// they are built for that target too, and RunHeadGroups runs the kernels' lambdas inline.
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_WINDOW_WINDOW_PLAN_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_WINDOW_WINDOW_PLAN_INL_H_
#undef ATTN2D_SRC_CPU_WINDOW_WINDOW_PLAN_INL_H_
#else
#define ATTN2D_SRC_CPU_WINDOW_WINDOW_PLAN_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "attn2d/attention_params.h"
#include "attn2d/host.h"
#include "attn2d/status.h"
#include "core/workspace.h"
#include "cpu/common/tiling.h"
#include "cpu/window/window_geometry.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Blocks (of kBlockRows vectors, block_stride positions apart) down each strip of a head.
template <typename T>
std::int64_t BlocksPerStrip(const WindowGeometry<T>& g) {
  const std::int64_t R = static_cast<std::int64_t>(kBlockRows);
  const std::int64_t V = g.block_stride / g.lanes;
  return (g.vectors + R * V - 1) / (R * V);
}

// Blocks [a_begin, a_begin + blocks) of strip c of head `slot` of a packed group whose first
// (batch, head) pair is group_first: vectors v0 + k V (k < kBlockRows) each.
struct BlockWalk {
  std::int64_t slot, b, h;     // head slot in the packed group, batch, head
  std::int64_t L, V, vectors;  // lanes, vectors per block stride, vectors per head
  std::int64_t c, a_begin, blocks;  // strip, first block, blocks
  template <typename T>
  BlockWalk(const WindowGeometry<T>& g, std::int64_t slot_, std::int64_t strip,
            std::int64_t first_block, std::int64_t block_count, std::int64_t group_first,
            std::int64_t heads)
      : slot(slot_),
        b((group_first + slot_) / heads),
        h((group_first + slot_) % heads),
        L(g.lanes),
        V(g.block_stride / g.lanes),
        vectors(g.vectors),
        c(strip),
        a_begin(first_block),
        blocks(block_count) {}
  // First vector of block a, or -1 past the walk's blocks or the head.
  std::int64_t first(std::int64_t a) const {
    const std::int64_t v0 = a * static_cast<std::int64_t>(kBlockRows) * V + c;
    return a < a_begin + blocks && v0 < vectors ? v0 : -1;
  }
  // Raster position of the first lane of vector k of the block from v0.
  std::int64_t position(std::int64_t v0, size_t k) const {
    return (v0 + static_cast<std::int64_t>(k) * V) * L;
  }
};

// Packed heads share one buffer of at most this many bytes, or one head where a head is larger
// (the backward's 3 E + 3 Ev + 2 rows: 7.2 MB a head at 128x128 with E = Ev = 16): transient
// workspace of O(N (E + Ev)). A buffer of two such heads would lift a training step's peak
// memory above global attention's.
constexpr size_t kPackBudgetBytes = size_t{8} << 20;
constexpr std::int64_t kPackChunk = 1024;  // positions per packing task

// Heads packed at once: as many of head_bytes as fit kPackBudgetBytes, at least one.
inline std::int64_t HeadsPerGroup(size_t head_bytes, std::int64_t pairs) {
  return std::clamp<std::int64_t>(static_cast<std::int64_t>(kPackBudgetBytes / head_bytes), 1,
                                  pairs);
}

// The whole-head kernels' run: reserves the packed planes of as many heads as HeadsPerGroup
// allows and each thread's scratch (plan.head_elems, plan.scratch_elems elements of T), sets
// plan.packed and plan.scratch, and calls run_group() once per group of heads, with
// plan.group_first and plan.group_size set.
template <typename T, class Plan, class RunGroup>
Status RunHeadGroups(const Host& host, std::int64_t pairs, const char* op, Plan& plan,
                     RunGroup&& run_group) {
  const std::int64_t group = HeadsPerGroup(plan.head_elems * sizeof(T), pairs);
  const size_t packed = plan.head_elems * static_cast<size_t>(group);
  const size_t threads = static_cast<size_t>(std::max(host.num_threads, 1));
  Workspace ws(host);
  const Status reserved = ws.reserve((packed + plan.scratch_elems * threads) * sizeof(T), op);
  if (!reserved.ok()) return reserved;
  plan.packed = reinterpret_cast<T*>(ws.data());
  plan.scratch = plan.packed + packed;
  for (plan.group_first = 0; plan.group_first < pairs; plan.group_first += group) {
    plan.group_size = std::min(group, pairs - plan.group_first);
    run_group();
  }
  return Status::Ok();
}

// Packing task `task` of a group whose first (batch, head) pair is group_first: head `slot` of
// the group, positions [n0, n0 + count).
struct PackChunk {
  std::int64_t slot, b, h, n0, count;
  PackChunk(std::int64_t task, std::int64_t tasks_per_head, std::int64_t group_first,
            std::int64_t heads, std::int64_t N)
      : slot(task / tasks_per_head),
        b((group_first + slot) / heads),
        h((group_first + slot) % heads),
        n0(task % tasks_per_head * kPackChunk),
        count(std::min(kPackChunk, N - n0)) {}
};

// Per-thread packed planes that follow a walk down one head in bands of query rows, for the
// blocked window forward (window_forward.cc). Packing whole heads first would write Q^T, K^T
// and V^T of a 128x128 head (3.3 MB at E = Ev = 16) past a 2 MB L2, for the query tasks to read
// back from L3. Here a thread packs the keys a band needs just before it runs the band, into
// planes that stay in its L2, and keeps the keys it packed for the previous band when that was
// the same head's (a 15x15 window's reach, 14 pixel rows, is the overlap of two bands): under
// PyTorch's parallel_for a thread runs consecutive tasks, so each key is packed about once; any
// other order only packs more.

// Bytes of a band's planes that should stay in L2 (what the band reads: Q^T of its queries, K^T
// and V^T of their keys). Bands of whole block rows (R = kBlockRows vectors block_stride apart,
// over every strip; blocks [a0, a1) cover positions [a0 R V L, a1 R V L), V = block_stride / L)
// as many as fit, one at least: at E = Ev = 16 (192 bytes a position) and a 15x15 window, 16
// pixel rows at width 128 (2048 queries, 1806 more keys) and 4 at width 256. Larger bands run
// slower as their planes leave L2.
constexpr std::int64_t kStreamBandBytes = std::int64_t{768} << 10;

template <typename T>
std::int64_t StreamBlocksPerBand(const WindowGeometry<T>& g, std::int64_t bytes_per_position) {
  const std::int64_t row = static_cast<std::int64_t>(kBlockRows) * g.block_stride;
  const std::int64_t reach =
      std::max<std::int64_t>(g.off_max, 0) - std::min<std::int64_t>(g.off_min, 0);
  const std::int64_t fit = (kStreamBandBytes / bytes_per_position - reach) / row;
  // A head of 4 block rows or more has 4 bands at least, so that a small map (32x32: 8 block
  // rows) still gives two threads work and walks its planes as a large one does.
  return std::clamp<std::int64_t>(fit, 1, std::max<std::int64_t>(1, BlocksPerStrip(g) / 4));
}

// The positions a band [p0, p1) of queries reads in its planes: its keys, and itself (Q^T shares
// the planes' columns, and a window need not hold offset 0: off_min may be above 0).
template <typename T>
std::int64_t StreamLo(const WindowGeometry<T>& g, std::int64_t p0) {
  return p0 + std::min<std::int64_t>(g.off_min, 0);
}
template <typename T>
std::int64_t StreamHi(const WindowGeometry<T>& g, std::int64_t p1) {
  return p1 + std::max<std::int64_t>(g.off_max, 0);
}

// Which positions a thread's planes hold: [lo, hi) of head bh (batch * heads + head), at
// columns n - origin of rows ld long.
struct StreamSpan {
  size_t ld = 0;
  std::int64_t bh = -1, origin = 0, lo = 0, hi = 0;
};

// Readies planes spanned by s for positions [lo, hi) of head bh and returns the first position
// left to pack: keeps the positions already there from the same head's walk (lo and hi only
// grow along it), moving the rows of `planes` ({first row, rows}; each row ld long) to the front
// when hi would overflow them; anything else starts over (returns lo).
template <typename T>
HWY_INLINE std::int64_t SlideStream(StreamSpan& s, std::int64_t L, std::int64_t bh,
                                    std::int64_t lo, std::int64_t hi,
                                    std::initializer_list<std::pair<T*, size_t>> planes) {
  const std::int64_t aligned_lo = floor_div(lo, L) * L;
  std::int64_t from = lo;
  if (s.bh == bh && lo >= s.lo && lo <= s.hi && hi >= s.hi) {
    from = s.hi;
    if (hi - s.origin > static_cast<std::int64_t>(s.ld)) {
      // Move the kept positions [aligned_lo, s.hi) to the front.
      const size_t shift = static_cast<size_t>(aligned_lo - s.origin);
      const size_t keep = static_cast<size_t>(s.hi - aligned_lo);
      for (const auto& [first, rows] : planes) {
        for (size_t r = 0; r < rows; ++r) {
          T* row = first + r * s.ld;
          std::memmove(row, row + shift, keep * sizeof(T));
        }
      }
      s.origin = aligned_lo;
    }
  } else {
    s.origin = aligned_lo;
  }
  s.bh = bh;
  s.lo = lo;
  s.hi = hi;
  return from;
}

// One thread's planes: Q^T (scaled), K^T and V^T, each (rows, ld) with position n at local
// column n - origin. Positions [lo, hi) of head `bh`'s keys are packed; positions outside the
// map hold zeros, as the whole-head planes' margins do.
template <typename T>
struct KeyStream : StreamSpan {
  T* qt = nullptr;  // (e_pad, ld)
  T* kt = nullptr;  // (e_pad, ld)
  T* vt = nullptr;  // (ev_pad, ld)

  // Elements of one thread's planes, for bands of `band` positions under geometry g: the band,
  // its keys' reach and a vector on each side, twice over, so that the kept keys are moved to
  // the front only every few bands. An odd number of vectors a row, as WindowGeometry::ld.
  static size_t RowLength(const WindowGeometry<T>& g, std::int64_t band) {
    const std::int64_t L = g.lanes;
    std::int64_t ld = 2 * (StreamHi(g, band) - StreamLo(g, 0) + 2 * L);
    ld = (ld + L - 1) / L * L;
    if (ld / L % 2 == 0) ld += L;
    return static_cast<size_t>(ld);
  }
  static size_t Elems(size_t ld, size_t e_pad, size_t ev_pad) {
    return (2 * e_pad + ev_pad) * ld;
  }
  void Carve(T* base, size_t ld_, size_t e_pad) {
    ld = ld_;
    qt = base;
    kt = qt + e_pad * ld;
    vt = kt + e_pad * ld;
  }
};

constexpr std::int64_t kRowsPerTask = 32;  // vectors per task, one below the other

template <typename T>
struct WindowPlan {
  const AttentionParams* p;
  const WindowGeometry<T>* g;
  size_t e_pad, ev_pad;  // E and Ev rounded up to 4 (zero rows)
  std::int64_t tasks_per_head;
  std::int64_t pack_tasks_per_head;
  std::int64_t group_first = 0;  // the (b, h) pairs packed now: group_first ..
  std::int64_t group_size = 0;
  size_t head_elems;  // packed elements per head: (2 e_pad + ev_pad) * ld
  T* packed;
  size_t scratch_elems;  // per thread
  T* scratch;
  // Blocked: each thread's planes (KeyStream above), bands of blocks_per_band block rows.
  KeyStream<T>* streams = nullptr;
  std::int64_t blocks_per_band = 0;

  // Head `slot` of the group: Q^T (scaled), K^T, V^T, each (rows, ld) with column margin + n
  // holding position n.
  size_t ld() const { return static_cast<size_t>(g->ld); }
  T* qt(std::int64_t slot) const { return packed + static_cast<size_t>(slot) * head_elems; }
  T* kt(std::int64_t slot) const { return qt(slot) + e_pad * ld(); }
  T* vt(std::int64_t slot) const { return kt(slot) + e_pad * ld(); }
};

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_WINDOW_WINDOW_PLAN_INL_H_
