// attn2d's attention on LibTorch tensors, differentiable: the same operators and the same C++
// autograd functions that attn2d.attention and attn2d.attention2d call from Python, reached
// through torch's dispatcher. Link attn2d::torch (find_package(attn2d CONFIG) after
// find_package(Torch)). CPU tensors of float32, float64, bfloat16 or float16.
//
// Bad input throws c10::ValueError or c10::TypeError naming the argument; a workspace the
// allocator refuses throws c10::OutOfMemoryError. Gradients are first order: a second backward
// through these (create_graph, as gradient penalties ask) is refused with an error; from
// Python, attn2d has it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "attn2d/pattern.h"

namespace attn2d {
namespace functional {

struct AttentionOptions {
  // Bool (true: may attend) or additive float, broadcastable to (B, heads, Lq, Lk).
  std::optional<at::Tensor> attn_mask;
  // Query i sees keys j <= i + Lk - Lq (the lower-right corner, as torch's SDPA).
  bool is_causal = false;
  // Default 1/sqrt(E).
  std::optional<double> scale;
};

// q (B, heads, Lq, E), k (B, heads, Lk, E), v (B, heads, Lk, Ev) -> (B, heads, Lq, Ev). A row
// whose mask allows no key gives 0, with 0 gradients.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionOptions& options = {});

// A pattern compiled for one query grid, key grid and head count: what attention2d reads. The
// window kernels take a single Window where they serve it (the core's rule, kernel_choice.h);
// every other pattern reads its block-sparse layout. Compiling costs about the allowed pairs;
// keep the result while the grids stay.
class CompiledPattern {
 public:
  static CompiledPattern compile(const Pattern& pattern, GridShape q_hw, GridShape kv_hw,
                                 std::int64_t heads);

  GridShape q_hw() const { return q_hw_; }
  GridShape kv_hw() const { return kv_hw_; }
  std::int64_t heads() const { return heads_; }
  // Whether the window kernels run it (else the block-sparse layout).
  bool on_window_kernels() const { return window_offsets_.defined(); }

 private:
  friend at::Tensor attention2d(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                const CompiledPattern&, std::optional<double>);
  GridShape q_hw_{}, kv_hw_{};
  std::int64_t heads_ = 0;
  std::vector<at::Tensor> layout_;
  at::Tensor window_offsets_;
};

// Attention between pixels: q (B, heads, Hq, Wq, E), k (B, heads, Hk, Wk, E),
// v (B, heads, Hk, Wk, Ev) -> (B, heads, Hq, Wq, Ev). The key grid may be smaller than the
// query grid (pooled keys): query pixel (i, j) is centred at key pixel (i*Hk/Hq, j*Wk/Wq).
// No pattern: global attention. scale defaults to 1/sqrt(E).
at::Tensor attention2d(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const std::optional<Pattern>& pattern = std::nullopt,
                       std::optional<double> scale = std::nullopt);
// The same with a pattern compiled ahead; its grids and heads must be those of q and k.
at::Tensor attention2d(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const CompiledPattern& pattern, std::optional<double> scale = std::nullopt);

}  // namespace functional
}  // namespace attn2d
