// The CPU forward's entry: runs the kernel family the chooser picked, the window kernels
// (window/) or the tiled ones (tiled/, which hold the query lanes' task too); and the facts of
// the dispatched SIMD target that the chooser reads.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/attention_forward_cpu.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <cstddef>
#include <string>

#include "attn2d/attention_params.h"
#include "attn2d/host.h"
#include "attn2d/status.h"
#include "cpu/attention_cpu.h"
#include "cpu/common/x86_intrinsics-inl.h"
#include "cpu/tiled/tiled_attention.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

std::size_t FloatLanes() { return hn::Lanes(hn::ScalableTag<float>()); }
std::size_t DoubleLanes() { return hn::Lanes(hn::ScalableTag<double>()); }

bool NativeBf16Target() {
#if defined(ATTN2D_NATIVE_BF16)
  return true;
#else
  return false;
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn2d {
namespace cpu {

HWY_EXPORT(TargetName);
HWY_EXPORT(FloatLanes);
HWY_EXPORT(DoubleLanes);
HWY_EXPORT(NativeBf16Target);

Status attention_forward(const AttentionParams& params, const Host& host,
                         const KernelChoice& choice) {
  switch (choice.kernel) {
    case Kernel::kWindow:
      return window_forward(params, host, choice);
    case Kernel::kDenseTiles:
    case Kernel::kSparseTiles:
    case Kernel::kQueryLanes:
      return tiled_forward(params, host, choice);
    case Kernel::kReference:
      break;
  }
  return Status::Unsupported(std::string("the CPU backend has no kernel ") +
                             kernel_name(choice.kernel));
}

const char* simd_target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

std::size_t vector_lanes(bool float64) {
  return float64 ? HWY_DYNAMIC_DISPATCH(DoubleLanes)() : HWY_DYNAMIC_DISPATCH(FloatLanes)();
}

bool native_bf16_target() { return HWY_DYNAMIC_DISPATCH(NativeBf16Target)(); }

}  // namespace cpu
}  // namespace attn2d
#endif  // HWY_ONCE
