// A sparse forward task on the query-lanes path (query_lanes-inl.h), which the kernel chooser
// (core/kernel_choice.cc) picks for float32 heads up to 256 wide; tiled/tiled_forward.cc runs it.
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_LANES_LANE_QUERY_TASK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_LANES_LANE_QUERY_TASK_INL_H_
#undef ATTN2D_SRC_CPU_LANES_LANE_QUERY_TASK_INL_H_
#else
#define ATTN2D_SRC_CPU_LANES_LANE_QUERY_TASK_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "attn2d/attention_params.h"
#include "attn2d/sparse_layout.h"
#include "core/strided.h"
#include "cpu/common/pack-inl.h"
#include "cpu/lanes/query_lanes-inl.h"
#include "cpu/tiled/forward_plan-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// A sparse task on the query-lanes path (lanes/query_lanes-inl.h). With 16 lanes and rows of
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

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_LANES_LANE_QUERY_TASK_INL_H_
