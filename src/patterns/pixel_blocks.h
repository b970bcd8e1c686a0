// A grid cut into blocks of neighbouring pixels: the tiles of a window's layout, where a
// query's window falls into few key tiles.
#pragma once

#include <cstdint>
#include <vector>

#include "attn2d/patterns.h"

namespace attn2d {
namespace patterns {

// Raster rows of `hw` in blocks of at most `block` pixels, 8 wide where the grid is that wide
// (square-ish 2-D neighbourhoods), in block-raster order and raster order within a block; each
// block padded with -1 to `block` rows: (blocks, block).
std::vector<std::int32_t> pixel_block_rows(GridShape hw, std::int64_t block);

}  // namespace patterns
}  // namespace attn2d
