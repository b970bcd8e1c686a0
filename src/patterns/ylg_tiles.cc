// Floor patterns: queries and keys both in enumeration order, a floor query's keys being the
// positions of its block of l. Repetitive patterns: queries in raster order; key tiles first the
// "special" positions (one a block of the 1-D pattern, seen by every query), then the other
// positions in runs that follow the query tiles. Each step is a counting sort or a scan, O(len_q
// + len_k).
#include "patterns/ylg_tiles.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace attn2d {
namespace patterns {
namespace {

constexpr std::int64_t kBlockQ = kPatternBlockQ, kBlockK = kPatternBlockK;

// Consecutive runs of `block` entries, each padded with -1 to `block`, appended to *rows.
void append_chunks(const std::vector<std::int32_t>& entries, std::int64_t block,
                   std::vector<std::int32_t>* rows) {
  for (size_t i = 0; i < entries.size(); i += static_cast<size_t>(block)) {
    const size_t end = std::min(entries.size(), i + static_cast<size_t>(block));
    rows->insert(rows->end(), entries.begin() + static_cast<std::ptrdiff_t>(i),
                 entries.begin() + static_cast<std::ptrdiff_t>(end));
    rows->resize(rows->size() + static_cast<size_t>(block) - (end - i), -1);
  }
}

}  // namespace

TilePlan ylg_tile_plan(YlgKind kind, const YlgEnumeration& e) {
  const std::int64_t n = e.n, l = e.stride;
  const std::int64_t len_q = static_cast<std::int64_t>(e.query_position.size());
  const bool repetitive = kind == YlgKind::kLtrRepetitive || kind == YlgKind::kRtlRepetitive;
  TilePlan plan;

  // Every query of a repetitive pattern sees the same special keys and one key of its own, so
  // any order serves, and raster order makes a tile's rows, outputs and log-sum-exps contiguous
  // where the enumeration puts them one anti-diagonal step (a line each) apart. A floor query
  // sees its block of positions: queries sorted by position (stably, by raster index within
  // one position).
  std::vector<std::int32_t> q_order(static_cast<size_t>(len_q));
  if (repetitive) {
    for (std::int64_t q = 0; q < len_q; ++q) {
      q_order[static_cast<size_t>(q)] = static_cast<std::int32_t>(q);
    }
  } else {
    std::vector<std::int64_t> next(static_cast<size_t>(n) + 1, 0);
    for (const std::int32_t p : e.query_position) ++next[static_cast<size_t>(p) + 1];
    for (size_t p = 0; p < static_cast<size_t>(n); ++p) next[p + 1] += next[p];
    for (std::int64_t q = 0; q < len_q; ++q) {
      const size_t p = static_cast<size_t>(e.query_position[static_cast<size_t>(q)]);
      q_order[static_cast<size_t>(next[p]++)] = static_cast<std::int32_t>(q);
    }
  }
  append_chunks(q_order, kBlockQ, &plan.q_rows);

  std::vector<std::int32_t> special;
  std::vector<char> is_special(static_cast<size_t>(n), 0);
  for (std::int64_t p = 0; p < n; ++p) {
    if (is_special_position(kind, n, l, p)) {
      special.push_back(static_cast<std::int32_t>(p));
      is_special[static_cast<size_t>(p)] = 1;
    }
  }
  // The other positions' key tiles, as positions.
  std::vector<std::vector<std::int32_t>> rest_tiles;
  auto cut = [&](const std::vector<std::int32_t>& run) {
    for (size_t i = 0; i < run.size(); i += static_cast<size_t>(kBlockK)) {
      const size_t end = std::min(run.size(), i + static_cast<size_t>(kBlockK));
      rest_tiles.emplace_back(run.begin() + static_cast<std::ptrdiff_t>(i),
                              run.begin() + static_cast<std::ptrdiff_t>(end));
    }
  };
  if (repetitive) {
    // A query's own key (outside the special positions) is the cell of its pattern row: the
    // other positions are cut into runs, one for each query tile, of the keys whose first
    // user is that tile, in raster order; with 2x2-pooled keys (official mapping) a raster tile
    // of 64 queries then uses 64 consecutive key cells, one each (a single-key visit: one score
    // a query). Positions no query uses go last.
    const std::int64_t q_tiles = (len_q + kBlockQ - 1) / kBlockQ;
    std::vector<std::int64_t> first_user(static_cast<size_t>(n), q_tiles);
    for (std::int64_t q = 0; q < len_q; ++q) {
      const size_t p = static_cast<size_t>(e.query_position[static_cast<size_t>(q)]);
      first_user[p] = std::min(first_user[p], q / kBlockQ);
    }
    std::vector<std::vector<std::int32_t>> runs(static_cast<size_t>(q_tiles) + 1);
    for (std::int64_t raster = 0; raster < n; ++raster) {  // raster order within each run
      const size_t p = static_cast<size_t>(e.rank[static_cast<size_t>(raster)]);
      if (!is_special[p]) {
        runs[static_cast<size_t>(first_user[p])].push_back(static_cast<std::int32_t>(p));
      }
    }
    for (const auto& run : runs) cut(run);
  } else {
    std::vector<std::int32_t> rest;
    for (std::int64_t p = 0; p < n; ++p) {
      if (!is_special[static_cast<size_t>(p)]) rest.push_back(static_cast<std::int32_t>(p));
    }
    cut(rest);
    if (kind == YlgKind::kRtlFloor) {
      // A query sees the keys of its block at or after its own position: listed backwards, a
      // query tile's keys lead its key tile, and the kernels compute only the leading columns a
      // visit's masks reach, as they do for ltr-floor's tiles in ascending order.
      for (auto& tile : rest_tiles) std::reverse(tile.begin(), tile.end());
    }
  }

  std::vector<std::int32_t> keys;
  auto to_keys = [&](const std::vector<std::int32_t>& positions) {
    keys.clear();
    for (const std::int32_t p : positions) keys.push_back(e.order[static_cast<size_t>(p)]);
    return keys;
  };
  append_chunks(to_keys(special), kBlockK, &plan.k_rows);
  for (const auto& tile : rest_tiles) append_chunks(to_keys(tile), kBlockK, &plan.k_rows);

  plan.allowed_keys = [kind, &e](std::int64_t row, std::vector<std::int32_t>* out) {
    append_ylg_keys(kind, e, row, out);
  };
  return plan;
}

}  // namespace patterns
}  // namespace attn2d
