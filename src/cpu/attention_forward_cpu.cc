// Tiled forward: one task per (batch, head, query tile); each task walks the key tiles it can
// see with an online softmax (running max m, running sum l, accumulator acc) and writes the
// output rows and their log-sum-exp. Scratch per thread: O(block_q * block_k + tiles of q, k, v).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/attention_forward_cpu.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <limits>

#include "attn2d/attention_params.h"
#include "attn2d/host.h"
#include "attn2d/status.h"
#include "core/strided.h"
#include "core/workspace.h"
#include "cpu/attention_cpu.h"
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
  std::int64_t q_tiles;
  size_t scratch_elems;  // per thread
  T* workspace;

  struct Arrays {
    T *q, *kt, *v, *s, *acc, *m, *l;
    size_t elems;
  };
  // Lays out one thread's arrays at base (null: only counts them into `elems`).
  Arrays carve(T* base) const {
    const size_t bq = tiles.block_q, bk = tiles.block_k;
    const size_t E = static_cast<size_t>(p->dim_qk);
    ScratchCarver<T> c(base);
    Arrays a;
    a.q = c.take(bq * E);           // (block_q, E), pre-multiplied by scale
    a.kt = c.take(E * bk);          // (E, block_k): keys along the vector
    a.v = c.take(bk * dim_v_pad);   // (block_k, Ev_pad)
    a.s = c.take(bq * bk);          // (block_q, block_k) scores, then probabilities
    a.acc = c.take(bq * dim_v_pad); // (block_q, Ev_pad)
    a.m = c.take(bq);
    a.l = c.take(bq);
    a.elems = c.used();
    return a;
  }
};

template <typename T>
void ForwardTask(void* ctx, std::int64_t task, int thread) {
  const ForwardPlan<T>& plan = *static_cast<const ForwardPlan<T>*>(ctx);
  const AttentionParams& p = *plan.p;
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const size_t L = VectorLanes<T>();
  const size_t E = static_cast<size_t>(p.dim_qk);
  const size_t Ev = static_cast<size_t>(p.dim_v);
  const size_t Evp = plan.dim_v_pad;
  const size_t bk = static_cast<size_t>(plan.tiles.block_k);

  const std::int64_t bh = task / plan.q_tiles;
  const std::int64_t b = bh / p.heads, h = bh % p.heads;
  const std::int64_t i0 = (task % plan.q_tiles) * plan.tiles.block_q;
  const size_t rows = static_cast<size_t>(std::min(plan.tiles.block_q, p.len_q - i0));
  auto a = plan.carve(plan.workspace + static_cast<size_t>(thread) * plan.scratch_elems);

  const T* q = static_cast<const T*>(p.q) + offset4(p.q_stride, b, h, i0, 0);
  const T* k = static_cast<const T*>(p.k) + offset4(p.k_stride, b, h, 0, 0);
  const T* v = static_cast<const T*>(p.v) + offset4(p.v_stride, b, h, 0, 0);
  const SliceMask<T> mask = slice_mask<T>(p, b, h);

  PackRows(q, p.q_stride[2], p.q_stride[3], rows, E, static_cast<T>(p.scale), a.q, E, rows);
  std::fill(a.acc, a.acc + rows * Evp, T(0));
  std::fill(a.m, a.m + rows, kNegInf);
  std::fill(a.l, a.l + rows, T(0));

  // Causal: keys after the tile's last query are never visible.
  const std::int64_t key_end =
      p.is_causal ? std::min<std::int64_t>(p.len_k, i0 + static_cast<std::int64_t>(rows))
                  : p.len_k;
  for (std::int64_t j0 = 0; j0 < key_end; j0 += plan.tiles.block_k) {
    const size_t cols = static_cast<size_t>(std::min(plan.tiles.block_k, p.len_k - j0));
    const size_t cols_pad = (cols + L - 1) / L * L;
    PackTransposed(k + j0 * p.k_stride[2], p.k_stride[2], p.k_stride[3], cols, E, a.kt, bk,
                   cols_pad);
    PackRows(v + j0 * p.v_stride[2], p.v_stride[2], p.v_stride[3], cols, Ev, T(1), a.v, Evp,
             cols);
    Gemm<false>(rows, cols_pad, E, a.q, E, 1, a.kt, bk, a.s, bk);
    MaskTile(a.s, bk, rows, cols, cols_pad, i0, j0, mask);
    for (size_t r = 0; r < rows; ++r) {
      T* s = a.s + r * bk;
      const T tile_max = RowMax(s, cols_pad);
      T m_new = std::isnan(tile_max) ? tile_max : std::max(a.m[r], tile_max);
      if (m_new == kNegInf) {
        // SIMD max may skip NaN lanes (the scalar target does): an all-NaN row must not pass
        // for a fully masked one.
        if (RowHasNaN(s, cols_pad)) {
          m_new = std::numeric_limits<T>::quiet_NaN();
        } else {  // no visible key so far: contributes nothing
          ZeroRow(s, cols_pad);
          continue;
        }
      }
      const T alpha = a.m[r] == kNegInf ? T(0) : std::exp(a.m[r] - m_new);
      const T tile_sum = ExpShiftSum(s, cols_pad, m_new);
      a.l[r] = a.l[r] * alpha + tile_sum;
      a.m[r] = m_new;
      if (alpha != T(1)) ScaleRow(a.acc + r * Evp, Evp, alpha);
    }
    Gemm<true>(rows, Evp, cols, a.s, bk, 1, a.v, Evp, a.acc, Evp);
  }

  T* out = static_cast<T*>(p.out) + offset4(p.out_stride, b, h, i0, 0);
  T* lse = static_cast<T*>(p.lse);
  for (size_t r = 0; r < rows; ++r) {
    const bool empty = a.m[r] == kNegInf;  // fully masked row: output 0, lse -inf
    const T inv_l = empty ? T(0) : T(1) / a.l[r];
    T* o = out + static_cast<std::int64_t>(r) * p.out_stride[2];
    for (size_t e = 0; e < Ev; ++e) {
      o[static_cast<std::int64_t>(e) * p.out_stride[3]] = empty ? T(0) : a.acc[r * Evp + e] * inv_l;
    }
    if (lse != nullptr) {
      lse[b * p.lse_stride[0] + h * p.lse_stride[1] +
          (i0 + static_cast<std::int64_t>(r)) * p.lse_stride[2]] =
          empty ? kNegInf : a.m[r] + std::log(a.l[r]);
    }
  }
}

template <typename T>
Status Forward(const AttentionParams& p, const Host& host) {
  if (p.batch == 0 || p.heads == 0 || p.len_q == 0) return Status::Ok();
  const size_t L = VectorLanes<T>();
  ForwardPlan<T> plan;
  plan.p = &p;
  plan.tiles = choose_tiles(p.len_q, p.len_k, p.dim_qk, p.dim_v, sizeof(T), std::max<size_t>(L, 16));
  plan.dim_v_pad = static_cast<size_t>(round_up(p.dim_v, static_cast<std::int64_t>(L)));
  plan.q_tiles = (p.len_q + plan.tiles.block_q - 1) / plan.tiles.block_q;
  plan.scratch_elems = plan.carve(nullptr).elems;
  const int threads = std::max(host.num_threads, 1);
  Workspace ws(host);
  if (!ws.allocate(plan.scratch_elems * sizeof(T) * static_cast<size_t>(threads))) {
    return Status::OutOfMemory("attention_forward: the host could not allocate " +
                               std::to_string(plan.scratch_elems * sizeof(T) * threads) +
                               " bytes of workspace");
  }
  plan.workspace = reinterpret_cast<T*>(ws.data());
  run_tasks(host, p.batch * p.heads * plan.q_tiles, &plan, ForwardTask<T>);
  return Status::Ok();
}

Status ForwardFloat32(const AttentionParams& p, const Host& host) { return Forward<float>(p, host); }
Status ForwardFloat64(const AttentionParams& p, const Host& host) {
  return Forward<double>(p, host);
}
const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn2d {
namespace cpu {

HWY_EXPORT(ForwardFloat32);
HWY_EXPORT(ForwardFloat64);
HWY_EXPORT(TargetName);

Status attention_forward(const AttentionParams& params, const Host& host) {
  if (params.dtype == DType::kFloat64) return HWY_DYNAMIC_DISPATCH(ForwardFloat64)(params, host);
  return HWY_DYNAMIC_DISPATCH(ForwardFloat32)(params, host);
}

const char* simd_target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

}  // namespace cpu
}  // namespace attn2d
#endif  // HWY_ONCE
