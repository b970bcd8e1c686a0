// The tiled kernels' GEMM micro-kernel on every compiled SIMD target, over the block shapes it
// chooses between (4-vector panels in 6-, 3- and 1-row blocks and K chunks on AVX-512; 2- and
// 1-vector panels in 12-, 6-, 4- and 1-row blocks), row-major and transposed A, with and without
// accumulation: against an in-order scalar fused multiply-add loop, bit for bit where the
// target has fused multiply-adds and within float rounding where it has not.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/common/gemm.h"
#include "hwy/targets.h"
#include "hwy/tests/hwy_gtest.h"

namespace attn2d {
namespace {

bool HasFma(std::int64_t target) {
#if HWY_ARCH_X86
  return target <= HWY_AVX2;
#else
  (void)target;
  return false;
#endif
}

struct Shape {
  size_t M, N, K;
  bool transposed_a;  // A(m, k) = A[m + k * lda] instead of A[m * lda + k]
  bool accumulate;
};

template <typename T>
void CheckShape(std::int64_t target, const Shape& s, std::mt19937* rng) {
  std::uniform_real_distribution<T> u(T(-1), T(1));
  // Padded strides, so that a read or write past a row's end lands in the padding and shows.
  const size_t lda = (s.transposed_a ? s.M : s.K) + 3, ldb = s.N + 5, ldc = s.N + 7;
  const size_t a_rs = s.transposed_a ? 1 : lda, a_ks = s.transposed_a ? lda : 1;
  std::vector<T> A((s.transposed_a ? s.K : s.M) * lda + 1), B(s.K * ldb + 1), C(s.M * ldc);
  for (T& x : A) x = u(*rng);
  for (T& x : B) x = u(*rng);
  const T kSentinel = T(1234.5);
  for (size_t m = 0; m < s.M; ++m) {
    for (size_t n = 0; n < ldc; ++n) C[m * ldc + n] = n < s.N ? u(*rng) : kSentinel;
  }
  // A C that is not accumulated into must be overwritten: NaN shows any element left.
  if (!s.accumulate) {
    for (size_t m = 0; m < s.M; ++m) {
      for (size_t n = 0; n < s.N; ++n) C[m * ldc + n] = std::numeric_limits<T>::quiet_NaN();
    }
  }
  const std::vector<T> C0 = C;
  cpu::gemm(s.accumulate, s.M, s.N, s.K, A.data(), a_rs, a_ks, B.data(), ldb, C.data(), ldc);
  // The same product with K split in two, the second part accumulated: each element's sum runs
  // over k in order either way, so the bits agree.
  std::vector<T> split = C0;
  const size_t k1 = s.K / 3;
  cpu::gemm(s.accumulate, s.M, s.N, k1, A.data(), a_rs, a_ks, B.data(), ldb, split.data(), ldc);
  cpu::gemm(true, s.M, s.N, s.K - k1, A.data() + k1 * a_ks, a_rs, a_ks, B.data() + k1 * ldb, ldb,
            split.data(), ldc);
  const bool fma = HasFma(target);
  const T eps = std::numeric_limits<T>::epsilon();
  const std::string where = std::string(hwy::TargetName(target)) +
                            " M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) +
                            " K=" + std::to_string(s.K) + (s.transposed_a ? " A^T" : "") +
                            (s.accumulate ? " +=" : "");
  for (size_t m = 0; m < s.M; ++m) {
    for (size_t n = 0; n < ldc; ++n) {
      const T got = C[m * ldc + n];
      ASSERT_EQ(std::memcmp(&got, &split[m * ldc + n], sizeof(T)), 0) << where << " at " << m
                                                                      << "," << n;
      if (n >= s.N) {
        ASSERT_EQ(got, kSentinel) << where << ": wrote past column N at " << m << "," << n;
        continue;
      }
      T want = s.accumulate ? C0[m * ldc + n] : T(0);
      double magnitude = std::abs(static_cast<double>(want));
      for (size_t k = 0; k < s.K; ++k) {
        const T a = A[m * a_rs + k * a_ks], b = B[k * ldb + n];
        want = std::fma(a, b, want);
        magnitude += std::abs(static_cast<double>(a) * b);
      }
      if (fma) {
        ASSERT_EQ(std::memcmp(&got, &want, sizeof(T)), 0)
            << where << " at " << m << "," << n << ": " << got << " vs " << want;
      } else {
        // Separate multiplies and adds: at most 2K roundings of partial sums bounded by
        // `magnitude`.
        ASSERT_LE(std::abs(static_cast<double>(got) - want), 2.0 * (s.K + 1) * eps * magnitude)
            << where << " at " << m << "," << n;
      }
    }
  }
}

template <typename T>
void CheckEveryShape(std::int64_t target) {
  std::mt19937 rng(7);
  for (size_t M : {1, 3, 5, 6, 7, 12, 13, 31}) {
    for (size_t N : {16, 32, 48, 64, 80, 144}) {
      for (size_t K : {0, 1, 8, 33, 64, 65, 130}) {
        for (bool transposed_a : {false, true}) {
          for (bool accumulate : {false, true}) {
            CheckShape<T>(target, Shape{M, N, K, transposed_a, accumulate}, &rng);
          }
        }
      }
    }
  }
}

// Each test on every SIMD target this build compiled and this CPU runs.
class GemmOnTarget : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(GemmOnTarget);

TEST_P(GemmOnTarget, FloatMatchesInOrderProducts) { CheckEveryShape<float>(GetParam()); }
TEST_P(GemmOnTarget, DoubleMatchesInOrderProducts) { CheckEveryShape<double>(GetParam()); }

}  // namespace
}  // namespace attn2d
