// Checks of a compiled pattern against its dense mask, shared by the pattern tests: the tiles
// partition the rows, the forward and backward visit lists agree, the visits' pairs are exactly
// the mask's, validate() accepts the layout, and a second compile gives the same layout.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "attn2d/attention.h"
#include "attn2d/patterns.h"

namespace attn2d {
namespace pattern_checks {

struct Grids {
  GridShape q, kv;
};

inline std::int64_t pixels(GridShape g) { return g.height * g.width; }

// ---- a compiled layout against a dense mask ---------------------------------------------------

// Rows of tiles [begin, end) of `rows` (block entries a tile), each row in exactly one tile and
// -1 only as trailing padding.
inline void expect_partition(const std::vector<std::int32_t>& rows, std::int64_t block,
                             std::int64_t begin, std::int64_t end, std::int64_t len,
                             const char* side) {
  std::vector<int> seen(static_cast<size_t>(len), 0);
  for (std::int64_t t = begin; t < end; ++t) {
    bool padding = false;
    for (std::int64_t r = 0; r < block; ++r) {
      const std::int32_t row = rows[static_cast<size_t>(t * block + r)];
      if (row < 0) {
        padding = true;
        continue;
      }
      ASSERT_FALSE(padding) << side << " tile " << t << " has a row after its padding";
      ASSERT_LT(row, len) << side;
      ++seen[static_cast<size_t>(row)];
    }
    ASSERT_GE(rows[static_cast<size_t>(t * block)], 0) << side << " tile " << t << " is empty";
  }
  for (std::int64_t row = 0; row < len; ++row) {
    ASSERT_EQ(seen[static_cast<size_t>(row)], 1) << side << " row " << row;
  }
}

// The layout's arrays are consistent, validate() accepts it, and for every head the union of
// the visits (a visit without a mask: every valid pair) is exactly the dense mask, each pair
// in one visit.
inline void expect_layout_matches_mask(const CompiledLayout& lay,
                                       const std::vector<std::uint8_t>& mask,
                                       std::int64_t heads, std::int64_t len_q,
                                       std::int64_t len_k) {
  const std::int64_t bq = lay.block_q, bk = lay.block_k;
  ASSERT_EQ(bq, 64);
  ASSERT_EQ(bk, 64);
  const std::int64_t layouts = lay.num_layouts();
  ASSERT_GE(layouts, 1);
  ASSERT_EQ(static_cast<std::int64_t>(lay.head_layout.size()), heads);
  ASSERT_EQ(lay.k_tile_begin.size(), lay.q_tile_begin.size());
  const std::int64_t q_tiles = lay.q_tile_begin.back(), k_tiles = lay.k_tile_begin.back();
  ASSERT_EQ(static_cast<std::int64_t>(lay.q_rows.size()), q_tiles * bq);
  ASSERT_EQ(static_cast<std::int64_t>(lay.k_rows.size()), k_tiles * bk);
  ASSERT_EQ(static_cast<std::int64_t>(lay.masks.size()), lay.num_masks() * bq);
  for (std::int64_t l = 0; l < layouts; ++l) {
    expect_partition(lay.q_rows, bq, lay.q_tile_begin[l], lay.q_tile_begin[l + 1], len_q, "query");
    expect_partition(lay.k_rows, bk, lay.k_tile_begin[l], lay.k_tile_begin[l + 1], len_k, "key");
  }

  // Forward CSR: ascending key tiles of the query tile's own layout, masks in range, each mask
  // used once, in visit order.
  ASSERT_EQ(static_cast<std::int64_t>(lay.fwd_begin.size()), q_tiles + 1);
  ASSERT_EQ(lay.fwd_begin.front(), 0);
  const std::int64_t visits = lay.fwd_begin.back();
  ASSERT_EQ(static_cast<std::int64_t>(lay.fwd_k_tile.size()), visits);
  ASSERT_EQ(static_cast<std::int64_t>(lay.fwd_mask.size()), visits);
  std::int64_t next_mask = 0;
  std::vector<std::tuple<std::int32_t, std::int32_t, std::int64_t>> transposed;  // (kt, qt, m)
  for (std::int64_t l = 0; l < layouts; ++l) {
    for (std::int64_t t = lay.q_tile_begin[l]; t < lay.q_tile_begin[l + 1]; ++t) {
      ASSERT_LE(lay.fwd_begin[t], lay.fwd_begin[t + 1]);
      for (std::int64_t v = lay.fwd_begin[t]; v < lay.fwd_begin[t + 1]; ++v) {
        ASSERT_GE(lay.fwd_k_tile[v], lay.k_tile_begin[l]);
        ASSERT_LT(lay.fwd_k_tile[v], lay.k_tile_begin[l + 1]);
        if (v > lay.fwd_begin[t]) {
          ASSERT_LT(lay.fwd_k_tile[v - 1], lay.fwd_k_tile[v]);
        }
        if (lay.fwd_mask[v] >= 0) {
          ASSERT_EQ(lay.fwd_mask[v], next_mask++);
        } else {
          ASSERT_EQ(lay.fwd_mask[v], -1);
        }
        transposed.emplace_back(lay.fwd_k_tile[v], static_cast<std::int32_t>(t), lay.fwd_mask[v]);
      }
    }
  }
  ASSERT_EQ(next_mask, lay.num_masks());
  // Backward CSR: the forward's visits sorted by (key tile, query tile).
  std::sort(transposed.begin(), transposed.end());
  ASSERT_EQ(static_cast<std::int64_t>(lay.bwd_begin.size()), k_tiles + 1);
  ASSERT_EQ(lay.bwd_begin.front(), 0);
  ASSERT_EQ(lay.bwd_begin.back(), visits);
  ASSERT_EQ(static_cast<std::int64_t>(lay.bwd_q_tile.size()), visits);
  for (std::int64_t k = 0; k < k_tiles; ++k) {
    for (std::int64_t v = lay.bwd_begin[k]; v < lay.bwd_begin[k + 1]; ++v) {
      ASSERT_EQ(transposed[static_cast<size_t>(v)],
                std::make_tuple(static_cast<std::int32_t>(k), lay.bwd_q_tile[v], lay.bwd_mask[v]))
          << "backward visit " << v;
    }
  }

  // The visits' pairs, per layout, against the mask of every head using it.
  std::vector<std::vector<std::uint8_t>> covered(static_cast<size_t>(layouts));
  for (std::int64_t l = 0; l < layouts; ++l) {
    std::vector<std::uint8_t>& cover = covered[static_cast<size_t>(l)];
    cover.assign(static_cast<size_t>(len_q * len_k), 0);
    for (std::int64_t t = lay.q_tile_begin[l]; t < lay.q_tile_begin[l + 1]; ++t) {
      for (std::int64_t v = lay.fwd_begin[t]; v < lay.fwd_begin[t + 1]; ++v) {
        const std::int64_t kt = lay.fwd_k_tile[v], m = lay.fwd_mask[v];
        std::int64_t pairs = 0, valid_pairs = 0;
        for (std::int64_t a = 0; a < bq; ++a) {
          const std::int32_t q = lay.q_rows[static_cast<size_t>(t * bq + a)];
          const std::uint64_t word =
              m < 0 ? ~std::uint64_t{0} : lay.masks[static_cast<size_t>(m * bq + a)];
          for (std::int64_t c = 0; c < bk; ++c) {
            const std::int32_t key = lay.k_rows[static_cast<size_t>(kt * bk + c)];
            const bool bit = (word >> c) & 1;
            if (q < 0 || key < 0) {
              if (m >= 0) {
                ASSERT_FALSE(bit) << "a mask bit outside the valid rows or columns";
              }
              continue;
            }
            ++valid_pairs;
            if (!bit) continue;
            ++pairs;
            std::uint8_t& seen = cover[static_cast<size_t>(q * len_k + key)];
            ASSERT_EQ(seen, 0) << "pair (" << q << ", " << key << ") in two visits";
            seen = 1;
          }
        }
        ASSERT_GT(pairs, 0) << "a visit without an allowed pair";
        if (m >= 0) {
          ASSERT_LT(pairs, valid_pairs) << "a mask allowing every pair";
        }
      }
    }
  }
  for (std::int64_t h = 0; h < heads; ++h) {
    const std::int32_t l = lay.head_layout[static_cast<size_t>(h)];
    ASSERT_GE(l, 0);
    ASSERT_LT(l, layouts);
    const auto head = mask.begin() + h * len_q * len_k;
    ASSERT_TRUE(std::equal(head, head + len_q * len_k, covered[static_cast<size_t>(l)].begin()))
        << "head " << h << ": the visits differ from the dense mask";
  }

  // The core's own check of a layout it is given.
  std::vector<float> q(static_cast<size_t>(heads * len_q)), k(static_cast<size_t>(heads * len_k));
  std::vector<float> out(static_cast<size_t>(heads * len_q));
  const SparseLayout view = lay.view();
  AttentionParams p;
  p.batch = 1, p.heads = heads, p.len_q = len_q, p.len_k = len_k, p.dim_qk = 1, p.dim_v = 1;
  p.q = q.data(), p.k = k.data(), p.v = k.data(), p.out = out.data();
  const std::int64_t q_strides[4] = {heads * len_q, len_q, 1, 1};
  const std::int64_t k_strides[4] = {heads * len_k, len_k, 1, 1};
  std::copy(q_strides, q_strides + 4, p.q_stride);
  std::copy(q_strides, q_strides + 4, p.out_stride);
  std::copy(k_strides, k_strides + 4, p.k_stride);
  std::copy(k_strides, k_strides + 4, p.v_stride);
  p.layout = &view;
  const Status s = validate(p);
  ASSERT_TRUE(s.ok()) << s.message();
}

// The dense mask of `pattern` against `allows(head, query, key)`, then its layout against the
// mask, and the layout compiled twice is the same.
template <typename Pattern, typename Allows>
void check_pattern(const Pattern& pattern, const Grids& g, std::int64_t heads, Allows allows) {
  const std::int64_t len_q = pixels(g.q), len_k = pixels(g.kv);
  std::vector<std::uint8_t> mask;
  Status s = pattern.dense_mask(g.q, g.kv, heads, &mask);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(static_cast<std::int64_t>(mask.size()), heads * len_q * len_k);
  for (std::int64_t h = 0; h < heads; ++h) {
    for (std::int64_t q = 0; q < len_q; ++q) {
      for (std::int64_t key = 0; key < len_k; ++key) {
        ASSERT_EQ(mask[static_cast<size_t>((h * len_q + q) * len_k + key)] != 0,
                  allows(h, q, key))
            << "head " << h << " query " << q << " key " << key;
      }
    }
  }
  CompiledLayout layout, again;
  s = pattern.compile(g.q, g.kv, heads, &layout);
  ASSERT_TRUE(s.ok()) << s.message();
  expect_layout_matches_mask(layout, mask, heads, len_q, len_k);
  ASSERT_TRUE(pattern.compile(g.q, g.kv, heads, &again).ok());
  EXPECT_EQ(layout.q_rows, again.q_rows);
  EXPECT_EQ(layout.k_rows, again.k_rows);
  EXPECT_EQ(layout.fwd_k_tile, again.fwd_k_tile);
  EXPECT_EQ(layout.masks, again.masks);
}

}  // namespace pattern_checks
}  // namespace attn2d
