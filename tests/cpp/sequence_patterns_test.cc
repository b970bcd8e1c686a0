// Window1D, Random, BlockMask and their unions and intersections (attn2d/sequence_patterns.h,
// attn2d/pattern.h): dense masks against predicates written here from the definitions, layouts
// against their dense masks, Random's draw fixed across runs and platforms, the sparse forward
// against the reference under the dense mask, and bad arguments as a Status.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "attn2d/attention.h"
#include "attn2d/pattern.h"
#include "attn2d/sequence_patterns.h"
#include "pattern_checks.h"

namespace attn2d {
namespace {

using pattern_checks::check_pattern;
using pattern_checks::Grids;
using pattern_checks::pixels;

// Sequences as 1 x L grids, grids read in raster order, and query counts unequal to key counts.
const Grids kSequences[] = {
    {{1, 1}, {1, 1}},     {{1, 17}, {1, 17}},   {{1, 64}, {1, 64}},   {{1, 65}, {1, 65}},
    {{1, 200}, {1, 200}}, {{1, 131}, {1, 77}},  {{1, 40}, {1, 131}},  {{7, 13}, {7, 13}},
    {{16, 16}, {8, 8}},   {{1, 300}, {1, 300}},
};

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// ---- Window1D --------------------------------------------------------------------------------

TEST(SequencePatterns, Window1DMatchesItsDefinition) {
  for (const Grids& g : kSequences) {
    const std::int64_t lq = pixels(g.q), lk = pixels(g.kv);
    for (const std::int64_t size : {1, 2, 3, 5, 8, 17}) {
      for (const std::int64_t dilation : {1, 2, 3}) {
        for (const bool causal : {false, true}) {
          const Window1D w{size, dilation, causal};
          if (dilation * (size - 1) >= lk) {
            EXPECT_EQ(w.validate(g.q, g.kv, 2).code(), StatusCode::kInvalidArgument);
            continue;
          }
          SCOPED_TRACE(std::to_string(lq) + "->" + std::to_string(lk) + " size " +
                       std::to_string(size) + " dilation " + std::to_string(dilation) +
                       (causal ? " causal" : ""));
          check_pattern(w, g, 2, [&](std::int64_t, std::int64_t q, std::int64_t k) {
            const std::int64_t c = q * lk / lq, diff = k - c;
            if (diff % dilation != 0) return false;
            const std::int64_t o = diff / dilation;
            return causal ? (o <= 0 && o > -size) : (o >= -(size / 2) && o < size - size / 2);
          });
        }
      }
    }
  }
}

TEST(SequencePatterns, CausalWindow1DAsLongAsTheSequenceIsCausalAttention) {
  const GridShape g{1, 50};
  std::vector<std::uint8_t> mask;
  ASSERT_TRUE((Window1D{50, 1, true}).dense_mask(g, g, 1, &mask).ok());
  for (std::int64_t q = 0; q < 50; ++q) {
    for (std::int64_t k = 0; k < 50; ++k) ASSERT_EQ(mask[q * 50 + k] != 0, k <= q);
  }
}

// ---- Random ----------------------------------------------------------------------------------

TEST(SequencePatterns, RandomMatchesItsDefinition) {
  for (const Grids& g : kSequences) {
    const std::int64_t lq = pixels(g.q), lk = pixels(g.kv);
    for (const std::int64_t block : {1, 4, 16, 64}) {
      const std::int64_t key_blocks = ceil_div(lk, block), query_blocks = ceil_div(lq, block);
      for (const std::int64_t per_row : {std::int64_t{0}, std::int64_t{1}, std::int64_t{3},
                                         key_blocks - 1}) {
        if (per_row < 0 || per_row > key_blocks - 1) continue;
        for (const std::int64_t global : {std::int64_t{0}, std::int64_t{3}}) {
          if (global > std::min(lq, lk)) continue;
          const Random r{per_row, block, 12345, global};
          SCOPED_TRACE(std::to_string(lq) + "->" + std::to_string(lk) + " block " +
                       std::to_string(block) + " per row " + std::to_string(per_row) +
                       " global " + std::to_string(global));
          // The draw: the query block's own key block and per_row distinct others.
          std::vector<std::set<std::int64_t>> drawn;
          for (std::int64_t b = 0; b < query_blocks; ++b) {
            const std::vector<std::int64_t> blocks = r.key_blocks(b, lq, lk);
            const std::set<std::int64_t> unique(blocks.begin(), blocks.end());
            ASSERT_EQ(unique.size(), blocks.size());
            ASSERT_EQ(static_cast<std::int64_t>(blocks.size()), per_row + 1);
            ASSERT_TRUE(std::is_sorted(blocks.begin(), blocks.end()));
            ASSERT_EQ(unique.count(b * key_blocks / query_blocks), 1u);
            ASSERT_GE(blocks.front(), 0);
            ASSERT_LT(blocks.back(), key_blocks);
            drawn.push_back(unique);
          }
          check_pattern(r, g, 1, [&](std::int64_t, std::int64_t q, std::int64_t k) {
            if (q < global || k < global) return true;
            return drawn[static_cast<size_t>(q / block)].count(k / block) == 1;
          });
        }
      }
    }
  }
}

TEST(SequencePatterns, RandomDrawsTheSameBlocksForASeedOnEveryRunAndPlatform) {
  // Fixed here: SplitMix64 and the bounded draw use 64-bit integer arithmetic alone, so these
  // are the blocks on every platform and compiler.
  const Random r{3, 64, 7, 0};
  const std::vector<std::vector<std::int64_t>> expected = {
      {0, 4, 7, 10}, {1, 7, 13, 14}, {1, 2, 9, 12}, {3, 10, 11, 13}};
  for (std::int64_t b = 0; b < 4; ++b) {
    EXPECT_EQ(r.key_blocks(b, 1024, 1024), expected[static_cast<size_t>(b)]) << "block " << b;
  }
  // The same seed again gives the same layout; another seed another draw.
  CompiledLayout a, again, other;
  ASSERT_TRUE(r.compile({1, 1024}, {1, 1024}, 2, &a).ok());
  ASSERT_TRUE(r.compile({1, 1024}, {1, 1024}, 2, &again).ok());
  ASSERT_TRUE((Random{3, 64, 8, 0}).compile({1, 1024}, {1, 1024}, 2, &other).ok());
  EXPECT_EQ(a.fwd_k_tile, again.fwd_k_tile);
  EXPECT_EQ(a.masks, again.masks);
  EXPECT_NE(a.fwd_k_tile, other.fwd_k_tile);
}

TEST(SequencePatterns, RandomDrawsEveryOtherBlockAboutEquallyOften) {
  // 4,000 query blocks of one token over 10 key blocks: each key block is the own block of 400
  // of them and is drawn, with chance 1/9, by each of the other 3,600: 400 draws expected,
  // a standard deviation of 19.
  const Random r{1, 1, 99, 0};
  std::vector<int> count(10, 0);
  for (std::int64_t b = 0; b < 4000; ++b) {
    for (const std::int64_t k : r.key_blocks(b, 4000, 10)) {
      if (k != b * 10 / 4000) ++count[static_cast<size_t>(k)];
    }
  }
  for (std::int64_t k = 0; k < 10; ++k) {
    EXPECT_NEAR(count[static_cast<size_t>(k)], 400, 90) << "key block " << k;
  }
}

// ---- BlockMask -------------------------------------------------------------------------------

BlockMask random_block_mask(std::int64_t heads, std::int64_t lq, std::int64_t lk,
                            std::int64_t bq, std::int64_t bk, std::uint32_t seed) {
  BlockMask m;
  m.block_q = bq, m.block_k = bk, m.mask_heads = heads;
  m.rows = ceil_div(lq, bq), m.cols = ceil_div(lk, bk);
  std::mt19937 rng(seed);
  m.mask.resize(static_cast<size_t>(heads * m.rows * m.cols));
  for (auto& x : m.mask) x = static_cast<std::uint8_t>(rng() % 3 == 0);
  return m;
}

TEST(SequencePatterns, BlockMaskMatchesItsDefinition) {
  for (const Grids& g : kSequences) {
    const std::int64_t lq = pixels(g.q), lk = pixels(g.kv);
    for (const std::int64_t heads : {1, 3}) {
      for (const auto& [bq, bk] : {std::pair<std::int64_t, std::int64_t>{64, 64}, {16, 32},
                                   {5, 7}, {1, 1}}) {
        for (const std::int64_t mask_heads : {std::int64_t{1}, heads}) {
          const BlockMask m = random_block_mask(mask_heads, lq, lk, bq, bk, 5);
          check_pattern(m, g, heads, [&](std::int64_t h, std::int64_t q, std::int64_t k) {
            const std::int64_t mh = mask_heads == 1 ? 0 : h;
            return m.mask[static_cast<size_t>((mh * m.rows + q / bq) * m.cols + k / bk)] != 0;
          });
        }
      }
    }
  }
}

TEST(SequencePatterns, BlockMaskRefusesMalformedMasks) {
  const GridShape g{1, 100};
  BlockMask m = random_block_mask(1, 100, 100, 16, 16, 1);
  ASSERT_TRUE(m.validate(g, g, 2).ok());
  BlockMask wrong_rows = m;
  wrong_rows.rows = 6;
  EXPECT_NE(wrong_rows.validate(g, g, 2).message().find("the mask must have 7 x 7 blocks"),
            std::string::npos);
  BlockMask short_data = m;
  short_data.mask.pop_back();
  EXPECT_NE(short_data.validate(g, g, 2).message().find("entries"), std::string::npos);
  BlockMask heads = m;
  heads.mask_heads = 3;
  EXPECT_NE(heads.validate(g, g, 2).message().find("holds 3 heads"), std::string::npos);
  BlockMask zero = m;
  zero.block_k = 0;
  EXPECT_EQ(zero.validate(g, g, 2).code(), StatusCode::kInvalidArgument);
  CompiledLayout layout;
  EXPECT_EQ(wrong_rows.compile(g, g, 2, &layout).code(), StatusCode::kInvalidArgument);
}

// ---- unions and intersections ----------------------------------------------------------------

TEST(SequencePatterns, UnionsAndIntersectionsAreTheirPartsMasksOredAndAnded) {
  const Grids grids[] = {{{1, 130}, {1, 130}}, {{12, 10}, {12, 10}}, {{16, 16}, {8, 8}}};
  for (const Grids& g : grids) {
    const std::int64_t lq = pixels(g.q), lk = pixels(g.kv), heads = 4;
    const std::vector<Pattern> parts = {
        Pattern(Window1D{9, 2, false}), Pattern(Random{2, 16, 3, 2}),
        Pattern(random_block_mask(heads, lq, lk, 8, 16, 9)), Pattern(Window{5}),
        Pattern(YLG::with_heads(heads))};
    std::vector<std::vector<std::uint8_t>> masks(parts.size());
    for (size_t i = 0; i < parts.size(); ++i) {
      ASSERT_TRUE(parts[i].dense_mask(g.q, g.kv, heads, &masks[i]).ok());
    }
    const std::vector<std::vector<size_t>> picks = {{0, 1}, {0, 2}, {1, 3}, {3, 4}, {0, 1, 2},
                                                    {2, 4}, {0}, {4}};
    for (const auto& pick : picks) {
      for (const bool intersect : {false, true}) {
        std::vector<Pattern> chosen;
        for (const size_t i : pick) chosen.push_back(parts[i]);
        const Pattern combined =
            intersect ? Pattern::Intersection(chosen) : Pattern::Union(chosen);
        SCOPED_TRACE(std::string(intersect ? "intersection" : "union") + " of " +
                     std::to_string(pick.size()) + " parts, first " + std::to_string(pick[0]) +
                     ", grid " + std::to_string(lq) + "->" + std::to_string(lk));
        check_pattern(combined, g, heads, [&](std::int64_t h, std::int64_t q, std::int64_t k) {
          const size_t at = static_cast<size_t>((h * lq + q) * lk + k);
          bool any = false, all = true;
          for (const size_t i : pick) {
            any |= masks[i][at] != 0;
            all &= masks[i][at] != 0;
          }
          return intersect ? all : any;
        });
      }
    }
  }
}

void expect_same_layout(const CompiledLayout& a, const CompiledLayout& b) {
  EXPECT_EQ(a.head_layout, b.head_layout);
  EXPECT_EQ(a.q_rows, b.q_rows);
  EXPECT_EQ(a.k_rows, b.k_rows);
  EXPECT_EQ(a.fwd_begin, b.fwd_begin);
  EXPECT_EQ(a.fwd_k_tile, b.fwd_k_tile);
  EXPECT_EQ(a.fwd_mask, b.fwd_mask);
  EXPECT_EQ(a.masks, b.masks);
}

TEST(SequencePatterns, ASingleWindowOrYlgCompilesAsItDoesAlone) {
  const GridShape g{13, 11};
  const Window window{5, WindowMetric::kManhattan};
  const YLG ylg = YLG::with_heads(4);
  CompiledLayout wrapped, alone;
  ASSERT_TRUE(Pattern(window).compile(g, g, 4, &wrapped).ok());
  ASSERT_TRUE(window.compile(g, g, 4, &alone).ok());
  expect_same_layout(wrapped, alone);
  ASSERT_TRUE(Pattern(ylg).compile(g, g, 4, &wrapped).ok());
  ASSERT_TRUE(ylg.compile(g, g, 4, &alone).ok());
  expect_same_layout(wrapped, alone);
}

TEST(SequencePatterns, OnlyASingleWindowIsAWindow) {
  const Window window{7, WindowMetric::kChebyshev, 2};
  const Pattern wrapped(window);
  const Window* seen = wrapped.as_window();
  ASSERT_NE(seen, nullptr);
  EXPECT_EQ(seen->size, 7);
  EXPECT_EQ(seen->metric, WindowMetric::kChebyshev);
  EXPECT_EQ(seen->dilation, 2);
  EXPECT_EQ(Pattern(YLG::with_heads(4)).as_window(), nullptr);
  EXPECT_EQ(Pattern(Window1D{5, 1, false}).as_window(), nullptr);
  EXPECT_EQ(Pattern::Union({Pattern(window)}).as_window(), nullptr);
}

TEST(SequencePatterns, CombinationsRefuseWhatAPartRefuses) {
  const GridShape g{1, 40};
  CompiledLayout layout;
  EXPECT_NE(Pattern::Union({}).compile(g, g, 1, &layout).message().find(
                "attn2d.patterns.Union: needs at least one pattern"),
            std::string::npos);
  // A 9-key window with dilation 5 spans 41 keys, past the 40 of the sequence.
  const Status s = Pattern::Intersection({Pattern(Random{1, 8, 0, 0}), Pattern(Window1D{9, 5})})
                       .validate(g, g, 1);
  EXPECT_NE(s.message().find("attn2d.patterns.Window1D: dilation*(size-1)"), std::string::npos)
      << s.message();
  // YLG's heads are its own.
  EXPECT_EQ(Pattern::Union({Pattern(YLG::with_heads(4)), Pattern(Window1D{3})})
                .validate({6, 6}, {6, 6}, 2)
                .code(),
            StatusCode::kInvalidArgument);
}

TEST(SequencePatterns, BadOptionsAreInvalidArguments) {
  const GridShape g{1, 30};
  const Status cases[] = {
      (Window1D{0}).validate(g, g, 1),           (Window1D{3, 0}).validate(g, g, 1),
      (Window1D{31}).validate(g, g, 1),          (Window1D{3}).validate(g, g, 0),
      (Window1D{3}).validate({0, 3}, g, 1),      (Random{1, 0}).validate(g, g, 1),
      (Random{-1, 4}).validate(g, g, 1),         (Random{8, 4}).validate(g, g, 1),
      (Random{1, 4, 0, -1}).validate(g, g, 1),   (Random{1, 4, 0, 31}).validate(g, g, 1),
  };
  for (const Status& s : cases) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
    EXPECT_EQ(s.message().rfind("attn2d.patterns", 0), 0u) << s.message();
  }
  EXPECT_NE((Random{8, 4}).validate(g, g, 1).message().find(
                "blocks_per_row must be smaller than the 8 key blocks"),
            std::string::npos);
}

// ---- the kernels on a compiled sequence pattern ----------------------------------------------

TEST(SequencePatterns, SparseForwardMatchesTheReferenceWithTheDenseMask) {
  const std::int64_t h = 3, lq = 150, lk = 150, e = 8;
  const Pattern pattern = Pattern::Union(
      {Pattern(Window1D{7, 1, true}), Pattern(Random{1, 32, 4, 2})});
  const GridShape g{1, lq};
  CompiledLayout layout;
  std::vector<std::uint8_t> mask;
  ASSERT_TRUE(pattern.compile(g, g, h, &layout).ok());
  ASSERT_TRUE(pattern.dense_mask(g, g, h, &mask).ok());
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> q(h * lq * e), k(h * lk * e), v(h * lk * e);
  for (auto* t : {&q, &k, &v}) {
    for (float& x : *t) x = normal(rng);
  }
  auto params = [&](std::vector<float>* out) {
    AttentionParams p;
    p.batch = 1, p.heads = h, p.len_q = lq, p.len_k = lk, p.dim_qk = e, p.dim_v = e;
    p.q = q.data(), p.k = k.data(), p.v = v.data(), p.out = out->data();
    const std::int64_t s[4] = {h * lq * e, lq * e, e, 1};
    for (auto* stride : {p.q_stride, p.k_stride, p.v_stride, p.out_stride}) {
      std::copy(s, s + 4, stride);
    }
    p.scale = 0.35;
    return p;
  };
  std::vector<float> sparse(h * lq * e), dense(h * lq * e);
  const SparseLayout view = layout.view();
  AttentionParams sp = params(&sparse);
  sp.layout = &view;
  ASSERT_TRUE(attention_forward(sp, serial_host(), Backend::kCpu).ok());
  AttentionParams dp = params(&dense);
  dp.mask_kind = MaskKind::kBool;
  dp.mask = mask.data();
  const std::int64_t ms[4] = {h * lq * lk, lq * lk, lk, 1};
  std::copy(ms, ms + 4, dp.mask_stride);
  ASSERT_TRUE(attention_forward(dp, serial_host(), Backend::kReference).ok());
  for (size_t i = 0; i < sparse.size(); ++i) ASSERT_NEAR(sparse[i], dense[i], 1e-5) << i;
}

}  // namespace
}  // namespace attn2d
