// Windows and YLG compiled in the core (attn2d/patterns.h): dense masks against per-pixel
// predicates written here from the patterns' definitions, layouts against their dense masks
// (the union of the visits with their masks is the mask, tiles partition the rows, the
// backward lists are the forward's transposed), validate() accepting every layout, window
// offsets against the mask, and bad arguments coming back as a Status.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attn2d/attention.h"
#include "attn2d/kernel_choice.h"
#include "attn2d/patterns.h"
#include "pattern_checks.h"

namespace attn2d {
namespace {

using pattern_checks::check_pattern;
using pattern_checks::expect_layout_matches_mask;
using pattern_checks::Grids;
using pattern_checks::pixels;


std::string text(const Grids& g) {
  return std::to_string(g.q.height) + "x" + std::to_string(g.q.width) + "->" +
         std::to_string(g.kv.height) + "x" + std::to_string(g.kv.width);
}

// 1x1, a row, a column, primes, non-square, 2x2-pooled keys and other key grids coarser than
// the queries.
const Grids kAwkwardGrids[] = {
    {{1, 1}, {1, 1}},     {{1, 17}, {1, 17}},   {{17, 1}, {17, 1}},   {{7, 5}, {7, 5}},
    {{11, 13}, {11, 13}}, {{13, 7}, {13, 7}},   {{3, 100}, {3, 100}}, {{23, 29}, {23, 29}},
    {{10, 6}, {5, 3}},    {{9, 9}, {4, 4}},     {{8, 8}, {4, 4}},     {{32, 32}, {16, 16}},
    {{14, 22}, {7, 11}},  {{2, 2}, {1, 1}},     {{16, 16}, {16, 16}},
};

std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  return a / b - ((a % b != 0) && ((a < 0) != (b < 0)) ? 1 : 0);
}

// ---- the patterns from their definitions, one (query, key) pair at a time -------------------

// The key pixel a query pixel is centred at.
std::pair<std::int64_t, std::int64_t> centre(std::int64_t query, const Grids& g) {
  const std::int64_t i = query / g.q.width, j = query % g.q.width;
  return {i * g.kv.height / g.q.height, j * g.kv.width / g.q.width};
}

// Per axis of a shifted window: the k positions of the centre's residue class mod d nearest to
// the centred window, moved inside the map. [c][p]: may a query centred at c see position p.
std::vector<std::vector<bool>> shifted_axis(const Window& w, std::int64_t length) {
  const std::int64_t d = w.dilation, k = w.size;
  std::vector<std::vector<bool>> allowed(static_cast<size_t>(length),
                                         std::vector<bool>(static_cast<size_t>(length)));
  for (std::int64_t c = 0; c < length; ++c) {
    std::vector<std::int64_t> cls;
    for (std::int64_t x = c % d; x < length; x += d) cls.push_back(x);
    const std::int64_t index = std::find(cls.begin(), cls.end(), c) - cls.begin();
    const std::int64_t t = std::min(std::max<std::int64_t>(index - k / 2, 0),
                                    static_cast<std::int64_t>(cls.size()) - k);
    for (std::int64_t i = t; i < t + k; ++i) {
      allowed[static_cast<size_t>(c)][static_cast<size_t>(cls[static_cast<size_t>(i)])] = true;
    }
  }
  return allowed;
}

class WindowByDefinition {
 public:
  WindowByDefinition(const Window& w, const Grids& g) : w_(w), g_(g) {
    if (w.border == WindowBorder::kShift) {
      rows_ = shifted_axis(w, g.kv.height);
      cols_ = shifted_axis(w, g.kv.width);
    }
  }

  bool allows(std::int64_t query, std::int64_t key) const {
    const auto [ci, cj] = centre(query, g_);
    const std::int64_t kr = key / g_.kv.width, kc = key % g_.kv.width;
    if (w_.border == WindowBorder::kShift) {
      return rows_[static_cast<size_t>(ci)][static_cast<size_t>(kr)] &&
             cols_[static_cast<size_t>(cj)][static_cast<size_t>(kc)];
    }
    return clip_allows(ci, cj, kr, kc);
  }

 private:
  bool clip_allows(std::int64_t ci, std::int64_t cj, std::int64_t kr, std::int64_t kc) const;

  Window w_;
  Grids g_;
  std::vector<std::vector<bool>> rows_, cols_;
};

bool WindowByDefinition::clip_allows(std::int64_t ci, std::int64_t cj, std::int64_t kr,
                                     std::int64_t kc) const {
  const std::int64_t d = w_.dilation, k = w_.size;
  const std::int64_t dr = kr - ci, dc = kc - cj;
  if (dr % d != 0 || dc % d != 0) return false;
  const std::int64_t di = floor_div(dr, d), dj = floor_div(dc, d), lo = -(k / 2), r = k / 2;
  if (di < lo || di >= lo + k || dj < lo || dj >= lo + k) return false;
  if (w_.metric == WindowMetric::kManhattan) return std::abs(di) + std::abs(dj) <= r;
  if (w_.metric == WindowMetric::kEuclidean) return std::hypot(di, dj) <= r + 1e-9;
  return true;
}

// Whether the window fits the key map, from Python's Window.check.
bool window_fits(const Window& w, const Grids& g) {
  const std::int64_t hk = g.kv.height, wk = g.kv.width;
  if (w.border == WindowBorder::kShift) return w.dilation * w.size <= std::min(hk, wk);
  return w.dilation * (w.size - 1) < std::max(hk, wk);
}

// ESA as described: key cells enumerated by (i + j, i); a query's pattern row is its raster
// index mod n (official) or its centre cell's position (geometric).
class YlgByDefinition {
 public:
  YlgByDefinition(YlgMapping mapping, const Grids& g) : mapping_(mapping), g_(g) {
    const std::int64_t hk = g.kv.height, wk = g.kv.width;
    std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>> cells;
    for (std::int64_t i = 0; i < hk; ++i) {
      for (std::int64_t j = 0; j < wk; ++j) cells.emplace_back(i + j, i, i * wk + j);
    }
    std::sort(cells.begin(), cells.end());
    position_.resize(cells.size());
    for (size_t p = 0; p < cells.size(); ++p) position_[std::get<2>(cells[p])] = p;
    n_ = hk * wk;
    l_ = std::max<std::int64_t>(static_cast<std::int64_t>(std::floor(std::sqrt(n_ + 0.5))), 1);
  }

  bool allows(YlgKind kind, std::int64_t query, std::int64_t key) const {
    std::int64_t cell = query % n_;
    if (mapping_ == YlgMapping::kGeometric) {
      const auto [ci, cj] = centre(query, g_);
      cell = ci * g_.kv.width + cj;
    }
    const std::int64_t r = position_[cell], c = position_[key];
    switch (kind) {
      case YlgKind::kLtrFloor:
        return r - r % l_ <= c && c <= r;
      case YlgKind::kRtlFloor:
        return c - c % l_ <= r && r <= c;
      case YlgKind::kLtrRepetitive:
        return c == r || c % l_ == l_ - 1;
      case YlgKind::kRtlRepetitive:
        return c == r || (c % l_ == 0 && c + l_ - 1 < n_);
    }
    return false;
  }

 private:
  YlgMapping mapping_;
  Grids g_;
  std::vector<std::int64_t> position_;
  std::int64_t n_, l_;
};

const WindowMetric kMetrics[] = {WindowMetric::kChebyshev, WindowMetric::kManhattan,
                                 WindowMetric::kEuclidean};
const YlgKind kKinds[] = {YlgKind::kRtlFloor, YlgKind::kRtlRepetitive, YlgKind::kLtrFloor,
                          YlgKind::kLtrRepetitive};

// ---- windows ---------------------------------------------------------------------------------

TEST(PatternsWindow, ClipMasksAndLayoutsMatchTheDefinitionOnAwkwardGrids) {
  for (const Grids& g : kAwkwardGrids) {
    for (const WindowMetric metric : kMetrics) {
      for (const std::int64_t size : {1, 2, 3, 4, 5, 7}) {
        for (const std::int64_t dilation : {1, 2, 3}) {
          const Window w{size, metric, dilation, WindowBorder::kClip};
          SCOPED_TRACE(text(g) + " " + window_metric_name(metric) + " size " +
                       std::to_string(size) + " dilation " + std::to_string(dilation));
          if (!window_fits(w, g)) {
            EXPECT_EQ(w.validate(g.q, g.kv, 1).code(), StatusCode::kInvalidArgument);
            continue;
          }
          const WindowByDefinition definition(w, g);
          check_pattern(w, g, /*heads=*/2, [&](std::int64_t, std::int64_t q, std::int64_t k) {
            return definition.allows(q, k);
          });
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(PatternsWindow, ShiftMasksAndLayoutsMatchTheDefinitionAndSeeSizeSquaredKeys) {
  for (const Grids& g : kAwkwardGrids) {
    for (const std::int64_t size : {1, 2, 3, 4, 5}) {
      for (const std::int64_t dilation : {1, 2, 3}) {
        const Window w{size, WindowMetric::kChebyshev, dilation, WindowBorder::kShift};
        SCOPED_TRACE(text(g) + " size " + std::to_string(size) + " dilation " +
                     std::to_string(dilation));
        if (!window_fits(w, g)) {
          EXPECT_EQ(w.validate(g.q, g.kv, 1).code(), StatusCode::kInvalidArgument);
          continue;
        }
        const WindowByDefinition definition(w, g);
        check_pattern(w, g, /*heads=*/1, [&](std::int64_t, std::int64_t q, std::int64_t k) {
          return definition.allows(q, k);
        });
        if (HasFatalFailure()) return;
        std::vector<std::uint8_t> mask;
        ASSERT_TRUE(w.dense_mask(g.q, g.kv, 1, &mask).ok());
        const std::int64_t len_k = pixels(g.kv);
        for (std::int64_t q = 0; q < pixels(g.q); ++q) {
          EXPECT_EQ(std::count(mask.begin() + q * len_k, mask.begin() + (q + 1) * len_k, 1),
                    size * size);
        }
      }
    }
  }
}

TEST(PatternsWindow, LargeWindowsOnLargerGridsSpanSeveralKeyTiles) {
  const Grids cases[] = {{{40, 37}, {40, 37}}, {{64, 64}, {32, 32}}};
  for (const Grids& g : cases) {
    for (const Window& w : {Window{15}, Window{15, WindowMetric::kManhattan},
                            Window{9, WindowMetric::kEuclidean, 2},
                            Window{15, WindowMetric::kChebyshev, 1, WindowBorder::kShift}}) {
      SCOPED_TRACE(text(g) + " size " + std::to_string(w.size));
      const WindowByDefinition definition(w, g);
      check_pattern(w, g, 1, [&](std::int64_t, std::int64_t q, std::int64_t k) {
        return definition.allows(q, k);
      });
      if (HasFatalFailure()) return;
    }
  }
}

TEST(PatternsWindow, OffsetsOnOneGridAreTheMasksDisplacements) {
  const Grids one_grid[] = {{{1, 1}, {1, 1}},   {{1, 17}, {1, 17}}, {{7, 5}, {7, 5}},
                            {{11, 13}, {11, 13}}, {{16, 16}, {16, 16}}};
  for (const Grids& g : one_grid) {
    for (const WindowMetric metric : kMetrics) {
      for (const std::int64_t size : {1, 3, 4, 7, 15}) {
        for (const std::int64_t dilation : {1, 2}) {
          const Window w{size, metric, dilation};
          if (!window_fits(w, g)) continue;
          SCOPED_TRACE(text(g) + " " + window_metric_name(metric) + " size " +
                       std::to_string(size) + " dilation " + std::to_string(dilation));
          std::optional<CompiledWindowOffsets> offsets;
          ASSERT_TRUE(w.offsets_on_grid(g.q, g.kv, &offsets).ok());
          ASSERT_TRUE(offsets.has_value());
          ASSERT_EQ(offsets->height, g.kv.height);
          ASSERT_EQ(offsets->width, g.kv.width);
          ASSERT_EQ(offsets->dr.size(), offsets->dc.size());
          // Every displacement some query sees, once: the offsets, as a set.
          std::set<std::pair<std::int64_t, std::int64_t>> want, got;
          const WindowByDefinition definition(w, g);
          for (std::int64_t q = 0; q < pixels(g.q); ++q) {
            for (std::int64_t k = 0; k < pixels(g.kv); ++k) {
              if (!definition.allows(q, k)) continue;
              want.emplace(k / g.kv.width - q / g.q.width, k % g.kv.width - q % g.q.width);
            }
          }
          // Row-major, as Window.offsets lists them.
          std::vector<std::pair<std::int64_t, std::int64_t>> listed;
          for (size_t o = 0; o < offsets->dr.size(); ++o) {
            listed.emplace_back(offsets->dr[o], offsets->dc[o]);
          }
          got.insert(listed.begin(), listed.end());
          EXPECT_EQ(got, want);
          EXPECT_EQ(got.size(), listed.size());
          EXPECT_TRUE(std::is_sorted(listed.begin(), listed.end()));

          // The core accepts them as a window.
          const WindowOffsets view = offsets->view();
          std::vector<float> buf(static_cast<size_t>(pixels(g.q)));
          AttentionParams p;
          p.batch = 1, p.heads = 1, p.len_q = p.len_k = pixels(g.q), p.dim_qk = p.dim_v = 1;
          p.q = p.k = p.v = buf.data();
          p.out = buf.data();
          const std::int64_t strides[4] = {p.len_q, p.len_q, 1, 1};
          for (std::int64_t* s : {p.q_stride, p.k_stride, p.v_stride, p.out_stride}) {
            std::copy(strides, strides + 4, s);
          }
          p.window = &view;
          const Status s = validate(p);
          EXPECT_TRUE(s.ok()) << s.message();

          // kernel_offsets: the same offsets where the chooser takes them, else none.
          std::optional<CompiledWindowOffsets> kernel;
          ASSERT_TRUE(w.kernel_offsets(g.q, g.kv, &kernel).ok());
          if (window_kernel_refusal(view).empty()) {
            ASSERT_TRUE(kernel.has_value());
            EXPECT_EQ(kernel->dr, offsets->dr);
            EXPECT_EQ(kernel->dc, offsets->dc);
          } else {
            EXPECT_FALSE(kernel.has_value());
          }
        }
      }
    }
  }
}

TEST(PatternsWindow, NoOffsetsForPooledKeysOrAShiftedWindow) {
  std::optional<CompiledWindowOffsets> offsets;
  ASSERT_TRUE(Window{3}.offsets_on_grid({8, 8}, {4, 4}, &offsets).ok());
  EXPECT_FALSE(offsets.has_value());
  const Window shifted{3, WindowMetric::kChebyshev, 1, WindowBorder::kShift};
  ASSERT_TRUE(shifted.offsets_on_grid({8, 8}, {8, 8}, &offsets).ok());
  EXPECT_FALSE(offsets.has_value());
  ASSERT_TRUE(shifted.kernel_offsets({8, 8}, {8, 8}, &offsets).ok());
  EXPECT_FALSE(offsets.has_value());
  // A 7x7 square on 7x5 leaves most offsets outside the map for most queries: the tiles serve
  // it (the chooser's 2x rule); a 3x3 one on 16x16 takes the window kernels.
  ASSERT_TRUE(Window{7}.kernel_offsets({7, 5}, {7, 5}, &offsets).ok());
  EXPECT_FALSE(offsets.has_value());
  ASSERT_TRUE(Window{3}.kernel_offsets({16, 16}, {16, 16}, &offsets).ok());
  ASSERT_TRUE(offsets.has_value());
  EXPECT_EQ(offsets->dr, (std::vector<std::int32_t>{-1, -1, -1, 0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(offsets->dc, (std::vector<std::int32_t>{-1, 0, 1, -1, 0, 1, -1, 0, 1}));
}

// ---- YLG -------------------------------------------------------------------------------------

TEST(PatternsYlg, EveryKindAndMappingMatchesTheDefinitionOnAwkwardGrids) {
  const Grids extra[] = {{{2, 1}, {2, 1}}, {{1, 3}, {1, 3}}, {{4, 4}, {2, 2}},
                         {{12, 12}, {12, 12}}, {{7, 9}, {3, 4}}};
  std::vector<Grids> grids(std::begin(kAwkwardGrids), std::end(kAwkwardGrids));
  grids.insert(grids.end(), std::begin(extra), std::end(extra));
  for (const Grids& g : grids) {
    for (const YlgMapping mapping : {YlgMapping::kOfficial, YlgMapping::kGeometric}) {
      const YlgByDefinition definition(mapping, g);
      for (const std::int64_t heads : {1, 2, 4, 8}) {
        const YLG ylg = YLG::with_heads(heads, mapping);
        SCOPED_TRACE(text(g) + " " + ylg_mapping_name(mapping) + " heads " + std::to_string(heads));
        check_pattern(ylg, g, heads, [&](std::int64_t h, std::int64_t q, std::int64_t k) {
          return definition.allows(ylg.patterns[static_cast<size_t>(h)], q, k);
        });
        if (HasFatalFailure()) return;
      }
      for (const YlgKind kind : kKinds) {
        YLG single;
        single.patterns = {kind};
        single.mapping = mapping;
        SCOPED_TRACE(text(g) + " " + ylg_mapping_name(mapping) + " " + ylg_kind_name(kind));
        check_pattern(single, g, 1, [&](std::int64_t, std::int64_t q, std::int64_t k) {
          return definition.allows(kind, q, k);
        });
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(PatternsYlg, PooledKeysOnALargerGridSpanSeveralTilesOfEachKind) {
  const Grids g{{64, 64}, {32, 32}};
  for (const YlgMapping mapping : {YlgMapping::kOfficial, YlgMapping::kGeometric}) {
    const YlgByDefinition definition(mapping, g);
    const YLG ylg = YLG::with_heads(4, mapping);
    check_pattern(ylg, g, 4, [&](std::int64_t h, std::int64_t q, std::int64_t k) {
      return definition.allows(ylg.patterns[static_cast<size_t>(h)], q, k);
    });
    if (HasFatalFailure()) return;
  }
}

TEST(PatternsYlg, DefaultHeadsFollowTheOfficialOrder) {
  const YLG eight = YLG::with_heads(8);
  EXPECT_EQ(eight.patterns,
            (std::vector<YlgKind>{YlgKind::kRtlFloor, YlgKind::kRtlFloor, YlgKind::kRtlRepetitive,
                                  YlgKind::kRtlRepetitive, YlgKind::kLtrFloor, YlgKind::kLtrFloor,
                                  YlgKind::kLtrRepetitive, YlgKind::kLtrRepetitive}));
  EXPECT_EQ(YLG::with_heads(2).patterns,
            (std::vector<YlgKind>{YlgKind::kRtlFloor, YlgKind::kLtrFloor}));
  EXPECT_EQ(YLG::with_heads(8).mapping, YlgMapping::kOfficial);
  EXPECT_TRUE(YLG::with_heads(0).patterns.empty());
}

TEST(PatternsYlg, CustomHeadListsShareOneLayoutPerKindInFirstUseOrder) {
  YLG ylg;
  ylg.patterns = {YlgKind::kLtrRepetitive, YlgKind::kRtlFloor, YlgKind::kLtrRepetitive,
                  YlgKind::kLtrFloor, YlgKind::kRtlFloor};
  for (const Grids& g : {Grids{{8, 8}, {8, 8}}, Grids{{10, 6}, {5, 3}}, Grids{{13, 7}, {13, 7}}}) {
    for (const YlgMapping mapping : {YlgMapping::kOfficial, YlgMapping::kGeometric}) {
      ylg.mapping = mapping;
      const YlgByDefinition definition(mapping, g);
      check_pattern(ylg, g, 5, [&](std::int64_t h, std::int64_t q, std::int64_t k) {
        return definition.allows(ylg.patterns[static_cast<size_t>(h)], q, k);
      });
      if (HasFatalFailure()) return;
      CompiledLayout layout;
      ASSERT_TRUE(ylg.compile(g.q, g.kv, 5, &layout).ok());
      EXPECT_EQ(layout.head_layout, (std::vector<std::int32_t>{0, 1, 0, 2, 1}));
      EXPECT_EQ(layout.num_layouts(), 3);
    }
  }
}

// ---- the compiled layout on the kernels --------------------------------------------------------

// The sparse forward through a compiled layout equals the reference with the dense mask as a
// boolean mask: the kernels read the layout as the pattern means it.
TEST(PatternsLayout, SparseForwardMatchesTheReferenceWithTheDenseMask) {
  struct Case {
    const char* name;
    Grids g;
    std::int64_t heads;
    std::function<Status(CompiledLayout*, std::vector<std::uint8_t>*)> build;
  };
  const Window pooled{5, WindowMetric::kManhattan};
  const YLG ylg = YLG::with_heads(8);
  const Case cases[] = {
      {"window 5 manhattan, pooled keys", {{16, 12}, {8, 6}}, 2,
       [&](CompiledLayout* l, std::vector<std::uint8_t>* m) {
         const Status s = pooled.compile({16, 12}, {8, 6}, 2, l);
         return s.ok() ? pooled.dense_mask({16, 12}, {8, 6}, 2, m) : s;
       }},
      {"YLG(8) on 9x11", {{9, 11}, {9, 11}}, 8,
       [&](CompiledLayout* l, std::vector<std::uint8_t>* m) {
         const Status s = ylg.compile({9, 11}, {9, 11}, 8, l);
         return s.ok() ? ylg.dense_mask({9, 11}, {9, 11}, 8, m) : s;
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    CompiledLayout layout;
    std::vector<std::uint8_t> mask;
    ASSERT_TRUE(c.build(&layout, &mask).ok());
    const std::int64_t h = c.heads, lq = pixels(c.g.q), lk = pixels(c.g.kv), e = 8;
    std::vector<float> q(static_cast<size_t>(h * lq * e)), k(static_cast<size_t>(h * lk * e)),
        v(static_cast<size_t>(h * lk * e));
    std::uint32_t state = 12345;
    auto next = [&] {
      state = state * 1664525u + 1013904223u;
      return static_cast<float>(state >> 8) / static_cast<float>(1u << 24) - 0.5f;
    };
    for (auto* t : {&q, &k, &v}) std::generate(t->begin(), t->end(), next);
    std::vector<float> sparse(q.size()), dense(q.size());
    const SparseLayout view = layout.view();
    auto params = [&](std::vector<float>* out) {
      AttentionParams p;
      p.batch = 1, p.heads = h, p.len_q = lq, p.len_k = lk, p.dim_qk = p.dim_v = e;
      p.q = q.data(), p.k = k.data(), p.v = v.data(), p.out = out->data();
      const std::int64_t qs[4] = {h * lq * e, lq * e, e, 1}, ks[4] = {h * lk * e, lk * e, e, 1};
      std::copy(qs, qs + 4, p.q_stride);
      std::copy(qs, qs + 4, p.out_stride);
      std::copy(ks, ks + 4, p.k_stride);
      std::copy(ks, ks + 4, p.v_stride);
      p.scale = 1.0 / std::sqrt(static_cast<double>(e));
      return p;
    };
    AttentionParams sp = params(&sparse);
    sp.layout = &view;
    Status s = attention_forward(sp, serial_host(), Backend::kCpu);
    ASSERT_TRUE(s.ok()) << s.message();
    AttentionParams dp = params(&dense);
    dp.mask_kind = MaskKind::kBool;
    dp.mask = mask.data();
    const std::int64_t ms[4] = {h * lq * lk, lq * lk, lk, 1};
    std::copy(ms, ms + 4, dp.mask_stride);
    s = attention_forward(dp, serial_host(), Backend::kReference);
    ASSERT_TRUE(s.ok()) << s.message();
    for (size_t i = 0; i < sparse.size(); ++i) ASSERT_NEAR(sparse[i], dense[i], 1e-5) << i;
  }
}

// ---- bad arguments ---------------------------------------------------------------------------

void expect_rejected(const Status& s, StatusCode code, const std::string& substring) {
  EXPECT_EQ(s.code(), code) << s.message();
  EXPECT_NE(s.message().find(substring), std::string::npos)
      << "\"" << s.message() << "\" lacks \"" << substring << "\"";
}

TEST(PatternsValidate, WindowRejectionsCarryPythonsMessages) {
  const GridShape g5{5, 5};
  const std::int64_t big = std::numeric_limits<std::int64_t>::max();
  const struct {
    Window w;
    GridShape q, kv;
    std::int64_t heads;
    std::string message;
  } cases[] = {
      {Window{0}, g5, g5, 1, "attn2d.patterns.Window: size must be >= 1; got 0"},
      {Window{-3}, g5, g5, 1, "size must be >= 1; got -3"},
      {Window{3, WindowMetric::kChebyshev, 0}, g5, g5, 1,
       "attn2d.patterns.Window: dilation must be an int >= 1; got 0"},
      {Window{3, static_cast<WindowMetric>(7)}, g5, g5, 1,
       "metric must be one of ('chebyshev', 'manhattan', 'euclidean'); got WindowMetric(7)"},
      {Window{3, WindowMetric::kChebyshev, 1, static_cast<WindowBorder>(-1)}, g5, g5, 1,
       "border must be one of ('clip', 'shift')"},
      {Window{3, WindowMetric::kManhattan, 1, WindowBorder::kShift}, g5, g5, 1,
       "attn2d.patterns.Window: border='shift' needs metric='chebyshev' (a shifted manhattan "
       "window is not defined); got metric='manhattan'"},
      {Window{3}, g5, g5, 0, "attn2d.patterns: heads must be an int >= 1; got 0"},
      {Window{3}, {0, 5}, g5, 1, "attn2d.patterns: q_hw must be at least 1x1; got (0, 5)"},
      {Window{3}, g5, {5, -2}, 1, "attn2d.patterns: kv_hw must be at least 1x1; got (5, -2)"},
      {Window{3}, {1 << 16, 1 << 16}, g5, 1, "more pixels than a layout's int32 rows index"},
      {Window{9}, g5, g5, 1,
       "attn2d.patterns.Window: dilation*(size-1) = 8 must be smaller than the key map's longer "
       "side (5x5); got size=9, dilation=1"},
      {Window{6, WindowMetric::kChebyshev, 1, WindowBorder::kShift}, g5, g5, 1,
       "attn2d.patterns.Window: border='shift' needs dilation*size = 6 <= both sides of the key "
       "map (5x5); got size=6, dilation=1"},
      {Window{3, WindowMetric::kChebyshev, 2, WindowBorder::kShift}, {7, 5}, {7, 5}, 1,
       "dilation*size = 6 <= both sides of the key map (7x5)"},
      // Products beyond 64 bits are compared without overflow and printed exactly.
      {Window{big, WindowMetric::kChebyshev, big}, g5, g5, 1,
       "dilation*(size-1) = 85070591730234615838173535747377725442 must be smaller"},
      {Window{big, WindowMetric::kChebyshev, big, WindowBorder::kShift}, g5, g5, 1,
       "dilation*size = 85070591730234615847396907784232501249 <= both sides"},
  };
  for (const auto& c : cases) {
    CompiledLayout layout;
    std::vector<std::uint8_t> mask;
    std::optional<CompiledWindowOffsets> offsets;
    expect_rejected(c.w.validate(c.q, c.kv, c.heads), StatusCode::kInvalidArgument, c.message);
    expect_rejected(c.w.compile(c.q, c.kv, c.heads, &layout), StatusCode::kInvalidArgument,
                    c.message);
    expect_rejected(c.w.dense_mask(c.q, c.kv, c.heads, &mask), StatusCode::kInvalidArgument,
                    c.message);
    if (c.heads == 1) {
      expect_rejected(c.w.offsets_on_grid(c.q, c.kv, &offsets), StatusCode::kInvalidArgument,
                      c.message);
    }
  }
  // Clip on a 1xN map: the window's rows are clipped, the longer side bounds it.
  EXPECT_TRUE(Window{17}.validate({1, 17}, {1, 17}, 1).ok());
  EXPECT_FALSE(Window{18}.validate({1, 17}, {1, 17}, 1).ok());
  const Window shifted{3, WindowMetric::kChebyshev, 2, WindowBorder::kShift};
  EXPECT_TRUE(shifted.validate({6, 6}, {6, 6}, 1).ok());
}

TEST(PatternsValidate, YlgRejectionsCarryPythonsMessages) {
  const GridShape g4{4, 4};
  YLG empty;
  expect_rejected(empty.validate(g4, g4, 1), StatusCode::kInvalidArgument,
                  "attn2d.patterns.YLG: needs at least one head");
  YLG bad_kind;
  bad_kind.patterns = {YlgKind::kLtrFloor, static_cast<YlgKind>(9)};
  expect_rejected(bad_kind.validate(g4, g4, 2), StatusCode::kInvalidArgument,
                  "unknown pattern YlgKind(9); choose from ('rtl-floor', 'rtl-repetitive', "
                  "'ltr-floor', 'ltr-repetitive')");
  YLG bad_mapping = YLG::with_heads(2);
  bad_mapping.mapping = static_cast<YlgMapping>(5);
  expect_rejected(bad_mapping.validate(g4, g4, 2), StatusCode::kInvalidArgument,
                  "mapping must be 'official' or 'geometric'; got YlgMapping(5)");
  const YLG eight = YLG::with_heads(8);
  CompiledLayout layout;
  std::vector<std::uint8_t> mask;
  expect_rejected(eight.compile(g4, g4, 4, &layout), StatusCode::kInvalidArgument,
                  "attn2d.patterns.YLG: the pattern has 8 heads but the tensors have 4");
  expect_rejected(eight.dense_mask(g4, {0, 4}, 8, &mask), StatusCode::kInvalidArgument,
                  "kv_hw must be at least 1x1; got (0, 4)");
  expect_rejected(eight.compile({3, 1 << 30}, g4, 8, &layout), StatusCode::kInvalidArgument,
                  "q_hw (3, 1073741824) holds more pixels");
}

TEST(PatternsValidate, OversizedRequestsReturnAStatus) {
  // A dense mask past the address space, and a head list past a vector's largest size: a
  // Status, not an exception or an abort.
  std::vector<std::uint8_t> mask;
  expect_rejected(Window{1}.dense_mask({1 << 15, 1 << 15}, {1 << 15, 1 << 15}, 1LL << 40, &mask),
                  StatusCode::kOutOfMemory, "exceed the addressable size");
  CompiledLayout layout;
  expect_rejected(Window{1}.compile({1, 1}, {1, 1}, std::numeric_limits<std::int64_t>::max(),
                                    &layout),
                  StatusCode::kOutOfMemory, "attn2d.patterns.Window.compile");
}

TEST(PatternsNames, ParseAndNameRoundTripWithPythonsMessages) {
  for (const WindowMetric m : kMetrics) {
    WindowMetric parsed;
    ASSERT_TRUE(parse_window_metric(window_metric_name(m), &parsed).ok());
    EXPECT_EQ(parsed, m);
  }
  for (const WindowBorder b : {WindowBorder::kClip, WindowBorder::kShift}) {
    WindowBorder parsed;
    ASSERT_TRUE(parse_window_border(window_border_name(b), &parsed).ok());
    EXPECT_EQ(parsed, b);
  }
  for (const YlgKind k : kKinds) {
    YlgKind parsed;
    ASSERT_TRUE(parse_ylg_kind(ylg_kind_name(k), &parsed).ok());
    EXPECT_EQ(parsed, k);
  }
  for (const YlgMapping m : {YlgMapping::kOfficial, YlgMapping::kGeometric}) {
    YlgMapping parsed;
    ASSERT_TRUE(parse_ylg_mapping(ylg_mapping_name(m), &parsed).ok());
    EXPECT_EQ(parsed, m);
  }
  WindowMetric metric;
  expect_rejected(parse_window_metric("taxicab", &metric), StatusCode::kInvalidArgument,
                  "attn2d.patterns.Window: metric must be one of ('chebyshev', 'manhattan', "
                  "'euclidean'); got 'taxicab'");
  WindowBorder border;
  expect_rejected(parse_window_border("wrap", &border), StatusCode::kInvalidArgument,
                  "attn2d.patterns.Window: border must be one of ('clip', 'shift'); got 'wrap'");
  YlgKind kind;
  expect_rejected(parse_ylg_kind("diagonal", &kind), StatusCode::kInvalidArgument,
                  "attn2d.patterns.YLG: unknown pattern 'diagonal'; choose from ('rtl-floor', "
                  "'rtl-repetitive', 'ltr-floor', 'ltr-repetitive')");
  YlgMapping mapping;
  expect_rejected(parse_ylg_mapping("nearest", &mapping), StatusCode::kInvalidArgument,
                  "attn2d.patterns.YLG: mapping must be 'official' or 'geometric'; got 'nearest'");
}

}  // namespace
}  // namespace attn2d
