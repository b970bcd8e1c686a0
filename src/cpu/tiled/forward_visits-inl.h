// The tiled forward's work on one query tile, per target: packing it, a visit of one key tile
// (Q K^T, mask, online softmax, P V; on bf16 pairs where the CPU has them), a visit that allows
// one key a row, and the finished rows written out.
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_TILED_FORWARD_VISITS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_TILED_FORWARD_VISITS_INL_H_
#undef ATTN2D_SRC_CPU_TILED_FORWARD_VISITS_INL_H_
#else
#define ATTN2D_SRC_CPU_TILED_FORWARD_VISITS_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "attn2d/attention_params.h"
#include "core/strided.h"
#include "cpu/common/bf16_pairs-inl.h"
#include "cpu/common/bf16_pairs_avx512.h"
#include "cpu/common/exp-inl.h"
#include "cpu/common/gemm-inl.h"
#include "cpu/common/masks-inl.h"
#include "cpu/common/online_softmax-inl.h"
#include "cpu/common/pack-inl.h"
#include "cpu/common/row_ops-inl.h"
#include "cpu/common/x86_intrinsics-inl.h"
#include "cpu/tiled/forward_plan-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Writes the finished rows of a query tile: out = acc / l (0 for a fully masked row) and
// lse = m + log l (-inf for a fully masked row). 1 / l and the logs (LogSumExp) a vector of
// rows at a time, and float rows with unit stride as vectors: a log call a row and Ev strided
// stores cost much beside a sparse query tile's work (YLG's rows see about 100 keys each).
template <typename T, typename IO>
HWY_INLINE void FinishQueryTile(const AttentionParams& p, const ForwardPlan<T>& plan,
                                std::int64_t b, std::int64_t h, const Rows& rows,
                                const typename ForwardPlan<T>::Arrays& a) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const hn::ScalableTag<T> d;
  const size_t L = hn::Lanes(d);
  const size_t Ev = static_cast<size_t>(p.dim_v), Evp = plan.dim_v_pad;
  IO* out = static_cast<IO*>(p.out) + offset4(p.out_stride, b, h, 0, 0);
  T* out_accum = OutAccumAt<T>(p, b, h);
  T* lse = static_cast<T*>(p.lse);
  HWY_ALIGN T inv_l[HWY_MAX_BYTES / sizeof(T)];
  HWY_ALIGN T log_sum[HWY_MAX_BYTES / sizeof(T)];
  for (size_t r0 = 0; r0 < rows.count; r0 += L) {
    const size_t n = std::min(L, rows.count - r0);
    // Lanes past the tile's rows (m and l are padded to whole vectors, their padding unset)
    // read as an empty row, with no copy of m and l into whole vectors lane by lane.
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
      if (out_accum != nullptr) {
        StoreTile(a.acc + r * Evp, Evp, Rows{nullptr, rows[r], 1}, Ev, inv_l[i], out_accum,
                  p.out_accum_stride[2], p.out_accum_stride[3], /*stream=*/false);
      }
    }
    if (lse != nullptr) {
      T* lse_bh = lse + b * p.lse_stride[0] + h * p.lse_stride[1];
      for (size_t i = 0; i < n; ++i) lse_bh[rows[r0 + i] * p.lse_stride[2]] = log_sum[i];
    }
  }
}

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
// where each query sees one key of its query tile's run. Each row's score is its packed query
// row dotted with the key's row, read from the tensor, and the online softmax step and
// acc += p v run per row, a vector of rows at a time: no key tile is packed, and no 64 x 16
// score tile is formed, masked and multiplied by V.
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

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_TILED_FORWARD_VISITS_INL_H_
