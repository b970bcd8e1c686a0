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

// kRows x kVecs vectors of C. The accumulators must cover FMA latency x throughput (4 x 2 on
// current x86 cores) with room to spare; each B vector loaded feeds kRows multiply-adds and each
// A broadcast kVecs of them.
template <size_t kRows, size_t kVecs, bool kAccumulate, class D, typename T>
HWY_INLINE void BlockRows(D d, size_t K, const T* HWY_RESTRICT A, size_t a_rs, size_t a_ks,
                          const T* HWY_RESTRICT B, size_t ldb, T* HWY_RESTRICT C, size_t ldc) {
  using V = decltype(hn::Zero(d));
  const size_t L = hn::Lanes(d);
  V c[kRows][kVecs];
  HWY_UNROLL(12)
  for (size_t r = 0; r < kRows; ++r) {
    HWY_UNROLL(4)
    for (size_t j = 0; j < kVecs; ++j) {
      c[r][j] = kAccumulate ? hn::LoadU(d, C + r * ldc + j * L) : hn::Zero(d);
    }
  }
  for (size_t k = 0; k < K; ++k) {
    V b[kVecs];
    HWY_UNROLL(4)
    for (size_t j = 0; j < kVecs; ++j) b[j] = hn::LoadU(d, B + k * ldb + j * L);
    const T* a = A + k * a_ks;
    HWY_UNROLL(12)
    for (size_t r = 0; r < kRows; ++r) {
      const auto ar = hn::Set(d, a[r * a_rs]);
      HWY_UNROLL(4)
      for (size_t j = 0; j < kVecs; ++j) c[r][j] = hn::MulAdd(ar, b[j], c[r][j]);
    }
  }
  HWY_UNROLL(12)
  for (size_t r = 0; r < kRows; ++r) {
    HWY_UNROLL(4)
    for (size_t j = 0; j < kVecs; ++j) hn::StoreU(c[r][j], d, C + r * ldc + j * L);
  }
}

// One column panel of kVecs vectors over every row: kRows rows a block, then kRestRows, then
// single rows.
template <size_t kRows, size_t kRestRows, size_t kVecs, bool kAccumulate, class D, typename T>
HWY_INLINE void PanelRows(D d, size_t M, size_t K, const T* HWY_RESTRICT A, size_t a_rs,
                          size_t a_ks, const T* HWY_RESTRICT B, size_t ldb, T* HWY_RESTRICT C,
                          size_t ldc) {
  size_t m = 0;
  for (; m + kRows <= M; m += kRows) {
    BlockRows<kRows, kVecs, kAccumulate>(d, K, A + m * a_rs, a_rs, a_ks, B, ldb, C + m * ldc,
                                         ldc);
  }
  for (; m + kRestRows <= M; m += kRestRows) {
    BlockRows<kRestRows, kVecs, kAccumulate>(d, K, A + m * a_rs, a_rs, a_ks, B, ldb,
                                             C + m * ldc, ldc);
  }
  for (; m < M; ++m) {
    BlockRows<1, kVecs, kAccumulate>(d, K, A + m * a_rs, a_rs, a_ks, B, ldb, C + m * ldc, ldc);
  }
}

// The column panels of 4 vectors in 6-row blocks (24 accumulators, as 12 x 2, but each broadcast
// feeds 4 multiply-adds and only 6 row addresses stay live: 12 exceed x86-64's general registers
// beside the loop's own, and the rest reload from the stack every k). K runs in chunks whose B
// sub-panel (16 KiB) stays in L1 while every row block reads it: a whole K x 4-vector panel of
// P*V (256 keys, 64 KiB) would stream from L2 once per block. Each accumulator still sums over
// k in order, stored and reloaded between chunks, so the result is bitwise that of one pass.
// Returns the columns done.
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
    for (size_t n = 0; n < n_end; n += W) {
      const T* Ak = A + k0 * a_ks;
      const T* Bk = B + k0 * ldb + n;
      if (kAccumulate || k0 != 0) {
        PanelRows<6, 3, 4, true>(d, M, kk, Ak, a_rs, a_ks, Bk, ldb, C + n, ldc);
      } else {
        PanelRows<6, 3, 4, false>(d, M, kk, Ak, a_rs, a_ks, Bk, ldb, C + n, ldc);
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
  // as 4). Column panels outermost: a K x 2L panel of B stays in L1 while every row block uses
  // it. The last single vector of columns (e.g. P*V at Ev <= 16 floats) keeps kRows rows too:
  // 4 rows would keep 4 multiply-add chains in flight, half the 8 that 4-cycle FMAs at 2 a
  // cycle need.
  constexpr size_t kRows = HWY_TARGET <= HWY_AVX3 ? 12 : 6;
  for (; n + 2 * L <= N; n += 2 * L) {
    PanelRows<kRows, 4, 2, kAccumulate>(d, M, K, A, a_rs, a_ks, B + n, ldb, C + n, ldc);
  }
  for (; n < N; n += L) {
    PanelRows<kRows, 4, 1, kAccumulate>(d, M, K, A, a_rs, a_ks, B + n, ldb, C + n, ldc);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_COMMON_GEMM_INL_H_
