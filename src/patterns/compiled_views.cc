// The owning layout and offsets lent to the kernels as views.
#include "attn2d/patterns.h"

namespace attn2d {

std::int64_t CompiledLayout::num_layouts() const {
  return static_cast<std::int64_t>(q_tile_begin.size()) - 1;
}

std::int64_t CompiledLayout::num_masks() const {
  return static_cast<std::int64_t>(masks.size()) / block_q;
}

SparseLayout CompiledLayout::view() const {
  SparseLayout lay;
  lay.block_q = block_q;
  lay.block_k = block_k;
  lay.num_layouts = num_layouts();
  lay.head_layout = head_layout.data();
  lay.q_tile_begin = q_tile_begin.data();
  lay.k_tile_begin = k_tile_begin.data();
  lay.q_rows = q_rows.data();
  lay.k_rows = k_rows.data();
  lay.fwd_begin = fwd_begin.data();
  lay.fwd_k_tile = fwd_k_tile.data();
  lay.fwd_mask = fwd_mask.data();
  lay.bwd_begin = bwd_begin.data();
  lay.bwd_q_tile = bwd_q_tile.data();
  lay.bwd_mask = bwd_mask.data();
  lay.num_masks = num_masks();
  lay.masks = masks.data();
  return lay;
}

WindowOffsets CompiledWindowOffsets::view() const {
  WindowOffsets w;
  w.height = height;
  w.width = width;
  w.count = static_cast<std::int64_t>(dr.size());
  w.dr = dr.data();
  w.dc = dc.data();
  return w;
}

}  // namespace attn2d
