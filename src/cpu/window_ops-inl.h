// Per-target building blocks of the window kernels (window_forward_cpu.cc,
// window_backward_cpu.cc). One vector holds L consecutive raster queries; for an offset o their
// keys sit at the same raster distance off[o], so every product below is a contiguous load
// shifted by off[o] from a packed (rows, ld) buffer (window_geometry.h), with no gather.
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_WINDOW_OPS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_WINDOW_OPS_INL_H_
#undef ATTN2D_SRC_CPU_WINDOW_OPS_INL_H_
#else
#define ATTN2D_SRC_CPU_WINDOW_OPS_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "attn2d/host.h"
#include "attn2d/status.h"
#include "core/workspace.h"
#include "cpu/tile_ops-inl.h"
#include "cpu/window_geometry.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {

// Offsets whose scores are summed in one sweep: 8 independent FMA chains cover the FMA latency
// (4 cycles) at two FMAs per cycle.
constexpr size_t kOffsetsPerSweep = 8;
// Rows (of Q^T, V^T, ...) held in registers per sweep: 16 vectors + 8 accumulators of AVX-512's
// 32. Packed buffers round their rows up to a multiple of 4 (zero rows).
constexpr size_t kMaxQuads = 4;
constexpr size_t kRowsPerSweep = 4 * kMaxQuads;

// S[o * L + lane] = sum over the 4 kQuads rows i of a[i * ld + lane] * b[i * ld + off[o] + lane]
// (plus S's old value when kAccumulate); returns the lane-wise max of the new S when kMax.
template <size_t kQuads, bool kAccumulate, bool kMax, class D, typename T>
HWY_INLINE hn::Vec<D> ShiftedDots(D d, const T* HWY_RESTRICT a, const T* HWY_RESTRICT b,
                                  size_t ld, const std::int64_t* HWY_RESTRICT off, size_t count,
                                  T* HWY_RESTRICT S, hn::Vec<D> vmax) {
  constexpr size_t kRows = 4 * kQuads, kG = kOffsetsPerSweep;
  const size_t L = hn::Lanes(d);
  hn::Vec<D> av[kRows];
  HWY_UNROLL(16)
  for (size_t i = 0; i < kRows; ++i) av[i] = hn::LoadU(d, a + i * ld);
  size_t o = 0;
  for (; o + kG <= count; o += kG) {
    hn::Vec<D> s[kG];
    HWY_UNROLL(8)
    for (size_t g = 0; g < kG; ++g) s[g] = kAccumulate ? hn::Load(d, S + (o + g) * L) : hn::Zero(d);
    HWY_UNROLL(16)
    for (size_t i = 0; i < kRows; ++i) {
      HWY_UNROLL(8)
      for (size_t g = 0; g < kG; ++g) {
        s[g] = hn::MulAdd(av[i], hn::LoadU(d, b + i * ld + off[o + g]), s[g]);
      }
    }
    HWY_UNROLL(8)
    for (size_t g = 0; g < kG; ++g) {
      hn::Store(s[g], d, S + (o + g) * L);
      if (kMax) vmax = hn::Max(vmax, s[g]);
    }
  }
  for (; o < count; ++o) {
    auto s = kAccumulate ? hn::Load(d, S + o * L) : hn::Zero(d);
    HWY_UNROLL(16)
    for (size_t i = 0; i < kRows; ++i) s = hn::MulAdd(av[i], hn::LoadU(d, b + i * ld + off[o]), s);
    hn::Store(s, d, S + o * L);
    if (kMax) vmax = hn::Max(vmax, s);
  }
  return vmax;
}

// S[o * L + lane] = sum over rows r < rows (a multiple of 4) of a[r * ld + lane] *
// b[r * ld + off[o] + lane], for the `count` offsets from off; returns the lane-wise max when
// track_max.
template <class D, typename T>
HWY_INLINE hn::Vec<D> VectorDots(D d, const WindowGeometry<T>& g, const std::int64_t* off,
                                 size_t count, const T* a, const T* b, size_t rows, T* S,
                                 bool track_max) {
  const size_t ld = static_cast<size_t>(g.ld);
  auto vmax = hn::Set(d, -std::numeric_limits<T>::infinity());
  for (size_t r0 = 0; r0 < rows; r0 += kRowsPerSweep) {
    const size_t quads = std::min(kMaxQuads, (rows - r0) / 4);
    const bool first = r0 == 0, last = r0 + 4 * quads == rows;
    const T* ar = a + r0 * ld;
    const T* br = b + r0 * ld;
#define ATTN2D_SHIFTED_DOTS(Q)                                                   \
  if (first && last && track_max) {                                               \
    vmax = ShiftedDots<Q, false, true>(d, ar, br, ld, off, count, S, vmax);      \
  } else if (first) {                                                             \
    ShiftedDots<Q, false, false>(d, ar, br, ld, off, count, S, vmax);            \
  } else if (last && track_max) {                                                 \
    vmax = ShiftedDots<Q, true, true>(d, ar, br, ld, off, count, S, vmax);       \
  } else {                                                                        \
    ShiftedDots<Q, true, false>(d, ar, br, ld, off, count, S, vmax);             \
  }
    switch (quads) {
      case 1:
        ATTN2D_SHIFTED_DOTS(1) break;
      case 2:
        ATTN2D_SHIFTED_DOTS(2) break;
      case 3:
        ATTN2D_SHIFTED_DOTS(3) break;
      default:
        ATTN2D_SHIFTED_DOTS(4) break;
    }
#undef ATTN2D_SHIFTED_DOTS
  }
  return vmax;
}

// out[i * L + lane] = sum over o of P[o * L + lane] * b[i * ld + off[o] + lane], i < 4 kQuads.
// kExp: P holds the scores S on entry, and P = exp(S - shift) is formed here, stored back for
// the later sweeps of a wider Ev, and summed into *sum: the exp's ~26 float instructions then
// overlap this loop's loads, where a separate pass over P spent ~16 cycles per vector (the
// forward at 128x128 with a 15x15 window ran 12% faster, best of 25 runs, 3 runs each).
// kAccumulate: out's old value is added to.
template <size_t kQuads, bool kExp, bool kAccumulate, class D, typename T>
HWY_INLINE void ShiftedCombine(D d, T* HWY_RESTRICT P, const T* HWY_RESTRICT b, size_t ld,
                               const std::int64_t* HWY_RESTRICT off, size_t count,
                               T* HWY_RESTRICT out, hn::Vec<D> shift, hn::Vec<D>* sum) {
  constexpr size_t kRows = 4 * kQuads;
  const size_t L = hn::Lanes(d);
  hn::Vec<D> acc[kRows];
  HWY_UNROLL(16)
  for (size_t i = 0; i < kRows; ++i) acc[i] = kAccumulate ? hn::Load(d, out + i * L) : hn::Zero(d);
  auto total = hn::Zero(d);
  for (size_t o = 0; o < count; ++o) {
    auto pv = hn::Load(d, P + o * L);
    if (kExp) {
      pv = ExpOf(d, hn::Sub(pv, shift));
      hn::Store(pv, d, P + o * L);
      total = hn::Add(total, pv);
    }
    const T* bo = b + off[o];
    HWY_UNROLL(16)
    for (size_t i = 0; i < kRows; ++i) acc[i] = hn::MulAdd(pv, hn::LoadU(d, bo + i * ld), acc[i]);
  }
  HWY_UNROLL(16)
  for (size_t i = 0; i < kRows; ++i) hn::Store(acc[i], d, out + i * L);
  if (kExp) *sum = total;
}

// ShiftedCombine over `quads` (1..4) quads of rows and the `count` offsets from off; with
// `exp` (forward), P holds scores and becomes exp(S - shift), their sum going to *sum; with
// `accumulate` (backward), out is added to.
template <class D, typename T>
HWY_INLINE void VectorCombine(D d, const WindowGeometry<T>& g, const std::int64_t* off,
                              size_t count, T* P, const T* b, size_t quads, T* out, bool exp,
                              bool accumulate, hn::Vec<D> shift, hn::Vec<D>* sum) {
  const size_t ld = static_cast<size_t>(g.ld);
#define ATTN2D_SHIFTED_COMBINE(Q)                                                            \
  return exp ? ShiftedCombine<Q, true, false>(d, P, b, ld, off, count, out, shift, sum)     \
             : accumulate                                                                    \
                   ? ShiftedCombine<Q, false, true>(d, P, b, ld, off, count, out, shift, sum) \
                   : ShiftedCombine<Q, false, false>(d, P, b, ld, off, count, out, shift, sum)
  switch (quads) {
    case 1:
      ATTN2D_SHIFTED_COMBINE(1);
    case 2:
      ATTN2D_SHIFTED_COMBINE(2);
    case 3:
      ATTN2D_SHIFTED_COMBINE(3);
    default:
      ATTN2D_SHIFTED_COMBINE(4);
  }
#undef ATTN2D_SHIFTED_COMBINE
}

// dst[i * ld + off[o] + lane] += P[o * L + lane] * a[i * ld + lane] for every offset and the
// 4 kQuads rows i: the transpose of ShiftedCombine, scattering a query vector's terms onto the
// keys it sees (dK^T += dS q, dV^T += P dO).
template <size_t kQuads, class D, typename T>
HWY_INLINE void ShiftedScatter(D d, const T* HWY_RESTRICT P, const T* HWY_RESTRICT a, size_t ld,
                               const std::int64_t* HWY_RESTRICT off, size_t count,
                               const std::uint16_t* HWY_RESTRICT order, T* HWY_RESTRICT dst) {
  constexpr size_t kRows = 4 * kQuads;
  const size_t L = hn::Lanes(d);
  hn::Vec<D> av[kRows];
  HWY_UNROLL(16)
  for (size_t i = 0; i < kRows; ++i) av[i] = hn::Load(d, a + i * ld);
  for (size_t t = 0; t < count; ++t) {
    const size_t o = order[t];
    const auto pv = hn::Load(d, P + o * L);
    T* to = dst + off[o];
    HWY_UNROLL(16)
    for (size_t i = 0; i < kRows; ++i) {
      hn::StoreU(hn::MulAdd(pv, av[i], hn::LoadU(d, to + i * ld)), d, to + i * ld);
    }
  }
}

// ShiftedScatter over rows r < rows (a multiple of 4) and the `count` offsets from off.
template <class D, typename T>
HWY_INLINE void VectorScatter(D d, const WindowGeometry<T>& g, const std::int64_t* off,
                              size_t count, const std::uint16_t* order, const T* P, const T* a,
                              size_t rows, T* dst) {
  const size_t ld = static_cast<size_t>(g.ld);
  for (size_t r0 = 0; r0 < rows; r0 += kRowsPerSweep) {
    const T* ar = a + r0 * ld;
    T* dr = dst + r0 * ld;
    switch (std::min(kMaxQuads, (rows - r0) / 4)) {
      case 1:
        ShiftedScatter<1>(d, P, ar, ld, off, count, order, dr);
        break;
      case 2:
        ShiftedScatter<2>(d, P, ar, ld, off, count, order, dr);
        break;
      case 3:
        ShiftedScatter<3>(d, P, ar, ld, off, count, order, dr);
        break;
      default:
        ShiftedScatter<4>(d, P, ar, ld, off, count, order, dr);
        break;
    }
  }
}

// Blocked kernels (window_geometry.h, Column): R query vectors block_stride apart. The offsets
// of one column are evenly spaced by that stride, so query k at the column's m-th offset reads
// the same key vector as query k + 1 at offset m - 1: key row u = k + m. One load then feeds up
// to R multiply-adds, where the unblocked kernels above spend one load per multiply-add.

// Query vectors per block and column offsets per dots sweep: R x D = 24 accumulators + R query
// vectors + 1 key vector of AVX-512's 32 registers; (R + (R + D - 1)) / (R D) = 0.54 loads per
// multiply-add.
constexpr size_t kBlockRows = 4;
constexpr size_t kBlockOffsets = 6;
// Blocks (of kBlockRows vectors, block_stride positions apart) down each strip of a head.
template <typename T>
std::int64_t BlocksPerStrip(const WindowGeometry<T>& g) {
  const std::int64_t R = static_cast<std::int64_t>(kBlockRows);
  const std::int64_t V = g.block_stride / g.lanes;
  return (g.vectors + R * V - 1) / (R * V);
}

// Blocks [a_begin, a_begin + blocks) of strip c of head `slot` of a packed group whose first
// (batch, head) pair is group_first: vectors v0 + k V (k < kBlockRows) each.
struct BlockWalk {
  std::int64_t slot, b, h;     // head slot in the packed group, batch, head
  std::int64_t L, V, vectors;  // lanes, vectors per block stride, vectors per head
  std::int64_t c, a_begin, blocks;  // strip, first block, blocks
  template <typename T>
  BlockWalk(const WindowGeometry<T>& g, std::int64_t slot_, std::int64_t strip,
            std::int64_t first_block, std::int64_t block_count, std::int64_t group_first,
            std::int64_t heads)
      : slot(slot_),
        b((group_first + slot_) / heads),
        h((group_first + slot_) % heads),
        L(g.lanes),
        V(g.block_stride / g.lanes),
        vectors(g.vectors),
        c(strip),
        a_begin(first_block),
        blocks(block_count) {}
  // First vector of block a, or -1 past the walk's blocks or the head.
  std::int64_t first(std::int64_t a) const {
    const std::int64_t v0 = a * static_cast<std::int64_t>(kBlockRows) * V + c;
    return a < a_begin + blocks && v0 < vectors ? v0 : -1;
  }
  // Raster position of the first lane of vector k of the block from v0.
  std::int64_t position(std::int64_t v0, size_t k) const {
    return (v0 + static_cast<std::int64_t>(k) * V) * L;
  }
};

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
    // out so, the walk has no test per (row, vector) pair: a diamond's columns (1, 3, .., 15
    // offsets) changed that pattern every few rows; its 128x128 forward, one thread, alternated
    // with the guarded loop twice: 9.6, 9.8 -> 9.4, 8.9 ms (the square's, 15 offsets a column:
    // 15.8, 16.2 -> 15.5, 14.7 ms).
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
// column's 72 stores apart at n = 15) measured within noise of this (128x128 square, one
// thread, 3 rounds: 45.6, 45.2, 46.8 against 51.6, 46.9, 46.8 ms).
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
      // out without the test per pair, as in BlockCombine, it measured the same).
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

// P = exp(S - shift) over the (count, L) scores S in place; returns their lane-wise sum.
template <class D, typename T>
HWY_INLINE hn::Vec<D> ExpInPlace(D d, T* S, size_t count, hn::Vec<D> shift) {
  const size_t L = hn::Lanes(d);
  auto sum0 = hn::Zero(d), sum1 = hn::Zero(d);
  size_t o = 0;
  for (; o + 2 <= count; o += 2) {
    const auto p0 = ExpOf(d, hn::Sub(hn::Load(d, S + o * L), shift));
    const auto p1 = ExpOf(d, hn::Sub(hn::Load(d, S + (o + 1) * L), shift));
    hn::Store(p0, d, S + o * L);
    hn::Store(p1, d, S + (o + 1) * L);
    sum0 = hn::Add(sum0, p0);
    sum1 = hn::Add(sum1, p1);
  }
  if (o < count) {
    const auto p0 = ExpOf(d, hn::Sub(hn::Load(d, S + o * L), shift));
    hn::Store(p0, d, S + o * L);
    sum0 = hn::Add(sum0, p0);
  }
  return hn::Add(sum0, sum1);
}

// The lane-wise max of the (count, L) scores S.
template <class D, typename T>
HWY_INLINE hn::Vec<D> RowMax(D d, const T* S, size_t count) {
  const size_t L = hn::Lanes(d);
  auto m0 = hn::Set(d, -std::numeric_limits<T>::infinity()), m1 = m0;
  size_t o = 0;
  for (; o + 2 <= count; o += 2) {
    m0 = hn::Max(m0, hn::Load(d, S + o * L));
    m1 = hn::Max(m1, hn::Load(d, S + (o + 1) * L));
  }
  if (o < count) m0 = hn::Max(m0, hn::Load(d, S + o * L));
  return hn::Max(m0, m1);
}

// lanes_i, lanes_j (L,) = the pixel row and column of each lane of the vector from query q0; a
// row of -2 * height for lanes past the last query or on a pad column puts them out of reach
// of every offset.
template <class D, typename T>
HWY_INLINE void LanePositions(D d, const WindowGeometry<T>& g, std::int64_t q0, T* lanes_i,
                              T* lanes_j) {
  const std::int64_t N = g.positions();
  // One division, then a walk along the raster, where each lane divided: 16 64-bit divisions
  // per border vector, and a third of a 15x15 window's vectors at 128x128 are border vectors.
  std::int64_t i = q0 / g.pitch, j = q0 % g.pitch;
  for (size_t lane = 0; lane < hn::Lanes(d); ++lane) {
    const std::int64_t n = q0 + static_cast<std::int64_t>(lane);
    lanes_i[lane] = n < N && j < g.width ? static_cast<T>(i) : static_cast<T>(-2 * g.height);
    lanes_j[lane] = static_cast<T>(j);
    if (++j == g.pitch) {
      j = 0;
      ++i;
    }
  }
}

// Sets to -inf the scores S (count, L) of the offsets (dr_of[o], dc_of[o]), o < count, in the
// lanes (positions from LanePositions) whose key at that offset falls outside the map; returns
// their lane-wise max.
template <class D, typename T>
HWY_INLINE hn::Vec<D> MaskOutside(D d, const WindowGeometry<T>& g, const T* dr_of,
                                  const T* dc_of, size_t count, const T* lanes_i,
                                  const T* lanes_j, T* S) {
  const size_t L = hn::Lanes(d);
  const auto neg_inf = hn::Set(d, -std::numeric_limits<T>::infinity());
  const auto i_lo = hn::Sub(hn::Zero(d), hn::Load(d, lanes_i));  // dr >= -i
  const auto i_hi = hn::Sub(hn::Set(d, static_cast<T>(g.height - 1)), hn::Load(d, lanes_i));
  const auto j_lo = hn::Sub(hn::Zero(d), hn::Load(d, lanes_j));
  const auto j_hi = hn::Sub(hn::Set(d, static_cast<T>(g.width - 1)), hn::Load(d, lanes_j));
  auto vmax = neg_inf;
  for (size_t o = 0; o < count; ++o) {
    const auto dr = hn::Set(d, dr_of[o]), dc = hn::Set(d, dc_of[o]);
    const auto inside = hn::And(hn::And(hn::Ge(dr, i_lo), hn::Le(dr, i_hi)),
                                hn::And(hn::Ge(dc, j_lo), hn::Le(dc, j_hi)));
    const auto s = hn::IfThenElse(inside, hn::Load(d, S + o * L), neg_inf);
    hn::Store(s, d, S + o * L);
    vmax = hn::Max(vmax, s);
  }
  return vmax;
}

// dst[(q0 + lane) * s_n + r * s_e] = src[r * L + lane] * scale[lane] for rows r < rows and
// lanes < lanes: rows of L positions, as the kernels keep them, back into a (positions, width)
// tensor; src is scaled in place; scale (L,), or null for none. A contiguous float output
// takes the packing's transpose (the element-wise stores were 5.6% of a 15x15 window's
// backward), with non-temporal stores when stream (cpu/result_stores.h).
template <class D, typename T, typename IO>
HWY_INLINE void StoreLanes(D d, T* src, size_t rows, size_t lanes, const T* scale, IO* dst,
                           std::int64_t q0, std::int64_t s_n, std::int64_t s_e, bool stream) {
  const size_t L = hn::Lanes(d);
  if (scale != nullptr) {
    const auto sv = hn::Load(d, scale);
    for (size_t r = 0; r < rows; ++r) {
      hn::Store(hn::Mul(hn::Load(d, src + r * L), sv), d, src + r * L);
    }
  }
  if constexpr (std::is_same<IO, T>::value) {
    if (s_e == 1) {
      PackTransposed<T, T>(src, Rows{nullptr, 0, rows}, static_cast<std::int64_t>(L), 1, lanes,
                           dst + q0 * s_n, static_cast<size_t>(s_n), rows, stream);
      return;
    }
  }
  for (size_t lane = 0; lane < lanes; ++lane) {
    IO* o = dst + (q0 + static_cast<std::int64_t>(lane)) * s_n;
    for (size_t r = 0; r < rows; ++r) {
      o[static_cast<std::int64_t>(r) * s_e] = Store<IO>(src[r * L + lane]);
    }
  }
}

// Masks the scores Sk (count, L) of the vector from q0, offsets in column order (a blocked
// kernel's), where its keys fall outside the map; returns their lane-wise max when track_max
// (else -inf). Interior vectors need no mask.
template <class D, typename T>
HWY_INLINE hn::Vec<D> MaskBlockVector(D d, const WindowGeometry<T>& g, std::int64_t q0, T* Sk,
                                      T* lanes_i, T* lanes_j, bool track_max) {
  const size_t count = static_cast<size_t>(g.count);
  if (g.interior(q0)) {
    return track_max ? RowMax(d, Sk, count) : hn::Set(d, -std::numeric_limits<T>::infinity());
  }
  LanePositions(d, g, q0, lanes_i, lanes_j);
  return MaskOutside(d, g, g.col_dr.data(), g.col_dc.data(), count, lanes_i, lanes_j, Sk);
}

// Packed heads share one buffer of at most this many bytes, or one head where a head is larger
// (forward: 3.3 MB a head at 128x128 with E = Ev = 16, 13.3 MB at 256x256; backward, with 3 E
// + 3 Ev + 2 rows: 7.2 and 28.5 MB): transient workspace of O(N (E + Ev)). The backward's
// buffer at two 128x128 heads (16 MiB) lifted a training step's peak memory above global
// attention's (30.1 against 21.6 MiB).
constexpr size_t kPackBudgetBytes = size_t{8} << 20;
constexpr std::int64_t kPackChunk = 1024;  // positions per packing task

// Heads packed at once: as many of head_bytes as fit kPackBudgetBytes, at least one.
inline std::int64_t HeadsPerGroup(size_t head_bytes, std::int64_t pairs) {
  return std::clamp<std::int64_t>(static_cast<std::int64_t>(kPackBudgetBytes / head_bytes), 1,
                                  pairs);
}

// The whole-head kernels' run: reserves the packed planes of as many heads as HeadsPerGroup
// allows and each thread's scratch (plan.head_elems, plan.scratch_elems elements of T), sets
// plan.packed and plan.scratch, and calls run_group() once per group of heads, with
// plan.group_first and plan.group_size set.
template <typename T, class Plan, class RunGroup>
Status RunHeadGroups(const Host& host, std::int64_t pairs, const char* op, Plan& plan,
                     RunGroup&& run_group) {
  const std::int64_t group = HeadsPerGroup(plan.head_elems * sizeof(T), pairs);
  const size_t packed = plan.head_elems * static_cast<size_t>(group);
  const size_t threads = static_cast<size_t>(std::max(host.num_threads, 1));
  Workspace ws(host);
  const Status reserved = ws.reserve((packed + plan.scratch_elems * threads) * sizeof(T), op);
  if (!reserved.ok()) return reserved;
  plan.packed = reinterpret_cast<T*>(ws.data());
  plan.scratch = plan.packed + packed;
  for (plan.group_first = 0; plan.group_first < pairs; plan.group_first += group) {
    plan.group_size = std::min(group, pairs - plan.group_first);
    run_group();
  }
  return Status::Ok();
}

// Packing task `task` of a group whose first (batch, head) pair is group_first: head `slot` of
// the group, positions [n0, n0 + count).
struct PackChunk {
  std::int64_t slot, b, h, n0, count;
  PackChunk(std::int64_t task, std::int64_t tasks_per_head, std::int64_t group_first,
            std::int64_t heads, std::int64_t N)
      : slot(task / tasks_per_head),
        b((group_first + slot) / heads),
        h((group_first + slot) % heads),
        n0(task % tasks_per_head * kPackChunk),
        count(std::min(kPackChunk, N - n0)) {}
};

// dst[r * ld + margin + n] = value for rows r < rows in the margins before and after the
// positions, written by the tasks holding the first and the last position.
template <typename T>
HWY_INLINE void FillMargins(const WindowGeometry<T>& g, std::int64_t n0, std::int64_t count,
                            size_t rows, T value, T* dst) {
  const size_t ld = static_cast<size_t>(g.ld);
  const std::int64_t N = g.height * g.width;
  for (size_t r = 0; r < rows; ++r) {
    T* row = dst + r * ld;
    if (n0 == 0) std::fill(row, row + g.margin, value);
    if (n0 + count == N) std::fill(row + g.margin + N, row + ld, value);
  }
}

// The same over the chunk's own columns too.
template <typename T>
HWY_INLINE void FillWindowRows(const WindowGeometry<T>& g, std::int64_t n0, std::int64_t count,
                               size_t rows, T value, T* dst) {
  const size_t ld = static_cast<size_t>(g.ld);
  for (size_t r = 0; r < rows; ++r) {
    std::fill(dst + r * ld + g.margin + n0, dst + r * ld + g.margin + n0 + count, value);
  }
  FillMargins(g, n0, count, rows, value, dst);
}

// Packs positions [n0, n1) of one head's (positions, width) rows from `base` (strides in
// elements, base at (b, h, 0, 0)) into dst (width rows of ld) transposed, at columns n - origin,
// times `scale`; positions outside [0, N) as zeros. Whole-head planes put position n at column
// margin + n (origin -margin, PackWindowRows); the forward's streamed planes at n - origin for
// the origin of the band they follow (window_stream-inl.h).
template <typename T, typename IO>
HWY_INLINE void StreamRows(const IO* base, const std::int64_t* stride, std::int64_t N,
                           std::int64_t n0, std::int64_t n1, size_t width, T* dst, size_t ld,
                           std::int64_t origin, T scale = T(1)) {
  if (n0 >= n1 || width == 0) return;
  const std::int64_t in0 = std::max<std::int64_t>(n0, 0), in1 = std::min(n1, N);  // in the map
  const std::int64_t before = std::min(n1, in0), after = std::max(n0, in1);
  for (size_t r = 0; r < width; ++r) {
    T* row = dst + r * ld;
    std::fill(row + (n0 - origin), row + (before - origin), T(0));
    std::fill(row + (after - origin), row + (n1 - origin), T(0));
  }
  if (in0 >= in1) return;
  const size_t n = static_cast<size_t>(in1 - in0);
  T* chunk = dst + (in0 - origin);
  PackTransposed(base + in0 * stride[2], Rows{nullptr, 0, n}, stride[2], stride[3], width, chunk,
                 ld, n);
  if (scale != T(1)) {
    for (size_t r = 0; r < width; ++r) {
      for (size_t c = 0; c < n; ++c) chunk[r * ld + c] *= scale;
    }
  }
}

// StreamRows for the positions [n0, n1) of g's raster: on a pitched raster a run of each pixel
// row's columns comes from the tensors, and pad columns and rows outside the map are zeros.
template <typename T, typename IO>
HWY_INLINE void StreamPixels(const WindowGeometry<T>& g, const IO* base,
                             const std::int64_t* stride, std::int64_t n0, std::int64_t n1,
                             size_t width, T* dst, size_t ld, std::int64_t origin,
                             T scale = T(1)) {
  if (g.pitch == g.width) {
    StreamRows(base, stride, g.height * g.width, n0, n1, width, dst, ld, origin, scale);
    return;
  }
  g.ForEachRowRun(n0, n1, [&](std::int64_t i, std::int64_t a, std::int64_t b) {
    // Row i's columns a .. b - 1, at plane columns i pitch + j - origin; a row outside the map
    // holds no pixel (N = 0: all zeros).
    const bool in_map = i >= 0 && i < g.height;
    StreamRows(in_map ? base + i * g.width * stride[2] : base, stride, in_map ? g.width : 0, a, b,
               width, dst, ld, origin - i * g.pitch, scale);
  });
}

// Packs positions [n0, n0 + count) of one head's (N, width) rows from `base` (strides in
// elements, base at (b, h, 0, 0)) into dst (rows_pad, ld) transposed and times `scale`, at
// columns margin + n; zeroes the padding rows and the margins.
template <typename T, typename IO>
HWY_INLINE void PackWindowRows(const WindowGeometry<T>& g, const IO* base,
                               const std::int64_t* stride, std::int64_t n0, std::int64_t count,
                               size_t width, size_t rows_pad, T* dst, T scale = T(1)) {
  StreamRows(base, stride, g.height * g.width, n0, n0 + count, width, dst,
             static_cast<size_t>(g.ld), -g.margin, scale);
  FillWindowRows(g, n0, count, rows_pad - width, T(0), dst + width * static_cast<size_t>(g.ld));
  FillMargins(g, n0, count, width, T(0), dst);
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_WINDOW_OPS_INL_H_
