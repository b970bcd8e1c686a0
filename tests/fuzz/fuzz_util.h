// Shared by the libFuzzer targets: a reader that turns the fuzzer's bytes into sizes, strides and
// choices (front to back, zeros once the bytes run out, so that tests/fuzz/make_corpus.py can
// write seeds by hand), tensors allocated to cover exactly what their sizes and strides address,
// hosts that reorder tasks or fail allocations, and the check that every answer is a Status.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string>

#include "attn2d/attention.h"
#include "attn2d/bf16_products.h"
#include "attn2d/kernel_choice.h"

namespace attn2d {
namespace fuzz {

// Inputs any larger are only validated, not run: the fuzzer should spend its time on many small
// cases, and the reference backend is O(len_q * len_k * dim) per (batch, head).
constexpr std::int64_t kMaxElements = 1 << 15;
constexpr std::int64_t kMaxWork = 1 << 17;

[[noreturn]] inline void fail(const char* what, const std::string& detail = std::string()) {
  std::fprintf(stderr, "fuzz check failed: %s %s\n", what, detail.c_str());
  std::abort();
}

class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}

  std::uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  bool flag() { return (byte() & 1) != 0; }
  // In [0, n).
  std::int64_t below(std::int64_t n) { return byte() % n; }

  template <typename T>
  T raw() {
    std::uint8_t bytes[sizeof(T)] = {};
    for (std::uint8_t& b : bytes) b = byte();
    T value;
    std::memcpy(&value, bytes, sizeof(T));
    return value;
  }

  // Mostly 0..7; then 8..101 (past a 64-key tile and a 16-lane vector); then negative; then any
  // 64-bit value.
  std::int64_t size() {
    const std::uint8_t b = byte();
    if (b < 0xC0) return b % 8;
    if (b < 0xE0) return 8 + (b - 0xC0) * 3;
    if (b < 0xF0) return -1 - static_cast<std::int64_t>(byte());
    return raw<std::int64_t>();
  }

  // kContiguous (the caller's packed stride) half the time; else small, zero (broadcast) or
  // negative; rarely any 64-bit value.
  static constexpr std::int64_t kContiguous = std::numeric_limits<std::int64_t>::min();
  std::int64_t stride() {
    const std::uint8_t b = byte();
    if (b < 0x80) return kContiguous;
    if (b < 0xF8) return static_cast<std::int64_t>(b % 19) - 9;
    return raw<std::int64_t>();
  }

  double scale() {
    switch (byte() % 8) {
      case 0:
        return std::numeric_limits<double>::infinity();
      case 1:
        return std::numeric_limits<double>::quiet_NaN();
      case 2:
        return raw<double>();
      case 3:
        return 0.0;
      default:
        return 0.125 * (1 + byte() % 16);
    }
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

inline bool mul_ok(std::int64_t a, std::int64_t b, std::int64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
inline bool add_ok(std::int64_t a, std::int64_t b, std::int64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}

// Elements of a tensor of these sizes (0 when empty), or -1 past kMaxElements or on overflow.
inline std::int64_t numel(const std::int64_t* size, int dims) {
  std::int64_t n = 1;
  for (int d = 0; d < dims; ++d) {
    if (size[d] < 0) return -1;
    if (!mul_ok(n, size[d], &n)) return -1;
  }
  return n > kMaxElements ? -1 : n;
}

// What a buffer holds: one of the dtypes, or the bytes of a bool mask.
enum class Fill { kFloat32, kFloat64, kBFloat16, kFloat16, kBool };

inline Fill fill_of(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return Fill::kFloat64;
    case DType::kBFloat16:
      return Fill::kBFloat16;
    case DType::kFloat16:
      return Fill::kFloat16;
    default:
      return Fill::kFloat32;
  }
}

inline std::size_t fill_bytes(Fill fill) {
  switch (fill) {
    case Fill::kFloat64:
      return 8;
    case Fill::kBFloat16:
    case Fill::kFloat16:
      return 2;
    case Fill::kBool:
      return 1;
    default:
      return 4;
  }
}

// Memory for one strided view: `base` addresses element (0, ..., 0), and every element the
// sizes and strides address lies inside the allocation, whatever the strides' signs. Allocated
// on 64 bytes, as torch's CPU allocator gives.
struct AlignedDelete {
  void operator()(unsigned char* p) const { ::operator delete[](p, std::align_val_t{64}); }
};

struct Buffer {
  std::unique_ptr<unsigned char[], AlignedDelete> storage;
  void* base = nullptr;
  bool runnable = false;  // empty, or small enough to allocate and run

  // Replaces Input::kContiguous strides by the packed ones, then allocates unless `null` and
  // fills the elements from `seed`: values of a few units, and where `wild`, also NaN, infinities
  // and huge values (or -inf in an additive mask, "masked").
  void make(const std::int64_t* size, std::int64_t* stride, int dims, Fill fill,
            std::uint8_t seed, bool wild, bool null) {
    std::int64_t packed = 1;
    for (int d = dims - 1; d >= 0; --d) {
      if (stride[d] == Input::kContiguous) stride[d] = packed;
      if (!mul_ok(packed, std::max<std::int64_t>(size[d], 1), &packed)) packed = 1;
    }
    const std::int64_t n = numel(size, dims);
    if (n < 0) return;  // too large to run: validated only, with a pointer never read
    runnable = true;
    if (n == 0 || null) return;
    std::int64_t lo = 0, hi = 0;
    for (int d = 0; d < dims; ++d) {
      std::int64_t reach;
      if (!mul_ok(size[d] - 1, stride[d], &reach) ||
          !add_ok(reach < 0 ? lo : hi, reach, reach < 0 ? &lo : &hi)) {
        runnable = false;
        return;
      }
    }
    std::int64_t span;
    if (__builtin_sub_overflow(hi, lo, &span) || span >= kMaxElements) {
      runnable = false;
      return;
    }
    ++span;
    const std::size_t elem = fill_bytes(fill);
    storage.reset(new (std::align_val_t{64}) unsigned char[static_cast<std::size_t>(span) * elem]);
    std::uint32_t h = 0x9e3779b9u * (seed + 1u);
    for (std::int64_t i = 0; i < span; ++i) {
      h = h * 1664525u + 1013904223u;
      const float x = static_cast<float>((h >> 8) % 4001) * 0.001f - 2.0f;
      float value = x;
      if (wild && (h >> 29) == 0) {
        const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                                  std::numeric_limits<float>::infinity(),
                                  -std::numeric_limits<float>::infinity(), 3.0e38f, -0.0f,
                                  1.0e-40f, 65504.0f, -1.0e30f};
        value = specials[(h >> 4) % 8];
      }
      unsigned char* at = storage.get() + static_cast<std::size_t>(i) * elem;
      switch (fill) {
        case Fill::kFloat32:
          std::memcpy(at, &value, 4);
          break;
        case Fill::kFloat64: {
          const double d = value;
          std::memcpy(at, &d, 8);
          break;
        }
        case Fill::kBFloat16: {
          std::uint32_t bits;
          std::memcpy(&bits, &value, 4);
          const std::uint16_t top = static_cast<std::uint16_t>(bits >> 16);
          std::memcpy(at, &top, 2);
          break;
        }
        case Fill::kFloat16: {
          // Sign, a small exponent and the mantissa's top bits: |x| in [2^-3, 2^4), or the
          // half-precision NaN and infinity where wild.
          std::uint16_t half = static_cast<std::uint16_t>(((h >> 31) << 15) |
                                                          ((12 + (h >> 20) % 7) << 10) |
                                                          (h >> 6 & 0x3ff));
          if (wild && (h >> 29) == 0) half = (h >> 4) % 2 ? 0x7c00 : 0x7e00;
          std::memcpy(at, &half, 2);
          break;
        }
        case Fill::kBool:
          *at = static_cast<unsigned char>(wild ? (h >> 24) : (h >> 24) % 3 != 0);
          break;
      }
    }
    base = storage.get() + static_cast<std::size_t>(-lo) * elem;
  }

  // The pointer the params get: null when asked, else the memory, or for an empty or
  // too-large view a non-null address no run reads.
  void* pointer(bool null) const {
    alignas(64) static unsigned char never_read[64];
    if (null) return nullptr;
    return base != nullptr ? base : never_read;
  }
};

// A serial host that runs tasks in an order the input picks, spreads them over `threads`
// scratch slots, and can refuse allocation number `fail_at`: every path must then report
// kOutOfMemory and free what it took (LeakSanitizer checks).
struct FuzzHost {
  int threads = 1;
  int order = 0;  // 0: ascending, 1: descending, 2: odd tasks first
  std::int64_t fail_at = -1;
  std::int64_t allocations = 0;

  static void parallel_for(void* ctx, std::int64_t n, void* fn_ctx, TaskFn fn) {
    const FuzzHost& self = *static_cast<const FuzzHost*>(ctx);
    for (std::int64_t i = 0; i < n; ++i) {
      std::int64_t task = i;
      if (self.order == 1) task = n - 1 - i;
      if (self.order == 2) task = i < n / 2 ? 2 * i + 1 : 2 * (i - n / 2);
      fn(fn_ctx, task, static_cast<int>(task % self.threads));
    }
  }
  static void* allocate(void* ctx, std::size_t bytes) {
    auto* self = static_cast<FuzzHost*>(ctx);
    if (self->allocations++ == self->fail_at) return nullptr;
    return ::operator new(std::max<std::size_t>(bytes, 1), std::align_val_t{64}, std::nothrow);
  }
  static void deallocate(void*, void* ptr) { ::operator delete(ptr, std::align_val_t{64}); }

  Host make(Input& in) {
    threads = 1 + static_cast<int>(in.below(4));
    order = static_cast<int>(in.below(3));
    fail_at = in.below(4) == 0 ? in.below(8) : -1;
    allocations = 0;
    Host h;
    h.num_threads = threads;
    h.ctx = this;
    h.parallel_for = &FuzzHost::parallel_for;
    h.allocate = &FuzzHost::allocate;
    h.deallocate = &FuzzHost::deallocate;
    switch (in.below(4)) {
      case 0:
        h.stream_result_bytes = 0;  // every aligned row through non-temporal stores
        break;
      case 1:
        h.stream_result_bytes = std::numeric_limits<std::int64_t>::max();
        break;
      default:
        h.stream_result_bytes = -1;
    }
    return h;
  }
};

// Every answer must be a known code, and a refusal must say why.
inline void check_status(const Status& s, const char* where) {
  switch (s.code()) {
    case StatusCode::kOk:
      return;
    case StatusCode::kInvalidArgument:
    case StatusCode::kUnsupported:
    case StatusCode::kOutOfMemory:
      if (s.message().empty()) fail(where, "a refusal without a message");
      return;
  }
  fail(where, "an unknown status code");
}

// A forward (and backward) accepted by validate must either run or report kUnsupported (a
// backend that does not take the request) or kOutOfMemory (the host refused memory).
inline void check_run(const Status& s, const char* where) {
  check_status(s, where);
  if (s.code() == StatusCode::kInvalidArgument) {
    fail(where, "validated params refused: " + s.message());
  }
}

inline Backend pick_backend(Input& in) {
  switch (in.below(4)) {
    case 0:
      return Backend::kReference;
    case 1:
      return Backend::kCpu;
    default:
      return Backend::kAuto;
  }
}

inline void pick_bf16_products(Input& in) {
  // kAuto measures VDPBF16PS once per process; the two forced choices cover both kernels.
  set_bf16_products(in.flag() ? Bf16Products::kPairs : Bf16Products::kFloat);
}

// The chooser's answers with their reasons: every name must resolve, and the window kernels
// only ever serve params that carry a window.
inline void check_choice(const AttentionParams& p, const Host& host) {
  for (const KernelChoice& c : {choose_forward(p, host, true), choose_backward(p, host, true)}) {
    if (std::strcmp(kernel_name(c.kernel), "unknown") == 0 ||
        std::strcmp(products_name(c.products), "unknown") == 0 ||
        std::strcmp(schedule_name(c.schedule), "unknown") == 0 || c.reason.empty()) {
      fail("kernel choice", c.reason);
    }
    if (c.kernel == Kernel::kWindow && p.window == nullptr) fail("window kernel without a window");
    if ((c.kernel == Kernel::kSparseTiles || c.kernel == Kernel::kQueryLanes) &&
        p.layout == nullptr) {
      fail("layout kernel without a layout");
    }
  }
}

// Contiguous tensors for params whose sizes, dtype and pattern (layout or window) are set: fills
// the pointers and strides, then runs the forward and, where asked, the backward on the fuzz
// host, as validated params must: run, or say why not.
struct DenseRun {
  Buffer q, k, v, out, lse, dout, dq, dk, dv;
  AttentionBackwardParams bp;

  void run(Input& in, AttentionParams p, bool backward, bool wild) {
    const Fill io = fill_of(p.dtype), acc = fill_of(accumulation_dtype(p.dtype));
    const std::int64_t q_size[4] = {p.batch, p.heads, p.len_q, p.dim_qk};
    const std::int64_t k_size[4] = {p.batch, p.heads, p.len_k, p.dim_qk};
    const std::int64_t v_size[4] = {p.batch, p.heads, p.len_k, p.dim_v};
    const std::int64_t o_size[4] = {p.batch, p.heads, p.len_q, p.dim_v};
    const std::int64_t lse_size[3] = {p.batch, p.heads, p.len_q};
    struct View {
      Buffer* buffer;
      const std::int64_t* size;
      std::int64_t* stride;
      int dims;
      Fill fill;
    } views[] = {{&q, q_size, p.q_stride, 4, io},       {&k, k_size, p.k_stride, 4, io},
                 {&v, v_size, p.v_stride, 4, io},       {&out, o_size, p.out_stride, 4, io},
                 {&lse, lse_size, p.lse_stride, 3, acc}, {&dout, o_size, bp.dout_stride, 4, io},
                 {&dq, q_size, bp.dq_stride, 4, io},    {&dk, k_size, bp.dk_stride, 4, io},
                 {&dv, v_size, bp.dv_stride, 4, io}};
    for (View& view : views) {
      for (int d = 0; d < view.dims; ++d) view.stride[d] = Input::kContiguous;
      view.buffer->make(view.size, view.stride, view.dims, view.fill, in.byte(), wild, false);
      if (!view.buffer->runnable) return;
    }
    p.q = q.pointer(false), p.k = k.pointer(false), p.v = v.pointer(false);
    p.out = out.pointer(false), p.lse = lse.pointer(false);
    FuzzHost fuzz_host;
    const Host host = fuzz_host.make(in);
    const Backend backend = pick_backend(in);
    pick_bf16_products(in);
    const Status valid = validate(p);
    if (!valid.ok()) fail("tensors made for validated params were refused", valid.message());
    check_choice(p, host);
    const Status forward = attention_forward(p, host, backend);
    check_run(forward, "attention_forward");
    if (!backward || !forward.ok()) return;
    bp.fwd = p;
    bp.dout = dout.pointer(false), bp.dq = dq.pointer(false);
    bp.dk = dk.pointer(false), bp.dv = dv.pointer(false);
    check_run(attention_backward(bp, host, backend), "attention_backward");
  }
};

// Work of one run: every (query, key) pair of every head over both widths, or kMaxWork + 1 on
// overflow or a negative size.
inline std::int64_t dense_work(const AttentionParams& p) {
  std::int64_t work = 1, widths;
  if (!add_ok(p.dim_qk, p.dim_v, &widths)) return kMaxWork + 1;
  for (std::int64_t f : {p.batch, p.heads, p.len_q, p.len_k, widths}) {
    if (f < 0 || !mul_ok(work, std::max<std::int64_t>(f, 1), &work)) return kMaxWork + 1;
  }
  return work;
}

}  // namespace fuzz
}  // namespace attn2d
