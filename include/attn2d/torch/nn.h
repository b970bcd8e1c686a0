// attn2d's attention blocks as LibTorch modules, with the parameters, initialisation and
// state_dict keys of the Python modules attn2d.nn.SelfAttention2d and
// attn2d.nn.MultiheadSelfAttention2d: weights trained in one load in the other
// (load_state_dict reads a state_dict Python's torch.save wrote). Link attn2d::torch.
//
// Not in C++: spectral_norm, downsample and checkpoint (the Python modules' options that add
// parameters or recompute), and autocast.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <optional>
#include <string>

#include "attn2d/pattern.h"
#include "attn2d/torch/functional.h"

namespace attn2d {
namespace nn {

// The SAGAN / BigGAN block: theta = query(x), phi = key(x), g = value(x) (1x1 convs; q/k at
// channels / qk_ratio, v at v_channels, default channels / 2); phi and g max-pooled by
// pool_kv; o = attention over `heads` heads; o projected back to `channels` by a 1x1 conv when
// out_conv; y = x + gamma * o (gamma starts at 0). scale 1.0 is SAGAN's unscaled dot product,
// nullopt 1/sqrt(head width). A pattern (a Window, a YLG with `heads` heads, ...) makes it
// sparse: the YLG-SAGAN block is heads 8 with YLG(8).
struct SelfAttention2dOptions {
  explicit SelfAttention2dOptions(std::int64_t channels) : channels_(channels) {}
  TORCH_ARG(std::int64_t, channels);
  TORCH_ARG(std::int64_t, qk_ratio) = 8;
  TORCH_ARG(std::optional<std::int64_t>, v_channels) = std::nullopt;
  TORCH_ARG(std::int64_t, heads) = 1;
  TORCH_ARG(std::int64_t, pool_kv) = 2;
  TORCH_ARG(bool, out_conv) = true;
  TORCH_ARG(bool, gamma) = true;
  TORCH_ARG(bool, residual) = true;
  TORCH_ARG(std::optional<double>, scale) = 1.0;
  TORCH_ARG(std::int64_t, groups) = 1;
  TORCH_ARG(std::optional<Pattern>, pattern) = std::nullopt;
};

class SelfAttention2dImpl : public torch::nn::Module {
 public:
  explicit SelfAttention2dImpl(const SelfAttention2dOptions& options);
  // x (B, channels, H, W) -> (B, channels, H, W).
  at::Tensor forward(const at::Tensor& x);
  // Where the block attends; the weights do not depend on it (training schedules change it).
  void set_pattern(std::optional<Pattern> pattern);

  SelfAttention2dOptions options;
  torch::nn::Conv2d query{nullptr}, key{nullptr}, value{nullptr}, out{nullptr};
  at::Tensor gamma;  // undefined without options.gamma()

 private:
  at::Tensor attend(const at::Tensor& x);
  std::optional<functional::CompiledPattern> compiled_;
};
TORCH_MODULE(SelfAttention2d);

// x (B, C, H, W) -> tokens; t = t + MHA(LN(t)); t = t + FF(t); back to (B, C, H, W). The
// attention's parameters are nn.MultiheadAttention's (mha.in_proj_weight, mha.in_proj_bias,
// mha.out_proj); a pattern makes it attend over the H x W grid sparsely.
struct MultiheadSelfAttention2dOptions {
  explicit MultiheadSelfAttention2dOptions(std::int64_t channels) : channels_(channels) {}
  TORCH_ARG(std::int64_t, channels);
  TORCH_ARG(std::int64_t, num_heads) = 4;
  TORCH_ARG(std::optional<Pattern>, pattern) = std::nullopt;
};

class MultiheadProjectionsImpl : public torch::nn::Module {
 public:
  MultiheadProjectionsImpl(std::int64_t channels, std::int64_t num_heads);
  // tokens (B, H*W, C) in raster order of an H x W grid.
  at::Tensor forward(const at::Tensor& tokens, GridShape grid,
                     const std::optional<functional::CompiledPattern>& pattern);

  std::int64_t num_heads;
  at::Tensor in_proj_weight, in_proj_bias;
  torch::nn::Linear out_proj{nullptr};
};
TORCH_MODULE(MultiheadProjections);

class MultiheadSelfAttention2dImpl : public torch::nn::Module {
 public:
  explicit MultiheadSelfAttention2dImpl(const MultiheadSelfAttention2dOptions& options);
  at::Tensor forward(const at::Tensor& x);
  void set_pattern(std::optional<Pattern> pattern);

  MultiheadSelfAttention2dOptions options;
  MultiheadProjections mha{nullptr};
  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Sequential ff_self{nullptr};

 private:
  std::optional<functional::CompiledPattern> compiled_;
};
TORCH_MODULE(MultiheadSelfAttention2d);

// Copies a state_dict that Python saved as a plain dict, torch.save(dict(m.state_dict()), path),
// into module's parameters and buffers, by name, as Python's load_state_dict(strict=True):
// a missing or unexpected key, or a shape that differs, throws c10::ValueError naming it.
void load_state_dict(torch::nn::Module& module, const std::string& path);

}  // namespace nn
}  // namespace attn2d
