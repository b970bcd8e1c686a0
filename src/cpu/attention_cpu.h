// Tiled online-softmax attention on the CPU (Highway SIMD, runtime dispatch).
#pragma once

#include "attn2d/attention_params.h"
#include "attn2d/host.h"
#include "attn2d/status.h"

namespace attn2d {
namespace cpu {

Status attention_forward(const AttentionParams& params, const Host& host);
Status attention_backward(const AttentionBackwardParams& params, const Host& host);
// params.window's forward (cpu/window_forward_cpu.cc); attention_forward routes to it.
Status window_forward(const AttentionParams& params, const Host& host);
// params.fwd.window's backward (cpu/window_backward_cpu.cc); attention_backward routes to it.
Status window_backward(const AttentionBackwardParams& params, const Host& host);
const char* simd_target_name();

}  // namespace cpu
}  // namespace attn2d
