// Products of bfloat16 tiles on the native AVX512-BF16 dot product (VDPBF16PS: 32 bf16 products
// into 16 float32 sums per instruction, twice the multiply-adds of a float32 FMA). Built in its
// own translation unit with -mavx512bf16, only when ATTN2D_HAVE_AVX512_BF16 is defined, and
// called only where the CPU has it; Highway 1.0.3 has no op for it.
//
// Operands are "pair" tiles: each 32-bit word holds two bf16 values that are adjacent along the
// reduction dimension (low half first, as a little-endian bf16 row stores them).
#pragma once

#include <cstddef>
#include <cstdint>

namespace attn2d {
namespace cpu {

// Whether this CPU runs AVX512-BF16 (and the AVX-512 F/BW/VL it needs) and the kernels below
// were built.
bool cpu_has_avx512_bf16();

// Whether the VDPBF16PS chains of this CPU do at least 1.5x the multiply-adds a second of zmm
// FMA chains (measured once per process, in a fraction of a millisecond; false without
// AVX512-BF16).
bool bf16_pairs_outpace_fma();

// Whether the kernels multiply bf16 inputs as pairs now: per attn2d::bf16_products().
bool use_bf16_pairs();

// C (M x N floats, row stride ldc) = [C +] alpha * A * B over P pairs: A (M x P words, row
// stride a_rs), B (P x N words, row stride ldb). N is a multiple of 16. alpha is applied to the
// float32 sums as they are stored (the softmax scale of S = Q K^T, without a pass of its own);
// with `accumulate`, the product is summed from 0 and then added to C (one rounding of C per
// call, as a separate sum-then-add would round it).
void gemm_bf16_pairs(bool accumulate, std::size_t M, std::size_t N, std::size_t P,
                     const std::uint32_t* A, std::size_t a_rs, const std::uint32_t* B,
                     std::size_t ldb, float* C, std::size_t ldc, float alpha = 1.0f);

// gemm_bf16_pairs with A(m, p) = A[m * a_rs + p * a_ps]: A may be a transposed pair tile (the
// backward's P^T and dS^T, paired along the query rows).
void gemm_bf16_pairs_strided(bool accumulate, std::size_t M, std::size_t N, std::size_t P,
                             const std::uint32_t* A, std::size_t a_rs, std::size_t a_ps,
                             const std::uint32_t* B, std::size_t ldb, float* C, std::size_t ldc,
                             float alpha = 1.0f);

// dst[e] = a[e] | b[e] << 16 for e < n: two bf16 rows as pairs (b null: zero high halves).
void interleave_bf16_rows(const std::uint16_t* a, const std::uint16_t* b, std::size_t n,
                          std::uint32_t* dst);

}  // namespace cpu
}  // namespace attn2d
