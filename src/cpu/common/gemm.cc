// Dispatch of gemm (gemm.h): the Gemm micro-kernel, per SIMD target, over arrays.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/common/gemm.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <cstddef>

#include "cpu/common/gemm-inl.h"
#include "cpu/common/gemm.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {

template <typename T>
void GemmArrays(bool accumulate, size_t M, size_t N, size_t K, const T* A, size_t a_rs,
                size_t a_ks, const T* B, size_t ldb, T* C, size_t ldc) {
  if (accumulate) {
    Gemm<true>(M, N, K, A, a_rs, a_ks, B, ldb, C, ldc);
  } else {
    Gemm<false>(M, N, K, A, a_rs, a_ks, B, ldb, C, ldc);
  }
}
void GemmFloat(bool accumulate, size_t M, size_t N, size_t K, const float* A, size_t a_rs,
               size_t a_ks, const float* B, size_t ldb, float* C, size_t ldc) {
  GemmArrays(accumulate, M, N, K, A, a_rs, a_ks, B, ldb, C, ldc);
}
void GemmDouble(bool accumulate, size_t M, size_t N, size_t K, const double* A, size_t a_rs,
                size_t a_ks, const double* B, size_t ldb, double* C, size_t ldc) {
  GemmArrays(accumulate, M, N, K, A, a_rs, a_ks, B, ldb, C, ldc);
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn2d {
namespace cpu {

HWY_EXPORT(GemmFloat);
HWY_EXPORT(GemmDouble);

void gemm(bool accumulate, std::size_t M, std::size_t N, std::size_t K, const float* A,
          std::size_t a_rs, std::size_t a_ks, const float* B, std::size_t ldb, float* C,
          std::size_t ldc) {
  HWY_DYNAMIC_DISPATCH(GemmFloat)(accumulate, M, N, K, A, a_rs, a_ks, B, ldb, C, ldc);
}
void gemm(bool accumulate, std::size_t M, std::size_t N, std::size_t K, const double* A,
          std::size_t a_rs, std::size_t a_ks, const double* B, std::size_t ldb, double* C,
          std::size_t ldc) {
  HWY_DYNAMIC_DISPATCH(GemmDouble)(accumulate, M, N, K, A, a_rs, a_ks, B, ldb, C, ldc);
}

}  // namespace cpu
}  // namespace attn2d
#endif  // HWY_ONCE
