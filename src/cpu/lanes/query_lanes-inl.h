// The sparse forward's visits with the queries along the vector lanes ("query lanes"), for
// float heads up to 256 wide. The tile path (tiled/forward_visits-inl.h, VisitKeyTile) forms a
// block_q x block_k score tile with a GEMM, masks it and reduces each row to its maximum and sum:
// at E = Ev = 16 and YLG's 64-key visits its rows are 4 vectors long, each with two horizontal
// reductions, and masked keys cost as much as allowed ones down to a tile's 16-column
// granularity (YLG's floor heads compute 1.23x their allowed pairs). Here one vector holds L
// query rows (16 floats on AVX-512) and a key is a scalar broadcast into it: score = sum over e
// of q^T[e] * k[e], then exp, then acc^T[c] += p * v[c]. A query row's maximum and sum are lanes
// of vectors (no reductions), a key outside every lane's mask is skipped, and keys are read from
// the tensor's rows as they are, with no packed key tile.
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_LANES_QUERY_LANES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_LANES_QUERY_LANES_INL_H_
#undef ATTN2D_SRC_CPU_LANES_QUERY_LANES_INL_H_
#else
#define ATTN2D_SRC_CPU_LANES_QUERY_LANES_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "attn2d/attention_params.h"
#include "attn2d/sparse_layout.h"
#include "cpu/common/exp-inl.h"
#include "cpu/common/masks-inl.h"
#include "cpu/common/pack-inl.h"
#include "cpu/common/x86_intrinsics-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Which query rows a visit's mask lets see key c: bit c of each lane's mask word, the words
// split into their low and high 32 bits (lanes past the vector's rows hold 0).
template <class D>
struct LaneMaskWords {
  using DU = hn::RebindToUnsigned<D>;
  hn::Vec<DU> lo, hi;
  HWY_INLINE hn::Mask<D> allows(D d, size_t c) const {
    const DU du;
    const auto bit = hn::Set(du, std::uint32_t{1} << (c & 31));
    return hn::RebindMask(d, hn::TestBit(c < 32 ? lo : hi, bit));
  }
};

// s^T[j] (L lanes) = q^T . k_j for kKeys keys j0 .. j0 + kKeys - 1 of the key tile `keys`, in
// the GEMM's order (e ascending, one multiply-add each, from 0: the tile path's scores bit for
// bit), masked lanes -inf when `masks`; returns max(mx, the scores). kKeys chains of 4-cycle
// multiply-adds in flight: 8 cover a Zen 4 core's one 512-bit FMA a cycle twice over.
template <size_t kKeys, class D>
HWY_INLINE hn::Vec<D> LaneScoreKeys(D d, const float* HWY_RESTRICT qt, size_t E, const float* k,
                                    std::int64_t ks_row, std::int64_t ks_col, const Rows& keys,
                                    size_t j0, const LaneMaskWords<D>* masks,
                                    float* HWY_RESTRICT st, hn::Vec<D> mx) {
  const size_t L = hn::Lanes(d);
  const float* row[kKeys];
  hn::Vec<D> s[kKeys];
  for (size_t c = 0; c < kKeys; ++c) {
    row[c] = k + keys[j0 + c] * ks_row;
    s[c] = hn::Zero(d);
  }
  std::int64_t off = 0;
  for (size_t e = 0; e < E; ++e, off += ks_col) {
    const auto q = hn::Load(d, qt + e * L);
    for (size_t c = 0; c < kKeys; ++c) s[c] = hn::MulAdd(q, hn::Set(d, row[c][off]), s[c]);
  }
  const auto neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  for (size_t c = 0; c < kKeys; ++c) {
    if (masks != nullptr) s[c] = hn::IfThenElse(masks->allows(d, j0 + c), s[c], neg_inf);
    hn::Store(s[c], d, st + (j0 + c) * L);
    mx = hn::Max(mx, s[c]);
  }
  return mx;
}

// acc^T[c] = alpha * acc^T[c] + sum over keys j in [j_lo, j_hi] of p^T[j] * v_j[c], for kCols
// columns c0 .. c0 + kCols - 1: kCols independent chains, a broadcast each.
template <size_t kCols, class D>
HWY_INLINE void LaneAccumulate(D d, float* HWY_RESTRICT acct, size_t c0, hn::Vec<D> alpha,
                               const float* HWY_RESTRICT pt, size_t j_lo, size_t j_hi,
                               const float* v, std::int64_t vs_row, std::int64_t vs_col,
                               const Rows& keys) {
  const size_t L = hn::Lanes(d);
  hn::Vec<D> acc[kCols];
  for (size_t c = 0; c < kCols; ++c) acc[c] = hn::Mul(hn::Load(d, acct + (c0 + c) * L), alpha);
  const float* base = v + static_cast<std::int64_t>(c0) * vs_col;
  for (size_t j = j_lo; j <= j_hi; ++j) {
    const auto p = hn::Load(d, pt + j * L);
    const float* row = base + keys[j] * vs_row;
    for (size_t c = 0; c < kCols; ++c) {
      acc[c] = hn::MulAdd(p, hn::Set(d, row[static_cast<std::int64_t>(c) * vs_col]), acc[c]);
    }
  }
  for (size_t c = 0; c < kCols; ++c) hn::Store(acc[c], d, acct + (c0 + c) * L);
}

// dst[c * ld_dst + r] = src[r * ld_src + c] for r < rows, c < cols: PackTransposed over
// consecutive rows (16 x 16 blocks in registers on AVX-512 targets, 8 x 8 on AVX2).
HWY_INLINE void TransposeFloats(const float* HWY_RESTRICT src, size_t ld_src, size_t rows,
                                size_t cols, float* HWY_RESTRICT dst, size_t ld_dst) {
  PackTransposed<float, float>(src, Rows{nullptr, 0, rows}, static_cast<std::int64_t>(ld_src), 1,
                               cols, dst, ld_dst, rows);
}

// Scratch of one thread: q^T (E, L), the scores / probabilities p^T (block_k, L) of one visit,
// acc^T (Ev, L) of one vector of query rows, and a single-key visit's gathered key or value
// rows (L, max(E, Ev)) and their transpose.
struct LaneArrays {
  float *qt, *st, *acct, *rows, *rows_t;
};

// The online-softmax step of one visit, per lane as VisitSingleKeys takes it per row, from the
// lanes' maxima m and the visit's mx: alpha (acc and l are scaled by it) is 0 where nothing was
// visible before and exactly 1 where the maximum did not move; *shift is what the visit's scores
// drop before their exp: a lane that has seen no key yet shifts by 0, so its -inf scores give
// exp(-inf) = 0, never exp(-inf + inf). m becomes the new maxima.
template <class D>
HWY_INLINE hn::Vec<D> LaneRescale(D d, hn::Vec<D>* m, hn::Vec<D> mx, hn::Vec<D>* shift) {
  const auto neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  const auto m_new = hn::Max(*m, mx);
  auto alpha = hn::IfThenElse(hn::Eq(*m, m_new), hn::Set(d, 1.0f), ExpOf(d, hn::Sub(*m, m_new)));
  alpha = hn::IfThenZeroElse(hn::Eq(*m, neg_inf), alpha);
  *shift = hn::IfThenZeroElse(hn::Eq(m_new, neg_inf), m_new);
  *m = m_new;
  return alpha;
}

// dst (L, width) = the rows key[i] of a (positions, width) slice (rs, cs apart), 0 where
// key[i] < 0; then dst_t (width, L) = its transpose.
template <class D>
HWY_INLINE void GatherLaneRows(D d, const float* src, std::int64_t rs, std::int64_t cs,
                               size_t width, const std::int64_t* key, float* HWY_RESTRICT dst,
                               float* HWY_RESTRICT dst_t) {
  const size_t L = hn::Lanes(d);
  for (size_t i = 0; i < L; ++i) {
    float* o = dst + i * width;
    if (key[i] < 0) {
      std::fill(o, o + width, 0.0f);
      continue;
    }
    const float* row = src + key[i] * rs;
    size_t c = 0;
    if (cs == 1) {
      for (; c + L <= width; c += L) hn::StoreU(hn::LoadU(d, row + c), d, o + c);
    }
    for (; c < width; ++c) o[c] = row[static_cast<std::int64_t>(c) * cs];
  }
  TransposeFloats(dst, width, L, width, dst_t, L);
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// LaneSingleKeys' visit where lane i's key is row key0 + i of the slice, or none (a repetitive
// YLG head's own keys: raster query r's is key r mod n, so a vector of raster queries has a run
// of them, less those that are special keys): the run's key and value rows are transposed
// straight from the tensor into registers, 16 columns at a time, where the gathered path copies
// 16 rows of each into scratch and transposes those. The same multiply-adds in the same order:
// the same bits. Lanes without a key take score -inf and
// value 0, as the gathered zero rows give them. Returns false, having done nothing, where the
// keys are no such run or the rows are not whole vectors of 16 contiguous floats.
HWY_INLINE bool LaneRunKeys(const AttentionParams& p, const std::int64_t* key, const float* k,
                            const float* v, const LaneArrays& a, hn::Vec512<float>* m,
                            hn::Vec512<float>* l) {
  const hn::Full512<float> d;
  constexpr size_t L = 16;
  const size_t E = static_cast<size_t>(p.dim_qk), Ev = static_cast<size_t>(p.dim_v);
  if (E % L != 0 || Ev % L != 0 || p.k_stride[3] != 1 || p.v_stride[3] != 1) return false;
  std::int64_t key0 = -1;
  std::uint32_t valid = 0;
  for (size_t i = 0; i < L; ++i) {
    if (key[i] < 0) continue;
    if (key0 < 0) key0 = key[i] - static_cast<std::int64_t>(i);
    if (key[i] != key0 + static_cast<std::int64_t>(i)) return false;
    valid |= 1u << i;
  }
  if (key0 < 0 || key0 + static_cast<std::int64_t>(L) > p.len_k) return false;
  const hn::Mask512<float> has_key{static_cast<__mmask16>(valid)};
  __m512 cols[L];
  auto s = hn::Zero(d);
  for (size_t c0 = 0; c0 < E; c0 += L) {
    Transpose16x16ToRegisters(k + key0 * p.k_stride[2] + c0, p.k_stride[2], cols);
    for (size_t e = 0; e < L; ++e) {
      s = hn::MulAdd(hn::Load(d, a.qt + (c0 + e) * L), hn::Vec512<float>{cols[e]}, s);
    }
  }
  s = hn::IfThenElse(has_key, s, hn::Set(d, -std::numeric_limits<float>::infinity()));
  hn::Vec512<float> shift;
  const auto alpha = LaneRescale(d, m, s, &shift);
  const auto pr = ExpOf(d, hn::Sub(s, shift));
  *l = hn::MulAdd(*l, alpha, pr);
  for (size_t c0 = 0; c0 < Ev; c0 += L) {
    Transpose16x16ToRegisters(v + key0 * p.v_stride[2] + c0, p.v_stride[2], cols);
    for (size_t c = 0; c < L; ++c) {
      float* acc = a.acct + (c0 + c) * L;
      const auto value = hn::IfThenElseZero(has_key, hn::Vec512<float>{cols[c]});
      hn::Store(hn::MulAdd(pr, value, hn::Mul(hn::Load(d, acc), alpha)), d, acc);
    }
  }
  return true;
}
#endif

// A visit that allows at most one key a row (a repetitive YLG head's own-position keys) for the
// rows r0 .. r0 + n - 1: each lane's key and value rows are gathered and transposed, so that a
// lane's score is q . k over E in the GEMM's order and its value row joins acc^T as whole
// vectors, and every visit runs on the lanes' state. It costs about what VisitSingleKeys (a
// reduction and a row update per query, on the row-major state) costs, most of it the gathered
// rows' loads.
template <class D>
HWY_INLINE void LaneSingleKeys(D d, const AttentionParams& p, const std::uint64_t* words,
                               const Rows& keys, size_t r0, size_t n, const float* k,
                               const float* v, const LaneArrays& a, hn::Vec<D>* m,
                               hn::Vec<D>* l) {
  const size_t L = hn::Lanes(d);
  const size_t E = static_cast<size_t>(p.dim_qk), Ev = static_cast<size_t>(p.dim_v);
  std::int64_t key[HWY_MAX_BYTES / sizeof(float)];
  HWY_ALIGN float none[HWY_MAX_BYTES / sizeof(float)];  // -inf for a lane without a key
  for (size_t i = 0; i < L; ++i) {
    const int col = i < n ? SingleKeyColumn(words[r0 + i], keys.count) : -1;
    key[i] = col < 0 ? -1 : keys[static_cast<size_t>(col)];
    none[i] = col < 0 ? -std::numeric_limits<float>::infinity() : 0.0f;
  }
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (std::is_same<hn::Vec<D>, hn::Vec512<float>>::value) {
    if (LaneRunKeys(p, key, k, v, a, m, l)) return;
  }
#endif
  GatherLaneRows(d, k, p.k_stride[2], p.k_stride[3], E, key, a.rows, a.rows_t);
  auto s = hn::Zero(d);
  for (size_t e = 0; e < E; ++e) {
    s = hn::MulAdd(hn::Load(d, a.qt + e * L), hn::Load(d, a.rows_t + e * L), s);
  }
  // A lane without a key gathered zeros: its finite score + -inf is -inf; a NaN score stays NaN.
  s = hn::Add(s, hn::Load(d, none));
  hn::Vec<D> shift;
  const auto alpha = LaneRescale(d, m, s, &shift);
  const auto pr = ExpOf(d, hn::Sub(s, shift));
  *l = hn::MulAdd(*l, alpha, pr);
  GatherLaneRows(d, v, p.v_stride[2], p.v_stride[3], Ev, key, a.rows, a.rows_t);
  for (size_t c = 0; c < Ev; ++c) {
    float* acc = a.acct + c * L;
    hn::Store(hn::MulAdd(pr, hn::Load(d, a.rows_t + c * L), hn::Mul(hn::Load(d, acc), alpha)), d,
              acc);
  }
}

// Where a vector of query rows starts: its m, l and acc rows, a vector's worth, in the tile
// path's row-major arrays (FinishQueryTile takes them from there).
struct LaneRowState {
  float* m;
  float* l;
  float* acc;  // (L, ld_acc)
  size_t ld_acc;
};

// Every visit of query tile `g` (global; `tile_rows` rows) for its rows r0 .. r0 + n - 1
// (n <= L), whose scaled q^T (E, L; zero past n) is in a.qt: acc^T in a.acct and the lanes'
// running max *m and sum *l, unnormalised. Out of line: inlined into LaneDirectVisits, whose
// 16 x 16 transposes hold 32 vectors, GCC 12 keeps the score pass's key-row pointers in vector
// registers, a move back for each multiply-add.
template <class D>
HWY_NOINLINE void LaneVisits(D d, const AttentionParams& p, const SparseLayout& lay,
                             std::int64_t g, size_t tile_rows, const float* k, const float* v,
                             size_t r0, size_t n, const LaneArrays& a, hn::Vec<D>* m_out,
                             hn::Vec<D>* l_out) {
  const size_t L = hn::Lanes(d);
  const size_t E = static_cast<size_t>(p.dim_qk), Ev = static_cast<size_t>(p.dim_v);
  const auto neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  std::fill(a.acct, a.acct + Ev * L, 0.0f);
  auto m = neg_inf;
  auto l = hn::Zero(d);
  for (std::int64_t visit = lay.fwd_begin[g]; visit < lay.fwd_begin[g + 1]; ++visit) {
    const std::uint64_t* words = MaskWords(lay, lay.fwd_mask[visit]);
    const Rows keys = LayoutTileRows(lay, lay.fwd_k_tile[visit], /*query=*/false);
    if (AtMostOneKeyARow(words, tile_rows)) {
      LaneSingleKeys(d, p, words, keys, r0, n, k, v, a, &m, &l);
      continue;
    }
    size_t j_lo = 0, j_hi = keys.count - 1;
    LaneMaskWords<D> masks;
    std::uint64_t every = ~std::uint64_t{0};
    if (words != nullptr) {
      // The keys some row of this vector may see: a floor head's vector of 4 positions sees
      // the first 4, 8, ..., 64 keys of its block.
      const std::uint64_t all = LeadingColumns(keys.count);
      HWY_ALIGN std::uint32_t lo[HWY_MAX_BYTES / sizeof(float)];
      HWY_ALIGN std::uint32_t hi[HWY_MAX_BYTES / sizeof(float)];
      std::uint64_t any = 0;
      for (size_t i = 0; i < L; ++i) {
        const std::uint64_t w = i < n ? words[r0 + i] & all : 0;
        any |= w;
        if (i < n) every &= w;
        lo[i] = static_cast<std::uint32_t>(w);
        hi[i] = static_cast<std::uint32_t>(w >> 32);
      }
      if (any == 0) continue;
      j_lo = static_cast<size_t>(__builtin_ctzll(any));
      j_hi = static_cast<size_t>(63 - __builtin_clzll(any));
      const typename LaneMaskWords<D>::DU du;
      masks.lo = hn::Load(du, lo);
      masks.hi = hn::Load(du, hi);
    }
    const LaneMaskWords<D>* lane_masks = words != nullptr ? &masks : nullptr;
    // The masks of keys j .. j + count - 1, or none where every row of the vector sees them all:
    // a floor head's vector of 4 positions p .. p + 3 sees keys up to p, all but its last 3,
    // which then need no blend.
    auto masks_of = [&](size_t j, size_t count) {
      const std::uint64_t run = ((std::uint64_t{1} << count) - 1) << j;
      return (every & run) == run ? nullptr : lane_masks;
    };
    auto mx = neg_inf;
    size_t j = j_lo;
    for (; j + 8 <= j_hi + 1; j += 8) {
      mx = LaneScoreKeys<8>(d, a.qt, E, k, p.k_stride[2], p.k_stride[3], keys, j, masks_of(j, 8),
                            a.st, mx);
    }
    if (j + 4 <= j_hi + 1) {
      mx = LaneScoreKeys<4>(d, a.qt, E, k, p.k_stride[2], p.k_stride[3], keys, j, masks_of(j, 4),
                            a.st, mx);
      j += 4;
    }
    for (; j <= j_hi; ++j) {
      mx = LaneScoreKeys<1>(d, a.qt, E, k, p.k_stride[2], p.k_stride[3], keys, j, masks_of(j, 1),
                            a.st, mx);
    }
    hn::Vec<D> shift;
    const auto alpha = LaneRescale(d, &m, mx, &shift);
    auto sum = hn::Zero(d);
    for (size_t c = j_lo; c <= j_hi; ++c) {
      const auto pr = ExpOf(d, hn::Sub(hn::Load(d, a.st + c * L), shift));
      sum = hn::Add(sum, pr);
      hn::Store(pr, d, a.st + c * L);
    }
    l = hn::MulAdd(l, alpha, sum);
    size_t c0 = 0;
    for (; c0 + 8 <= Ev; c0 += 8) {
      LaneAccumulate<8>(d, a.acct, c0, alpha, a.st, j_lo, j_hi, v, p.v_stride[2], p.v_stride[3],
                        keys);
    }
    for (; c0 < Ev; ++c0) {
      LaneAccumulate<1>(d, a.acct, c0, alpha, a.st, j_lo, j_hi, v, p.v_stride[2], p.v_stride[3],
                        keys);
    }
  }
  *m_out = m;
  *l_out = l;
}

// LaneVisits for the rows r0 .. r0 + n - 1 of query tile `g` from q (their packed, scaled rows,
// ld E, zero past n) -> the rows' m, l and acc in `state`, unnormalised, as the tile path leaves
// them for FinishQueryTile.
template <class D>
HWY_INLINE void LaneQueryVisits(D d, const AttentionParams& p, const SparseLayout& lay,
                                std::int64_t g, size_t tile_rows, const float* k, const float* v,
                                size_t r0, size_t n, const float* q, const LaneArrays& a,
                                const LaneRowState& state) {
  const size_t L = hn::Lanes(d);
  const size_t E = static_cast<size_t>(p.dim_qk), Ev = static_cast<size_t>(p.dim_v);
  TransposeFloats(q, E, L, E, a.qt, L);
  hn::Vec<D> m, l;
  LaneVisits(d, p, lay, g, tile_rows, k, v, r0, n, a, &m, &l);
  hn::Store(m, d, state.m);
  hn::Store(l, d, state.l);
  TransposeFloats(a.acct, L, Ev, L, state.acc, state.ld_acc);
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// Whether LaneDirectVisits takes a float task: q and out rows whole vectors of 16 contiguous
// floats.
HWY_INLINE bool LaneDirectRows(const AttentionParams& p) {
  return p.dim_qk % 16 == 0 && p.dim_v % 16 == 0 && p.q_stride[3] == 1 && p.out_stride[3] == 1;
}

// LaneVisits for 16 query rows (n of them; row[i] their positions in the slice) read from and
// written to the tensors: q^T = scale * q transposed straight from the rows, and the output rows
// (acc times 1 / l, 0 for a row that saw no key) and log-sum-exps written straight from acc^T,
// m and l. LaneQueryVisits packs the rows (PackRows), transposes the packed copy, transposes
// acc^T back to row-major state and FinishQueryTile then reads that: of those passes only the
// multiply and the stores remain here. The same products, the same bits.
HWY_INLINE void LaneDirectVisits(const AttentionParams& p, const SparseLayout& lay,
                                 std::int64_t g, size_t tile_rows, const float* q, float* out,
                                 float* lse, const float* k, const float* v, size_t r0, size_t n,
                                 const std::int64_t* row, const LaneArrays& a) {
  const hn::Full512<float> d;
  constexpr size_t L = 16;
  const size_t E = static_cast<size_t>(p.dim_qk), Ev = static_cast<size_t>(p.dim_v);
  __m512 r[L], t[L];
  const __m512 scale = _mm512_set1_ps(static_cast<float>(p.scale));
  for (size_t c0 = 0; c0 < E; c0 += L) {
    for (size_t i = 0; i < L; ++i) {
      r[i] = i < n ? _mm512_loadu_ps(q + row[i] * p.q_stride[2] + c0) : _mm512_setzero_ps();
    }
    Transpose16x16InRegisters(r, t);
    for (size_t c = 0; c < L; ++c) _mm512_store_ps(a.qt + (c0 + c) * L, _mm512_mul_ps(t[c], scale));
  }
  hn::Vec512<float> m, l;
  LaneVisits(d, p, lay, g, tile_rows, k, v, r0, n, a, &m, &l);
  const auto empty = hn::Eq(m, hn::Set(d, -std::numeric_limits<float>::infinity()));
  const auto inv_l = hn::IfThenZeroElse(empty, hn::Div(hn::Set(d, 1.0f), l));
  for (size_t c0 = 0; c0 < Ev; c0 += L) {
    for (size_t c = 0; c < L; ++c) r[c] = hn::Mul(hn::Load(d, a.acct + (c0 + c) * L), inv_l).raw;
    Transpose16x16InRegisters(r, t);
    for (size_t i = 0; i < n; ++i) _mm512_storeu_ps(out + row[i] * p.out_stride[2] + c0, t[i]);
  }
  if (lse != nullptr) {
    HWY_ALIGN float log_sum[L];
    hn::Store(LogSumExp(d, m, l), d, log_sum);
    for (size_t i = 0; i < n; ++i) lse[row[i] * p.lse_stride[2]] = log_sum[i];
  }
}
#endif

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_LANES_QUERY_LANES_INL_H_
