// A SAGAN-style self-attention block trained from C++ on LibTorch, at 128x128: 16,384 queries
// over 4,096 pooled keys, where the dense score matrix alone would take 256 MiB per image and
// head. A small denoiser (conv -> attn2d::nn::SelfAttention2d -> conv) learns to clean noisy
// smooth images for a few Adam steps; it prints the loss of each step and the peak memory.
//
//   sagan_block_libtorch [steps] [global|ylg]
//
// "ylg" gives the block 8 heads and YLG's sparse pattern (the YLG-SAGAN block).
#include <sys/resource.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "attn2d/torch/nn.h"

namespace {

constexpr std::int64_t kSize = 128, kChannels = 32, kBatch = 2;

struct DenoiserImpl : torch::nn::Module {
  explicit DenoiserImpl(const attn2d::nn::SelfAttention2dOptions& attention_options)
      : in(register_module("in", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, kChannels, 3)
                                                       .padding(1)))),
        attention(register_module("attention", attn2d::nn::SelfAttention2d(attention_options))),
        out(register_module("out", torch::nn::Conv2d(torch::nn::Conv2dOptions(kChannels, 3, 3)
                                                         .padding(1)))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    return out->forward(attention->forward(torch::relu(in->forward(x))));
  }

  torch::nn::Conv2d in;
  attn2d::nn::SelfAttention2d attention;
  torch::nn::Conv2d out;
};
TORCH_MODULE(Denoiser);

// Smooth images: random 8x8 colour fields upsampled to kSize.
torch::Tensor smooth_images(std::int64_t n) {
  const torch::Tensor coarse = torch::rand({n, 3, 8, 8});
  return torch::nn::functional::interpolate(
      coarse, torch::nn::functional::InterpolateFuncOptions()
                  .size(std::vector<std::int64_t>{kSize, kSize})
                  .mode(torch::kBilinear)
                  .align_corners(false));
}

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024.0;  // Linux reports KiB
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 5;
  const std::string kind = argc > 2 ? argv[2] : "global";
  if (steps < 1 || (kind != "global" && kind != "ylg")) {
    std::fprintf(stderr, "usage: sagan_block_libtorch [steps >= 1] [global|ylg]\n");
    return 2;
  }
  torch::manual_seed(0);
  attn2d::nn::SelfAttention2dOptions options(kChannels);
  if (kind == "ylg") options.heads(8).qk_ratio(4).pattern(attn2d::YLG::with_heads(8));
  Denoiser model(options);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(2e-3));
  std::printf("SAGAN-style block (%s attention) at %lldx%lld: %lld queries over %lld pooled keys\n",
              kind.c_str(), static_cast<long long>(kSize), static_cast<long long>(kSize),
              static_cast<long long>(kSize * kSize),
              static_cast<long long>(kSize * kSize / 4));
  double first = 0, last = 0;
  for (int step = 1; step <= steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    const torch::Tensor clean = smooth_images(kBatch);
    const torch::Tensor noisy = clean + 0.2 * torch::randn_like(clean);
    optimizer.zero_grad();
    const torch::Tensor loss = torch::mse_loss(model->forward(noisy), clean);
    loss.backward();
    optimizer.step();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    last = loss.item<double>();
    if (step == 1) first = last;
    std::printf("step %d: loss %.5f (%.2f s), attention gamma %+.5f\n", step, last, seconds,
                model->attention->gamma.item<double>());
  }
  const double dense_mib = 4.0 * kSize * kSize * (kSize * kSize / 4) / (1 << 20);
  std::printf("peak memory (RSS): %.0f MiB; the dense fp32 scores of one image and head: %.0f "
              "MiB\n", peak_rss_mib(), dense_mib);
  if (!(last < first)) {
    std::fprintf(stderr, "the loss did not fall (%.5f -> %.5f)\n", first, last);
    return 1;
  }
  return 0;
}
