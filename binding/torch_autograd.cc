// Autograd for the attn2d::*_forward operators, in C++: each records its backward operator
// (called through the dispatcher, so that a double backward reaches that operator's own
// autograd, which refuses it: attn2d/_ops.py). torch.library's Python autograd wrapper did
// the same at ~0.2 ms a step (flattening the arguments, a Python context, the layout's 12
// tensors): a YLG(8) forward and backward over an 8x8 map took 298 us where the operators
// alone took 92 us.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

namespace attn2d {
namespace binding {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// The operators, looked up once: calls through the dispatcher go below autograd inside the
// forwards (AutoDispatchBelowADInplaceOrView) and through autograd in the backwards.
template <class Signature>
c10::TypedOperatorHandle<Signature> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// The backwards: no gradients where no loss reached the output (autograd hands None then, since
// zero gradients are not materialized: lse, which no loss can reach, would otherwise get a
// zero-filled (B, H, Lq) tensor every step).
bool no_grad_out(const variable_list& grads) { return !grads[0].defined(); }

variable_list with_undefined(const Grads& g, size_t more) {
  variable_list out{std::get<0>(g), std::get<1>(g), std::get<2>(g)};
  out.resize(3 + more);
  return out;
}

using ForwardResult = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// Whether a forward keeps its float32 output for the backward: a 16-bit call that a backward
// may follow. D = rowsum(dO * O) from the rounded output carries that rounding into every dQ
// row (bf16 dQ 5-8x further from float64 than torch's); from the float32 output dQ is
// rounded once. Asked outside Function::apply, which runs the forward with grad mode off.
bool keeps_out_accum(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const bool half = q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf;
  return half && at::GradMode::is_enabled() &&
         (q.requires_grad() || k.requires_grad() || v.requires_grad());
}

// The forwards' common part: `call` (the operator, below autograd) gives out, lse and
// out_accum; lse and out_accum are not differentiable; q, k, v, the O the backward reads
// (out_accum where it is kept, else out), lse and `more` are saved for the backward, in that
// order.
template <class Call>
variable_list run_forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& v, std::vector<at::Tensor> more, const Call& call) {
  at::Tensor out, lse, out_accum;
  {
    at::AutoDispatchBelowADInplaceOrView below;
    std::tie(out, lse, out_accum) = call();
  }
  ctx->mark_non_differentiable({lse, out_accum});
  ctx->set_materialize_grads(false);
  const bool kept = out_accum.dim() == 4;
  std::vector<at::Tensor> saved{q, k, v, kept ? out_accum : out, lse};
  saved.insert(saved.end(), more.begin(), more.end());
  ctx->save_for_backward(saved);
  return {out, lse, out_accum};
}

class AttentionFunction : public torch::autograd::Function<AttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const std::optional<at::Tensor>& attn_mask,
                               bool is_causal, double scale, bool keep_out_accum) {
    static const auto op =
        find_op<ForwardResult(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const std::optional<at::Tensor>&, bool, double, bool)>(
            "attn2d::attention_forward");
    ctx->saved_data["is_causal"] = is_causal;
    ctx->saved_data["scale"] = scale;
    return run_forward(ctx, q, k, v, {attn_mask.value_or(at::Tensor())},
                       [&] {
                         return op.call(q, k, v, attn_mask, is_causal, scale, keep_out_accum);
                       });
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    constexpr size_t kOthers = 4;  // attn_mask, is_causal, scale, keep_out_accum
    if (no_grad_out(grads)) return variable_list(3 + kOthers);
    static const auto op =
        find_op<Grads(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                      bool, double)>("attn2d::attention_backward");
    const auto s = ctx->get_saved_variables();
    const std::optional<at::Tensor> mask =
        s[5].defined() ? std::optional<at::Tensor>(s[5]) : std::nullopt;
    return with_undefined(op.call(grads[0], s[0], s[1], s[2], s[3], s[4], mask,
                                  ctx->saved_data["is_causal"].toBool(),
                                  ctx->saved_data["scale"].toDouble()),
                          kOthers);
  }
};

class Attention2dFunction : public torch::autograd::Function<Attention2dFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, at::TensorList layout, std::int64_t block_q,
                               double scale, bool keep_out_accum) {
    static const auto op =
        find_op<ForwardResult(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              at::TensorList, std::int64_t, double, bool)>(
            "attn2d::attention2d_forward");
    ctx->saved_data["layout"] = layout.vec();
    ctx->saved_data["block_q"] = block_q;
    ctx->saved_data["scale"] = scale;
    return run_forward(ctx, q, k, v, {},
                       [&] { return op.call(q, k, v, layout, block_q, scale, keep_out_accum); });
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::vector<at::Tensor> layout = ctx->saved_data["layout"].toTensorVector();
    // A tensor list counts as one input a tensor; then block_q, scale and keep_out_accum.
    const size_t others = layout.size() + 3;
    if (no_grad_out(grads)) return variable_list(3 + others);
    static const auto op =
        find_op<Grads(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const at::Tensor&, const at::Tensor&, at::TensorList, std::int64_t,
                      double)>("attn2d::attention2d_backward");
    const auto s = ctx->get_saved_variables();
    return with_undefined(op.call(grads[0], s[0], s[1], s[2], s[3], s[4], layout,
                                  ctx->saved_data["block_q"].toInt(),
                                  ctx->saved_data["scale"].toDouble()),
                          others);
  }
};

class WindowFunction : public torch::autograd::Function<WindowFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& offsets,
                               std::int64_t height, std::int64_t width, double scale,
                               bool keep_out_accum) {
    static const auto op =
        find_op<ForwardResult(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const at::Tensor&, std::int64_t, std::int64_t, double, bool)>(
            "attn2d::attention2d_window_forward");
    ctx->saved_data["height"] = height;
    ctx->saved_data["width"] = width;
    ctx->saved_data["scale"] = scale;
    return run_forward(ctx, q, k, v, {offsets},
                       [&] {
                         return op.call(q, k, v, offsets, height, width, scale, keep_out_accum);
                       });
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    constexpr size_t kOthers = 5;  // offsets, height, width, scale, keep_out_accum
    if (no_grad_out(grads)) return variable_list(3 + kOthers);
    static const auto op =
        find_op<Grads(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const at::Tensor&, const at::Tensor&, const at::Tensor&, std::int64_t,
                      std::int64_t, double)>("attn2d::attention2d_window_backward");
    const auto s = ctx->get_saved_variables();
    return with_undefined(op.call(grads[0], s[0], s[1], s[2], s[3], s[4], s[5],
                                  ctx->saved_data["height"].toInt(),
                                  ctx->saved_data["width"].toInt(),
                                  ctx->saved_data["scale"].toDouble()),
                          kOthers);
  }
};

ForwardResult triple(const variable_list& r) { return {r[0], r[1], r[2]}; }

ForwardResult attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const std::optional<at::Tensor>& attn_mask, bool is_causal,
                                double scale, bool keep_out_accum) {
  // Its gradient would be an Lq x Lk tensor; returning none would be silently wrong. Under
  // no_grad no gradient is asked for, and the mask is read as it is (Function::apply runs the
  // forward with grad mode off, so this is asked here).
  TORCH_CHECK_VALUE(!(at::GradMode::is_enabled() && attn_mask.has_value() &&
                      attn_mask->requires_grad()),
                    "attn2d.attention: attn_mask requires grad, but gradients with respect to "
                    "the mask are not supported; pass attn_mask.detach()");
  return triple(AttentionFunction::apply(q, k, v, attn_mask, is_causal, scale,
                                         keep_out_accum || keeps_out_accum(q, k, v)));
}

ForwardResult attention2d_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  at::TensorList layout, std::int64_t block_q, double scale,
                                  bool keep_out_accum) {
  return triple(Attention2dFunction::apply(q, k, v, layout, block_q, scale,
                                           keep_out_accum || keeps_out_accum(q, k, v)));
}

ForwardResult attention2d_window_forward(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& offsets,
                                         std::int64_t height, std::int64_t width, double scale,
                                         bool keep_out_accum) {
  return triple(WindowFunction::apply(q, k, v, offsets, height, width, scale,
                                      keep_out_accum || keeps_out_accum(q, k, v)));
}

}  // namespace
}  // namespace binding
}  // namespace attn2d

TORCH_LIBRARY_IMPL(attn2d, Autograd, m) {
  m.impl("attention_forward", &attn2d::binding::attention_forward);
  m.impl("attention2d_forward", &attn2d::binding::attention2d_forward);
  m.impl("attention2d_window_forward", &attn2d::binding::attention2d_window_forward);
}
