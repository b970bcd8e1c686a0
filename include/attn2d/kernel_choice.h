// The kernel chooser: the one place that decides which kernel family serves a call, forward and
// backward, and says why, naming the reason each other family refused (NATTEN's can_run_* style).
// attention_forward and attention_backward run what it returns; attn2d.explain prints it.
#pragma once

#include <string>
#include <vector>

#include "attn2d/attention_params.h"
#include "attn2d/host.h"

namespace attn2d {

enum class Kernel : int {
  kReference = 0,  // naive, double accumulation: the oracle, run only when asked for
  kDenseTiles,     // tiled online softmax over every (query tile, key tile) pair
  kSparseTiles,    // the same tiles, visiting only a block-sparse layout's listed pairs
  kQueryLanes,     // a layout's visits with 16 queries along the vector lanes (forward only)
  kWindow,         // a clip window on one grid as offsets, queries along the vector lanes
};

// How the kernel multiplies its inputs.
enum class Products : int {
  kFloat32 = 0,     // float32 FMAs on float32 inputs
  kFloat64,         // float64 FMAs
  kWidened,         // 16-bit inputs widened to float32 as tiles are packed
  kBf16Pairs,       // VDPBF16PS on bf16 pairs, P and dS rounded to bf16 once
};

// The schedule: the tiled backward's (cpu/common/tiling.h), or the window kernels', forward and
// backward (cpu/window/window_geometry.h); kNone for the tiled forward and the query lanes.
enum class Schedule : int {
  kNone = 0,
  kWholeHeads,     // one task a (batch, head): no shared buffer
  kKeyTileGroups,  // groups of a head's key tiles, dQ summed from per-group shares
  kTwoPasses,      // key tiles for dK and dV, then query tiles for dQ
  kWindowBlocked,  // the window backward on blocks of 4 query vectors, streamed by bands
  kWindowVectors,  // the window backward one query vector at a time, on whole heads
};

const char* kernel_name(Kernel kernel);
const char* products_name(Products products);
const char* schedule_name(Schedule schedule);

struct KernelRefusal {
  Kernel kernel;
  std::string reason;
};

struct KernelChoice {
  Kernel kernel = Kernel::kDenseTiles;
  Products products = Products::kFloat32;
  Schedule schedule = Schedule::kNone;
  // Filled only when asked for (with_reasons): why `kernel`, and why each other one refused.
  std::string reason;
  std::vector<KernelRefusal> refused;
};

// The choice for params (validated or not: only sizes, dtype, layout and window are read).
// host.num_threads enters the backward's schedule.
KernelChoice choose_forward(const AttentionParams& params, const Host& host,
                            bool with_reasons = false);
KernelChoice choose_backward(const AttentionParams& params, const Host& host,
                             bool with_reasons = false);

// Empty where the window kernels take `window`; else why the block-sparse tiles serve it
// better: the window kernels compute every offset for every query, and past 2x the allowed
// pairs the tiles waste less.
std::string window_kernel_refusal(const WindowOffsets& window);

}  // namespace attn2d
