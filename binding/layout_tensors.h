// The core's compiled forms of a pattern as tensors, in the order the operators read them:
// the 12 tensors of a CompiledLayout (torch_ops.cc's make_layout) and a window's (2, count)
// int32 offsets (row offsets, then column offsets).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "attn2d/patterns.h"

namespace attn2d {
namespace binding {

std::vector<at::Tensor> layout_tensors(const CompiledLayout& layout);
at::Tensor offsets_tensor(const CompiledWindowOffsets& offsets);

}  // namespace binding
}  // namespace attn2d
