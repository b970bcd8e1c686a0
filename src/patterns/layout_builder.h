// Turns a pattern's tiles and allowed pairs into the block-sparse layout the kernels walk
// (attn2d/sparse_layout.h): for every query tile, the key tiles holding an allowed pair, in
// ascending order, each allowing every pair or carrying one mask word a query row.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "attn2d/patterns.h"

namespace attn2d {
namespace patterns {

// One layout of a pattern before its visits are found.
struct TilePlan {
  std::vector<std::int32_t> q_rows;  // (query tiles, kPatternBlockQ), -1 padded at the end
  std::vector<std::int32_t> k_rows;  // (key tiles, kPatternBlockK), each key in exactly one
  // Appends the keys query `row` may see to *keys (a key may come more than once).
  std::function<void(std::int64_t row, std::vector<std::int32_t>* keys)> allowed_keys;
};

class LayoutBuilder {
 public:
  explicit LayoutBuilder(std::int64_t len_k);

  // Appends one layout (the next index of head_layout) and its visits.
  void add(const TilePlan& plan);

  // The layout, with the backward's visit lists and each head's layout index.
  void finish(std::vector<std::int32_t> head_layout, CompiledLayout* out);

 private:
  std::int64_t len_k_;
  CompiledLayout layout_;
};

}  // namespace patterns
}  // namespace attn2d
