// The entry points: validate, then run the reference on request or the kernel the chooser
// (kernel_choice.cc) picks.
#include "attn2d/attention.h"

#include "attn2d/kernel_choice.h"

#include "cpu/attention_cpu.h"
#include "reference/attention_reference.h"

namespace attn2d {
namespace {

Status reference_refuses_layout() {
  return Status::Unsupported(
      "the reference backend takes patterns as a dense mask (MaskKind::kBool), not a layout "
      "or window offsets");
}

}  // namespace

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::kAuto:
      return "auto";
    case Backend::kReference:
      return "reference";
    case Backend::kCpu:
      return "cpu";
  }
  return "unknown";
}

Status attention_forward(const AttentionParams& params, const Host& host, Backend backend) {
  Status s = validate(params);
  if (!s.ok()) return s;
  if (backend == Backend::kReference) {
    if (params.layout != nullptr || params.window != nullptr) return reference_refuses_layout();
    return reference::attention_forward(params);
  }
  return cpu::attention_forward(params, host, choose_forward(params, host));
}

Status attention_backward(const AttentionBackwardParams& params, const Host& host,
                          Backend backend) {
  Status s = validate(params);
  if (!s.ok()) return s;
  if (backend == Backend::kReference) {
    if (params.fwd.layout != nullptr || params.fwd.window != nullptr) {
      return reference_refuses_layout();
    }
    return reference::attention_backward(params);
  }
  return cpu::attention_backward(params, host, choose_backward(params.fwd, host));
}

const char* cpu_simd_target() { return cpu::simd_target_name(); }

}  // namespace attn2d
