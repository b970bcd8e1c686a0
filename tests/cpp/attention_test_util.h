// Strided test tensors and a runner that fills AttentionParams from them.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <numeric>
#include <random>
#include <vector>

#include "attn2d/attention.h"
#include "hwy/targets.h"
#include "hwy/tests/hwy_gtest.h"
#include "reference/attention_reference.h"

// Runs the hwy::TestWithParamTarget suite `suite` on every SIMD target this build compiled and
// this CPU runs: HWY_TARGET_INSTANTIATE_TEST_SUITE_P, spelt with ::testing, as the macro's own
// unqualified testing:: names attn2d::testing where these tests live.
#define ATTN2D_TARGET_INSTANTIATE_TEST_SUITE_P(suite)                            \
  INSTANTIATE_TEST_SUITE_P(Targets, suite,                                         \
                           ::testing::ValuesIn(hwy::SupportedAndGeneratedTargets()), \
                           hwy::TestParamTargetName)

namespace attn2d {
namespace testing {

// How a (B, H, L, D) tensor sits in memory.
enum class Layout {
  kContiguous,    // (B, H, L, D)
  kSequenceMajor, // (B, L, H, D): a (B, N, C) projection split into heads
  kChannelsFirst, // (B, H, D, L) viewed transposed: an NCHW conv output, last-dim stride L
};

// Storage on 64-byte boundaries, as torch's CPU allocator gives: rows of whole cache lines then
// start on one, which the kernels' non-temporal result stores need (cpu/common/result_stores.h).
template <typename T>
struct LineAligned {
  using value_type = T;
  static constexpr std::align_val_t kAlignment{64};
  LineAligned() = default;
  template <typename U>
  LineAligned(const LineAligned<U>&) {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), kAlignment));
  }
  void deallocate(T* p, std::size_t) { ::operator delete(p, kAlignment); }
  template <typename U>
  bool operator==(const LineAligned<U>&) const { return true; }
  template <typename U>
  bool operator!=(const LineAligned<U>&) const { return false; }
};

template <typename T>
struct Tensor4 {
  std::array<std::int64_t, 4> size{};
  std::array<std::int64_t, 4> stride{};
  std::vector<T, LineAligned<T>> data;

  std::int64_t numel() const { return size[0] * size[1] * size[2] * size[3]; }
  std::int64_t offset(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return b * stride[0] + h * stride[1] + i * stride[2] + j * stride[3];
  }
  T& at(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
    return data[offset(b, h, i, j)];
  }
  T at(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return data[offset(b, h, i, j)];
  }

  template <typename F>
  void for_each(F f) const {
    for (std::int64_t b = 0; b < size[0]; ++b)
      for (std::int64_t h = 0; h < size[1]; ++h)
        for (std::int64_t i = 0; i < size[2]; ++i)
          for (std::int64_t j = 0; j < size[3]; ++j) f(b, h, i, j);
  }

  template <typename U>
  Tensor4<U> cast() const {
    Tensor4<U> out;
    out.size = size;
    out.stride = stride;
    out.data.assign(data.begin(), data.end());
    return out;
  }
};

// Memory is surrounded by NaN sentinels in the unused slots (as xFormers' tests do), so a read
// outside the view shows up as NaN in the result.
template <typename T>
Tensor4<T> make_tensor(std::array<std::int64_t, 4> size, Layout layout) {
  Tensor4<T> t;
  t.size = size;
  const std::int64_t B = size[0], H = size[1], L = size[2], D = size[3];
  switch (layout) {
    case Layout::kContiguous:
      t.stride = {H * L * D, L * D, D, 1};
      break;
    case Layout::kSequenceMajor:
      t.stride = {L * H * D, D, H * D, 1};
      break;
    case Layout::kChannelsFirst:
      t.stride = {H * D * L, D * L, 1, L};
      break;
  }
  // One spare slot at the end so a one-past read is caught too.
  t.data.assign(static_cast<std::size_t>(B * H * L * D + 1),
                std::numeric_limits<T>::quiet_NaN());
  return t;
}

template <typename T>
void fill_random(Tensor4<T>& t, std::mt19937_64& rng, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  t.for_each([&](auto b, auto h, auto i, auto j) { t.at(b, h, i, j) = static_cast<T>(dist(rng)); });
}

// Mask stored as a full (B, H, Lq, Lk) array but viewed through broadcast strides.
template <typename T>
struct MaskSpec {
  MaskKind kind = MaskKind::kNone;
  std::array<bool, 4> broadcast{};  // dims viewed with stride 0
  std::vector<unsigned char> bools;
  std::vector<T> bias;
  std::array<std::int64_t, 4> stride{};
};

template <typename T>
struct Problem {
  std::int64_t B = 1, H = 1, Lq = 1, Lk = 1, E = 1, Ev = 1;
  double scale = 1.0;
  bool causal = false;
  Layout layout = Layout::kContiguous;
  Tensor4<T> q, k, v, dout;
  MaskSpec<T> mask;
};

// Builds a problem with random inputs. mask_kind with `broadcast` dims; fully_masked_rows makes
// every third query row see no key.
template <typename T>
Problem<T> make_problem(std::int64_t B, std::int64_t H, std::int64_t Lq, std::int64_t Lk,
                        std::int64_t E, std::int64_t Ev, Layout layout, std::uint64_t seed,
                        MaskKind mask_kind = MaskKind::kNone, std::array<bool, 4> broadcast = {},
                        bool causal = false, bool fully_masked_rows = false) {
  Problem<T> p;
  p.B = B, p.H = H, p.Lq = Lq, p.Lk = Lk, p.E = E, p.Ev = Ev;
  p.scale = E > 0 ? 1.0 / std::sqrt(static_cast<double>(E)) : 1.0;
  p.causal = causal;
  p.layout = layout;
  std::mt19937_64 rng(seed);
  p.q = make_tensor<T>({B, H, Lq, E}, layout);
  p.k = make_tensor<T>({B, H, Lk, E}, layout);
  p.v = make_tensor<T>({B, H, Lk, Ev}, layout);
  p.dout = make_tensor<T>({B, H, Lq, Ev}, layout);
  // Scores of a few units: softmax far from uniform, as trained models see.
  fill_random(p.q, rng, -2.0, 2.0);
  fill_random(p.k, rng, -2.0, 2.0);
  fill_random(p.v, rng);
  fill_random(p.dout, rng);
  p.mask.kind = mask_kind;
  p.mask.broadcast = broadcast;
  if (mask_kind != MaskKind::kNone) {
    const std::array<std::int64_t, 4> full{B, H, Lq, Lk};
    std::array<std::int64_t, 4> dims;
    for (int d = 0; d < 4; ++d) dims[d] = broadcast[d] ? 1 : full[d];
    const std::int64_t n = dims[0] * dims[1] * dims[2] * dims[3];
    std::array<std::int64_t, 4> contiguous{dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
    for (int d = 0; d < 4; ++d) p.mask.stride[d] = broadcast[d] ? 0 : contiguous[d];
    std::bernoulli_distribution allowed(0.7);
    std::uniform_real_distribution<double> bias(-3.0, 3.0);
    p.mask.bools.resize(static_cast<std::size_t>(n));
    p.mask.bias.resize(static_cast<std::size_t>(n));
    for (std::int64_t e = 0; e < n; ++e) {
      const bool ok = allowed(rng);
      p.mask.bools[e] = ok ? 1 : 0;
      p.mask.bias[e] = ok ? static_cast<T>(bias(rng)) : -std::numeric_limits<T>::infinity();
    }
    if (fully_masked_rows) {
      const std::int64_t rows = dims[0] * dims[1] * dims[2];
      for (std::int64_t r = 0; r < rows; r += 3) {
        for (std::int64_t j = 0; j < dims[3]; ++j) {
          p.mask.bools[r * dims[3] + j] = 0;
          p.mask.bias[r * dims[3] + j] = -std::numeric_limits<T>::infinity();
        }
      }
    }
  }
  return p;
}

template <typename T>
struct Result {
  Tensor4<T> out, dq, dk, dv;
  std::vector<T> lse;
  Status forward_status, backward_status;
};

template <typename T>
void set_view(const Tensor4<T>& t, const void** data, std::int64_t* stride) {
  *data = t.data.data();
  std::copy(t.stride.begin(), t.stride.end(), stride);
}

template <typename T>
AttentionParams forward_params(const Problem<T>& pr, Tensor4<T>& out, std::vector<T>& lse) {
  AttentionParams p;
  p.dtype = sizeof(T) == 8 ? DType::kFloat64 : DType::kFloat32;
  p.batch = pr.B, p.heads = pr.H, p.len_q = pr.Lq, p.len_k = pr.Lk;
  p.dim_qk = pr.E, p.dim_v = pr.Ev;
  set_view(pr.q, &p.q, p.q_stride);
  set_view(pr.k, &p.k, p.k_stride);
  set_view(pr.v, &p.v, p.v_stride);
  p.out = out.data.data();
  std::copy(out.stride.begin(), out.stride.end(), p.out_stride);
  p.lse = lse.data();
  p.lse_stride[0] = pr.H * pr.Lq, p.lse_stride[1] = pr.Lq, p.lse_stride[2] = 1;
  p.mask_kind = pr.mask.kind;
  if (pr.mask.kind == MaskKind::kBool) p.mask = pr.mask.bools.data();
  if (pr.mask.kind == MaskKind::kAdditive) p.mask = pr.mask.bias.data();
  std::copy(pr.mask.stride.begin(), pr.mask.stride.end(), p.mask_stride);
  p.is_causal = pr.causal;
  p.scale = pr.scale;
  return p;
}

// Runs forward and backward with `backend` (reference: with `precision`).
template <typename T>
Result<T> run(const Problem<T>& pr, Backend backend, const Host& host,
              reference::Precision precision = reference::Precision::kFloat64,
              const WindowOffsets* window = nullptr) {
  Result<T> r;
  r.out = make_tensor<T>({pr.B, pr.H, pr.Lq, pr.Ev}, Layout::kContiguous);
  r.dq = make_tensor<T>({pr.B, pr.H, pr.Lq, pr.E}, pr.layout);
  r.dk = make_tensor<T>({pr.B, pr.H, pr.Lk, pr.E}, Layout::kSequenceMajor);
  r.dv = make_tensor<T>({pr.B, pr.H, pr.Lk, pr.Ev}, Layout::kContiguous);
  r.lse.assign(static_cast<std::size_t>(std::max<std::int64_t>(pr.B * pr.H * pr.Lq, 1)), T(0));
  AttentionBackwardParams bp;
  bp.fwd = forward_params(pr, r.out, r.lse);
  bp.fwd.window = window;
  if (backend == Backend::kReference) {
    r.forward_status = validate(bp.fwd);
    if (r.forward_status.ok()) r.forward_status = reference::attention_forward(bp.fwd, precision);
  } else {
    r.forward_status = attention_forward(bp.fwd, host, backend);
  }
  set_view(pr.dout, &bp.dout, bp.dout_stride);
  bp.dq = r.dq.data.data();
  std::copy(r.dq.stride.begin(), r.dq.stride.end(), bp.dq_stride);
  bp.dk = r.dk.data.data();
  std::copy(r.dk.stride.begin(), r.dk.stride.end(), bp.dk_stride);
  bp.dv = r.dv.data.data();
  std::copy(r.dv.stride.begin(), r.dv.stride.end(), bp.dv_stride);
  if (backend == Backend::kReference) {
    r.backward_status = validate(bp);
    if (r.backward_status.ok()) r.backward_status = reference::attention_backward(bp, precision);
  } else {
    r.backward_status = attention_backward(bp, host, backend);
  }
  return r;
}

// thread_host(threads) whose workspace arrives filled with NaN (all-ones bytes are a NaN in
// every float type): a kernel that reads scratch it never wrote shows NaN in its results.
inline Host poisoned_host(int threads) {
  Host host = thread_host(threads);
  host.allocate = [](void*, std::size_t bytes) -> void* {
    void* p = ::operator new(bytes, std::align_val_t{64}, std::nothrow);
    if (p != nullptr) std::memset(p, 0xFF, bytes);
    return p;
  };
  host.deallocate = [](void*, void* p) { ::operator delete(p, std::align_val_t{64}); };
  return host;
}

// Largest |a - b| over the view; NaN anywhere in a or b gives +inf.
template <typename A, typename B>
double max_abs_diff(const Tensor4<A>& a, const Tensor4<B>& b) {
  double worst = 0.0;
  a.for_each([&](auto n, auto h, auto i, auto j) {
    const double x = static_cast<double>(a.at(n, h, i, j));
    const double y = static_cast<double>(b.at(n, h, i, j));
    const double d = std::isnan(x) || std::isnan(y) ? std::numeric_limits<double>::infinity()
                                                    : std::abs(x - y);
    worst = std::max(worst, d);
  });
  return worst;
}

}  // namespace testing
}  // namespace attn2d
