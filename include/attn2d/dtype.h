// Element types the core understands. Accumulation is float for float32 inputs and double for
// float64 inputs.
#pragma once

#include <cstddef>

namespace attn2d {

enum class DType : int {
  kFloat32 = 0,
  kFloat64 = 1,
};

inline const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
  }
  return "unknown";
}

inline std::size_t dtype_size(DType dtype) {
  return dtype == DType::kFloat64 ? 8 : 4;
}

}  // namespace attn2d
