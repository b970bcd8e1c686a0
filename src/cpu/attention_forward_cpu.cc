// Tiled forward: one task per (batch, head, query tile); each task walks the key tiles it can
// see with an online softmax (running max m, running sum l, accumulator acc) and writes the
// output rows and their log-sum-exp. Scratch per thread: O(block_q * block_k + tiles of q, k, v).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/attention_forward_cpu.cc"
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
#include "attn2d/status.h"
#include "core/strided.h"
#include "core/workspace.h"
#include "cpu/attention_cpu.h"
#include "cpu/dtype_dispatch.h"
#include "cpu/bf16_pairs_avx512.h"
#include "cpu/query_lanes-inl.h"
#include "cpu/row_staging-inl.h"
#include "cpu/scratch.h"
#include "cpu/tile_ops-inl.h"
#include "cpu/tiling.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {

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
  // vector lanes (cpu/query_lanes-inl.h, LaneQueryTask).
  bool query_lanes = false;

  // More than one query tile a head (dense or sparse): each thread keeps packed K^T and V
  // tiles of the head it last worked on, so the next query tiles of that head (the binding's
  // threads take contiguous runs of tasks) skip the packing, which re-ran for every query tile
  // and took ~7% of the bf16 ViT-B N=1024 forward; a sparse layout's key tile is visited by
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

// Writes the finished rows of a query tile: out = acc / l (0 for a fully masked row) and
// lse = m + log l (-inf for a fully masked row). 1 / l and the logs (LogSumExp) a vector of
// rows at a time, and float rows with unit stride as vectors: the scalar version (a log call a
// row, Ev strided stores) was 6.5% of the YLG forward at 128x128, whose query tiles see about
// 100 keys a row.
template <typename T, typename IO>
HWY_INLINE void FinishQueryTile(const AttentionParams& p, const ForwardPlan<T>& plan,
                                std::int64_t b, std::int64_t h, const Rows& rows,
                                const typename ForwardPlan<T>::Arrays& a) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const hn::ScalableTag<T> d;
  const size_t L = hn::Lanes(d);
  const size_t Ev = static_cast<size_t>(p.dim_v), Evp = plan.dim_v_pad;
  IO* out = static_cast<IO*>(p.out) + offset4(p.out_stride, b, h, 0, 0);
  T* lse = static_cast<T*>(p.lse);
  HWY_ALIGN T inv_l[HWY_MAX_BYTES / sizeof(T)];
  HWY_ALIGN T log_sum[HWY_MAX_BYTES / sizeof(T)];
  for (size_t r0 = 0; r0 < rows.count; r0 += L) {
    const size_t n = std::min(L, rows.count - r0);
    // Lanes past the tile's rows (m and l are padded to whole vectors, their padding unset)
    // read as an empty row. A copy of m and l into whole vectors lane by lane was 5.7% of the
    // sparse forward task's own samples (YLG 128x128, one thread).
    const auto valid = hn::FirstN(d, n);
    const auto vm = hn::IfThenElse(valid, hn::LoadU(d, a.m + r0), hn::Set(d, kNegInf));
    const auto vl = hn::IfThenElse(valid, hn::LoadU(d, a.l + r0), hn::Set(d, T(1)));
    const auto empty = hn::Eq(vm, hn::Set(d, kNegInf));
    hn::Store(hn::IfThenZeroElse(empty, hn::Div(hn::Set(d, T(1)), vl)), d, inv_l);
    hn::Store(LogSumExp(d, vm, vl), d, log_sum);
    for (size_t i = 0; i < n; ++i) {
      const size_t r = r0 + i;
      StoreTile(a.acc + r * Evp, Evp, Rows{nullptr, rows[r], 1}, Ev, inv_l[i], out,
                p.out_stride[2], p.out_stride[3], /*stream=*/false);
    }
    if (lse != nullptr) {
      T* lse_bh = lse + b * p.lse_stride[0] + h * p.lse_stride[1];
      for (size_t i = 0; i < n; ++i) lse_bh[rows[r0 + i] * p.lse_stride[2]] = log_sum[i];
    }
  }
}

#if defined(ATTN2D_HAVE_AVX512_BF16) && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL)
#define ATTN2D_NATIVE_BF16 1
#endif

// Packs the query tile and resets the online-softmax state.
template <typename T, typename IO>
HWY_INLINE void StartQueryTile(const AttentionParams& p, const ForwardPlan<T>& plan,
                               std::int64_t b, std::int64_t h, const Rows& rows,
                               const typename ForwardPlan<T>::Arrays& a) {
  const size_t E = static_cast<size_t>(p.dim_qk);
  const IO* q = static_cast<const IO*>(p.q) + offset4(p.q_stride, b, h, 0, 0);
#if defined(ATTN2D_NATIVE_BF16)
  if constexpr (std::is_same<IO, BFloat16>::value) {
    if (plan.native_bf16) {
      PackQueryPairs(q, rows, p.q_stride[2], p.q_stride[3], E,
                     reinterpret_cast<std::uint32_t*>(a.q));
    }
  }
  if (!plan.native_bf16)
#endif
  {
    PackRows(q, rows, p.q_stride[2], p.q_stride[3], E, static_cast<T>(p.scale), a.q, E,
             rows.count);
  }
  std::fill(a.acc, a.acc + rows.count * plan.dim_v_pad, T(0));
  std::fill(a.m, a.m + rows.count, -std::numeric_limits<T>::infinity());
  std::fill(a.l, a.l + rows.count, T(0));
}

#if defined(ATTN2D_NATIVE_BF16)
// x = exp(x - shift) over a row of n floats (n a multiple of 16; Bf16SoftmaxExp), left as n / 2
// bf16 pair words at the row's start (rounded to nearest even, as VCVTNE2PS2BF16 rounds); returns
// the float sum of the exps. One pass where the exp and the rounding to pairs were two. The target
// attribute adds AVX512-BF16 to the AVX3 target's set for this one function.
__attribute__((target("avx512bf16"))) inline float ExpShiftSumToPairs(float* HWY_RESTRICT x,
                                                                       size_t n, float shift) {
  const hn::Full512<float> d;
  const auto vshift = hn::Set(d, shift);
  auto sum = hn::Zero(d);
  auto* out = reinterpret_cast<std::uint32_t*>(x);
  size_t j = 0;
  // Words j/2 .. j/2 + 15 are written after floats j .. j + 31 were read: in place is safe.
  for (; j + 32 <= n; j += 32) {
    const auto lo = Bf16SoftmaxExp(d, hn::Sub(hn::LoadU(d, x + j), vshift));
    const auto hi = Bf16SoftmaxExp(d, hn::Sub(hn::LoadU(d, x + j + 16), vshift));
    sum = hn::Add(sum, hn::Add(lo, hi));
    _mm512_storeu_si512(out + j / 2,
                        reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi.raw, lo.raw)));
  }
  if (j < n) {  // 16 left
    const auto lo = Bf16SoftmaxExp(d, hn::Sub(hn::LoadU(d, x + j), vshift));
    sum = hn::Add(sum, lo);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j / 2),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(lo.raw)));
  }
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

// VisitKeyTile on VDPBF16PS: S = scale * (Q K^T), mask, online softmax, P rounded to bf16 pairs
// in place, acc += P V.
template <typename T, class MaskFn>
HWY_INLINE void VisitKeyTileBf16(const AttentionParams& p, const ForwardPlan<T>& plan,
                                 std::int64_t b, std::int64_t h, size_t rows, const Rows& keys,
                                 size_t cols, const typename ForwardPlan<T>::Arrays& a, T* kt,
                                 T* v, bool pack, const MaskFn& mask) {
  const size_t L = VectorLanes<T>();
  const size_t E = static_cast<size_t>(p.dim_qk), W = (E + 1) / 2;
  const size_t Evp = plan.dim_v_pad, ld_kt = plan.ld_kt, ld_v = plan.ld_v, ld_s = plan.ld_s;
  const size_t cols_pad = (cols + L - 1) / L * L;
  auto* q2 = reinterpret_cast<const std::uint32_t*>(a.q);
  auto* kt2 = reinterpret_cast<std::uint32_t*>(kt);
  auto* v2 = reinterpret_cast<std::uint32_t*>(v);
  if (pack) {
    const size_t tile_pad = (keys.count + L - 1) / L * L;
    PackKeyPairsTransposed(static_cast<const BFloat16*>(p.k) + offset4(p.k_stride, b, h, 0, 0),
                           keys, p.k_stride[2], p.k_stride[3], E, kt2, ld_kt, tile_pad);
    PackRowPairs(static_cast<const BFloat16*>(p.v) + offset4(p.v_stride, b, h, 0, 0), keys,
                 p.v_stride[2], p.v_stride[3], static_cast<size_t>(p.dim_v), ld_v, tile_pad / 2,
                 v2);
  }
  PairScores(rows, cols_pad, W, q2, kt2, ld_kt, static_cast<T>(p.scale), a.s, ld_s);
  mask(a.s, cols_pad);
  OnlineSoftmaxStep(a.s, rows, cols_pad, ld_s, a.m, a.l, a.acc, Evp, ExpShiftSumToPairs);
  gemm_bf16_pairs(true, rows, Evp, cols_pad / 2, reinterpret_cast<const std::uint32_t*>(a.s),
                  ld_s, v2, ld_v, a.acc, Evp);
}
#endif

// Scores of the packed query tile against the first `cols` keys of key tile `keys` (into a.s),
// masked by `mask(S, cols_pad)`, then the online-softmax step and acc += P V. The whole key
// tile's K^T and V are packed into kt and v, unless `pack` is false: they are there from an
// earlier query tile.
template <typename T, typename IO, class MaskFn>
HWY_INLINE void VisitKeyTile(const AttentionParams& p, const ForwardPlan<T>& plan,
                             std::int64_t b, std::int64_t h, size_t rows, const Rows& keys,
                             size_t cols, const typename ForwardPlan<T>::Arrays& a, T* kt, T* v,
                             bool pack, const MaskFn& mask) {
#if defined(ATTN2D_NATIVE_BF16)
  if constexpr (std::is_same<IO, BFloat16>::value) {
    if (plan.native_bf16) {
      return VisitKeyTileBf16(p, plan, b, h, rows, keys, cols, a, kt, v, pack, mask);
    }
  }
#endif
  const size_t L = VectorLanes<T>();
  const size_t E = static_cast<size_t>(p.dim_qk), Ev = static_cast<size_t>(p.dim_v);
  const size_t Evp = plan.dim_v_pad, ld_kt = plan.ld_kt, ld_v = plan.ld_v, ld_s = plan.ld_s;
  const size_t cols_pad = (cols + L - 1) / L * L;
  if (pack) {
    PackTransposed(static_cast<const IO*>(p.k) + offset4(p.k_stride, b, h, 0, 0), keys,
                   p.k_stride[2], p.k_stride[3], E, kt, ld_kt, (keys.count + L - 1) / L * L);
    PackRows(static_cast<const IO*>(p.v) + offset4(p.v_stride, b, h, 0, 0), keys, p.v_stride[2],
             p.v_stride[3], Ev, T(1), v, ld_v, keys.count);
  }
  Gemm<false>(rows, cols_pad, E, a.q, E, 1, kt, ld_kt, a.s, ld_s);
  mask(a.s, cols_pad);
  OnlineSoftmaxStepExp(a.s, rows, cols_pad, ld_s, a.m, a.l, a.acc, Evp);
  Gemm<true>(rows, Evp, cols, a.s, ld_s, 1, v, ld_v, a.acc, Evp);
}

// A visit whose mask allows at most one key a row: a repetitive YLG pattern's own-position keys,
// where each query sees one key of its query tile's run (64 at 128x128 over 64x64; 16 when
// these tiles followed the enumeration, as in the figures below). Each row's score is its
// packed query row dotted with the key's row, read from the tensor, and the online softmax
// step and acc += p v run per row, a vector of rows at a time: no key tile is packed, and no
// 64 x 16 score tile is formed, masked and multiplied by V. On the tile path those visits
// took ~14% of that forward (one thread: 8.6 ms with them, 7.4 ms with them skipped); with this
// path, YLG(8) at 128x128 over 64x64, E = Ev = 16, the builds alternated 3 rounds: one thread
// 8.24, 8.34, 8.46 -> 7.71, 7.89, 7.76 ms; two threads 4.51, 4.51, 4.77 -> 4.25, 4.05, 4.07 ms;
// 256x256 over 128x128, one thread, 71.6, 68.7, 67.8 -> 68.2, 64.8, 67.1 ms.
template <typename T, typename IO>
HWY_INLINE void VisitSingleKeys(const AttentionParams& p, const ForwardPlan<T>& plan,
                                std::int64_t b, std::int64_t h, size_t rows, const Rows& keys,
                                const std::uint64_t* words,
                                const typename ForwardPlan<T>::Arrays& a) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const hn::ScalableTag<T> d;
  const size_t L = hn::Lanes(d);
  const size_t E = static_cast<size_t>(p.dim_qk), Ev = static_cast<size_t>(p.dim_v);
  const size_t Evp = plan.dim_v_pad;
  const auto [k, v] = slice_keys_values<IO>(p, b, h);
  constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(T);
  HWY_ALIGN T score[kMaxLanes];
  HWY_ALIGN T alpha[kMaxLanes];
  HWY_ALIGN T prob[kMaxLanes];
  std::int64_t key_of[kMaxLanes];
  int col[kMaxLanes];
  for (size_t r0 = 0; r0 < rows; r0 += L) {
    const size_t n = std::min(L, rows - r0);
    // The packed query rows are scaled.
    SingleKeyScores(words, keys, r0, n, L, a.q, E, k, p.k_stride[2], p.k_stride[3], E, col, key_of,
                    score);
    // m and l are padded to whole vectors (unset past the tile's rows: only n lanes are stored).
    const auto valid_lanes = hn::FirstN(d, n);
    const auto vs = hn::Load(d, score);
    const auto m_old = hn::LoadU(d, a.m + r0);
    // A NaN score makes its row's sum NaN (through alpha or p) whichever operand Max returns.
    const auto m_new = hn::Max(m_old, vs);
    const auto neg_inf = hn::Set(d, kNegInf);
    // 0 where nothing was visible before, exactly 1 where the maximum did not move; a row that
    // sees no key here adds exp(-inf) = 0, never exp(-inf + inf).
    auto va = hn::IfThenElse(hn::Eq(m_old, m_new), hn::Set(d, T(1)),
                             ExpOf(d, hn::Sub(m_old, m_new)));
    va = hn::IfThenZeroElse(hn::Eq(m_old, neg_inf), va);
    const auto vp = hn::IfThenZeroElse(hn::Eq(vs, neg_inf), ExpOf(d, hn::Sub(vs, m_new)));
    hn::BlendedStore(m_new, valid_lanes, d, a.m + r0);
    hn::BlendedStore(hn::MulAdd(hn::LoadU(d, a.l + r0), va, vp), valid_lanes, d, a.l + r0);
    hn::Store(va, d, alpha);
    hn::Store(vp, d, prob);
    for (size_t i = 0; i < n; ++i) {
      T* acc = a.acc + (r0 + i) * Evp;
      if (alpha[i] != T(1)) ScaleRow(acc, Evp, alpha[i]);
      if (key_of[i] < 0) continue;
      AxpyRow(acc, prob[i], v + key_of[i] * p.v_stride[2], Ev, p.v_stride[3]);
    }
  }
}

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
// the stores of its outputs waited on memory: 10% and 5% of the YLG forward at 256x256, one
// thread. The lines go to L2, not L1, where they evicted this task's arrays (PrefetchTo):
// YLG(8) at 128x128 over 64x64, E = Ev = 16, two threads on a Zen 4 core, the two requests
// alternated call by call, medians of 50: 5.39 -> 4.89 and 5.75 -> 4.96 ms; 8 ltr-floor heads
// 4.52 -> 3.95 and 4.62 -> 3.96 ms; 8 ltr-repetitive heads 5.90 -> 5.50 and 5.84 -> 5.66 ms.
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
  // gathered tile every 4 tasks. 8 ltr-floor heads as above: 4.08 -> 3.96, 4.61 -> 4.54,
  // 4.01 -> 3.93 ms. The query-lanes path packs no tile, and its floor heads' next task reads
  // this task's tile 3 times in 4, a repetitive head's always (its special keys): the requests
  // of lines it had just read took 11% of 8 ltr-floor heads' samples (one thread), and skipping
  // them (the three settings alternated call by call, medians of 40, two threads) took YLG(8)
  // at 128x128 over 64x64 from 4.61 to 4.51 ms (5.10 with no request at all), 8 ltr-floor heads
  // 3.26 -> 3.14 ms, 8 ltr-repetitive heads 5.70 -> 5.54 ms.
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

// A sparse task on the query-lanes path (cpu/query_lanes-inl.h). With 16 lanes and rows of
// whole vectors each vector of rows is read, visited and written by LaneDirectVisits; returns
// true, the task finished. Otherwise the tile's rows are packed (scaled, zero up to whole
// vectors), each vector of rows takes every visit and leaves its rows' m, l and acc, and it
// returns false: FinishQueryTile writes the rows.
template <typename T, typename IO>
HWY_INLINE bool LaneQueryTask(const AttentionParams& p, const ForwardPlan<T>& plan,
                              std::int64_t b, std::int64_t h, std::int64_t g, const Rows& rows,
                              const typename ForwardPlan<T>::Arrays& a) {
  static_assert(std::is_same<T, float>::value && std::is_same<IO, float>::value,
                "the query-lanes path takes float heads");
  const SparseLayout& lay = *p.layout;
  const hn::ScalableTag<float> d;
  const size_t L = hn::Lanes(d);
  const size_t E = static_cast<size_t>(p.dim_qk), Evp = plan.dim_v_pad;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (std::is_same<hn::Vec<decltype(d)>, hn::Vec512<float>>::value) {
    if (LaneDirectRows(p)) {
      const float* q = static_cast<const float*>(p.q) + offset4(p.q_stride, b, h, 0, 0);
      // The tile's scattered rows requested before the first is read, as PackRows does.
      if (rows.index != nullptr) PrefetchRows<false>(q, rows, p.q_stride[2], 1, E);
      float* out = static_cast<float*>(p.out) + offset4(p.out_stride, b, h, 0, 0);
      float* lse = p.lse == nullptr ? nullptr
                                    : static_cast<float*>(p.lse) + b * p.lse_stride[0] +
                                          h * p.lse_stride[1];
      const auto [k, v] = slice_keys_values<IO>(p, b, h);
      std::int64_t row[16];
      for (size_t r0 = 0; r0 < rows.count; r0 += L) {
        const size_t n = std::min(L, rows.count - r0);
        for (size_t i = 0; i < n; ++i) row[i] = rows[r0 + i];
        LaneDirectVisits(p, lay, g, rows.count, q, out, lse, k, v, r0, n, row,
                         LaneArrays{a.qt, a.st, a.acct, a.rows, a.rows_t});
      }
      return true;
    }
  }
#endif
  PackRows(static_cast<const IO*>(p.q) + offset4(p.q_stride, b, h, 0, 0), rows, p.q_stride[2],
           p.q_stride[3], E, static_cast<T>(p.scale), a.q, E, (rows.count + L - 1) / L * L);
  const auto [k, v] = slice_keys_values<IO>(p, b, h);
  for (size_t r0 = 0; r0 < rows.count; r0 += L) {
    LaneQueryVisits(d, p, lay, g, rows.count, k, v, r0, std::min(L, rows.count - r0),
                    a.q + r0 * E, LaneArrays{a.qt, a.st, a.acct, a.rows, a.rows_t},
                    LaneRowState{a.m + r0, a.l + r0, a.acc + r0 * Evp, Evp});
  }
  return false;
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
Status ForwardOn(const AttentionParams& p, const Host& host) {
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
  // Float heads up to 256 wide take the query-lanes path (wider ones were not measured). Against
  // the tile path (the two alternated call by call in one process, two threads on a Zen 4 core,
  // medians of 30-60):
  // YLG(8) at 128x128 over 64x64, E = Ev = 16, 5.30 -> 4.82, 5.84 -> 5.34 and 5.04 -> 4.51 ms;
  // its floor heads alone 4.25 -> 3.60 ms, its repetitive heads alone 1.01-1.14x (two runs
  // minutes apart, the VM drifting between them); YLG(8) at 64x64 over 32x32,
  // E = 8, Ev = 32, channels-first 1.63 -> 1.44 ms; a 7x7 window over 2x-pooled keys at 128x128,
  // 4 heads, E = Ev = 16 8.92 -> 4.79 ms (E = 8, Ev = 32: 8.52 -> 4.42); a 5x5 one at 64x64,
  // E = Ev = 32, 2.54 -> 1.25 ms; a 15x15 "shift" window at 128x128 22.1 -> 14.1 ms. Wider
  // heads, a 7x7 window over 2x-pooled keys at 64x64: E = Ev = 64, 4 heads, 4.24 -> 2.35 ms;
  // E = Ev = 128, 2 heads, 4.09 -> 2.40 ms; at 32x32, E = Ev = 256, 1.45 -> 0.90 ms; YLG(8)
  // at 64x64 over 32x32, E = Ev = 64, 2.68 -> 2.31 ms; at 32x32 over 16x16, E = Ev = 128, 0.94
  // -> 0.69 ms; a 7x7 "shift" window at 64x64, E = Ev = 64, 10.3 -> 4.5 ms.
  plan.query_lanes = std::is_same<T, float>::value && std::is_same<IO, float>::value &&
                     p.layout != nullptr && p.dim_qk <= 256 && p.dim_v <= 256;
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
  plan.native_bf16 = std::is_same<IO, BFloat16>::value && use_bf16_pairs();
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
    // 8 runs a thread: a staged run of YLG(8)'s heads (rtl-floor x 2, rtl-repetitive x 2, then
    // the ltr ones) on channels-first views, 128x128 over 64x64, E = Ev = 16, two threads: 6.15
    // -> 5.15 ms against one contiguous range a thread (the two alternated call by call,
    // medians of 40); row-major inputs, one problem of all 8 heads, 4.39 against 4.42 ms.
    run_task_chunks(host, tasks, tasks / (8 * threads), &plan, SparseForwardTask<T, IO>);
  }
  return Status::Ok();
}

// A sparse layout over views whose gathered rows would touch a line per element: runs of heads
// of one batch element copied to rows (row_staging-inl.h), each run a problem of its own.
template <typename T, typename IO>
Status Forward(const AttentionParams& p, const Host& host) {
  if (p.layout == nullptr) return ForwardOn<T, IO>(p, host);
  AttentionParams sub = p;
  // Views of sub's tensors: each run's staging repoints them. Whether the tiles' rows lie apart
  // is asked (a walk over the layout) only where some view is channels-first.
  std::array<StagedView, 3> views{{{&sub.q, sub.q_stride, sub.len_q, sub.dim_qk, true},
                                   {&sub.k, sub.k_stride, sub.len_k, sub.dim_qk, true},
                                   {&sub.v, sub.v_stride, sub.len_k, sub.dim_v, true}}};
  if (StagedElemsPerHead(views) == 0) return ForwardOn<T, IO>(p, host);
  views[0].scattered = ScatteredTiles(*p.layout, /*query=*/true);
  views[1].scattered = views[2].scattered = ScatteredTiles(*p.layout, /*query=*/false);
  const size_t per_head = StagedElemsPerHead(views);
  if (per_head == 0) return ForwardOn<T, IO>(p, host);
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
      StageRows<IO>(host, sub.heads, views, reinterpret_cast<IO*>(ws.data()));
      const Status s = ForwardOn<T, IO>(sub, host);
      if (!s.ok()) return s;
    }
  }
  return Status::Ok();
}

ATTN2D_DTYPE_INSTANCES(Forward, Forward, AttentionParams)
const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

#undef ATTN2D_NATIVE_BF16  // this file is compiled once per target

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn2d {
namespace cpu {

HWY_EXPORT(TargetName);
ATTN2D_DTYPE_DISPATCH(Forward, tiled_forward, AttentionParams)

Status attention_forward(const AttentionParams& params, const Host& host) {
  if (params.window != nullptr) return window_forward(params, host);
  return tiled_forward(params, host);
}

const char* simd_target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

}  // namespace cpu
}  // namespace attn2d
#endif  // HWY_ONCE
