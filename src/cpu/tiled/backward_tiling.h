// The tiled backward's plan that does not depend on the SIMD target's code: its tiles and its
// schedule. The kernel chooser (core/kernel_choice.cc) reports the schedule it returns, and the
// backward (tiled/tiled_backward.cc) runs on it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attn2d/attention_params.h"
#include "cpu/common/tiling.h"

namespace attn2d {
namespace cpu {

// dQ shares stay under 256 MiB (at 64 threads, whole heads of len_q = 65536, E = 64 would want
// 2 GiB; two passes need none).
constexpr std::size_t kMaxShareBytes = std::size_t{256} << 20;

struct BackwardTiling {
  TileSizes tiles;
  std::int64_t q_tiles = 0;    // query tiles of a (batch, head) slice (a layout's most)
  std::int64_t k_tiles = 0;    // key tiles of a slice
  std::int64_t dq_groups = 1;  // key-tile groups of the dQ sum
  std::size_t share_rows = 0;  // rows of one slice's dQ share
  Schedule schedule = Schedule::kWholeHeads;  // the cheapest (choose_backward_schedule)
};

// lanes: the compute type's vector lanes on the dispatched SIMD target; elem_bytes: its size.
BackwardTiling plan_backward_tiling(const AttentionParams& p, int threads, std::size_t lanes,
                                    std::size_t elem_bytes);

}  // namespace cpu
}  // namespace attn2d
