// The tiled kernels' entries, dense and block-sparse (the latter's forward on the query lanes
// where the kernel chooser says so): attention_forward and attention_backward (attention_cpu.h)
// send here every problem the window kernels do not take.
#pragma once

#include "attn2d/attention_params.h"
#include "attn2d/host.h"
#include "attn2d/kernel_choice.h"
#include "attn2d/status.h"

namespace attn2d {
namespace cpu {

// tiled/tiled_forward.cc.
Status tiled_forward(const AttentionParams& params, const Host& host, const KernelChoice& choice);
// tiled/tiled_backward.cc.
Status tiled_backward(const AttentionBackwardParams& params, const Host& host,
                      const KernelChoice& choice);

}  // namespace cpu
}  // namespace attn2d
