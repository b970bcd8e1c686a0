#include "patterns/pixel_blocks.h"

#include <algorithm>

namespace attn2d {
namespace patterns {

std::vector<std::int32_t> pixel_block_rows(GridShape hw, std::int64_t block) {
  const std::int64_t block_w = std::min<std::int64_t>(hw.width, 8);
  const std::int64_t block_h = std::max<std::int64_t>(block / block_w, 1);
  const std::int64_t blocks =
      ((hw.height + block_h - 1) / block_h) * ((hw.width + block_w - 1) / block_w);
  std::vector<std::int32_t> rows(static_cast<size_t>(blocks * block), -1);
  auto out = rows.begin();
  for (std::int64_t r0 = 0; r0 < hw.height; r0 += block_h) {
    for (std::int64_t c0 = 0; c0 < hw.width; c0 += block_w) {
      auto slot = out;
      for (std::int64_t r = r0; r < std::min(r0 + block_h, hw.height); ++r) {
        for (std::int64_t c = c0; c < std::min(c0 + block_w, hw.width); ++c) {
          *slot++ = static_cast<std::int32_t>(r * hw.width + c);
        }
      }
      out += block;
    }
  }
  return rows;
}

}  // namespace patterns
}  // namespace attn2d
