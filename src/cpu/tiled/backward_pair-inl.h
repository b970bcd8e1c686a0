// The tiled backward's work on one (query tile, key tile) pair, per target: packing both sides,
// P and dS recomputed, a visit that allows one key a row, the products into dK, dV and dQ, and
// the finished gradients stored.
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_TILED_BACKWARD_PAIR_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_TILED_BACKWARD_PAIR_INL_H_
#undef ATTN2D_SRC_CPU_TILED_BACKWARD_PAIR_INL_H_
#else
#define ATTN2D_SRC_CPU_TILED_BACKWARD_PAIR_INL_H_
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
#include "cpu/common/pack-inl.h"
#include "cpu/common/row_ops-inl.h"
#include "cpu/common/x86_intrinsics-inl.h"
#include "cpu/tiled/backward_plan.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

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
// of all schedules stay bitwise equal. No key tile is packed and no score tile formed for them.
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

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_TILED_BACKWARD_PAIR_INL_H_
