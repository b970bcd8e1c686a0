// The AVX512-BF16 pair kernels against scalar float arithmetic on the same bf16 values; skipped
// on CPUs without AVX512-BF16 (the forward then never calls them).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "attn2d/bf16_products.h"
#include "cpu/common/bf16_pairs_avx512.h"
#include "cpu/common/half.h"

namespace attn2d {
namespace cpu {
namespace {

std::uint16_t RandomBf16(std::mt19937& gen) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  return narrow_bf16(dist(gen)).bits;
}

float Lo(std::uint32_t w) { return widen(BFloat16{static_cast<std::uint16_t>(w & 0xFFFF)}); }
float Hi(std::uint32_t w) { return widen(BFloat16{static_cast<std::uint16_t>(w >> 16)}); }

// sum over p < P of the pair products a(p) . b(p), in double (exact for bf16 inputs); the sum of
// their magnitudes into *magnitude. a(p) = a[p * a_step], b(p) = b[p * b_step].
double PairDot(const std::uint32_t* a, std::size_t a_step, const std::uint32_t* b,
               std::size_t b_step, std::size_t P, double* magnitude) {
  double sum = 0.0;
  *magnitude = 0.0;
  for (std::size_t p = 0; p < P; ++p) {
    const std::uint32_t x = a[p * a_step], y = b[p * b_step];
    sum += double(Lo(x)) * Lo(y) + double(Hi(x)) * Hi(y);
    *magnitude += std::abs(double(Lo(x)) * Lo(y)) + std::abs(double(Hi(x)) * Hi(y));
  }
  return sum;
}

TEST(Bf16Pairs, ProductChoiceFollowsTheSettingAndTheMeasurement) {
  EXPECT_EQ(bf16_products(), Bf16Products::kAuto);  // the default
  EXPECT_EQ(use_bf16_pairs(), bf16_pairs_outpace_fma());
  if (!cpu_has_avx512_bf16()) EXPECT_FALSE(bf16_pairs_outpace_fma());
  set_bf16_products(Bf16Products::kPairs);
  EXPECT_EQ(use_bf16_pairs(), cpu_has_avx512_bf16());
  set_bf16_products(Bf16Products::kFloat);
  EXPECT_FALSE(use_bf16_pairs());
  set_bf16_products(Bf16Products::kAuto);
  EXPECT_EQ(use_bf16_pairs(), bf16_pairs_outpace_fma());
}

TEST(Bf16Pairs, GemmMatchesScalarProducts) {
  if (!cpu_has_avx512_bf16()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  std::mt19937 gen(7);
  // Row counts that exercise the 12-, 4- and 1-row blocks; 48 columns: a 2-vector and a 1-vector
  // panel; P = 37 pairs (an odd reduction).
  for (std::size_t M : {1, 5, 12, 29}) {
    const std::size_t N = 48, P = 37, a_rs = P + 3, ldb = N + 16, ldc = N + 16;
    std::vector<std::uint32_t> A(M * a_rs), B(P * ldb);
    for (auto& w : A) w = RandomBf16(gen) | std::uint32_t{RandomBf16(gen)} << 16;
    for (auto& w : B) w = RandomBf16(gen) | std::uint32_t{RandomBf16(gen)} << 16;
    for (bool accumulate : {false, true}) {
      for (float alpha : {1.0f, -0.37f}) {
        std::vector<float> C(M * ldc, 0.5f);
        gemm_bf16_pairs(accumulate, M, N, P, A.data(), a_rs, B.data(), ldb, C.data(), ldc, alpha);
        for (std::size_t m = 0; m < M; ++m) {
          for (std::size_t n = 0; n < N; ++n) {
            double magnitude;
            const double product = PairDot(&A[m * a_rs], 1, &B[n], ldb, P, &magnitude);
            const double want = (accumulate ? 0.5 : 0.0) + alpha * product;
            magnitude = std::abs(alpha) * magnitude + (accumulate ? 0.5 : 0.0);
            // float32 sums of 2P exact products: a few float32 rounding units of the magnitude.
            EXPECT_NEAR(C[m * ldc + n], want, 4 * 6e-8 * magnitude + 1e-6)
                << m << ", " << n << ", alpha " << alpha;
          }
        }
        EXPECT_EQ(C[N], 0.5f) << "the padding past N is untouched";
      }
    }
  }
}

TEST(Bf16Pairs, StridedGemmReadsATransposed) {
  if (!cpu_has_avx512_bf16()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  std::mt19937 gen(9);
  // A(m, p) = At[p * lda + m]: the backward's P^T and dS^T, paired along the query rows.
  const std::size_t M = 17, N = 32, P = 9, lda = 24;
  std::vector<std::uint32_t> At(P * lda), B(P * N);
  for (auto& w : At) w = RandomBf16(gen) | std::uint32_t{RandomBf16(gen)} << 16;
  for (auto& w : B) w = RandomBf16(gen) | std::uint32_t{RandomBf16(gen)} << 16;
  std::vector<float> C(M * N);
  gemm_bf16_pairs_strided(false, M, N, P, At.data(), 1, lda, B.data(), N, C.data(), N);
  for (std::size_t m = 0; m < M; ++m) {
    for (std::size_t n = 0; n < N; ++n) {
      double magnitude;
      const double want = PairDot(&At[m], lda, &B[n], N, P, &magnitude);
      EXPECT_NEAR(C[m * N + n], want, 4 * 6e-8 * magnitude + 1e-6) << m << ", " << n;
    }
  }
}

TEST(Bf16Pairs, InterleavesTwoRows) {
  if (!cpu_has_avx512_bf16()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  for (std::size_t n : {1, 16, 21, 64}) {
    std::vector<std::uint16_t> a(n), b(n);
    for (std::size_t e = 0; e < n; ++e) a[e] = std::uint16_t(e + 1), b[e] = std::uint16_t(1000 + e);
    std::vector<std::uint32_t> both(n + 1, 7), low(n + 1, 7);
    interleave_bf16_rows(a.data(), b.data(), n, both.data());
    interleave_bf16_rows(a.data(), nullptr, n, low.data());
    for (std::size_t e = 0; e < n; ++e) {
      EXPECT_EQ(both[e], a[e] | std::uint32_t{b[e]} << 16);
      EXPECT_EQ(low[e], a[e]);
    }
    EXPECT_EQ(both[n], 7u) << "nothing written past n";
  }
}

}  // namespace
}  // namespace cpu
}  // namespace attn2d
