// The argument checks every pattern shares, with the messages of attn2d.patterns' ValueErrors,
// and the centre a query pixel has on the key grid.
#pragma once

#include <cstdint>

#include "attn2d/patterns.h"

namespace attn2d {
namespace patterns {

// Both sides >= 1, and few enough pixels for the int32 rows of a layout.
Status check_grid(const char* name, GridShape hw);
Status check_heads(std::int64_t heads);

inline std::int64_t pixels(GridShape hw) { return hw.height * hw.width; }

// The key pixel query pixel (i, j) is centred at: (floor(i*Hk/Hq), floor(j*Wk/Wq)). Both grids
// hold at most 2^31 - 1 pixels (check_grid), so the products fit in 64 bits.
inline std::int64_t centre_row(std::int64_t i, GridShape q_hw, GridShape kv_hw) {
  return i * kv_hw.height / q_hw.height;
}
inline std::int64_t centre_col(std::int64_t j, GridShape q_hw, GridShape kv_hw) {
  return j * kv_hw.width / q_hw.width;
}

// "(H, W)", as Python prints a tuple.
std::string grid_text(GridShape hw);

}  // namespace patterns
}  // namespace attn2d
