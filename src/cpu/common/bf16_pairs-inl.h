// bf16 pair packing for the AVX512-BF16 products (bf16_pairs_avx512.h), per target: tiles of
// 32-bit words, each two bf16 values adjacent along the product's reduction. Built on the AVX-512
// targets when the compiler has the instruction; the kernels use it only where the CPU does.
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_COMMON_BF16_PAIRS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_COMMON_BF16_PAIRS_INL_H_
#undef ATTN2D_SRC_CPU_COMMON_BF16_PAIRS_INL_H_
#else
#define ATTN2D_SRC_CPU_COMMON_BF16_PAIRS_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu/common/bf16_pairs_avx512.h"
#include "cpu/common/half.h"
#include "cpu/common/pack-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if defined(ATTN2D_HAVE_AVX512_BF16) && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL)
inline std::uint32_t Bf16Pair(BFloat16 lo, BFloat16 hi) {
  return static_cast<std::uint32_t>(lo.bits) | static_cast<std::uint32_t>(hi.bits) << 16;
}

// Element c of row r, or 0 past the width: a pair's missing high half when the width is odd.
inline BFloat16 ElementOrZero(const BFloat16* row, std::int64_t cs, size_t c, size_t width) {
  return c < width ? row[static_cast<std::int64_t>(c) * cs] : BFloat16{0};
}

// dst[r * W + w] = (q[r][2w], q[r][2w + 1]) for the tile's rows, W = ceil(E / 2).
inline void PackQueryPairs(const BFloat16* base, const Rows& rows, std::int64_t rs,
                           std::int64_t cs, size_t E, std::uint32_t* dst) {
  const size_t W = (E + 1) / 2;
  for (size_t r = 0; r < rows.count; ++r) {
    const BFloat16* s = base + rows[r] * rs;
    if (cs == 1 && E % 2 == 0) {
      std::memcpy(dst + r * W, s, E * sizeof(BFloat16));
      continue;
    }
    for (size_t w = 0; w < W; ++w) {
      dst[r * W + w] = Bf16Pair(ElementOrZero(s, cs, 2 * w, E), ElementOrZero(s, cs, 2 * w + 1, E));
    }
  }
}

// S (rows x cols_pad, row stride ld_s) = scale * Q K^T from q pairs (rows x W) and K^T pairs
// (W x ld_kt): the scores of both passes, so the backward recomputes exactly the forward's.
inline void PairScores(size_t rows, size_t cols_pad, size_t W, const std::uint32_t* q2,
                       const std::uint32_t* kt2, size_t ld_kt, float scale, float* S,
                       size_t ld_s) {
  gemm_bf16_pairs(false, rows, cols_pad, W, q2, W, kt2, ld_kt, S, ld_s, scale);
}

// dst[w * ld + n] = (k[n][2w], k[n][2w + 1]); zero for n in [keys.count, cols_pad). Rows of an
// even width, stored contiguously at 4-byte alignment, are already pair words: transposed as
// floats (bit moves only).
inline void PackKeyPairsTransposed(const BFloat16* base, const Rows& keys, std::int64_t rs,
                                   std::int64_t cs, size_t E, std::uint32_t* dst, size_t ld,
                                   size_t cols_pad) {
  const size_t W = (E + 1) / 2;
  if (cs == 1 && E % 2 == 0 && rs % 2 == 0 && reinterpret_cast<std::uintptr_t>(base) % 4 == 0) {
    PackTransposed<float, float>(reinterpret_cast<const float*>(base), keys, rs / 2, 1, W,
                                 reinterpret_cast<float*>(dst), ld, cols_pad);
    return;
  }
  for (size_t n = 0; n < keys.count; ++n) {
    const BFloat16* s = base + keys[n] * rs;
    for (size_t w = 0; w < W; ++w) {
      dst[w * ld + n] = Bf16Pair(ElementOrZero(s, cs, 2 * w, E), ElementOrZero(s, cs, 2 * w + 1, E));
    }
  }
  for (size_t w = 0; w < W; ++w) {
    for (size_t n = keys.count; n < cols_pad; ++n) dst[w * ld + n] = 0;
  }
}

// dst[w * ld + e] = (x[2w][e], x[2w + 1][e]) for w < pairs: bf16 rows paired along the row axis
// (V and K along the keys, q and dO along the queries). Zero high halves for a missing row
// 2w + 1, zero words past the rows and for e in [width, ld).
inline void PackRowPairs(const BFloat16* base, const Rows& rows, std::int64_t rs, std::int64_t cs,
                         size_t width, size_t ld, size_t pairs, std::uint32_t* dst) {
  for (size_t w = 0; w < pairs; ++w) {
    std::uint32_t* o = dst + w * ld;
    if (2 * w >= rows.count) {
      std::fill(o, o + ld, 0u);
      continue;
    }
    const BFloat16* a = base + rows[2 * w] * rs;
    const BFloat16* b = 2 * w + 1 < rows.count ? base + rows[2 * w + 1] * rs : nullptr;
    if (cs == 1) {
      interleave_bf16_rows(&a->bits, b == nullptr ? nullptr : &b->bits, width, o);
    } else {
      for (size_t e = 0; e < width; ++e) {
        const std::int64_t off = static_cast<std::int64_t>(e) * cs;
        o[e] = Bf16Pair(a[off], b == nullptr ? BFloat16{0} : b[off]);
      }
    }
    std::fill(o + width, o + ld, 0u);
  }
}

#endif

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_COMMON_BF16_PAIRS_INL_H_
