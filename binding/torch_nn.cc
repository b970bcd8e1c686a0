// attn2d::nn (include/attn2d/torch/nn.h): the Python modules of python/attn2d/nn/ in LibTorch,
// step for step, so that the same weights give the same outputs and gradients.
#include "attn2d/torch/nn.h"

#include <ATen/ATen.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/activation.h>
#include <torch/serialize.h>
#include <torch/utils.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace attn2d {
namespace nn {
namespace {

std::int64_t check_positive(const char* module, const char* name, std::int64_t value) {
  TORCH_CHECK_VALUE(value >= 1, module, ": ", name, " must be >= 1; got ", value);
  return value;
}

void check_divisible(const char* module, const char* name, std::int64_t value,
                     const char* by_name, std::int64_t by) {
  TORCH_CHECK_VALUE(value % by == 0, module, ": ", name, " (", value, ") must be divisible by ",
                    by_name, " (", by, ")");
}

void check_map_input(const char* module, const at::Tensor& x, std::int64_t channels) {
  TORCH_CHECK_TYPE(x.defined(), module, ": input must be a defined tensor");
  TORCH_CHECK_VALUE(x.dim() == 4, module, ": input must be 4-D (B, C, H, W); got shape ",
                    x.sizes());
  TORCH_CHECK_VALUE(x.size(1) == channels, module, ": input has ", x.size(1),
                    " channels; the module was built for ", channels);
}

// (B, heads*d, H, W) -> (B, heads, H, W, d), a view.
at::Tensor map_to_grid_heads(const at::Tensor& t, std::int64_t heads) {
  return t.reshape({t.size(0), heads, t.size(1) / heads, t.size(2), t.size(3)})
      .permute({0, 1, 3, 4, 2});
}

// (B, heads, H, W, d) -> (B, heads*d, H, W).
at::Tensor grid_heads_to_map(const at::Tensor& t) {
  return t.permute({0, 1, 4, 2, 3}).reshape({t.size(0), t.size(1) * t.size(4), t.size(2), t.size(3)});
}

// (B, N, heads*d) -> (B, heads, N, d), a view; and back.
at::Tensor tokens_to_heads(const at::Tensor& t, std::int64_t heads) {
  return t.view({t.size(0), t.size(1), heads, t.size(2) / heads}).transpose(1, 2);
}

at::Tensor heads_to_tokens(const at::Tensor& t) {
  return t.transpose(1, 2).reshape({t.size(0), t.size(2), t.size(1) * t.size(3)});
}

// The compiled pattern for these grids, compiled again only when the grids or heads change.
const std::optional<functional::CompiledPattern>& compiled_for(
    const std::optional<Pattern>& pattern, GridShape q_hw, GridShape kv_hw, std::int64_t heads,
    std::optional<functional::CompiledPattern>* cache) {
  if (!pattern) {
    cache->reset();
    return *cache;
  }
  const auto same = [](GridShape a, GridShape b) {
    return a.height == b.height && a.width == b.width;
  };
  if (!*cache || !same((*cache)->q_hw(), q_hw) || !same((*cache)->kv_hw(), kv_hw) ||
      (*cache)->heads() != heads) {
    *cache = functional::CompiledPattern::compile(*pattern, q_hw, kv_hw, heads);
  }
  return *cache;
}

constexpr const char* kSelfAttention = "attn2d::nn::SelfAttention2d";
constexpr const char* kMultihead = "attn2d::nn::MultiheadSelfAttention2d";

}  // namespace

SelfAttention2dImpl::SelfAttention2dImpl(const SelfAttention2dOptions& options_)
    : options(options_) {
  const std::int64_t channels = check_positive(kSelfAttention, "channels", options.channels());
  const std::int64_t qk_ratio = check_positive(kSelfAttention, "qk_ratio", options.qk_ratio());
  const std::int64_t heads = check_positive(kSelfAttention, "heads", options.heads());
  check_positive(kSelfAttention, "pool_kv", options.pool_kv());
  const std::int64_t groups = check_positive(kSelfAttention, "groups", options.groups());
  const std::int64_t v_channels = check_positive(
      kSelfAttention, "v_channels", options.v_channels().value_or(channels / 2));
  options.v_channels(v_channels);
  check_divisible(kSelfAttention, "channels", channels, "qk_ratio", qk_ratio);
  const std::int64_t qk_channels = channels / qk_ratio;
  check_divisible(kSelfAttention, "channels / qk_ratio", qk_channels, "heads", heads);
  check_divisible(kSelfAttention, "v_channels", v_channels, "heads", heads);
  check_divisible(kSelfAttention, "channels", channels, "groups", groups);
  check_divisible(kSelfAttention, "channels / qk_ratio", qk_channels, "groups", groups);
  check_divisible(kSelfAttention, "v_channels", v_channels, "groups", groups);
  TORCH_CHECK_VALUE(options.out_conv() || v_channels == channels || !options.residual(),
                    kSelfAttention, ": residual without out_conv needs v_channels == channels; "
                    "got v_channels=", v_channels, ", channels=", channels);
  if (options.scale()) {
    TORCH_CHECK_VALUE(std::isfinite(*options.scale()), kSelfAttention,
                      ": scale must be finite; got ", *options.scale());
  }
  const auto conv = [&](std::int64_t in, std::int64_t out_channels) {
    return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out_channels, 1).groups(groups));
  };
  query = register_module("query", conv(channels, qk_channels));
  key = register_module("key", conv(channels, qk_channels));
  value = register_module("value", conv(channels, v_channels));
  if (options.out_conv()) out = register_module("out", conv(v_channels, channels));
  if (options.gamma()) gamma = register_parameter("gamma", at::zeros({1}));
}

void SelfAttention2dImpl::set_pattern(std::optional<Pattern> pattern) {
  options.pattern(std::move(pattern));
  compiled_.reset();
}

at::Tensor SelfAttention2dImpl::attend(const at::Tensor& x) {
  const std::int64_t heads = options.heads(), pool = options.pool_kv();
  at::Tensor q = query->forward(x), k = key->forward(x), v = value->forward(x);
  if (pool > 1) {
    k = at::max_pool2d(k, {pool, pool});
    v = at::max_pool2d(v, {pool, pool});
  }
  q = map_to_grid_heads(q, heads);
  k = map_to_grid_heads(k, heads);
  v = map_to_grid_heads(v, heads);
  const auto& compiled = compiled_for(options.pattern(), GridShape{q.size(2), q.size(3)},
                                      GridShape{k.size(2), k.size(3)}, heads, &compiled_);
  const at::Tensor o = grid_heads_to_map(
      compiled ? functional::attention2d(q, k, v, *compiled, options.scale())
               : functional::attention2d(q, k, v, std::nullopt, options.scale()));
  return out ? out->forward(o) : o;
}

at::Tensor SelfAttention2dImpl::forward(const at::Tensor& x) {
  check_map_input(kSelfAttention, x, options.channels());
  const std::int64_t pool = options.pool_kv();
  TORCH_CHECK_VALUE(x.size(2) >= pool && x.size(3) >= pool, kSelfAttention, ": pool_kv=", pool,
                    " needs an attended map of at least ", pool, "x", pool, "; got ", x.size(2),
                    "x", x.size(3));
  at::Tensor o = attend(x);
  if (gamma.defined()) o = gamma * o;
  return options.residual() ? x + o : o;
}

MultiheadProjectionsImpl::MultiheadProjectionsImpl(std::int64_t channels,
                                                   std::int64_t num_heads_)
    : num_heads(num_heads_) {
  // nn.MultiheadAttention's parameters and initialisation.
  in_proj_weight = register_parameter("in_proj_weight", at::empty({3 * channels, channels}));
  in_proj_bias = register_parameter("in_proj_bias", at::empty({3 * channels}));
  out_proj = register_module("out_proj", torch::nn::Linear(channels, channels));
  torch::NoGradGuard no_grad;
  torch::nn::init::xavier_uniform_(in_proj_weight);
  in_proj_bias.zero_();
  out_proj->bias.zero_();
}

at::Tensor MultiheadProjectionsImpl::forward(
    const at::Tensor& tokens, GridShape grid,
    const std::optional<functional::CompiledPattern>& pattern) {
  const std::vector<at::Tensor> qkv = at::linear(tokens, in_proj_weight, in_proj_bias).chunk(3, -1);
  at::Tensor q = tokens_to_heads(qkv[0], num_heads), k = tokens_to_heads(qkv[1], num_heads),
             v = tokens_to_heads(qkv[2], num_heads);
  at::Tensor o;
  if (!pattern) {
    o = functional::attention(q, k, v);
  } else {
    const std::vector<std::int64_t> hw{grid.height, grid.width};
    o = functional::attention2d(q.unflatten(2, hw), k.unflatten(2, hw), v.unflatten(2, hw),
                                *pattern)
            .flatten(2, 3);
  }
  return out_proj->forward(heads_to_tokens(o));
}

MultiheadSelfAttention2dImpl::MultiheadSelfAttention2dImpl(
    const MultiheadSelfAttention2dOptions& options_)
    : options(options_) {
  const std::int64_t channels = check_positive(kMultihead, "channels", options.channels());
  const std::int64_t heads = check_positive(kMultihead, "num_heads", options.num_heads());
  check_divisible(kMultihead, "channels", channels, "num_heads", heads);
  mha = register_module("mha", MultiheadProjections(channels, heads));
  ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({channels})));
  ff_self = register_module(
      "ff_self",
      torch::nn::Sequential(torch::nn::LayerNorm(torch::nn::LayerNormOptions({channels})),
                            torch::nn::Linear(channels, channels), torch::nn::GELU(),
                            torch::nn::Linear(channels, channels)));
}

void MultiheadSelfAttention2dImpl::set_pattern(std::optional<Pattern> pattern) {
  options.pattern(std::move(pattern));
  compiled_.reset();
}

at::Tensor MultiheadSelfAttention2dImpl::forward(const at::Tensor& x) {
  check_map_input(kMultihead, x, options.channels());
  const std::int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const GridShape grid{H, W};
  const auto& compiled = compiled_for(options.pattern(), grid, grid, options.num_heads(),
                                      &compiled_);
  const at::Tensor tokens = x.flatten(2).transpose(1, 2);
  const at::Tensor a =
      mha->forward(ln->forward(tokens), grid, compiled).transpose(1, 2).reshape({B, C, H, W});
  at::Tensor t = (x + a).flatten(2).transpose(1, 2);
  t = ff_self->forward(t) + t;
  return t.transpose(1, 2).reshape({B, C, H, W});
}

void load_state_dict(torch::nn::Module& module, const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  TORCH_CHECK_VALUE(file.good(), "attn2d::nn::load_state_dict: cannot read ", path);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(file)),
                                std::istreambuf_iterator<char>());
  c10::IValue loaded;
  try {
    loaded = torch::pickle_load(bytes);
  } catch (const c10::Error& e) {
    // state_dict() is an OrderedDict with a _metadata attribute, which LibTorch's unpickler
    // cannot set.
    TORCH_CHECK_VALUE(false, "attn2d::nn::load_state_dict: cannot read ", path, " (",
                      e.what_without_backtrace(), "); save the state_dict as a plain dict: "
                      "torch.save(dict(module.state_dict()), path)");
  }
  TORCH_CHECK_VALUE(loaded.isGenericDict(), "attn2d::nn::load_state_dict: ", path,
                    " holds a ", loaded.tagKind(), ", not a state_dict (a dict of tensors)");
  std::map<std::string, at::Tensor> state;
  for (const auto& item : loaded.toGenericDict()) {
    TORCH_CHECK_VALUE(item.key().isString() && item.value().isTensor(),
                      "attn2d::nn::load_state_dict: ", path,
                      " must map names to tensors; it holds a ", item.key().tagKind(), " -> ",
                      item.value().tagKind(), " entry");
    state.emplace(item.key().toStringRef(), item.value().toTensor());
  }
  std::set<std::string> unused;
  for (const auto& entry : state) unused.insert(entry.first);
  torch::NoGradGuard no_grad;
  const auto copy_into = [&](const std::string& name, at::Tensor& target) {
    const auto found = state.find(name);
    TORCH_CHECK_VALUE(found != state.end(), "attn2d::nn::load_state_dict: ", path,
                      " has no entry for ", name);
    TORCH_CHECK_VALUE(found->second.sizes() == target.sizes(), "attn2d::nn::load_state_dict: ",
                      name, " has shape ", found->second.sizes(), " in ", path,
                      " but the module's is ", target.sizes());
    target.copy_(found->second);
    unused.erase(name);
  };
  for (auto& item : module.named_parameters(true)) copy_into(item.key(), item.value());
  for (auto& item : module.named_buffers(true)) copy_into(item.key(), item.value());
  TORCH_CHECK_VALUE(unused.empty(), "attn2d::nn::load_state_dict: ", path,
                    " has entries the module does not: ", *unused.begin(),
                    unused.size() > 1 ? " and more" : "");
}

}  // namespace nn
}  // namespace attn2d
