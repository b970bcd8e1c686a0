// The tiled kernels' GEMM micro-kernel (gemm-inl.h) over arrays, on the best SIMD target the CPU
// runs (hwy::SetSupportedTargetsForTest picks another), so that tests can check every block
// shape on every compiled target.
#pragma once

#include <cstddef>

namespace attn2d {
namespace cpu {

// C (M x N, row stride ldc) = [C +] A * B with A(m, k) = A[m * a_rs + k * a_ks] and B (K x N,
// row stride ldb); N a multiple of 16.
void gemm(bool accumulate, std::size_t M, std::size_t N, std::size_t K, const float* A,
          std::size_t a_rs, std::size_t a_ks, const float* B, std::size_t ldb, float* C,
          std::size_t ldc);
void gemm(bool accumulate, std::size_t M, std::size_t N, std::size_t K, const double* A,
          std::size_t a_rs, std::size_t a_ks, const double* B, std::size_t ldb, double* C,
          std::size_t ldc);

}  // namespace cpu
}  // namespace attn2d
