// The kernels' float32 exp (SoftmaxExp, exp-inl.h) over an array, on the best SIMD target
// the CPU runs (hwy::SetSupportedTargetsForTest picks another), so that tests can check it on
// every compiled target.
#pragma once

#include <cstddef>

namespace attn2d {
namespace cpu {

// out[i] = SoftmaxExp(x[i]), i < n: exp(x) for x >= -87, 0 below (and for -inf), NaN for NaN.
void softmax_exp(const float* x, std::size_t n, float* out);

}  // namespace cpu
}  // namespace attn2d
