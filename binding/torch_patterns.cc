// The core's patterns (attn2d/patterns.h) as operators: attn2d.patterns' Window and YLG hand
// their options here and get back the core's checks, dense masks, compiled layouts and window
// offsets as tensors, so that Python and C++ callers compile a pattern with the same code.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attn2d/patterns.h"
#include "python_errors.h"

namespace attn2d {
namespace binding {
namespace {

// The core's messages already name the pattern and the argument (Python's own text), so they
// are raised as they are: ValueError for a bad value, TypeError for an unsupported one.
void raise_unless_ok(const Status& s) {
  if (s.ok()) return;
  if (s.code() == StatusCode::kOutOfMemory) throw_memory_error(s.message());
  TORCH_CHECK_TYPE(s.code() != StatusCode::kUnsupported, s.message());
  TORCH_CHECK_VALUE(false, s.message());
}

GridShape grid(at::IntArrayRef hw, const char* name) {
  TORCH_CHECK_VALUE(hw.size() == 2, "attn2d.patterns: ", name,
                    " must be a pair of ints (H, W); got ", hw.size(), " values");
  return GridShape{hw[0], hw[1]};
}

Window make_window(std::int64_t size, c10::string_view metric, std::int64_t dilation,
                   c10::string_view border) {
  Window w;
  w.size = size;
  w.dilation = dilation;
  raise_unless_ok(parse_window_metric(std::string_view(metric.data(), metric.size()), &w.metric));
  raise_unless_ok(parse_window_border(std::string_view(border.data(), border.size()), &w.border));
  return w;
}

YLG make_ylg(const std::vector<c10::string_view>& kinds, c10::string_view mapping) {
  YLG y;
  raise_unless_ok(
      parse_ylg_mapping(std::string_view(mapping.data(), mapping.size()), &y.mapping));
  for (const c10::string_view& name : kinds) {
    YlgKind kind;
    raise_unless_ok(parse_ylg_kind(std::string_view(name.data(), name.size()), &kind));
    y.patterns.push_back(kind);
  }
  return y;
}

template <typename T>
at::Tensor tensor_of(const std::vector<T>& values, at::ScalarType type) {
  at::Tensor t = at::empty({static_cast<std::int64_t>(values.size())}, at::dtype(type));
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(T));
  return t;
}

// The 12 tensors of binding/torch_ops.cc's make_layout, in CompiledLayout's order.
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

// The mask as a tensor that owns the core's buffer: a dense mask is as large as the attention
// matrix, and a copy would double the peak.
at::Tensor mask_tensor(std::vector<std::uint8_t>&& mask, std::int64_t heads, GridShape q,
                       GridShape kv) {
  auto* owned = new std::vector<std::uint8_t>(std::move(mask));
  return at::from_blob(
      owned->data(), {heads, q.height * q.width, kv.height * kv.width},
      [owned](void*) { delete owned; }, at::dtype(at::kBool));
}

void check_window(std::int64_t size, c10::string_view metric, std::int64_t dilation,
                  c10::string_view border, at::IntArrayRef q_hw, at::IntArrayRef kv_hw,
                  std::int64_t heads) {
  raise_unless_ok(make_window(size, metric, dilation, border)
                      .validate(grid(q_hw, "q_hw"), grid(kv_hw, "kv_hw"), heads));
}

at::Tensor window_dense_mask(std::int64_t size, c10::string_view metric, std::int64_t dilation,
                             c10::string_view border, at::IntArrayRef q_hw,
                             at::IntArrayRef kv_hw, std::int64_t heads) {
  const GridShape q = grid(q_hw, "q_hw"), kv = grid(kv_hw, "kv_hw");
  std::vector<std::uint8_t> mask;
  raise_unless_ok(make_window(size, metric, dilation, border).dense_mask(q, kv, heads, &mask));
  return mask_tensor(std::move(mask), heads, q, kv);
}

std::vector<at::Tensor> compile_window(std::int64_t size, c10::string_view metric,
                                       std::int64_t dilation, c10::string_view border,
                                       at::IntArrayRef q_hw, at::IntArrayRef kv_hw,
                                       std::int64_t heads) {
  CompiledLayout layout;
  raise_unless_ok(make_window(size, metric, dilation, border)
                      .compile(grid(q_hw, "q_hw"), grid(kv_hw, "kv_hw"), heads, &layout));
  return layout_tensors(layout);
}

// A (2, count) int32 tensor (row offsets, then column offsets), or None: on_grid_only picks
// Window::offsets_on_grid, else Window::kernel_offsets.
std::optional<at::Tensor> window_offsets(std::int64_t size, c10::string_view metric,
                                         std::int64_t dilation, c10::string_view border,
                                         at::IntArrayRef q_hw, at::IntArrayRef kv_hw,
                                         bool on_grid_only) {
  const Window w = make_window(size, metric, dilation, border);
  const GridShape q = grid(q_hw, "q_hw"), kv = grid(kv_hw, "kv_hw");
  std::optional<CompiledWindowOffsets> offsets;
  raise_unless_ok(on_grid_only ? w.offsets_on_grid(q, kv, &offsets)
                               : w.kernel_offsets(q, kv, &offsets));
  if (!offsets) return std::nullopt;
  std::vector<std::int32_t> both = offsets->dr;
  both.insert(both.end(), offsets->dc.begin(), offsets->dc.end());
  return tensor_of(both, at::kInt).view({2, static_cast<std::int64_t>(offsets->dr.size())});
}

void check_ylg(std::vector<c10::string_view> kinds, c10::string_view mapping,
               at::IntArrayRef q_hw, at::IntArrayRef kv_hw, std::int64_t heads) {
  raise_unless_ok(
      make_ylg(kinds, mapping).validate(grid(q_hw, "q_hw"), grid(kv_hw, "kv_hw"), heads));
}

at::Tensor ylg_dense_mask(std::vector<c10::string_view> kinds, c10::string_view mapping,
                          at::IntArrayRef q_hw, at::IntArrayRef kv_hw, std::int64_t heads) {
  const GridShape q = grid(q_hw, "q_hw"), kv = grid(kv_hw, "kv_hw");
  std::vector<std::uint8_t> mask;
  raise_unless_ok(make_ylg(kinds, mapping).dense_mask(q, kv, heads, &mask));
  return mask_tensor(std::move(mask), heads, q, kv);
}

std::vector<at::Tensor> compile_ylg(std::vector<c10::string_view> kinds,
                                    c10::string_view mapping, at::IntArrayRef q_hw,
                                    at::IntArrayRef kv_hw, std::int64_t heads) {
  CompiledLayout layout;
  raise_unless_ok(
      make_ylg(kinds, mapping).compile(grid(q_hw, "q_hw"), grid(kv_hw, "kv_hw"), heads, &layout));
  return layout_tensors(layout);
}

}  // namespace
}  // namespace binding
}  // namespace attn2d

#define ATTN2D_WINDOW_ARGS "int size, str metric, int dilation, str border, int[] q_hw, int[] kv_hw"
#define ATTN2D_YLG_ARGS "str[] patterns, str mapping, int[] q_hw, int[] kv_hw"

TORCH_LIBRARY_FRAGMENT(attn2d, m) {
  m.def("check_window(" ATTN2D_WINDOW_ARGS ", int heads) -> ()", &attn2d::binding::check_window);
  m.def("window_dense_mask(" ATTN2D_WINDOW_ARGS ", int heads) -> Tensor",
        &attn2d::binding::window_dense_mask);
  m.def("compile_window(" ATTN2D_WINDOW_ARGS ", int heads) -> Tensor[]",
        &attn2d::binding::compile_window);
  m.def("window_offsets(" ATTN2D_WINDOW_ARGS ", bool on_grid_only) -> Tensor?",
        &attn2d::binding::window_offsets);
  m.def("check_ylg(" ATTN2D_YLG_ARGS ", int heads) -> ()", &attn2d::binding::check_ylg);
  m.def("ylg_dense_mask(" ATTN2D_YLG_ARGS ", int heads) -> Tensor",
        &attn2d::binding::ylg_dense_mask);
  m.def("compile_ylg(" ATTN2D_YLG_ARGS ", int heads) -> Tensor[]",
        &attn2d::binding::compile_ylg);
}
