// What attn2d::Pattern holds: a node that checks grids and lists, for each head and query, the
// keys it allows. Dense masks and the layouts of combinations are built from those lists alone
// (generic_dense_mask, generic_compile); Window and YLG keep their own tiles when alone.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attn2d/pattern.h"

namespace attn2d {
namespace patterns {

// A pattern's keys on given grids and heads (made after the pattern validated them).
class KeyLister {
 public:
  virtual ~KeyLister() = default;
  // Heads with equal variants allow the same pairs and share a layout.
  virtual std::int64_t variant(std::int64_t head) const = 0;
  // Appends the keys query `row` may see under head `head` (a key may come more than once).
  virtual void append(std::int64_t head, std::int64_t row,
                      std::vector<std::int32_t>* keys) const = 0;
};

enum class Tiling : int {
  kTokenRuns = 0,    // 64 consecutive raster indices a tile: sequences
  kPixelBlocks = 1,  // 8-pixel-wide blocks of 64 pixels: 2-D neighbourhoods
};

class PatternNode {
 public:
  virtual ~PatternNode() = default;
  // "attn2d.patterns.Union", for messages.
  virtual const char* name() const = 0;
  virtual Status validate(GridShape q_hw, GridShape kv_hw, std::int64_t heads) const = 0;
  // Grids and heads validated first.
  virtual std::unique_ptr<KeyLister> keys(GridShape q_hw, GridShape kv_hw,
                                          std::int64_t heads) const = 0;
  virtual Tiling tiling() const = 0;
  // The layout; by default generic_compile's.
  virtual Status compile(GridShape q_hw, GridShape kv_hw, std::int64_t heads,
                         CompiledLayout* layout) const;
};

// The (heads, len_q, len_k) mask from the node's key lists, with the checks of dense_mask.
Status generic_dense_mask(const PatternNode& node, GridShape q_hw, GridShape kv_hw,
                          std::int64_t heads, std::vector<std::uint8_t>* mask);
// One layout per distinct variant, on the node's tiling (or `tiling`), from its key lists.
Status generic_compile(const PatternNode& node, GridShape q_hw, GridShape kv_hw,
                       std::int64_t heads, CompiledLayout* layout);
Status generic_compile(const PatternNode& node, Tiling tiling, GridShape q_hw, GridShape kv_hw,
                       std::int64_t heads, CompiledLayout* layout);

// The nodes of the sequence patterns, for their own calls (sequence_patterns.cc).
std::shared_ptr<const PatternNode> node_of(Window1D window);
std::shared_ptr<const PatternNode> node_of(Random random);
std::shared_ptr<const PatternNode> node_of(BlockMask mask);

}  // namespace patterns
}  // namespace attn2d
