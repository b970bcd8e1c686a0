// The CPU backend's entries (Highway SIMD, runtime dispatch). attn2d::attention_forward and
// attention_backward (core/attention.cc) call them with the kernel chooser's answer
// (attn2d/kernel_choice.h), which they run.
#pragma once

#include <cstddef>

#include "attn2d/attention_params.h"
#include "attn2d/host.h"
#include "attn2d/kernel_choice.h"
#include "attn2d/status.h"

namespace attn2d {
namespace cpu {

Status attention_forward(const AttentionParams& params, const Host& host,
                         const KernelChoice& choice);
Status attention_backward(const AttentionBackwardParams& params, const Host& host,
                          const KernelChoice& choice);
// The window kernels on params.window (cpu/window/).
Status window_forward(const AttentionParams& params, const Host& host, const KernelChoice& choice);
Status window_backward(const AttentionBackwardParams& params, const Host& host,
                       const KernelChoice& choice);

// The SIMD target the kernels dispatch to on this CPU, and facts of it the chooser reads: the
// compute type's vector lanes (double for float64 inputs, else float) and whether the target
// was built with the AVX512-BF16 pair kernels.
const char* simd_target_name();
std::size_t vector_lanes(bool float64);
bool native_bf16_target();

}  // namespace cpu
}  // namespace attn2d
