// What the LibTorch library (attn2d::torch) has and the Python module has not: a workspace the
// host could not allocate is c10::OutOfMemoryError, and the backward operators refuse a second
// backward through them by name. From Python, attn2d/_ops.py registers those operators' own
// autograd (the double backward that gradient penalties take), so this file is not linked there.
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <string>

#include "errors.h"

namespace attn2d {
namespace binding {

void throw_memory_error(const std::string& message) {
  TORCH_CHECK_WITH(OutOfMemoryError, false, message);
  __builtin_unreachable();
}

}  // namespace binding
}  // namespace attn2d

TORCH_LIBRARY_IMPL(attn2d, Autograd, m) {
  m.impl("attention_backward", torch::autograd::autogradNotImplementedFallback());
  m.impl("attention2d_backward", torch::autograd::autogradNotImplementedFallback());
  m.impl("attention2d_window_backward", torch::autograd::autogradNotImplementedFallback());
}
