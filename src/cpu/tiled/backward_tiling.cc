#include "cpu/tiled/backward_tiling.h"

#include <algorithm>

#include "cpu/tiled/layout_scan.h"

namespace attn2d {
namespace cpu {

BackwardTiling plan_backward_tiling(const AttentionParams& p, int threads, std::size_t lanes,
                                    std::size_t elem_bytes) {
  BackwardTiling t;
  const std::int64_t L = static_cast<std::int64_t>(std::max<std::size_t>(lanes, 1));
  if (p.layout != nullptr) {
    t.tiles = TileSizes{p.layout->block_q, p.layout->block_k};
    t.q_tiles = MostLayoutTiles(*p.layout, /*query=*/true);
    t.k_tiles = MostLayoutTiles(*p.layout, /*query=*/false);
  } else {
    t.tiles = choose_tiles(p.len_q, p.len_k, p.dim_qk, p.dim_v, elem_bytes,
                           std::max<std::size_t>(static_cast<std::size_t>(L), 16));
    t.q_tiles = (p.len_q + t.tiles.block_q - 1) / t.tiles.block_q;
    t.k_tiles = (p.len_k + t.tiles.block_k - 1) / t.tiles.block_k;
  }
  t.share_rows = p.layout != nullptr ? static_cast<std::size_t>(t.q_tiles * t.tiles.block_q)
                                     : static_cast<std::size_t>(p.len_q);
  const std::size_t share_elems = t.share_rows * static_cast<std::size_t>(round_up(p.dim_qk, L));
  // A sparse layout's query tile sees few key tiles (YLG at 128x128 over 64x64: 1.5 visits on
  // average), and each group costs a zeroed (len_q, E_pad) share and its add, whichever rows it
  // touches. One group: one chain per dQ row, in key-tile order, in every schedule (two passes
  // where whole heads would leave threads idle).
  t.dq_groups = p.layout != nullptr ? 1 : backward_dq_groups(t.k_tiles);
  t.schedule = choose_backward_schedule(p.batch * p.heads, std::max(threads, 1), p.dim_qk,
                                        p.dim_v, t.dq_groups, share_elems, elem_bytes,
                                        kMaxShareBytes);
  return t;
}

}  // namespace cpu
}  // namespace attn2d
