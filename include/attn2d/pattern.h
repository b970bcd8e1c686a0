// Any pattern as one value, and patterns combined: Pattern holds a Window, YLG, Window1D, Random
// or BlockMask, or the union or intersection of other Patterns (query i may see key j under a
// union when any part allows it, under an intersection when every part does), with the same
// calls as each of them. A Pattern is immutable and cheap to copy (its parts are shared).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "attn2d/patterns.h"
#include "attn2d/sequence_patterns.h"

namespace attn2d {

namespace patterns {
class PatternNode;
}  // namespace patterns

class Pattern {
 public:
  Pattern(Window window);
  Pattern(YLG ylg);
  Pattern(Window1D window);
  Pattern(Random random);
  Pattern(BlockMask mask);

  // At least one part; parts of one combination must agree on the grids and heads they accept.
  static Pattern Union(std::vector<Pattern> parts);
  static Pattern Intersection(std::vector<Pattern> parts);

  Status validate(GridShape q_hw, GridShape kv_hw, std::int64_t heads) const;
  Status dense_mask(GridShape q_hw, GridShape kv_hw, std::int64_t heads,
                    std::vector<std::uint8_t>* mask) const;
  // A single Window or YLG compiles as it does on its own. A combination of sequence patterns
  // compiles on runs of 64 consecutive tokens, one of 2-D patterns (Window, YLG) on 8-pixel-wide
  // blocks of 64 pixels, and one of both on whichever of the two visits fewer tiles; one layout
  // per distinct combination of its parts' head layouts.
  Status compile(GridShape q_hw, GridShape kv_hw, std::int64_t heads,
                 CompiledLayout* layout) const;

  // The Window this Pattern is, or null for any other pattern or a combination: a single
  // window may run on the window kernels (Window::kernel_offsets), which read no layout.
  // The pointer lives as long as this Pattern (or a copy of it).
  const Window* as_window() const;

 private:
  explicit Pattern(std::shared_ptr<const patterns::PatternNode> node);
  std::shared_ptr<const patterns::PatternNode> node_;
};

}  // namespace attn2d
