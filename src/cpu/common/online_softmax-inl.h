// One key tile's step of the tiled forward's online softmax, per target: the running max and sum
// of each row and its rescaled accumulator, row by row, or 16 rows at once on AVX-512
// (x86_intrinsics-inl.h).
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_COMMON_ONLINE_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_COMMON_ONLINE_SOFTMAX_INL_H_
#undef ATTN2D_SRC_CPU_COMMON_ONLINE_SOFTMAX_INL_H_
#else
#define ATTN2D_SRC_CPU_COMMON_ONLINE_SOFTMAX_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>

#include "cpu/common/row_ops-inl.h"
#include "cpu/common/x86_intrinsics-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// One key tile's step of the online softmax for every row of the score tile s (rows x
// cols_pad, row stride ld), whose masked entries are -inf: updates the running max m and sum l,
// rescales the accumulator rows (ld_acc wide) and leaves the tile's probabilities in s.
// exp_row(s, cols_pad, shift) turns a row into its exps (ExpShiftSum; the bf16 forward's variant
// also rounds them to pairs) and returns their float sum.
template <typename T, class ExpRowFn>
HWY_INLINE void OnlineSoftmaxStep(T* HWY_RESTRICT s_tile, size_t rows, size_t cols_pad, size_t ld,
                                  T* HWY_RESTRICT m, T* HWY_RESTRICT l, T* HWY_RESTRICT acc,
                                  size_t ld_acc, const ExpRowFn& exp_row) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  for (size_t r = 0; r < rows; ++r) {
    T* s = s_tile + r * ld;
    const T tile_max = RowMax(s, cols_pad);
    T m_new = std::isnan(tile_max) ? tile_max : std::max(m[r], tile_max);
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
    // The running max rarely moves after the first tiles: skip the scalar exp then.
    const T alpha = m[r] == kNegInf ? T(0) : m[r] == m_new ? T(1) : std::exp(m[r] - m_new);
    const T tile_sum = exp_row(s, cols_pad, m_new);
    l[r] = l[r] * alpha + tile_sum;
    m[r] = m_new;
    if (alpha != T(1)) ScaleRow(acc + r * ld_acc, ld_acc, alpha);
  }
}

// OnlineSoftmaxStep with ExpShiftSum: 16 rows at a time where the target has 16 float lanes.
template <typename T>
HWY_INLINE void OnlineSoftmaxStepExp(T* HWY_RESTRICT s_tile, size_t rows, size_t cols_pad,
                                     size_t ld, T* HWY_RESTRICT m, T* HWY_RESTRICT l,
                                     T* HWY_RESTRICT acc, size_t ld_acc) {
  size_t r0 = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (std::is_same<T, float>::value) {
    for (; r0 + 16 <= rows; r0 += 16) {
      OnlineSoftmaxStep16(s_tile + r0 * ld, cols_pad, ld, m + r0, l + r0, acc + r0 * ld_acc,
                          ld_acc);
    }
  }
#endif
  OnlineSoftmaxStep(s_tile + r0 * ld, rows - r0, cols_pad, ld, m + r0, l + r0,
                    acc + r0 * ld_acc, ld_acc,
                    [](T* x, size_t n, T shift) { return ExpShiftSum(x, n, shift); });
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_COMMON_ONLINE_SOFTMAX_INL_H_
