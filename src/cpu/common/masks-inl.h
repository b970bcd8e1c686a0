// Which (query, key) pairs a score tile may hold, per target: a sparse layout's tiles, visits and
// mask words (attn2d/sparse_layout.h), the scores of a visit that allows one key a row, and the
// masking of a score tile by mask bits or by the dense mask (core/strided.h).
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_COMMON_MASKS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_COMMON_MASKS_INL_H_
#undef ATTN2D_SRC_CPU_COMMON_MASKS_INL_H_
#else
#define ATTN2D_SRC_CPU_COMMON_MASKS_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "attn2d/sparse_layout.h"
#include "core/strided.h"
#include "cpu/common/pack-inl.h"
#include "cpu/common/row_ops-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The rows of global query (or key) tile `global`: its leading non-negative entries (validate
// checks that the -1 padding only ends a tile), counted a vector at a time: a branch an entry,
// or a binary search, mispredicts on the partly filled tiles.
HWY_INLINE Rows LayoutTileRows(const SparseLayout& lay, std::int64_t global, bool query) {
  const hn::ScalableTag<std::int32_t> d;
  const size_t L = hn::Lanes(d);
  const size_t block = static_cast<size_t>(query ? lay.block_q : lay.block_k);
  const std::int32_t* idx = (query ? lay.q_rows : lay.k_rows) + global * block;
  size_t count = 0, c = 0;
  for (; c + L <= block; c += L) {
    count += hn::CountTrue(d, hn::Gt(hn::LoadU(d, idx + c), hn::Set(d, -1)));
  }
  for (; c < block; ++c) count += idx[c] >= 0 ? 1 : 0;
  return Rows{idx, 0, count};
}

// Head h's query (or key) tile number `local`: false past the end of its layout's tiles.
HWY_INLINE bool LayoutTile(const SparseLayout& lay, std::int64_t h, std::int64_t local,
                           bool query, std::int64_t* global, Rows* rows) {
  const std::int64_t layout = lay.head_layout[h];
  const std::int64_t* begin = query ? lay.q_tile_begin : lay.k_tile_begin;
  *global = begin[layout] + local;
  if (*global >= begin[layout + 1]) return false;
  *rows = LayoutTileRows(lay, *global, query);
  return true;
}

// Task `task` of a sparse pass (tiles_per_head tasks per (batch, head)): its batch b, head h
// and tile of the head's layout; false when that layout has fewer tiles.
HWY_INLINE bool SparseTaskTile(const SparseLayout& lay, std::int64_t heads,
                               std::int64_t tiles_per_head, std::int64_t task, bool query,
                               std::int64_t* b, std::int64_t* h, std::int64_t* global,
                               Rows* rows) {
  const std::int64_t bh = task / tiles_per_head;
  *b = bh / heads;
  *h = bh % heads;
  return LayoutTile(lay, *h, task % tiles_per_head, query, global, rows);
}

HWY_INLINE const std::uint64_t* MaskWords(const SparseLayout& lay, std::int64_t m) {
  return m < 0 ? nullptr : lay.masks + m * lay.block_q;
}

// The leading columns of a key tile that hold every pair a visit allows: all `cols` for a full
// visit (null words), else up to the highest bit any of its `rows` mask words sets. The layouts
// put the keys a query tile sees partly first (YLG's floor tiles: a tile of 16 positions sees
// the first 16, 32, 48 or 64 keys of its block), so a visit computes 40 columns of 64 on
// average there, where the masked columns past them cost as much as allowed ones.
HWY_INLINE size_t VisitColumns(const std::uint64_t* words, size_t rows, size_t cols) {
  if (words == nullptr) return cols;
  std::uint64_t any = 0;
  for (size_t r = 0; r < rows; ++r) any |= words[r];
  // The layouts' visits hold an allowed pair each (_layout.py lists no other); one with none
  // keeps the whole tile, whose scores are then all masked.
  if (any == 0) return cols;
  return std::min(cols, static_cast<size_t>(64 - __builtin_clzll(any)));
}

// The mask word of a tile's first n (<= 64) columns.
HWY_INLINE std::uint64_t LeadingColumns(size_t n) {
  return n >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << n) - 1;
}

// True when a visit's mask allows at most one key in each of its `rows` rows (false for a full
// visit, null words): the kernels then take each row's one key by itself (VisitSingleKeys,
// SingleKeyGrads) instead of a tile.
HWY_INLINE bool AtMostOneKeyARow(const std::uint64_t* words, size_t rows) {
  if (words == nullptr) return false;
  for (size_t r = 0; r < rows; ++r) {
    if ((words[r] & (words[r] - 1)) != 0) return false;
  }
  return true;
}

// Column c of a visit's one key a row: bit c of the row's word, bits past the tile's `count`
// keys ignored (MaskTileBits masks them too); -1 for a row that sees no key.
HWY_INLINE int SingleKeyColumn(std::uint64_t word, size_t count) {
  const std::uint64_t w = word & LeadingColumns(count);
  return w == 0 ? -1 : __builtin_ctzll(w);
}

// Rows r0 .. r0 + n - 1 of a visit that allows at most one key a row, a vector's worth (lanes):
// key[i] = the key row that row r0 + i sees (-1: none, and for lanes i >= n), col[i] its column
// in the key tile, score[i] = x_i . k_key over E elements (x: packed rows, ldx apart; k: the
// slice's keys, ks_row and ks_col apart), -inf for rows without a key.
template <typename T, typename IO>
HWY_INLINE void SingleKeyScores(const std::uint64_t* words, const Rows& keys, size_t r0, size_t n,
                                size_t lanes, const T* x, size_t ldx, const IO* k,
                                std::int64_t ks_row, std::int64_t ks_col, size_t E, int* col,
                                std::int64_t* key, T* score) {
  for (size_t i = 0; i < lanes; ++i) {
    col[i] = i < n ? SingleKeyColumn(words[r0 + i], keys.count) : -1;
    key[i] = col[i] < 0 ? -1 : keys[static_cast<size_t>(col[i])];
    score[i] = col[i] < 0 ? -std::numeric_limits<T>::infinity()
                          : DotRow(x + (r0 + i) * ldx, k + key[i] * ks_row, E, ks_col);
  }
}

// Masks a gathered tile by its bit rows: key c of row r is allowed when bit c of words[r] is
// set (null words: all allowed); columns in [cols, cols_pad) are padding and always masked.
// One vector of lanes per step (LoadMaskBits of the shifted word): a bit-by-bit scalar loop
// costs as much as the Q*K^T product at E = 16.
template <typename T>
HWY_INLINE void MaskTileBits(T* HWY_RESTRICT S, size_t ld, size_t rows, size_t cols,
                             size_t cols_pad, const std::uint64_t* words) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const hn::ScalableTag<T> d;
  const size_t L = hn::Lanes(d);
  const auto neg_inf = hn::Set(d, kNegInf);
  const std::uint64_t all = LeadingColumns(cols);
  for (size_t r = 0; r < rows; ++r) {
    T* s = S + r * ld;
    for (size_t c = cols; c < cols_pad; ++c) s[c] = kNegInf;
    if (words == nullptr || (words[r] & all) == all) continue;
    const std::uint64_t w = words[r] & all;
    for (size_t c = 0; c < cols_pad; c += L) {
      const std::uint64_t bits = c < 64 ? w >> c : 0;  // cols_pad <= block_k = 64
      std::uint8_t bytes[8];
      std::memcpy(bytes, &bits, sizeof(bytes));
      const auto allowed = hn::LoadMaskBits(d, bytes);
      hn::StoreU(hn::IfThenElse(allowed, hn::LoadU(d, s + c), neg_inf), d, s + c);
    }
  }
}

// Applies the mask to a score tile whose top-left element is (query i0, key j0): columns in
// [cols, cols_pad) are padding past len_k and always masked.
template <typename T>
HWY_INLINE void MaskTile(T* HWY_RESTRICT S, size_t ld, size_t rows, size_t cols, size_t cols_pad,
                         std::int64_t i0, std::int64_t j0, const SliceMask<T>& mask) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  if (cols < cols_pad) {
    for (size_t r = 0; r < rows; ++r) {
      for (size_t c = cols; c < cols_pad; ++c) S[r * ld + c] = kNegInf;
    }
  }
  if (mask.kind == MaskKind::kNone) {
    // Causal: only tiles that straddle the diagonal need work.
    if (!mask.causal || j0 + static_cast<std::int64_t>(cols) - 1 <= i0) return;
    for (size_t r = 0; r < rows; ++r) {
      const std::int64_t first_masked = i0 + static_cast<std::int64_t>(r) + 1 - j0;
      for (std::int64_t c = first_masked < 0 ? 0 : first_masked;
           c < static_cast<std::int64_t>(cols); ++c) {
        S[r * ld + static_cast<size_t>(c)] = kNegInf;
      }
    }
    return;
  }
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) {
      S[r * ld + c] = mask.apply(S[r * ld + c], i0 + static_cast<std::int64_t>(r),
                                 j0 + static_cast<std::int64_t>(c));
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_COMMON_MASKS_INL_H_
