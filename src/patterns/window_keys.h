// The keys a window lets one query see, listed directly from the query's centre so that a
// layout costs about its allowed pairs.
#pragma once

#include <cstdint>
#include <vector>

#include "attn2d/patterns.h"

namespace attn2d {
namespace patterns {

class WindowKeys {
 public:
  // `window` must have passed validate for these grids.
  WindowKeys(const Window& window, GridShape q_hw, GridShape kv_hw);

  // Appends the keys query `row` (a raster index of the query grid) may see, each once. A clip
  // window lists the steps of its square that land inside the map and keeps those within its
  // metric's radius; at least half of them pass (for a step (a, b) of a quadrant's rectangle
  // [0, A] x [0, B] with A, B <= radius, (A - a, B - b) is in it too and one of the two is
  // within the radius), so a query costs at most twice its keys.
  void append(std::int64_t row, std::vector<std::int32_t>* keys) const;

 private:
  // First key position along one axis of a shifted window: the window's `size` positions of
  // the centre's residue class mod dilation, moved inside [0, length).
  std::int64_t shifted_start(std::int64_t centre, std::int64_t length) const;

  Window window_;
  GridShape q_hw_, kv_hw_;
};

}  // namespace patterns
}  // namespace attn2d
