// Element types the core understands. Accumulation (and the lse and additive-mask element type)
// is double for float64 and float for float32, bfloat16 and float16: the 16-bit types are
// widened when tiles are packed and rounded once when results are stored.
#pragma once

#include <cstddef>

namespace attn2d {

enum class DType : int {
  kFloat32 = 0,
  kFloat64 = 1,
  kBFloat16 = 2,
  kFloat16 = 3,
};

inline const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat16:
      return "float16";
  }
  return "unknown";
}

inline std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return 8;
    case DType::kBFloat16:
    case DType::kFloat16:
      return 2;
    case DType::kFloat32:
      break;
  }
  return 4;
}

// The type of lse, of an additive mask's elements, and of every sum.
inline DType accumulation_dtype(DType dtype) {
  return dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
}

}  // namespace attn2d
