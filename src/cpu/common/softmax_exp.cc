// Dispatch of softmax_exp (softmax_exp.h): SoftmaxExp, per SIMD target, over an array.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/common/softmax_exp.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cstddef>

#include "cpu/common/exp-inl.h"
#include "cpu/common/softmax_exp.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {

void SoftmaxExpArray(const float* HWY_RESTRICT x, size_t n, float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> d;
  const size_t L = hn::Lanes(d);
  size_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(SoftmaxExp(d, hn::LoadU(d, x + i)), d, out + i);
  if (i < n) {
    // The tail through a full vector: the last lanes are the exp of 0 and are dropped.
    HWY_ALIGN float buf[hn::MaxLanes(hn::ScalableTag<float>())] = {};
    std::copy(x + i, x + n, buf);
    hn::Store(SoftmaxExp(d, hn::Load(d, buf)), d, buf);
    std::copy(buf, buf + (n - i), out + i);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn2d {
namespace cpu {

HWY_EXPORT(SoftmaxExpArray);

void softmax_exp(const float* x, std::size_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(SoftmaxExpArray)(x, n, out);
}

}  // namespace cpu
}  // namespace attn2d
#endif  // HWY_ONCE
