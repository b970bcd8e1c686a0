#include "patterns/ylg_enumeration.h"

#include <algorithm>
#include <cmath>

#include "patterns/grid_checks.h"

namespace attn2d {
namespace patterns {
namespace {

std::int64_t integer_sqrt(std::int64_t n) {
  std::int64_t s = static_cast<std::int64_t>(std::sqrt(static_cast<double>(n)));
  while (s * s > n) --s;
  while ((s + 1) * (s + 1) <= n) ++s;
  return s;
}

}  // namespace

YlgEnumeration enumerate_ylg(YlgMapping mapping, GridShape q_hw, GridShape kv_hw) {
  YlgEnumeration e;
  const std::int64_t h = kv_hw.height, w = kv_hw.width;
  e.n = h * w;
  e.stride = std::max<std::int64_t>(integer_sqrt(e.n), 1);
  e.rank.resize(static_cast<size_t>(e.n));
  e.order.resize(static_cast<size_t>(e.n));
  // Anti-diagonal s = i + j in turn, each by ascending i: the order of sorting by (i + j, i),
  // without the sort.
  std::int32_t position = 0;
  for (std::int64_t s = 0; s <= h + w - 2; ++s) {
    for (std::int64_t i = std::max<std::int64_t>(0, s - (w - 1)); i <= std::min(s, h - 1); ++i) {
      const std::int64_t raster = i * w + (s - i);
      e.rank[static_cast<size_t>(raster)] = position;
      e.order[static_cast<size_t>(position)] = static_cast<std::int32_t>(raster);
      ++position;
    }
  }
  const std::int64_t len_q = pixels(q_hw);
  e.query_position.resize(static_cast<size_t>(len_q));
  for (std::int64_t q = 0; q < len_q; ++q) {
    // official: raster index mod n, as the published code tiles its mask; geometric: the key
    // cell the query is centred at.
    const std::int64_t cell =
        mapping == YlgMapping::kOfficial
            ? q % e.n
            : centre_row(q / q_hw.width, q_hw, kv_hw) * w + centre_col(q % q_hw.width, q_hw, kv_hw);
    e.query_position[static_cast<size_t>(q)] = e.rank[static_cast<size_t>(cell)];
  }
  return e;
}

bool is_special_position(YlgKind kind, std::int64_t n, std::int64_t stride,
                         std::int64_t position) {
  switch (kind) {
    case YlgKind::kLtrRepetitive:
      return position % stride == stride - 1;
    case YlgKind::kRtlRepetitive:
      return position % stride == 0 && position + stride - 1 < n;
    default:
      return false;
  }
}

void append_ylg_keys(YlgKind kind, const YlgEnumeration& e, std::int64_t row,
                     std::vector<std::int32_t>* keys) {
  const std::int64_t r = e.query_position[static_cast<size_t>(row)], l = e.stride, n = e.n;
  const std::int64_t block_start = r - r % l;
  auto add = [&](std::int64_t position) {
    keys->push_back(e.order[static_cast<size_t>(position)]);
  };
  switch (kind) {
    case YlgKind::kLtrFloor:  // r's block up to r
      for (std::int64_t c = block_start; c <= r; ++c) add(c);
      break;
    case YlgKind::kRtlFloor:  // the transpose: r to the end of its block
      for (std::int64_t c = r; c <= std::min(block_start + l - 1, n - 1); ++c) add(c);
      break;
    case YlgKind::kLtrRepetitive:  // the last position of every block, and r
      for (std::int64_t c = l - 1; c < n; c += l) add(c);
      if (!is_special_position(kind, n, l, r)) add(r);
      break;
    case YlgKind::kRtlRepetitive:  // the first position of every full block, and r
      for (std::int64_t c = 0; c + l - 1 < n; c += l) add(c);
      if (!is_special_position(kind, n, l, r)) add(r);
      break;
  }
}

}  // namespace patterns
}  // namespace attn2d
