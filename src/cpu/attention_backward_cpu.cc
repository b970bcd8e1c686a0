// The CPU backward's entry: runs the kernel family the chooser picked, as attention_forward
// does: the window kernels (window/) or the tiled ones (tiled/).

#include <string>

#include "attn2d/attention_params.h"
#include "attn2d/host.h"
#include "attn2d/status.h"
#include "cpu/attention_cpu.h"
#include "cpu/tiled/tiled_attention.h"

namespace attn2d {
namespace cpu {

Status attention_backward(const AttentionBackwardParams& params, const Host& host,
                          const KernelChoice& choice) {
  switch (choice.kernel) {
    case Kernel::kWindow:
      return window_backward(params, host, choice);
    case Kernel::kDenseTiles:
    case Kernel::kSparseTiles:
      return tiled_backward(params, host, choice);
    case Kernel::kQueryLanes:
    case Kernel::kReference:
      break;
  }
  return Status::Unsupported(std::string("the CPU backward has no kernel ") +
                             kernel_name(choice.kernel));
}

}  // namespace cpu
}  // namespace attn2d
