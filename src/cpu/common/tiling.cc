#include "cpu/common/tiling.h"

#include <algorithm>
#include <cmath>

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
  // quarter of L2). Every query tile re-packs every K/V tile, so block_q divides that traffic;
  // 256 rows also avoid the slowdown of NCHW views, whose 64 KiB strides alias in the caches.
  std::int64_t block_q = std::clamp<std::int64_t>(65536 / block_k, 16, 256) / 4 * 4;
  block_q = std::min(block_q, round_up(std::max<std::int64_t>(len_q, 1), 4));
  return TileSizes{block_q, block_k};
}

std::int64_t backward_dq_groups(std::int64_t k_tiles) {
  // 8 groups feed up to 8 threads on one head; each costs one add of a (len_q, E) share.
  return std::clamp<std::int64_t>(k_tiles, 1, 8);
}

Schedule choose_backward_schedule(std::int64_t slices, int threads, std::int64_t dim_qk,
                                  std::int64_t dim_v, std::int64_t dq_groups,
                                  std::size_t share_elems, std::size_t elem_bytes,
                                  std::size_t max_share_bytes) {
  threads = std::max(threads, 1);
  const double t = threads, E = static_cast<double>(dim_qk), Ev = static_cast<double>(dim_v);
  // Multiply-adds per (query, key) pair: one pass does Q*K^T (E), dO*V^T (Ev), dV (Ev), dK (E)
  // and dQ (E); two passes do Q*K^T and dO*V^T twice; each pass also pays the recomputed exp
  // and softmax gradient (~16 multiply-adds' worth).
  constexpr double kSoftmaxCost = 16.0;
  const double one_pass = 3.0 * E + 2.0 * Ev + kSoftmaxCost;
  const double two_pass = 4.0 * E + 3.0 * Ev + 2.0 * kSoftmaxCost;
  // Per-thread time in units of one slice's pairs: the busiest thread's share of the tasks.
  auto rounds = [&](std::int64_t tasks, std::int64_t per_slice) {
    return std::ceil(static_cast<double>(tasks) / t) / static_cast<double>(per_slice);
  };
  const double whole_heads = one_pass * rounds(slices, 1);
  const double groups = one_pass * rounds(slices * dq_groups, dq_groups);
  const double two_passes = two_pass * static_cast<double>(slices) / t;
  const double share_bytes = static_cast<double>(share_elems * elem_bytes);
  const bool heads_fit = 2.0 * t * share_bytes <= static_cast<double>(max_share_bytes);
  const bool groups_fit = static_cast<double>(slices * dq_groups) * share_bytes <=
                          static_cast<double>(max_share_bytes);
  Schedule best = Schedule::kTwoPasses;
  double best_cost = two_passes;
  if (groups_fit && groups < best_cost) best = Schedule::kKeyTileGroups, best_cost = groups;
  // Whole heads win ties: no shared buffer and no final sum.
  if (heads_fit && whole_heads <= best_cost) best = Schedule::kWholeHeads;
  return best;
}

}  // namespace cpu
}  // namespace attn2d
