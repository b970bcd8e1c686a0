// One plain params struct for dense attention, filled by a binding and read by every backend.
// All strides are in elements and may be anything (0 for broadcast, non-unit last dimension).
#pragma once

#include <cstdint>

#include "attn2d/dtype.h"
#include "attn2d/sparse_layout.h"
#include "attn2d/window_offsets.h"

namespace attn2d {

enum class MaskKind : int {
  kNone = 0,
  kBool = 1,      // uint8/bool elements, nonzero = attention allowed
  kAdditive = 2,  // elements of accumulation_dtype(dtype), added to the scaled scores (-inf = masked)
};

struct AttentionParams {
  // Of q, k, v, out (and dout, dq, dk, dv). lse and an additive mask hold
  // accumulation_dtype(dtype): float for float32, bfloat16 and float16; double for float64.
  DType dtype = DType::kFloat32;
  std::int64_t batch = 0;
  std::int64_t heads = 0;
  std::int64_t len_q = 0;
  std::int64_t len_k = 0;
  std::int64_t dim_qk = 0;  // E
  std::int64_t dim_v = 0;   // Ev

  const void* q = nullptr;  // (batch, heads, len_q, dim_qk)
  std::int64_t q_stride[4] = {};
  const void* k = nullptr;  // (batch, heads, len_k, dim_qk)
  std::int64_t k_stride[4] = {};
  const void* v = nullptr;  // (batch, heads, len_k, dim_v)
  std::int64_t v_stride[4] = {};
  void* out = nullptr;  // (batch, heads, len_q, dim_v); read by the backward unless out_accum
  std::int64_t out_stride[4] = {};
  // (batch, heads, len_q) row log-sum-exp of the scaled, masked scores, in the accumulation type
  // (double for float64, else float); -inf for a row with no allowed key. The forward
  // writes it when non-null; the backward requires it.
  void* lse = nullptr;
  std::int64_t lse_stride[3] = {};
  // (batch, heads, len_q, dim_v) in float: the output before its rounding to a 16-bit dtype
  // (bfloat16 and float16 only; null otherwise). The forward writes it when non-null. The
  // backward reads it in place of `out` when non-null: its D = rowsum(dO * O) from the rounded
  // output would carry that rounding into every dQ row, where the float output keeps dQ to
  // one rounding.
  void* out_accum = nullptr;
  std::int64_t out_accum_stride[4] = {};

  MaskKind mask_kind = MaskKind::kNone;
  const void* mask = nullptr;  // (batch, heads, len_q, len_k), broadcast through 0 strides
  std::int64_t mask_stride[4] = {};
  // Top-left aligned as in torch SDPA: query i may see key j only when j <= i. Combines (AND)
  // with `mask`.
  bool is_causal = false;
  double scale = 1.0;  // multiplies q.k before the mask is added
  // A sparse pattern over raster-ordered queries and keys (len_q, len_k = grid sizes); null:
  // dense attention. Excludes `mask` and `is_causal`.
  const SparseLayout* layout = nullptr;
  // A window given as offsets (attn2d/window_offsets.h); null: none. Excludes `mask` and
  // `is_causal`. With a `layout` of the same window beside it, the kernel chooser
  // (attn2d/kernel_choice.h) runs the layout where the window kernels would waste more.
  const WindowOffsets* window = nullptr;
};

struct AttentionBackwardParams {
  AttentionParams fwd;  // the forward's inputs plus its `out` and `lse`
  const void* dout = nullptr;  // (batch, heads, len_q, dim_v)
  std::int64_t dout_stride[4] = {};
  void* dq = nullptr;  // (batch, heads, len_q, dim_qk), overwritten
  std::int64_t dq_stride[4] = {};
  void* dk = nullptr;  // (batch, heads, len_k, dim_qk), overwritten
  std::int64_t dk_stride[4] = {};
  void* dv = nullptr;  // (batch, heads, len_k, dim_v), overwritten
  std::int64_t dv_stride[4] = {};
};

}  // namespace attn2d
