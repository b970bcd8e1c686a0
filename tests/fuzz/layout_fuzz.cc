// libFuzzer target: the sparse-layout validator (attn2d/sparse_layout.h, validate_layout in
// src/core/validate.cc) and the kernels behind it. The input builds a layout the way the
// Python builder does (rows partitioned into tiles, visits, mask words, the backward lists
// transposed) and then edits any of its arrays, so that both well-formed layouts and every kind
// of malformed one reach the validator. Each array is allocated to exactly the length its
// declared sizes give (sparse_layout.h), so a read past it is a sanitizer report. Where the
// validator accepts and the problem is small, the chooser, the forward and the backward run.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "fuzz_util.h"

namespace attn2d {
namespace fuzz {
namespace {

// Rows a structured build lays out at most; longer sequences get tiles of arbitrary rows.
constexpr std::int64_t kMaxRows = 320;
// Longest array the harness gives: a longer declared length is not a layout anyone can pass.
constexpr std::int64_t kMaxArray = 1 << 16;

template <typename T>
struct Array {
  std::vector<T> values;
  std::unique_ptr<T[]> exact;  // the values, in an allocation of exactly the declared length
  bool null = false;

  // Copies the values to `length` elements (padding with `pad`); false where the length is
  // impossible.
  bool seal(std::int64_t length, T pad) {
    if (length < 0 || length > kMaxArray) return false;
    exact.reset(new T[static_cast<std::size_t>(length)]);
    for (std::int64_t i = 0; i < length; ++i) {
      exact[static_cast<std::size_t>(i)] =
          i < static_cast<std::int64_t>(values.size()) ? values[static_cast<std::size_t>(i)] : pad;
    }
    return true;
  }
  const T* data() const { return null ? nullptr : exact.get(); }
};

std::int64_t edit_value(Input& in) {
  switch (in.below(4)) {
    case 0:
      return -1;
    case 1:
      return in.raw<std::int32_t>();
    default:
      return static_cast<std::int64_t>(in.byte()) - 8;
  }
}

void run(Input& in) {
  AttentionParams p;
  p.dtype = static_cast<DType>(in.below(4));
  const std::uint8_t flags = in.byte();
  const bool backward = flags & 1;
  const bool wild = flags & 2;
  if (flags & 4) p.is_causal = true;  // excluded by a layout
  if (flags & 8) p.mask_kind = MaskKind::kBool;
  p.batch = 1 + in.below(2);
  p.heads = 1 + in.below(3);
  p.len_q = in.size();
  p.len_k = in.size();
  p.dim_qk = in.below(9);
  p.dim_v = in.below(9);
  p.scale = 0.5;

  SparseLayout lay;
  const std::uint8_t bq = in.byte();
  lay.block_q = bq < 0xF0 ? 4 * (1 + bq % 64) : in.size();
  lay.block_k = in.byte() < 0xF0 ? 64 : in.size();
  const std::uint8_t nl = in.byte();
  lay.num_layouts = nl < 0xF0 ? 1 + nl % 3 : in.size();
  if (lay.num_layouts > 8) return;  // no arrays that long to give
  const std::int64_t layouts = std::max<std::int64_t>(lay.num_layouts, 0);
  // Tiles of these blocks can be built; others reach the validator with whatever the edits make.
  const bool build_q = lay.block_q >= 1 && lay.block_q <= 256;
  const bool build_k = lay.block_k >= 1 && lay.block_k <= 256;

  Array<std::int32_t> head_layout, q_rows, k_rows, fwd_k_tile, bwd_q_tile;
  Array<std::int64_t> q_begin, k_begin, fwd_begin, fwd_mask, bwd_begin, bwd_mask;
  Array<std::uint64_t> masks;
  for (std::int64_t h = 0; h < p.heads; ++h) {
    head_layout.values.push_back(static_cast<std::int32_t>(layouts > 0 ? h % layouts : 0));
  }

  // Each layout's rows shuffled into tiles of 1..block rows (ragged, -1 padding at the end).
  auto tiles = [&](std::int64_t len, std::int64_t block, bool build, Array<std::int32_t>& rows,
                   Array<std::int64_t>& begin) {
    begin.values = {0};
    for (std::int64_t l = 0; l < layouts; ++l) {
      std::int64_t n = 0;
      if (build && len >= 0 && len <= kMaxRows) {
        std::vector<std::int32_t> perm(static_cast<std::size_t>(len));
        std::iota(perm.begin(), perm.end(), 0);
        const std::uint8_t shuffle = in.byte();
        for (std::size_t i = perm.size(); i > 1 && shuffle != 0; --i) {
          std::swap(perm[i - 1], perm[(i * shuffle + in.byte()) % i]);
        }
        const std::int64_t take = 1 + in.below(static_cast<std::int64_t>(block));
        for (std::int64_t i = 0; i < len; i += take, ++n) {
          for (std::int64_t r = 0; r < block; ++r) {
            rows.values.push_back(i + r < len && r < take ? perm[static_cast<std::size_t>(i + r)]
                                                          : -1);
          }
        }
      } else if (build) {
        // Too many rows to lay out (or a negative count): a few tiles of arbitrary rows.
        n = in.below(3);
        for (std::int64_t r = 0; r < n * block; ++r) {
          rows.values.push_back(static_cast<std::int32_t>(edit_value(in)));
        }
      }
      begin.values.push_back(begin.values.back() + n);
    }
  };
  tiles(p.len_q, lay.block_q, build_q, q_rows, q_begin);
  tiles(p.len_k, lay.block_k, build_k, k_rows, k_begin);

  // Visits: each (query tile, key tile) pair of a layout with probability about a half, all
  // pairs allowed or one new mask of input words.
  const std::int64_t block_q = build_q ? lay.block_q : 0;
  fwd_begin.values = {0};
  std::int64_t num_masks = 0;
  for (std::int64_t l = 0; l < layouts; ++l) {
    for (std::int64_t qt = q_begin.values[l]; qt < q_begin.values[l + 1]; ++qt) {
      for (std::int64_t kt = k_begin.values[l]; kt < k_begin.values[l + 1]; ++kt) {
        const std::uint8_t b = in.byte();
        if (b & 1) continue;
        fwd_k_tile.values.push_back(static_cast<std::int32_t>(kt));
        if (b & 2) {
          fwd_mask.values.push_back(-1);
        } else {
          fwd_mask.values.push_back(num_masks++);
          const std::uint64_t seed = in.raw<std::uint16_t>() * 0x9e3779b97f4a7c15ull;
          for (std::int64_t r = 0; r < block_q; ++r) {
            const std::uint64_t word = seed ^ (seed >> (r % 61)) ^ (r * 0x5bd1e995ull);
            masks.values.push_back((b & 4) ? ~0ull : word);
          }
        }
      }
      fwd_begin.values.push_back(static_cast<std::int64_t>(fwd_k_tile.values.size()));
    }
  }
  lay.num_masks = num_masks;

  // The backward lists: the forward's transposed, in query-tile order or reversed per key tile.
  const std::int64_t k_tiles = k_begin.values.back();
  const bool reverse = in.flag();
  bwd_begin.values.assign(static_cast<std::size_t>(k_tiles) + 1, 0);
  {
    std::vector<std::vector<std::pair<std::int32_t, std::int64_t>>> per_key(
        static_cast<std::size_t>(k_tiles));
    for (std::size_t t = 0; t + 1 < fwd_begin.values.size(); ++t) {
      for (std::int64_t v = fwd_begin.values[t]; v < fwd_begin.values[t + 1]; ++v) {
        const std::size_t at = static_cast<std::size_t>(v);
        per_key[static_cast<std::size_t>(fwd_k_tile.values[at])].emplace_back(
            static_cast<std::int32_t>(t), fwd_mask.values[at]);
      }
    }
    for (std::size_t k = 0; k < per_key.size(); ++k) {
      if (reverse) std::reverse(per_key[k].begin(), per_key[k].end());
      for (const auto& visit : per_key[k]) {
        bwd_q_tile.values.push_back(visit.first);
        bwd_mask.values.push_back(visit.second);
      }
      bwd_begin.values[k + 1] = static_cast<std::int64_t>(bwd_q_tile.values.size());
    }
  }

  // Edits: any entry of any array, or a count; most inputs make none or one.
  const std::int64_t edits = in.below(8) < 5 ? 0 : in.below(4) + 1;
  for (std::int64_t e = 0; e < edits; ++e) {
    const std::int64_t which = in.below(13);
    const std::int64_t value = edit_value(in);
    auto edit = [&](auto& array) {
      if (array.values.empty()) return;
      const std::size_t at = in.byte() % array.values.size();
      using T = typename std::decay_t<decltype(array.values)>::value_type;
      array.values[at] = static_cast<T>(value);
    };
    switch (which) {
      case 0: edit(head_layout); break;
      case 1: edit(q_rows); break;
      case 2: edit(k_rows); break;
      case 3: edit(q_begin); break;
      case 4: edit(k_begin); break;
      case 5: edit(fwd_begin); break;
      case 6: edit(fwd_k_tile); break;
      case 7: edit(fwd_mask); break;
      case 8: edit(bwd_begin); break;
      case 9: edit(bwd_q_tile); break;
      case 10: edit(bwd_mask); break;
      case 11: edit(masks); break;
      default: lay.num_masks += value % 3; break;
    }
  }
  // A null array now and then: the validator must refuse it wherever its length is not 0.
  if (in.below(16) == 0) {
    Array<std::int32_t>* i32[] = {&head_layout, &q_rows, &k_rows, &fwd_k_tile, &bwd_q_tile};
    Array<std::int64_t>* i64[] = {&q_begin, &k_begin, &fwd_begin, &fwd_mask, &bwd_begin, &bwd_mask};
    const std::int64_t which = in.below(12);
    if (which < 5) i32[which]->null = true;
    else if (which < 11) i64[which - 5]->null = true;
    else masks.null = true;
  }

  // Exactly the declared lengths (sparse_layout.h): head_layout (heads,), the tile ranges
  // (num_layouts + 1,), rows (tiles, block) with the tiles from the ranges' last entry, visit
  // offsets (tiles + 1,), visits and mask indices (visits,) from the offsets' last entry, masks
  // (num_masks, block_q).
  if (!head_layout.seal(p.heads, 0) || !q_begin.seal(layouts + 1, 0) ||
      !k_begin.seal(layouts + 1, 0)) {
    return;
  }
  const std::int64_t q_tiles = q_begin.exact[static_cast<std::size_t>(layouts)];
  const std::int64_t key_tiles = k_begin.exact[static_cast<std::size_t>(layouts)];
  std::int64_t q_rows_len, k_rows_len, mask_words;
  if (!mul_ok(q_tiles, lay.block_q, &q_rows_len) || !mul_ok(key_tiles, lay.block_k, &k_rows_len) ||
      !mul_ok(lay.num_masks, lay.block_q, &mask_words) || q_tiles < 0 || key_tiles < 0) {
    return;
  }
  const std::int64_t fwd_pad = fwd_begin.values.back(), bwd_pad = bwd_begin.values.back();
  if (!q_rows.seal(q_rows_len, -1) || !k_rows.seal(k_rows_len, -1) ||
      !fwd_begin.seal(q_tiles + 1, fwd_pad) || !bwd_begin.seal(key_tiles + 1, bwd_pad)) {
    return;
  }
  const std::int64_t fwd_visits = fwd_begin.exact[static_cast<std::size_t>(q_tiles)];
  const std::int64_t bwd_visits = bwd_begin.exact[static_cast<std::size_t>(key_tiles)];
  if (!fwd_k_tile.seal(fwd_visits, 0) || !fwd_mask.seal(fwd_visits, -1) ||
      !bwd_q_tile.seal(bwd_visits, 0) || !bwd_mask.seal(bwd_visits, -1) ||
      !masks.seal(std::max<std::int64_t>(mask_words, 0), 0)) {
    return;
  }
  lay.head_layout = head_layout.data();
  lay.q_tile_begin = q_begin.data();
  lay.k_tile_begin = k_begin.data();
  lay.q_rows = q_rows.data();
  lay.k_rows = k_rows.data();
  lay.fwd_begin = fwd_begin.data();
  lay.fwd_k_tile = fwd_k_tile.data();
  lay.fwd_mask = fwd_mask.data();
  lay.bwd_begin = bwd_begin.data();
  lay.bwd_q_tile = bwd_q_tile.data();
  lay.bwd_mask = bwd_mask.data();
  lay.masks = masks.data();
  p.layout = &lay;

  // Tensors are not what this target varies: non-null pointers never read when the problem is
  // only validated.
  p.q = p.k = p.v = p.mask = Buffer().pointer(false);
  p.out = Buffer().pointer(false);
  const Status s = validate(p);
  check_status(s, "validate(layout)");
  if (!s.ok() || dense_work(p) > kMaxWork) return;
  DenseRun().run(in, p, backward, wild);
}

}  // namespace
}  // namespace fuzz
}  // namespace attn2d

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  attn2d::fuzz::Input in(data, size);
  attn2d::fuzz::run(in);
  return 0;
}
