// attn2d::functional (include/attn2d/torch/functional.h): the C++ face of attn2d.attention and
// attn2d.attention2d. It calls the attn2d operators through the dispatcher, so a call records
// the autograd functions of torch_autograd.cc, the ones Python's calls record.
#include "attn2d/torch/functional.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cmath>
#include <tuple>

#include "errors.h"
#include "layout_tensors.h"

namespace attn2d {
namespace functional {
namespace {

using Outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

template <class Signature>
c10::TypedOperatorHandle<Signature> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

double resolve_scale(const char* fn, std::optional<double> scale, std::int64_t head_dim) {
  if (!scale) return head_dim > 0 ? 1.0 / std::sqrt(static_cast<double>(head_dim)) : 1.0;
  TORCH_CHECK_VALUE(std::isfinite(*scale), fn, ": scale must be finite; got ", *scale);
  return *scale;
}

void check_grid_tensor(const char* fn, const char* name, const at::Tensor& t, const char* what) {
  TORCH_CHECK_TYPE(t.defined(), fn, ": ", name, " must be a defined tensor");
  TORCH_CHECK_VALUE(t.dim() == 5, fn, ": ", name, " must be 5-D ", what, "; got shape ",
                    t.sizes());
}

// q, k, v checked as grids; returns (query grid, key grid).
std::pair<GridShape, GridShape> check_grids(const char* fn, const at::Tensor& q,
                                            const at::Tensor& k, const at::Tensor& v) {
  check_grid_tensor(fn, "q", q, "(B, heads, Hq, Wq, E)");
  check_grid_tensor(fn, "k", k, "(B, heads, Hk, Wk, E)");
  check_grid_tensor(fn, "v", v, "(B, heads, Hk, Wk, Ev)");
  TORCH_CHECK_VALUE(v.size(2) == k.size(2) && v.size(3) == k.size(3), fn, ": v's grid (",
                    v.size(2), ", ", v.size(3), ") must equal k's grid (", k.size(2), ", ",
                    k.size(3), ")");
  return {GridShape{q.size(2), q.size(3)}, GridShape{k.size(2), k.size(3)}};
}

}  // namespace

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionOptions& options) {
  static const auto op =
      find_op<Outputs(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const std::optional<at::Tensor>&, bool, double, bool)>(
          "attn2d::attention_forward");
  const char* fn = "attn2d::functional::attention";
  TORCH_CHECK_TYPE(q.defined() && k.defined() && v.defined(), fn,
                   ": q, k and v must be defined tensors");
  TORCH_CHECK_VALUE(q.dim() == 4, fn, ": q must be 4-D (B, heads, Lq, E); got shape ",
                    q.sizes());
  const double scale = resolve_scale(fn, options.scale, q.size(-1));
  return std::get<0>(op.call(q, k, v, options.attn_mask, options.is_causal, scale, false));
}

CompiledPattern CompiledPattern::compile(const Pattern& pattern, GridShape q_hw,
                                         GridShape kv_hw, std::int64_t heads) {
  binding::raise_unless_ok(pattern.validate(q_hw, kv_hw, heads));
  CompiledPattern compiled;
  compiled.q_hw_ = q_hw;
  compiled.kv_hw_ = kv_hw;
  compiled.heads_ = heads;
  if (const Window* window = pattern.as_window()) {
    std::optional<CompiledWindowOffsets> offsets;
    binding::raise_unless_ok(window->kernel_offsets(q_hw, kv_hw, &offsets));
    if (offsets) {
      compiled.window_offsets_ = binding::offsets_tensor(*offsets);
      return compiled;
    }
  }
  CompiledLayout layout;
  binding::raise_unless_ok(pattern.compile(q_hw, kv_hw, heads, &layout));
  compiled.layout_ = binding::layout_tensors(layout);
  return compiled;
}

at::Tensor attention2d(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const std::optional<Pattern>& pattern, std::optional<double> scale) {
  const char* fn = "attn2d::functional::attention2d";
  const auto [q_hw, kv_hw] = check_grids(fn, q, k, v);
  if (!pattern) {
    AttentionOptions options;
    options.scale = scale;
    return attention(q.flatten(2, 3), k.flatten(2, 3), v.flatten(2, 3), options)
        .unflatten(2, {q_hw.height, q_hw.width});
  }
  return attention2d(q, k, v, CompiledPattern::compile(*pattern, q_hw, kv_hw, q.size(1)), scale);
}

at::Tensor attention2d(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const CompiledPattern& pattern, std::optional<double> scale) {
  static const auto window_op =
      find_op<Outputs(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      std::int64_t, std::int64_t, double, bool)>(
          "attn2d::attention2d_window_forward");
  static const auto layout_op =
      find_op<Outputs(const at::Tensor&, const at::Tensor&, const at::Tensor&, at::TensorList,
                      std::int64_t, double, bool)>("attn2d::attention2d_forward");
  const char* fn = "attn2d::functional::attention2d";
  const auto [q_hw, kv_hw] = check_grids(fn, q, k, v);
  TORCH_CHECK_VALUE(pattern.heads() > 0, fn, ": the pattern was never compiled "
                    "(CompiledPattern::compile)");
  TORCH_CHECK_VALUE(q_hw.height == pattern.q_hw().height && q_hw.width == pattern.q_hw().width &&
                        kv_hw.height == pattern.kv_hw().height &&
                        kv_hw.width == pattern.kv_hw().width && q.size(1) == pattern.heads(),
                    fn, ": the pattern was compiled for query grid (", pattern.q_hw().height,
                    ", ", pattern.q_hw().width, "), key grid (", pattern.kv_hw().height, ", ",
                    pattern.kv_hw().width, ") and ", pattern.heads(), " heads; q and k have (",
                    q_hw.height, ", ", q_hw.width, "), (", kv_hw.height, ", ", kv_hw.width,
                    ") and ", q.size(1));
  const double s = resolve_scale(fn, scale, q.size(-1));
  const at::Tensor q4 = q.flatten(2, 3), k4 = k.flatten(2, 3), v4 = v.flatten(2, 3);
  at::Tensor out;
  if (pattern.on_window_kernels()) {
    out = std::get<0>(window_op.call(q4, k4, v4, pattern.window_offsets_, q_hw.height,
                                     q_hw.width, s, false));
  } else {
    out = std::get<0>(layout_op.call(q4, k4, v4, pattern.layout_, kPatternBlockQ, s, false));
  }
  return out.unflatten(2, {q_hw.height, q_hw.width});
}

}  // namespace functional
}  // namespace attn2d
