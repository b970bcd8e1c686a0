#include "cpu/tiling.h"

#include <algorithm>

namespace attn2d {
namespace cpu {

TileSizes choose_tiles(std::int64_t len_q, std::int64_t len_k, std::int64_t dim_qk,
                       std::int64_t dim_v, std::size_t elem_bytes, std::size_t granule) {
  const std::int64_t g = static_cast<std::int64_t>(std::max<std::size_t>(granule, 1));
  const std::int64_t eb = static_cast<std::int64_t>(std::max<std::size_t>(elem_bytes, 1));
  // The packed K and V tiles (block_k x (E + Ev)) are re-read by every 4-row block of queries:
  // 128 KiB keeps them in a 512 KiB-1 MiB L2 beside the score tile and the accumulator.
  constexpr std::int64_t kKvTileBytes = 128 * 1024;
  const std::int64_t width = std::max<std::int64_t>(dim_qk + dim_v, 1);
  std::int64_t block_k = kKvTileBytes / (width * eb);
  // 256 keys: beyond it the score tile outgrows L1/L2 with no gain; g: one vector.
  const std::int64_t max_block_k = std::max<std::int64_t>(g, 256 / g * g);
  block_k = std::clamp<std::int64_t>(block_k / g * g, g, max_block_k);
  block_k = std::min(block_k, round_up(std::max<std::int64_t>(len_k, 1), g));
  // The score tile (block_q x block_k) holds up to 64 K elements (256 KiB in float32, a
  // quarter of L2). Every query tile re-packs every K/V tile, so block_q divides that traffic:
  // 256 rows made the forward 13% faster than 128 at E=8, Ev=64 (41 vs 36 GFLOP/s here), and
  // removed the slowdown of NCHW views, whose 64 KiB strides alias in the caches.
  std::int64_t block_q = std::clamp<std::int64_t>(65536 / block_k, 16, 256) / 4 * 4;
  block_q = std::min(block_q, round_up(std::max<std::int64_t>(len_q, 1), 4));
  return TileSizes{block_q, block_k};
}

}  // namespace cpu
}  // namespace attn2d
