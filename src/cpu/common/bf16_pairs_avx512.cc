// Built only where the compiler takes -mavx512bf16 (CMakeLists.txt, which then defines
// ATTN2D_HAVE_AVX512_BF16 for the callers); nothing here runs unless cpu_has_avx512_bf16().
#include "cpu/common/bf16_pairs_avx512.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "attn2d/bf16_products.h"

namespace attn2d {
namespace cpu {

bool cpu_has_avx512_bf16() {
  static const bool has = __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bf16");
  return has;
}

namespace {

using Clock = std::chrono::steady_clock;

// 12 independent chains (enough to cover 2 a cycle at 5-6 cycles' latency) of `iterations`
// steps; returns the seconds they took. The operands come from run-time values, so that the
// compiler can neither fold the chains together nor drop them (see fma_peak.cc), and the loop
// over the chains is unrolled so that they stay in registers: kept in the array, each step
// goes through memory, and the FMA chains run at a fraction of their rate (under 40% of it on
// an Intel Xeon).
template <class Step>
double ChainsSeconds(std::int64_t iterations, float seed, const Step& step) {
  __m512 c[12];
  for (int i = 0; i < 12; ++i) c[i] = _mm512_set1_ps(seed + 0.125f * static_cast<float>(i));
  const auto t0 = Clock::now();
  for (std::int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) c[i] = step(c[i]);
  }
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  alignas(64) float lanes[16];
  volatile float sink = 0;
  for (int i = 0; i < 12; ++i) {
    _mm512_store_ps(lanes, c[i]);
    sink = sink + lanes[0];
  }
  return dt;
}

// kRows x kCols vectors of 16 sums: kRows * kCols accumulators; 12 x 2 uses 24 of 32 registers.
template <int kRows, int kCols>
inline void Block(bool accumulate, std::size_t P, const std::uint32_t* A, std::size_t a_rs,
                  std::size_t a_ps, const std::uint32_t* B, std::size_t ldb, float alpha,
                  float* C, std::size_t ldc) {
  // The sums start at 0 and C is added once at the end: a gradient summed over many query
  // tiles (dK, dV) gets one add per tile rather than one chain over every query.
  __m512 c[kRows][kCols];
  for (int r = 0; r < kRows; ++r) {
    for (int j = 0; j < kCols; ++j) c[r][j] = _mm512_setzero_ps();
  }
  for (std::size_t p = 0; p < P; ++p) {
    __m512bh b[kCols];
    for (int j = 0; j < kCols; ++j) {
      b[j] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(B + p * ldb + 16 * j));
    }
    for (int r = 0; r < kRows; ++r) {
      const __m512bh a = reinterpret_cast<__m512bh>(
          _mm512_set1_epi32(static_cast<int>(A[r * a_rs + p * a_ps])));
      for (int j = 0; j < kCols; ++j) c[r][j] = _mm512_dpbf16_ps(c[r][j], a, b[j]);
    }
  }
  if (alpha != 1.0f) {
    const __m512 va = _mm512_set1_ps(alpha);
    for (int r = 0; r < kRows; ++r) {
      for (int j = 0; j < kCols; ++j) c[r][j] = _mm512_mul_ps(va, c[r][j]);
    }
  }
  if (accumulate) {
    for (int r = 0; r < kRows; ++r) {
      for (int j = 0; j < kCols; ++j) {
        c[r][j] = _mm512_add_ps(_mm512_loadu_ps(C + r * ldc + 16 * j), c[r][j]);
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int j = 0; j < kCols; ++j) _mm512_storeu_ps(C + r * ldc + 16 * j, c[r][j]);
  }
}

template <int kCols>
inline void Panel(bool accumulate, std::size_t M, std::size_t P, const std::uint32_t* A,
                  std::size_t a_rs, std::size_t a_ps, const std::uint32_t* B, std::size_t ldb,
                  float alpha, float* C, std::size_t ldc) {
  std::size_t m = 0;
  for (; m + 12 <= M; m += 12) {
    Block<12, kCols>(accumulate, P, A + m * a_rs, a_rs, a_ps, B, ldb, alpha, C + m * ldc, ldc);
  }
  for (; m + 4 <= M; m += 4) {
    Block<4, kCols>(accumulate, P, A + m * a_rs, a_rs, a_ps, B, ldb, alpha, C + m * ldc, ldc);
  }
  for (; m < M; ++m) {
    Block<1, kCols>(accumulate, P, A + m * a_rs, a_rs, a_ps, B, ldb, alpha, C + m * ldc, ldc);
  }
}

}  // namespace

void gemm_bf16_pairs_strided(bool accumulate, std::size_t M, std::size_t N, std::size_t P,
                             const std::uint32_t* A, std::size_t a_rs, std::size_t a_ps,
                             const std::uint32_t* B, std::size_t ldb, float* C, std::size_t ldc,
                             float alpha) {
  std::size_t n = 0;
  for (; n + 32 <= N; n += 32) {
    Panel<2>(accumulate, M, P, A, a_rs, a_ps, B + n, ldb, alpha, C + n, ldc);
  }
  for (; n < N; n += 16) Panel<1>(accumulate, M, P, A, a_rs, a_ps, B + n, ldb, alpha, C + n, ldc);
}

bool bf16_pairs_outpace_fma() {
  static const bool faster = [] {
    if (!cpu_has_avx512_bf16()) return false;
    volatile float seed = 1.0f;
    // 4096 steps of 12 chains, ~50k instructions of each kind; the best of 8 runs each, taken
    // in turns, against a context switch or a slow first run.
    constexpr std::int64_t kSteps = 4096;
    const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3f803f80 ^ (seed > 2.0f)));
    const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x33803380));
    const __m512 x = _mm512_set1_ps(0.999999f * seed), y = _mm512_set1_ps(1e-7f);
    double dpbf = 1e9, fma = 1e9;
    for (int r = 0; r < 8; ++r) {
      dpbf = std::min(dpbf, ChainsSeconds(kSteps, seed, [&](__m512 c) {
                        return _mm512_dpbf16_ps(c, a, b);
                      }));
      fma = std::min(fma, ChainsSeconds(kSteps, seed, [&](__m512 c) {
                       return _mm512_fmadd_ps(c, x, y);
                     }));
    }
    // VDPBF16PS does 32 multiply-adds an instruction, a zmm FMA 16.
    return 32.0 / dpbf >= 1.5 * (16.0 / fma);
  }();
  return faster;
}

bool use_bf16_pairs() {
  switch (bf16_products()) {
    case Bf16Products::kPairs:
      return cpu_has_avx512_bf16();
    case Bf16Products::kFloat:
      return false;
    case Bf16Products::kAuto:
      break;
  }
  return bf16_pairs_outpace_fma();
}

void gemm_bf16_pairs(bool accumulate, std::size_t M, std::size_t N, std::size_t P,
                     const std::uint32_t* A, std::size_t a_rs, const std::uint32_t* B,
                     std::size_t ldb, float* C, std::size_t ldc, float alpha) {
  gemm_bf16_pairs_strided(accumulate, M, N, P, A, a_rs, 1, B, ldb, C, ldc, alpha);
}

void interleave_bf16_rows(const std::uint16_t* a, const std::uint16_t* b, std::size_t n,
                          std::uint32_t* dst) {
  for (std::size_t e = 0; e < n; e += 16) {
    const __mmask16 m = n - e >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - e)) - 1);
    const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, a + e));
    const __m512i hi = b == nullptr ? _mm512_setzero_si512()
                                    : _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, b + e));
    _mm512_mask_storeu_epi32(dst + e, m, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
  }
}

}  // namespace cpu
}  // namespace attn2d
