// Packing, per target: strided tensor slices into dense tiles and back, the kernels' only reads
// and writes of user memory, with the cache-line requests that hide a gathered tile's rows.
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_COMMON_PACK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_COMMON_PACK_INL_H_
#undef ATTN2D_SRC_CPU_COMMON_PACK_INL_H_
#else
#define ATTN2D_SRC_CPU_COMMON_PACK_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "cpu/common/half.h"
#include "cpu/common/x86_intrinsics-inl.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Which rows of a (len, width) tensor slice a tile holds: `count` consecutive rows from `first`
// (dense attention), or listed ones (a gathered tile of a sparse pattern).
struct Rows {
  const std::int32_t* index = nullptr;  // (count,) row numbers; null: consecutive
  std::int64_t first = 0;
  size_t count = 0;
  std::int64_t operator[](size_t r) const {
    return index != nullptr ? index[r] : first + static_cast<std::int64_t>(r);
  }
};

// Element (r, c) of a tile is base[rows[r] * rs + c * cs]. The loops walk the source along its
// smaller stride: an NCHW conv output viewed as (L, d) has stride 1 along L and H*W along d, so
// walking d first would touch one cache line (and at 256x256 one page) per element.

// Where a request puts its lines: kL1 for rows read right away; kL2 for rows a later task or a
// later block reads. Requests a task ahead into L1 evict the task's own arrays: a sparse forward
// task's scores, packed tiles and accumulators take ~41 KiB, over a 32 KiB L1 (on an AMD EPYC
// Zen 4, requesting the next tile's rows into L2 rather than L1 made YLG's forward 9-14% faster;
// PrefetchQueryTile, tiled/tiled_forward.cc).
enum class PrefetchTo : int { kL2 = 2, kL1 = 3 };

// Requests the cache lines of rows `rows` of a (positions, width) tensor view (base at the head's
// position 0, strides in elements), for writing when kWrite: up to 4 lines (256 bytes) of each
// row, where a row's elements are contiguous (cs == 1; a strided view's elements lie one line
// apart each, and are left to the copy).
template <bool kWrite, PrefetchTo kTo = PrefetchTo::kL1, typename IO>
HWY_INLINE void PrefetchRows(const IO* base, const Rows& rows, std::int64_t rs, std::int64_t cs,
                             size_t width) {
  if (cs != 1) return;
  const size_t lines = std::min<size_t>((width * sizeof(IO) + 63) / 64, 4);
  for (size_t r = 0; r < rows.count; ++r) {
    const char* row = reinterpret_cast<const char*>(base + rows[r] * rs);
    for (size_t i = 0; i < lines; ++i) {
      __builtin_prefetch(row + 64 * i, kWrite ? 1 : 0, static_cast<int>(kTo));
    }
  }
}

// dst[r * ld + c] = alpha * element(r, c) for r < rows.count, c < cols; zero for c in
// [cols, ld) and for r in [rows.count, rows_pad). Elements are stored as IO (T, or a 16-bit
// type widened here) and packed as the compute type T.
template <typename T, typename IO>
HWY_INLINE void PackRows(const IO* HWY_RESTRICT base, const Rows& rows, std::int64_t rs,
                         std::int64_t cs, size_t cols, T alpha, T* HWY_RESTRICT dst, size_t ld,
                         size_t rows_pad) {
  const size_t n = rows.count;
  if (cs != 1 && std::abs(rs) < std::abs(cs)) {
    for (size_t c = 0; c < cols; ++c) {
      const IO* s = base + static_cast<std::int64_t>(c) * cs;
      for (size_t r = 0; r < n; ++r) dst[r * ld + c] = alpha * Load<T>(s[rows[r] * rs]);
    }
  } else {
    // Gathered rows (a sparse tile's) are scattered over the head: every row's line is
    // requested before the first is copied, so that the rows' misses overlap.
    if (rows.index != nullptr) PrefetchRows<false>(base, rows, rs, cs, cols);
    for (size_t r = 0; r < n; ++r) {
      const IO* s = base + rows[r] * rs;
      if (cs == 1) {
        size_t c = 0;
        if constexpr (std::is_same<IO, T>::value) {
          // Whole vectors: with alpha = 1 GCC turned the element loop into a memmove call per
          // row (64 bytes at E = 16).
          const hn::ScalableTag<T> d;
          const size_t L = hn::Lanes(d);
          const auto va = hn::Set(d, alpha);
          for (; c + L <= cols; c += L) {
            hn::StoreU(hn::Mul(hn::LoadU(d, s + c), va), d, dst + r * ld + c);
          }
        }
        for (; c < cols; ++c) dst[r * ld + c] = alpha * Load<T>(s[c]);
      } else {
        for (size_t c = 0; c < cols; ++c) {
          dst[r * ld + c] = alpha * Load<T>(s[static_cast<std::int64_t>(c) * cs]);
        }
      }
    }
  }
  for (size_t r = 0; r < n; ++r) {
    for (size_t c = cols; c < ld; ++c) dst[r * ld + c] = T(0);
  }
  for (size_t r = n; r < rows_pad; ++r) {
    for (size_t c = 0; c < ld; ++c) dst[r * ld + c] = T(0);
  }
}

// How far ahead PackTransposed requests its source rows: with 16 rows of stores in flight to
// 16 destination rows, the hardware prefetcher does not keep up with the source; 6 KiB ahead is
// the best distance measured. The requests go to L2 (PrefetchTo::kL2), where they do not evict
// the rows being packed (on an AMD EPYC Zen 4 the window forwards ran 2-5% faster than with
// requests into L1).
constexpr size_t kPackPrefetchBytes = 6144;

// dst[c * ld + r] = element(r, c) for r < rows.count, c < cols; zero for r in
// [rows.count, rows_pad). stream (a result past the caches, result_stores.h): the whole
// 64-byte rows of 16 x 16 blocks are written with non-temporal stores where dst's rows are
// aligned, and the stores are fenced before returning, so that another thread that learns of
// the task's end sees them.
template <typename T, typename IO>
HWY_INLINE void PackTransposed(const IO* HWY_RESTRICT base, const Rows& rows, std::int64_t rs,
                               std::int64_t cs, size_t cols, T* HWY_RESTRICT dst, size_t ld,
                               size_t rows_pad, bool stream = false) {
  const size_t n = rows.count;
  if (std::abs(rs) < std::abs(cs)) {
    for (size_t c = 0; c < cols; ++c) {
      const IO* s = base + static_cast<std::int64_t>(c) * cs;
      T* o = dst + c * ld;
      for (size_t r = 0; r < n; ++r) o[r] = Load<T>(s[rows[r] * rs]);
    }
  } else {
    // 8 x 8 blocks: a whole key tile (64 x 256 floats = 64 KiB) outgrows a 48 KiB L1, so a
    // row-by-row walk, whose stores stride by ld, misses on nearly every store; a block touches
    // 8 source and 8 destination lines. Rows [r0, r1) (at most 8), columns from c_begin.
    constexpr size_t kBlock = 8;
    auto blocks8 = [&](size_t r0, size_t r1, size_t c_begin) {
      const IO* src[kBlock];
      for (size_t r = r0; r < r1; ++r) src[r - r0] = base + rows[r] * rs;
      for (size_t c0 = c_begin; c0 < cols; c0 += kBlock) {
        const size_t c1 = std::min(cols, c0 + kBlock);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
        if constexpr (std::is_same<T, float>::value && std::is_same<IO, float>::value) {
          if (cs == 1 && r1 - r0 == kBlock && c1 - c0 == kBlock) {
            Transpose8x8(src, c0, dst + c0 * ld + r0, ld);
            continue;
          }
        }
#endif
        for (size_t c = c0; c < c1; ++c) {
          T* o = dst + c * ld;
          const std::int64_t off = static_cast<std::int64_t>(c) * cs;
          for (size_t r = r0; r < r1; ++r) o[r] = Load<T>(src[r - r0][off]);
        }
      }
    };
    size_t r_begin = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    if constexpr (std::is_same<T, float>::value && std::is_same<IO, float>::value) {
      if (cs == 1 && cols >= 16 && rows.index == nullptr) {
        constexpr size_t kWide = 16;
        const bool aligned = reinterpret_cast<std::uintptr_t>(dst) % 64 == 0 && ld % kWide == 0;
        const size_t c_full = cols / kWide * kWide;
        // Rows ahead of the 16 being packed to request (a multiple of 16, at least 16).
        const size_t ahead = std::max<size_t>(
            kWide, kPackPrefetchBytes / (static_cast<size_t>(std::abs(rs)) * sizeof(float)) /
                       kWide * kWide);
        for (; r_begin + kWide <= n; r_begin += kWide) {
          const float* src = base + rows[r_begin] * rs;
          if (r_begin + ahead + kWide <= n) {
            PrefetchRows<false, PrefetchTo::kL2>(base, Rows{nullptr, rows[r_begin + ahead], kWide},
                                                 rs, 1, cols);
          }
          for (size_t c0 = 0; c0 < c_full; c0 += kWide) {
            Transpose16x16(src + c0, rs, dst + c0 * ld + r_begin, ld, stream && aligned);
          }
          if (c_full < cols) {
            blocks8(r_begin, r_begin + kBlock, c_full);
            blocks8(r_begin + kBlock, r_begin + kWide, c_full);
          }
        }
      }
    }
#endif
    for (size_t r0 = r_begin; r0 < n; r0 += kBlock) blocks8(r0, std::min(n, r0 + kBlock), 0);
  }
  for (size_t c = 0; c < cols; ++c) {
    for (size_t r = n; r < rows_pad; ++r) dst[c * ld + r] = T(0);
  }
  if (stream) hwy::FlushStream();
}

// element(r, c) = alpha * src[r * ld + c] for r < rows.count, c < cols: the inverse of PackRows,
// rounding once to the storage type. src's rows are read in whole vectors: ld >= cols rounded up
// to the vector length. Contiguous rows of the compute type are stored a vector at a time; a
// sparse layout's dQ rows, stored by gathered tiles, wait on their scattered lines unless stream
// (a result past the caches, result_stores.h) writes rows of whole vectors that start on a
// vector boundary with non-temporal stores, fenced before returning.
template <typename T, typename IO>
HWY_INLINE void StoreTile(const T* HWY_RESTRICT src, size_t ld, const Rows& rows, size_t cols,
                          T alpha, IO* HWY_RESTRICT base, std::int64_t rs, std::int64_t cs,
                          bool stream) {
  if constexpr (std::is_same<IO, T>::value) {
    if (cs == 1) {
      const hn::ScalableTag<T> d;
      const size_t L = hn::Lanes(d);
      const auto va = hn::Set(d, alpha);
      const size_t vector_bytes = L * sizeof(T);
      const bool whole = stream && cols % L == 0 &&
                         reinterpret_cast<std::uintptr_t>(base) % vector_bytes == 0 &&
                         (rs * sizeof(T)) % vector_bytes == 0;
      for (size_t r = 0; r < rows.count; ++r) {
        IO* o = base + rows[r] * rs;
        const T* s = src + r * ld;
        size_t c = 0;
        if (whole) {
          for (; c < cols; c += L) hn::Stream(hn::Mul(hn::LoadU(d, s + c), va), d, o + c);
          continue;
        }
        for (; c + L <= cols; c += L) hn::StoreU(hn::Mul(hn::LoadU(d, s + c), va), d, o + c);
        if (c < cols) {
          hn::BlendedStore(hn::Mul(hn::LoadU(d, s + c), va), hn::FirstN(d, cols - c), d, o + c);
        }
      }
      if (whole) hwy::FlushStream();
      return;
    }
  }
  for (size_t r = 0; r < rows.count; ++r) {
    IO* o = base + rows[r] * rs;
    for (size_t c = 0; c < cols; ++c) {
      o[static_cast<std::int64_t>(c) * cs] = Store<IO>(alpha * src[r * ld + c]);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_COMMON_PACK_INL_H_
