// The four dtype instances of a per-target kernel template and their run-time dispatch, written
// once for every CPU entry point (the tiled and the window forward and backward).
#pragma once

#include "attn2d/attention_params.h"
#include "attn2d/dtype.h"
#include "attn2d/host.h"
#include "attn2d/kernel_choice.h"
#include "attn2d/status.h"
#include "cpu/common/half.h"
#include "hwy/highway.h"

namespace attn2d {
namespace cpu {

inline DType dtype_of(const AttentionParams& p) { return p.dtype; }
inline DType dtype_of(const AttentionBackwardParams& p) { return p.fwd.dtype; }

}  // namespace cpu
}  // namespace attn2d

// Inside HWY_NAMESPACE: Name##Float32 .. Name##Float16 run Kernel<compute type, storage type>
// (float for float32 and the 16-bit types, double for float64) on the kernel chooser's choice.
#define ATTN2D_DTYPE_INSTANCES(Name, Kernel, Params)                                          \
  Status Name##Float32(const Params& p, const Host& host, const KernelChoice& choice) {       \
    return Kernel<float, float>(p, host, choice);                                             \
  }                                                                                           \
  Status Name##Float64(const Params& p, const Host& host, const KernelChoice& choice) {       \
    return Kernel<double, double>(p, host, choice);                                           \
  }                                                                                           \
  Status Name##BFloat16(const Params& p, const Host& host, const KernelChoice& choice) {      \
    return Kernel<float, BFloat16>(p, host, choice);                                          \
  }                                                                                           \
  Status Name##Float16(const Params& p, const Host& host, const KernelChoice& choice) {       \
    return Kernel<float, Float16>(p, host, choice);                                           \
  }

// In the HWY_ONCE part: exports the instances and defines `Status Entry(const Params&, const
// Host&, const KernelChoice&)`, which picks the instance of the params' dtype on the best SIMD
// target of this CPU.
#define ATTN2D_DTYPE_DISPATCH(Name, Entry, Params)                                 \
  HWY_EXPORT(Name##Float32);                                                       \
  HWY_EXPORT(Name##Float64);                                                       \
  HWY_EXPORT(Name##BFloat16);                                                      \
  HWY_EXPORT(Name##Float16);                                                       \
  Status Entry(const Params& params, const Host& host, const KernelChoice& choice) { \
    switch (dtype_of(params)) {                                                    \
      case DType::kFloat64:                                                        \
        return HWY_DYNAMIC_DISPATCH(Name##Float64)(params, host, choice);          \
      case DType::kBFloat16:                                                       \
        return HWY_DYNAMIC_DISPATCH(Name##BFloat16)(params, host, choice);         \
      case DType::kFloat16:                                                        \
        return HWY_DYNAMIC_DISPATCH(Name##Float16)(params, host, choice);          \
      case DType::kFloat32:                                                        \
        break;                                                                     \
    }                                                                              \
    return HWY_DYNAMIC_DISPATCH(Name##Float32)(params, host, choice);              \
  }
