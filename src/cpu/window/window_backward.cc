// Backward of a window given as offsets (attn2d/window_offsets.h), vectorised across queries as
// the forward is (window_forward.cc): per query vector and offset, with P recomputed from
// the forward's log-sum-exp,
//   S  = Q^T K^T(off)            P = exp(S - lse)           (E multiply-adds per pair)
//   dP = dO^T V^T(off)           dS = P (dP - D), D = rowsum(dO * O)     (Ev)
//   dQ^T          += dS K^T(off)   in registers across the offsets        (E)
//   dK^T(off)     += dS Q^T        read-modify-write of the shifted rows  (E)
//   dV^T(off)     += P dO^T                                               (Ev)
// 3E + 2Ev multiply-adds per allowed pair, as many as the dense backward spends per pair, where
// the tiled sparse backward computes every pair of each visited 8x8-pixel tile pair (2.5x the
// allowed pairs of a 15x15 square, 4.9x those of a diamond).
//
// dK and dV are scattered, so queries that reach the same keys must not run at once.
//
// Where the forward runs blocks (window_geometry.h: evenly spaced columns, width a multiple of
// L), the backward runs blocks of 4 query vectors one pixel row apart: S and dP by BlockDots
// (each key load shared by up to 4 multiply-adds), P and dS, dQ^T = dS K^T(off) in registers
// (BlockCombine), and dK^T, dV^T by BlockScatter, whose column walk shares each query row
// load across the column's offsets and keeps the overlapping stores of neighbouring columns a
// column's worth of rows apart: one pass, where a second pass per block of key vectors under the
// window turned around would recompute S^T, dP^T and their exps (4E + 3Ev multiply-adds and 2
// exps a pair against 3E + 2Ev and 1).
//
// Two schedules, both summing every key's terms in one fixed order whatever the thread count:
// the blocked one streams each head's bands through a thread's planes (StreamBackward,
// stream_backward-inl.h); the unblocked one packs whole heads and runs bands in phases
// (WholeHeadBackward, whole_head_backward-inl.h).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/window/window_backward.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cstdint>

#include "attn2d/attention_params.h"
#include "attn2d/host.h"
#include "attn2d/status.h"
#include "cpu/attention_cpu.h"
#include "cpu/common/dtype_dispatch.h"
#include "cpu/common/result_stores.h"
#include "cpu/common/row_ops-inl.h"
#include "cpu/common/tiling.h"
#include "cpu/window/stream_backward-inl.h"
#include "cpu/window/whole_head_backward-inl.h"
#include "cpu/window/window_geometry.h"
#include "cpu/window/window_plan-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {

template <typename T, typename IO>
Status WindowBackward(const AttentionBackwardParams& bp, const Host& host,
                      const KernelChoice& choice) {
  const AttentionParams& p = bp.fwd;
  if (p.batch == 0 || p.heads == 0 || p.len_q == 0) return Status::Ok();
  const WindowGeometry<T> g(*p.window, static_cast<std::int64_t>(VectorLanes<T>()), kBlockRows,
                            kBlockOffsets);
  const size_t e_pad = static_cast<size_t>(round_up(std::max<std::int64_t>(p.dim_qk, 1), 4));
  const size_t ev_pad = static_cast<size_t>(round_up(std::max<std::int64_t>(p.dim_v, 1), 4));
  const bool stream_grads =
      stream_results(host, gradient_bytes(p, static_cast<std::int64_t>(sizeof(IO))));
  const bool blocked = choice.schedule == Schedule::kWindowBlocked;
  if (blocked != (g.block_rows > 1)) return WindowChoiceDisagrees();
  if (blocked) return StreamBackward<T, IO>(bp, host, g, e_pad, ev_pad, stream_grads);
  return WholeHeadBackward<T, IO>(bp, host, g, e_pad, ev_pad, stream_grads);
}

ATTN2D_DTYPE_INSTANCES(WindowBackward, WindowBackward, AttentionBackwardParams)

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn2d {
namespace cpu {

ATTN2D_DTYPE_DISPATCH(WindowBackward, window_backward, AttentionBackwardParams)

}  // namespace cpu
}  // namespace attn2d
#endif  // HWY_ONCE
