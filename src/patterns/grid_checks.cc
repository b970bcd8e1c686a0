#include "patterns/grid_checks.h"

#include <limits>
#include <string>

namespace attn2d {
namespace patterns {

std::string grid_text(GridShape hw) {
  return "(" + std::to_string(hw.height) + ", " + std::to_string(hw.width) + ")";
}

Status check_grid(const char* name, GridShape hw) {
  if (hw.height < 1 || hw.width < 1) {
    return Status::InvalidArgument(std::string("attn2d.patterns: ") + name +
                                   " must be at least 1x1; got " + grid_text(hw));
  }
  // A layout stores rows as int32 (attn2d/sparse_layout.h).
  constexpr std::int64_t kMaxPixels = std::numeric_limits<std::int32_t>::max();
  if (hw.height > kMaxPixels / hw.width) {
    return Status::InvalidArgument(std::string("attn2d.patterns: ") + name + " " + grid_text(hw) +
                                   " holds more pixels than a layout's int32 rows index (" +
                                   std::to_string(kMaxPixels) + ")");
  }
  return Status::Ok();
}

Status check_heads(std::int64_t heads) {
  if (heads < 1) {
    return Status::InvalidArgument("attn2d.patterns: heads must be an int >= 1; got " +
                                   std::to_string(heads));
  }
  return Status::Ok();
}

}  // namespace patterns
}  // namespace attn2d
