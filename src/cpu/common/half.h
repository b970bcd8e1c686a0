// 16-bit storage types for bfloat16 and float16 tensors and their conversions to and from the
// float32 the kernels compute in. Only packing (loads) and stores convert; every product and
// sum runs in float32.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace attn2d {
namespace cpu {

struct BFloat16 {
  std::uint16_t bits;
};
struct Float16 {
  std::uint16_t bits;
};

inline float widen(BFloat16 x) {
  const std::uint32_t bits = static_cast<std::uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as torch's float -> bfloat16 does (truncating, as hwy::BF16FromF32
// does, would double the output's rounding error and bias it toward zero). NaN stays NaN.
inline BFloat16 narrow_bf16(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<std::uint16_t>((bits >> 16) | 0x40u)};
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return BFloat16{static_cast<std::uint16_t>(bits >> 16)};
}

#if defined(__FLT16_MAX__)
inline float widen(Float16 x) {
  _Float16 h;
  std::memcpy(&h, &x.bits, 2);
  return static_cast<float>(h);
}
inline Float16 narrow_f16(float f) {
  const _Float16 h = static_cast<_Float16>(f);  // IEEE round to nearest even
  Float16 x;
  std::memcpy(&x.bits, &h, 2);
  return x;
}
#else
#error "attn2d needs a compiler with _Float16 (GCC >= 12 or Clang >= 15 on x86-64 / AArch64)"
#endif

// Load<T>(x): an element of a tensor as the compute type T; Store<IO>(t): back to storage.
template <typename T, typename IO>
inline T Load(IO x) {
  if constexpr (std::is_same<IO, BFloat16>::value || std::is_same<IO, Float16>::value) {
    return static_cast<T>(widen(x));
  } else {
    return static_cast<T>(x);
  }
}

template <typename IO, typename T>
inline IO Store(T x) {
  if constexpr (std::is_same<IO, BFloat16>::value) {
    return narrow_bf16(static_cast<float>(x));
  } else if constexpr (std::is_same<IO, Float16>::value) {
    return narrow_f16(static_cast<float>(x));
  } else {
    return static_cast<IO>(x);
  }
}

}  // namespace cpu
}  // namespace attn2d
