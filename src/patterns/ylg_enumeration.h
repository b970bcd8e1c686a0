// YLG's Enumerate step and its 1-D patterns: the key grid's cells ordered by Manhattan distance
// i + j from (0, 0), ties by smaller i; each query uses one row of a 1-D pattern over those
// positions.
#pragma once

#include <cstdint>
#include <vector>

#include "attn2d/patterns.h"

namespace attn2d {
namespace patterns {

struct YlgEnumeration {
  std::int64_t n = 0;       // key pixels, the 1-D patterns' length
  std::int64_t stride = 1;  // l = max(isqrt(n), 1), the patterns' block
  std::vector<std::int32_t> rank;            // key raster index -> position
  std::vector<std::int32_t> order;           // position -> key raster index
  std::vector<std::int32_t> query_position;  // query raster index -> its pattern row
};

// Grids checked by the caller (check_grid).
YlgEnumeration enumerate_ylg(YlgMapping mapping, GridShape q_hw, GridShape kv_hw);

// The positions every query of a repetitive pattern sees: one a block of the 1-D pattern (its
// last for ltr, the first of every full block for rtl). None for the floor patterns.
bool is_special_position(YlgKind kind, std::int64_t n, std::int64_t stride, std::int64_t position);

// Appends the keys (raster indices) query `row` may see under pattern `kind`, each once: at
// most l for the floor patterns, about n/l + 1 for the repetitive ones.
void append_ylg_keys(YlgKind kind, const YlgEnumeration& e, std::int64_t row,
                     std::vector<std::int32_t>* keys);

}  // namespace patterns
}  // namespace attn2d
