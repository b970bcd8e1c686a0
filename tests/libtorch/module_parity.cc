// Runs one attn2d::nn module on a case that tests/python/test_libtorch.py wrote, and writes
// what it computed, for that test to compare with the Python module:
//   module_parity CASE STATE RESULT [--double-backward]
// CASE (torch.save of a dict): "module" ("SelfAttention2d" or "MultiheadSelfAttention2d"),
// the module's options by their Python names, "pattern" ("", "window" or "ylg") with
// "window_size" and "window_metric", "x" and "grad_y". STATE: the Python module's state_dict,
// as torch.save wrote it. RESULT (torch::pickle_save): "y", "grad_x" and "grad.<parameter>".
// --double-backward instead differentiates the input gradient's norm (a gradient penalty),
// which attn2d::torch refuses: the program prints the error and exits with 3.
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "attn2d/torch/nn.h"

namespace {

c10::Dict<c10::IValue, c10::IValue> read_dict(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(file)),
                                std::istreambuf_iterator<char>());
  return torch::pickle_load(bytes).toGenericDict();
}

std::optional<attn2d::Pattern> pattern_of(const c10::Dict<c10::IValue, c10::IValue>& c,
                                          std::int64_t heads) {
  const std::string kind = c.at("pattern").toStringRef();
  if (kind.empty()) return std::nullopt;
  if (kind == "ylg") return attn2d::Pattern(attn2d::YLG::with_heads(heads));
  attn2d::Window window;
  window.size = c.at("window_size").toInt();
  const std::string metric = c.at("window_metric").toStringRef();
  if (!attn2d::parse_window_metric(metric, &window.metric).ok()) {
    throw std::invalid_argument("unknown window metric " + metric);
  }
  return attn2d::Pattern(window);
}

}  // namespace

int main(int argc, char** argv) {
  const bool double_backward = argc == 5 && std::string(argv[4]) == "--double-backward";
  if (argc != 4 && !double_backward) {
    std::fprintf(stderr, "usage: module_parity CASE STATE RESULT [--double-backward]\n");
    return 2;
  }
  const auto c = read_dict(argv[1]);
  const std::string kind = c.at("module").toStringRef();
  torch::nn::AnyModule module;
  std::shared_ptr<torch::nn::Module> held;
  if (kind == "SelfAttention2d") {
    attn2d::nn::SelfAttention2dOptions o(c.at("channels").toInt());
    o.qk_ratio(c.at("qk_ratio").toInt()).heads(c.at("heads").toInt());
    o.pool_kv(c.at("pool_kv").toInt()).groups(c.at("groups").toInt());
    o.out_conv(c.at("out_conv").toBool()).gamma(c.at("gamma").toBool());
    o.residual(c.at("residual").toBool());
    if (!c.at("v_channels").isNone()) o.v_channels(c.at("v_channels").toInt());
    o.scale(c.at("scale").isNone() ? std::nullopt
                                   : std::optional<double>(c.at("scale").toDouble()));
    o.pattern(pattern_of(c, o.heads()));
    attn2d::nn::SelfAttention2d m(o);
    module = torch::nn::AnyModule(m);
    held = m.ptr();
  } else {
    attn2d::nn::MultiheadSelfAttention2dOptions o(c.at("channels").toInt());
    o.num_heads(c.at("heads").toInt());
    o.pattern(pattern_of(c, o.num_heads()));
    attn2d::nn::MultiheadSelfAttention2d m(o);
    module = torch::nn::AnyModule(m);
    held = m.ptr();
  }
  held->to(torch::kFloat64);
  attn2d::nn::load_state_dict(*held, argv[2]);
  const at::Tensor x = c.at("x").toTensor().clone().requires_grad_(true);
  const at::Tensor y = module.forward(x);
  if (double_backward) {
    try {
      const at::Tensor g = torch::autograd::grad({(y * c.at("grad_y").toTensor()).sum()}, {x},
                                                 {}, std::nullopt, /*create_graph=*/true)[0];
      g.pow(2).sum().backward();
    } catch (const c10::Error& e) {
      std::fprintf(stderr, "%s\n", e.what_without_backtrace());
      return 3;
    }
    return 0;
  }
  y.backward(c.at("grad_y").toTensor());

  c10::Dict<std::string, at::Tensor> result;
  result.insert("y", y.detach());
  result.insert("grad_x", x.grad());
  for (const auto& p : held->named_parameters(true)) {
    result.insert("grad." + p.key(), p.value().grad());
  }
  const std::vector<char> bytes = torch::pickle_save(result);
  std::ofstream(argv[3], std::ios::binary).write(bytes.data(), bytes.size());
  return 0;
}
