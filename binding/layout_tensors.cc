#include "layout_tensors.h"

#include <ATen/ATen.h>

#include <cstring>

namespace attn2d {
namespace binding {
namespace {

template <typename T>
at::Tensor tensor_of(const std::vector<T>& values, at::ScalarType type) {
  at::Tensor t = at::empty({static_cast<std::int64_t>(values.size())}, at::dtype(type));
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(T));
  return t;
}

}  // namespace

std::vector<at::Tensor> layout_tensors(const CompiledLayout& l) {
  const std::int64_t masks = l.num_masks();
  return {tensor_of(l.head_layout, at::kInt),
          tensor_of(l.q_tile_begin, at::kLong),
          tensor_of(l.k_tile_begin, at::kLong),
          tensor_of(l.q_rows, at::kInt).view({-1, l.block_q}),
          tensor_of(l.k_rows, at::kInt).view({-1, l.block_k}),
          tensor_of(l.fwd_begin, at::kLong),
          tensor_of(l.fwd_k_tile, at::kInt),
          tensor_of(l.fwd_mask, at::kLong),
          tensor_of(l.bwd_begin, at::kLong),
          tensor_of(l.bwd_q_tile, at::kInt),
          tensor_of(l.bwd_mask, at::kLong),
          tensor_of(l.masks, at::kLong).view({masks, l.block_q})};
}

at::Tensor offsets_tensor(const CompiledWindowOffsets& offsets) {
  std::vector<std::int32_t> both = offsets.dr;
  both.insert(both.end(), offsets.dc.begin(), offsets.dc.end());
  return tensor_of(both, at::kInt).view({2, static_cast<std::int64_t>(offsets.dr.size())});
}

}  // namespace binding
}  // namespace attn2d
