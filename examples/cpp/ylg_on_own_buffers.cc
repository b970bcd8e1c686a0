// A 256x256 feature map attending to itself under YLG's sparse pattern (8 heads), on buffers
// the program owns, through attn2d::core alone: no torch, no Python.
//
// It first checks the sparse path on a 32x32 map against the same pattern given as a dense
// boolean mask (the naive float64 reference with that mask), then times the 256x256 forward
// and backward, where a dense mask would take 32 GiB.
//
//   ylg_on_own_buffers [threads]
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "attn2d/attention.h"
#include "attn2d/patterns.h"

namespace {

constexpr std::int64_t kHeads = 8;
constexpr std::int64_t kDim = 16;  // E = Ev

// (1, heads, len, kDim) float32, contiguous: the strides in elements.
void set_contiguous(std::int64_t len, std::int64_t* stride) {
  stride[3] = 1;
  stride[2] = kDim;
  stride[1] = len * kDim;
  stride[0] = kHeads * len * kDim;
}

struct Buffers {
  std::vector<float> q, k, v, out, lse;
  explicit Buffers(std::int64_t len, std::uint32_t seed)
      : q(kHeads * len * kDim), k(q.size()), v(q.size()), out(q.size()), lse(kHeads * len) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    for (auto* t : {&q, &k, &v}) {
      for (float& x : *t) x = normal(rng);
    }
  }
};

attn2d::AttentionParams params_for(Buffers& b, std::int64_t len) {
  attn2d::AttentionParams p;
  p.dtype = attn2d::DType::kFloat32;
  p.batch = 1, p.heads = kHeads, p.len_q = len, p.len_k = len, p.dim_qk = kDim, p.dim_v = kDim;
  p.q = b.q.data(), p.k = b.k.data(), p.v = b.v.data(), p.out = b.out.data();
  for (auto* stride : {p.q_stride, p.k_stride, p.v_stride, p.out_stride}) {
    set_contiguous(len, stride);
  }
  p.lse = b.lse.data();
  p.lse_stride[2] = 1, p.lse_stride[1] = len, p.lse_stride[0] = kHeads * len;
  p.scale = 1.0 / std::sqrt(static_cast<double>(kDim));
  return p;
}

bool fail(const attn2d::Status& s, const char* what) {
  if (s.ok()) return false;
  std::fprintf(stderr, "%s: %s\n", what, s.message().c_str());
  return true;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  if (threads < 1) {
    std::fprintf(stderr, "threads must be >= 1; got %s\n", argv[1]);
    return 2;
  }
  const attn2d::Host host = attn2d::thread_host(threads);
  const attn2d::YLG ylg = attn2d::YLG::with_heads(kHeads);

  // 1. The compiled layout against the pattern's dense mask, on a 32x32 map.
  {
    const attn2d::GridShape grid{32, 32};
    const std::int64_t len = grid.height * grid.width;
    attn2d::CompiledLayout layout;
    std::vector<std::uint8_t> mask;
    if (fail(ylg.compile(grid, grid, kHeads, &layout), "compile") ||
        fail(ylg.dense_mask(grid, grid, kHeads, &mask), "dense_mask")) {
      return 1;
    }
    Buffers sparse(len, 1), dense(len, 1);
    const attn2d::SparseLayout view = layout.view();
    attn2d::AttentionParams p = params_for(sparse, len);
    p.layout = &view;
    attn2d::AttentionParams d = params_for(dense, len);
    d.mask_kind = attn2d::MaskKind::kBool;
    d.mask = mask.data();
    d.mask_stride[3] = 1, d.mask_stride[2] = len, d.mask_stride[1] = len * len;
    if (fail(attn2d::attention_forward(p, host), "sparse forward") ||
        fail(attn2d::attention_forward(d, host, attn2d::Backend::kReference), "reference")) {
      return 1;
    }
    double worst = 0;
    for (size_t i = 0; i < sparse.out.size(); ++i) {
      worst = std::fmax(worst, std::fabs(sparse.out[i] - dense.out[i]));
    }
    std::printf("32x32, YLG(8): sparse layout vs dense-mask reference, max |diff| %.2e\n", worst);
    if (!(worst < 1e-5)) return 1;
  }

  // 2. 256x256: 65,536 queries, each seeing about 2 x 256 keys.
  const attn2d::GridShape grid{256, 256};
  const std::int64_t len = grid.height * grid.width;
  auto t0 = std::chrono::steady_clock::now();
  attn2d::CompiledLayout layout;
  if (fail(ylg.compile(grid, grid, kHeads, &layout), "compile")) return 1;
  const double compile_s = seconds_since(t0);
  const attn2d::SparseLayout view = layout.view();
  Buffers b(len, 2);
  attn2d::AttentionParams p = params_for(b, len);
  p.layout = &view;
  t0 = std::chrono::steady_clock::now();
  if (fail(attn2d::attention_forward(p, host), "forward")) return 1;
  const double forward_s = seconds_since(t0);

  std::vector<float> dout(b.out.size(), 1.0f / static_cast<float>(len)), dq(b.q.size()),
      dk(b.k.size()), dv(b.v.size());
  attn2d::AttentionBackwardParams bp;
  bp.fwd = p;
  bp.dout = dout.data(), bp.dq = dq.data(), bp.dk = dk.data(), bp.dv = dv.data();
  for (auto* stride : {bp.dout_stride, bp.dq_stride, bp.dk_stride, bp.dv_stride}) {
    set_contiguous(len, stride);
  }
  t0 = std::chrono::steady_clock::now();
  if (fail(attn2d::attention_backward(bp, host), "backward")) return 1;
  const double backward_s = seconds_since(t0);

  double sum = 0;
  for (float x : dv) sum += x;
  std::printf(
      "256x256, YLG(8), E=%lld, %d threads (%s): compile %.1f ms, forward %.1f ms, backward "
      "%.1f ms; sum(dV) = %.6f (sum(dO) = %d)\n",
      static_cast<long long>(kDim), threads, attn2d::cpu_simd_target(), compile_s * 1e3,
      forward_s * 1e3, backward_s * 1e3, sum, static_cast<int>(kHeads * kDim));
  // Each row's probabilities sum to 1, so dV sums to dO's sum: a check that every row ran.
  return std::fabs(sum - static_cast<double>(kHeads * kDim)) < 1e-3 * kHeads * kDim ? 0 : 1;
}
