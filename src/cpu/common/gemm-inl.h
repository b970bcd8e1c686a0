// The tiled kernels' one GEMM micro-kernel, per target: A may be any strided view, so that one
// kernel serves every product of the forward and the backward.
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_COMMON_GEMM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_COMMON_GEMM_INL_H_
#undef ATTN2D_SRC_CPU_COMMON_GEMM_INL_H_
#else
#define ATTN2D_SRC_CPU_COMMON_GEMM_INL_H_
#endif

#include <algorithm>
#include <cstddef>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// C (M x N, row stride ldc) = [C +] A * B, where A(m, k) = A[m * a_rs + k * a_ks] is read one
// scalar at a time and broadcast, and B (K x N, row stride ldb) is read in vectors. N must be a
// multiple of the vector length. Because A may be any strided view, this one kernel serves
// Q*K^T, P*V, dO*V^T, P^T*dO, dS^T*Q and dS*K.

// kRows x 2 vectors of C. The accumulators must cover FMA latency x throughput (4 x 2 on
// current x86 cores) with room to spare, and each B vector loaded feeds kRows FMAs.
template <size_t kRows, bool kAccumulate, class D, typename T>
HWY_INLINE void BlockRowsx2(D d, size_t K, const T* HWY_RESTRICT A, size_t a_rs, size_t a_ks,
                            const T* HWY_RESTRICT B, size_t ldb, T* HWY_RESTRICT C, size_t ldc) {
  using V = decltype(hn::Zero(d));
  const size_t L = hn::Lanes(d);
  V c0[kRows], c1[kRows];
  HWY_UNROLL(12)
  for (size_t r = 0; r < kRows; ++r) {
    c0[r] = kAccumulate ? hn::LoadU(d, C + r * ldc) : hn::Zero(d);
    c1[r] = kAccumulate ? hn::LoadU(d, C + r * ldc + L) : hn::Zero(d);
  }
  for (size_t k = 0; k < K; ++k) {
    const auto b0 = hn::LoadU(d, B + k * ldb);
    const auto b1 = hn::LoadU(d, B + k * ldb + L);
    const T* a = A + k * a_ks;
    HWY_UNROLL(12)
    for (size_t r = 0; r < kRows; ++r) {
      const auto ar = hn::Set(d, a[r * a_rs]);
      c0[r] = hn::MulAdd(ar, b0, c0[r]);
      c1[r] = hn::MulAdd(ar, b1, c1[r]);
    }
  }
  HWY_UNROLL(12)
  for (size_t r = 0; r < kRows; ++r) {
    hn::StoreU(c0[r], d, C + r * ldc);
    hn::StoreU(c1[r], d, C + r * ldc + L);
  }
}

// kRows x 1 vector of C: the last (or only) vector of columns, e.g. P*V at Ev <= 16 floats.
// kRows rows here too: 4 would keep 4 multiply-add chains in flight, half the 8 that 4-cycle
// FMAs at 2 a cycle need.
template <size_t kRows, bool kAccumulate, class D, typename T>
HWY_INLINE void BlockRowsx1(D d, size_t K, const T* HWY_RESTRICT A, size_t a_rs, size_t a_ks,
                            const T* HWY_RESTRICT B, size_t ldb, T* HWY_RESTRICT C, size_t ldc) {
  using V = decltype(hn::Zero(d));
  V c[kRows];
  HWY_UNROLL(12)
  for (size_t r = 0; r < kRows; ++r) c[r] = kAccumulate ? hn::LoadU(d, C + r * ldc) : hn::Zero(d);
  for (size_t k = 0; k < K; ++k) {
    const auto b = hn::LoadU(d, B + k * ldb);
    const T* a = A + k * a_ks;
    HWY_UNROLL(12)
    for (size_t r = 0; r < kRows; ++r) c[r] = hn::MulAdd(hn::Set(d, a[r * a_rs]), b, c[r]);
  }
  HWY_UNROLL(12)
  for (size_t r = 0; r < kRows; ++r) hn::StoreU(c[r], d, C + r * ldc);
}

// kRows x 4 vectors of C: as many accumulators as kRows x 2 at half the rows, so each A
// broadcast feeds 4 multiply-adds and the block keeps half the row addresses live (12 exceed
// x86-64's general registers beside the loop's own, and the rest reload from the stack).
template <size_t kRows, bool kAccumulate, class D, typename T>
HWY_INLINE void BlockRowsx4(D d, size_t K, const T* HWY_RESTRICT A, size_t a_rs, size_t a_ks,
                            const T* HWY_RESTRICT B, size_t ldb, T* HWY_RESTRICT C, size_t ldc) {
  using V = decltype(hn::Zero(d));
  const size_t L = hn::Lanes(d);
  V c0[kRows], c1[kRows], c2[kRows], c3[kRows];
  HWY_UNROLL(6)
  for (size_t r = 0; r < kRows; ++r) {
    c0[r] = kAccumulate ? hn::LoadU(d, C + r * ldc) : hn::Zero(d);
    c1[r] = kAccumulate ? hn::LoadU(d, C + r * ldc + L) : hn::Zero(d);
    c2[r] = kAccumulate ? hn::LoadU(d, C + r * ldc + 2 * L) : hn::Zero(d);
    c3[r] = kAccumulate ? hn::LoadU(d, C + r * ldc + 3 * L) : hn::Zero(d);
  }
  for (size_t k = 0; k < K; ++k) {
    const T* b = B + k * ldb;
    const auto b0 = hn::LoadU(d, b);
    const auto b1 = hn::LoadU(d, b + L);
    const auto b2 = hn::LoadU(d, b + 2 * L);
    const auto b3 = hn::LoadU(d, b + 3 * L);
    const T* a = A + k * a_ks;
    HWY_UNROLL(6)
    for (size_t r = 0; r < kRows; ++r) {
      const auto ar = hn::Set(d, a[r * a_rs]);
      c0[r] = hn::MulAdd(ar, b0, c0[r]);
      c1[r] = hn::MulAdd(ar, b1, c1[r]);
      c2[r] = hn::MulAdd(ar, b2, c2[r]);
      c3[r] = hn::MulAdd(ar, b3, c3[r]);
    }
  }
  HWY_UNROLL(6)
  for (size_t r = 0; r < kRows; ++r) {
    hn::StoreU(c0[r], d, C + r * ldc);
    hn::StoreU(c1[r], d, C + r * ldc + L);
    hn::StoreU(c2[r], d, C + r * ldc + 2 * L);
    hn::StoreU(c3[r], d, C + r * ldc + 3 * L);
  }
}

// The column panels of 4 vectors, in chunks of K whose B sub-panel (16 KiB) stays in L1 while
// every 6-row block reads it: a whole K x 4-vector panel of P*V (256 keys, 64 KiB) would stream
// from L2 once per block. Each accumulator still sums over k in order, stored and reloaded
// between chunks, so the result is bitwise that of one pass. Returns the columns done.
template <bool kAccumulate, class D, typename T>
HWY_INLINE size_t GemmPanelsx4(D d, size_t M, size_t N, size_t K, const T* HWY_RESTRICT A,
                               size_t a_rs, size_t a_ks, const T* HWY_RESTRICT B, size_t ldb,
                               T* HWY_RESTRICT C, size_t ldc) {
  const size_t W = 4 * hn::Lanes(d);
  const size_t n_end = N / W * W;
  const size_t k_chunk = 16384 / (W * sizeof(T));
  // At least one pass, so that C is still written (zeros) when K = 0 and not accumulating.
  for (size_t k0 = 0;; k0 += k_chunk) {
    const size_t kk = std::min(k_chunk, K - k0);
    const T* Ak = A + k0 * a_ks;
    const T* Bk = B + k0 * ldb;
    const bool accumulate = kAccumulate || k0 != 0;
    for (size_t n = 0; n < n_end; n += W) {
      size_t m = 0;
      for (; m + 6 <= M; m += 6) {
        if (accumulate) {
          BlockRowsx4<6, true>(d, kk, Ak + m * a_rs, a_rs, a_ks, Bk + n, ldb, C + m * ldc + n, ldc);
        } else {
          BlockRowsx4<6, false>(d, kk, Ak + m * a_rs, a_rs, a_ks, Bk + n, ldb, C + m * ldc + n,
                                ldc);
        }
      }
      for (; m + 3 <= M; m += 3) {
        if (accumulate) {
          BlockRowsx4<3, true>(d, kk, Ak + m * a_rs, a_rs, a_ks, Bk + n, ldb, C + m * ldc + n, ldc);
        } else {
          BlockRowsx4<3, false>(d, kk, Ak + m * a_rs, a_rs, a_ks, Bk + n, ldb, C + m * ldc + n,
                                ldc);
        }
      }
      for (; m < M; ++m) {
        if (accumulate) {
          BlockRowsx4<1, true>(d, kk, Ak + m * a_rs, a_rs, a_ks, Bk + n, ldb, C + m * ldc + n, ldc);
        } else {
          BlockRowsx4<1, false>(d, kk, Ak + m * a_rs, a_rs, a_ks, Bk + n, ldb, C + m * ldc + n,
                                ldc);
        }
      }
    }
    if (k0 + kk >= K) break;
  }
  return n_end;
}

template <bool kAccumulate, typename T>
HWY_NOINLINE void Gemm(size_t M, size_t N, size_t K, const T* HWY_RESTRICT A, size_t a_rs,
                       size_t a_ks, const T* HWY_RESTRICT B, size_t ldb, T* HWY_RESTRICT C,
                       size_t ldc) {
  const hn::ScalableTag<T> d;
  const size_t L = hn::Lanes(d);
  size_t n = 0;
#if HWY_TARGET <= HWY_AVX3
  // With 32 vector registers, panels of 4 vectors first (on an Intel Xeon Ice Lake core, P*V
  // at ViT-B's tiles ran 1.2x as fast as in 12 x 2 blocks), the last columns as below.
  n = GemmPanelsx4<kAccumulate>(d, M, N, K, A, a_rs, a_ks, B, ldb, C, ldc);
#endif
  // 12 rows where the target has 32 vector registers (24 accumulators, 2 B vectors, 1
  // broadcast), else 6 (12 + 3 of 16): the more rows each B vector feeds, the fewer loads a
  // multiply-add (on an AMD EPYC Zen 4, 12 rows ran the ViT-B N=1024 backward 1.25x as fast
  // as 4).
  constexpr size_t kRows = HWY_TARGET <= HWY_AVX3 ? 12 : 6;
  // Column panels outermost: a K x 2L panel of B stays in L1 while every row block uses it.
  for (; n + 2 * L <= N; n += 2 * L) {
    size_t m = 0;
    for (; m + kRows <= M; m += kRows) {
      BlockRowsx2<kRows, kAccumulate>(d, K, A + m * a_rs, a_rs, a_ks, B + n, ldb,
                                      C + m * ldc + n, ldc);
    }
    for (; m + 4 <= M; m += 4) {
      BlockRowsx2<4, kAccumulate>(d, K, A + m * a_rs, a_rs, a_ks, B + n, ldb, C + m * ldc + n,
                                  ldc);
    }
    for (; m < M; ++m) {
      BlockRowsx2<1, kAccumulate>(d, K, A + m * a_rs, a_rs, a_ks, B + n, ldb, C + m * ldc + n,
                                  ldc);
    }
  }
  for (; n < N; n += L) {
    size_t m = 0;
    for (; m + kRows <= M; m += kRows) {
      BlockRowsx1<kRows, kAccumulate>(d, K, A + m * a_rs, a_rs, a_ks, B + n, ldb,
                                      C + m * ldc + n, ldc);
    }
    for (; m + 4 <= M; m += 4) {
      BlockRowsx1<4, kAccumulate>(d, K, A + m * a_rs, a_rs, a_ks, B + n, ldb, C + m * ldc + n,
                                  ldc);
    }
    for (; m < M; ++m) {
      BlockRowsx1<1, kAccumulate>(d, K, A + m * a_rs, a_rs, a_ks, B + n, ldb, C + m * ldc + n,
                                  ldc);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_COMMON_GEMM_INL_H_
