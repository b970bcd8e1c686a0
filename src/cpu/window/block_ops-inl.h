// The window kernels' blocked products, per target (window_geometry.h, Column): R query vectors
// block_stride apart. The offsets of one column are evenly spaced by that stride, so query k at
// the column's m-th offset reads the same key vector as query k + 1 at offset m - 1: key row
// u = k + m. One load then feeds up to R multiply-adds, where the one-vector kernels
// (shifted_ops-inl.h) spend one load per multiply-add.
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_WINDOW_BLOCK_OPS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_WINDOW_BLOCK_OPS_INL_H_
#undef ATTN2D_SRC_CPU_WINDOW_BLOCK_OPS_INL_H_
#else
#define ATTN2D_SRC_CPU_WINDOW_BLOCK_OPS_INL_H_
#endif

#include <cstddef>
#include <cstdint>

#include "cpu/window/window_geometry.h"
#include "cpu/window/window_plan-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// v, kept in a register: GCC 12 otherwise folds a load with several multiply-add uses into each
// of them as a memory operand (19 loads per 20 multiply-adds in a 4 x 5 sweep instead of 12),
// which undoes the sharing the blocks are for.
template <class V>
HWY_INLINE V InRegister(V v) {
#if HWY_ARCH_X86
  asm("" : "+v"(v.raw));
#endif
  return v;
}

// S[k * s_stride + j * L + lane] = sum over rows e < rows of a[e * ld + k * rs + lane] *
// b[e * ld + (k + j) * rs + lane], for k < R and j < kD: R query vectors (a) against kD offsets
// of one column (b at its offset j = 0).
template <size_t kR, size_t kD, class D, typename T>
HWY_INLINE void BlockDotsSweep(D d, const T* HWY_RESTRICT a, const T* HWY_RESTRICT b, size_t ld,
                               size_t rows, size_t rs, T* HWY_RESTRICT S, size_t s_stride) {
  const size_t L = hn::Lanes(d);
  hn::Vec<D> acc[kR][kD];
  HWY_UNROLL(16)
  for (size_t k = 0; k < kR; ++k) {
    HWY_UNROLL(16)
    for (size_t j = 0; j < kD; ++j) acc[k][j] = hn::Zero(d);
  }
  for (size_t e = 0; e < rows; ++e) {
    const T* ae = a + e * ld;
    const T* be = b + e * ld;
    hn::Vec<D> qv[kR];
    HWY_UNROLL(16)
    for (size_t k = 0; k < kR; ++k) qv[k] = InRegister(hn::LoadU(d, ae + k * rs));
    HWY_UNROLL(16)
    for (size_t u = 0; u < kR + kD - 1; ++u) {
      const auto kv = InRegister(hn::LoadU(d, be + u * rs));
      HWY_UNROLL(16)
      for (size_t k = 0; k < kR; ++k) {
        if (u >= k && u - k < kD) acc[k][u - k] = hn::MulAdd(qv[k], kv, acc[k][u - k]);
      }
    }
  }
  HWY_UNROLL(16)
  for (size_t k = 0; k < kR; ++k) {
    HWY_UNROLL(16)
    for (size_t j = 0; j < kD; ++j) hn::Store(acc[k][j], d, S + k * s_stride + j * L);
  }
}

// The scores of R = kBlockRows query vectors (a: Q^T at the first) against every offset:
// S (R, count, L) in column order; b: K^T at the first query's position.
template <class D, typename T>
HWY_INLINE void BlockDots(D d, const WindowGeometry<T>& g, const T* a, const T* b, size_t rows,
                          T* S) {
  constexpr size_t kR = kBlockRows;
  const size_t L = hn::Lanes(d), ld = static_cast<size_t>(g.ld);
  const size_t rs = static_cast<size_t>(g.block_stride);
  const size_t s_stride = static_cast<size_t>(g.count) * L;
  using Sweep = void (*)(D, const T*, const T*, size_t, size_t, size_t, T*, size_t);
  static_assert(kBlockOffsets == 6, "one sweep per column length 1 .. kBlockOffsets");
  static constexpr Sweep kSweeps[kBlockOffsets] = {
      BlockDotsSweep<kR, 1, D, T>, BlockDotsSweep<kR, 2, D, T>, BlockDotsSweep<kR, 3, D, T>,
      BlockDotsSweep<kR, 4, D, T>, BlockDotsSweep<kR, 5, D, T>, BlockDotsSweep<kR, 6, D, T>};
  for (const auto& sw : g.sweeps) {
    kSweeps[sw.n - 1](d, a, b + sw.base, ld, rows, rs, S + static_cast<size_t>(sw.first) * L,
                      s_stride);
  }
}

// One key row u of a column in BlockCombine: acc[k][i] += P[k][u - k] * b[i][u] for the block's
// vectors k in [kLo, kHi] (those that the row serves), a compile-time range so that the loop
// over k has no guards.
template <size_t kLo, size_t kHi, class D, typename T>
HWY_INLINE void CombineKeyRow(D d, const T* HWY_RESTRICT pc, size_t p_stride,
                              const T* HWY_RESTRICT bc, size_t ld, size_t u, size_t rs,
                              hn::Vec<D> (&acc)[kBlockRows][4]) {
  const size_t L = hn::Lanes(d);
  hn::Vec<D> vv[4];
  HWY_UNROLL(4)
  for (size_t i = 0; i < 4; ++i) vv[i] = InRegister(hn::LoadU(d, bc + i * ld + u * rs));
  HWY_UNROLL(4)
  for (size_t k = kLo; k <= kHi; ++k) {
    const auto p = hn::Load(d, pc + k * p_stride + (u - k) * L);
    HWY_UNROLL(4)
    for (size_t i = 0; i < 4; ++i) acc[k][i] = hn::MulAdd(p, vv[i], acc[k][i]);
  }
}

// out[k * o_stride + i * L + lane] = sum over offsets of P[k * p_stride + o * L + lane] times
// b[i * ld + off + k * rs + lane], for the R = kBlockRows query vectors k and 4 rows i (b: V^T
// at the first query's position); P (R, count, L) in column order.
template <class D, typename T>
HWY_INLINE void BlockCombine(D d, const WindowGeometry<T>& g, const T* HWY_RESTRICT P,
                             const T* HWY_RESTRICT b, T* HWY_RESTRICT out, size_t o_stride) {
  constexpr size_t kR = kBlockRows, kRows = 4;
  static_assert(kR == 4, "the column walk below spells out 4 vectors");
  const size_t L = hn::Lanes(d), ld = static_cast<size_t>(g.ld);
  const size_t rs = static_cast<size_t>(g.block_stride);
  const size_t p_stride = static_cast<size_t>(g.count) * L;
  hn::Vec<D> acc[kR][kRows];
  HWY_UNROLL(16)
  for (size_t k = 0; k < kR; ++k) {
    HWY_UNROLL(16)
    for (size_t i = 0; i < kRows; ++i) acc[k][i] = hn::Zero(d);
  }
  for (const auto& col : g.columns) {
    const size_t n = static_cast<size_t>(col.n);
    const T* bc = b + col.base;
    const T* pc = P + static_cast<size_t>(col.first) * L;
    // Key row u serves query k at the column's offset u - k, where 0 <= u - k < n: rows 0..2
    // serve the first u + 1 vectors, rows 3..n-1 all 4, rows n..n+2 the last n + 3 - u. Spelt
    // out so, the walk has no test per (row, vector) pair, which a diamond's columns (1, 3, ..,
    // 15 offsets) would mispredict as their lengths change every few rows.
    if (n >= kR - 1) {
      CombineKeyRow<0, 0>(d, pc, p_stride, bc, ld, 0, rs, acc);
      CombineKeyRow<0, 1>(d, pc, p_stride, bc, ld, 1, rs, acc);
      CombineKeyRow<0, 2>(d, pc, p_stride, bc, ld, 2, rs, acc);
      for (size_t u = kR - 1; u < n; ++u) CombineKeyRow<0, 3>(d, pc, p_stride, bc, ld, u, rs, acc);
      CombineKeyRow<1, 3>(d, pc, p_stride, bc, ld, n, rs, acc);
      CombineKeyRow<2, 3>(d, pc, p_stride, bc, ld, n + 1, rs, acc);
      CombineKeyRow<3, 3>(d, pc, p_stride, bc, ld, n + 2, rs, acc);
      continue;
    }
    for (size_t u = 0; u < n + kR - 1; ++u) {
      hn::Vec<D> vv[kRows];
      HWY_UNROLL(16)
      for (size_t i = 0; i < kRows; ++i) vv[i] = InRegister(hn::LoadU(d, bc + i * ld + u * rs));
      HWY_UNROLL(16)
      for (size_t k = 0; k < kR; ++k) {
        if (u < k || u - k >= n) continue;
        const auto p = hn::Load(d, pc + k * p_stride + (u - k) * L);
        HWY_UNROLL(16)
        for (size_t i = 0; i < kRows; ++i) acc[k][i] = hn::MulAdd(p, vv[i], acc[k][i]);
      }
    }
  }
  HWY_UNROLL(16)
  for (size_t k = 0; k < kR; ++k) {
    HWY_UNROLL(16)
    for (size_t i = 0; i < kRows; ++i) hn::Store(acc[k][i], d, out + k * o_stride + i * L);
  }
}

// dst[i * ld + off + k * rs + lane] += P[k * p_stride + o * L + lane] * a[i * ld + k * rs + lane]
// for every offset o (off its raster distance), the R = kBlockRows vectors k and rows i < rows
// (a multiple of 4): the transpose of BlockCombine, adding a block's terms to the keys it sees
// (dK^T += dS Q^T, dV^T += P dO^T). Each column's key rows are read, added to and stored once
// for all 4 vectors (their query rows held in registers). Neighbouring columns' rows overlap one
// position apart, and a load that overlaps a queued store waits for it: columns outermost put
// 4 (n + 3) stores between them. Quads of rows outermost (the query rows loaded once a quad, a
// column's 72 stores apart at n = 15) run no faster.
template <class D, typename T>
HWY_INLINE void BlockScatter(D d, const WindowGeometry<T>& g, const T* HWY_RESTRICT P,
                             const T* HWY_RESTRICT a, size_t rows, T* HWY_RESTRICT dst) {
  constexpr size_t kR = kBlockRows, kRows = 4;
  const size_t ld = static_cast<size_t>(g.ld), L = hn::Lanes(d);
  const size_t rs = static_cast<size_t>(g.block_stride);
  const size_t p_stride = static_cast<size_t>(g.count) * L;
  for (const auto& col : g.columns) {
    const size_t n = static_cast<size_t>(col.n);
    const T* pc = P + static_cast<size_t>(col.first) * L;
    for (size_t r0 = 0; r0 < rows; r0 += kRows) {
      hn::Vec<D> av[kR][kRows];
      HWY_UNROLL(16)
      for (size_t k = 0; k < kR; ++k) {
        HWY_UNROLL(16)
        for (size_t i = 0; i < kRows; ++i) av[k][i] = hn::Load(d, a + (r0 + i) * ld + k * rs);
      }
      T* bc = dst + col.base + r0 * ld;
      // Key row u serves query k at the column's offset u - k, where 0 <= u - k < n (spelt
      // out without the test per pair, as in BlockCombine, it runs no faster).
      for (size_t u = 0; u < n + kR - 1; ++u) {
        hn::Vec<D> x[kRows];
        HWY_UNROLL(16)
        for (size_t i = 0; i < kRows; ++i) x[i] = hn::LoadU(d, bc + i * ld + u * rs);
        HWY_UNROLL(16)
        for (size_t k = 0; k < kR; ++k) {
          if (u < k || u - k >= n) continue;
          const auto p = hn::Load(d, pc + k * p_stride + (u - k) * L);
          HWY_UNROLL(16)
          for (size_t i = 0; i < kRows; ++i) x[i] = hn::MulAdd(p, av[k][i], x[i]);
        }
        HWY_UNROLL(16)
        for (size_t i = 0; i < kRows; ++i) hn::StoreU(x[i], d, bc + i * ld + u * rs);
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_WINDOW_BLOCK_OPS_INL_H_
