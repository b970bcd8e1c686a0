// The tiles of one YLG head pattern, chosen so that its allowed pairs fall into few
// (query tile, key tile) blocks.
#pragma once

#include "patterns/layout_builder.h"
#include "patterns/ylg_enumeration.h"

namespace attn2d {
namespace patterns {

// `e` must outlive the plan: its allowed_keys reads it.
TilePlan ylg_tile_plan(YlgKind kind, const YlgEnumeration& e);

}  // namespace patterns
}  // namespace attn2d
