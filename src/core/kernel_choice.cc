// The kernel chooser (attn2d/kernel_choice.h): every rule that picks a kernel family, its
// products and its schedule, with the reasons attn2d.explain prints.
#include "attn2d/kernel_choice.h"

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <string>

#include "attn2d/bf16_products.h"
#include "cpu/attention_cpu.h"
#include "cpu/tiled/backward_tiling.h"
#include "cpu/window/window_geometry.h"

namespace attn2d {
namespace {

template <typename... Args>
std::string format(const char* fmt, Args... args) {
  char buf[384];
  std::snprintf(buf, sizeof(buf), fmt, args...);
  return buf;
}

// (query, key) pairs the window kernels compute for one head, and the pairs the window allows.
void window_pairs(const WindowOffsets& w, double* computed, double* allowed) {
  *computed = static_cast<double>(w.count) * static_cast<double>(w.height * w.width);
  *allowed = 0.0;
  for (std::int64_t o = 0; o < w.count; ++o) {
    *allowed += static_cast<double>(w.height - std::abs(std::int64_t{w.dr[o]})) *
                static_cast<double>(w.width - std::abs(std::int64_t{w.dc[o]}));
  }
}

// How a tiled kernel multiplies params' inputs, with its reason.
Products tiled_products(DType dtype, std::string* reason) {
  switch (dtype) {
    case DType::kFloat32:
      if (reason) *reason = "float32 FMAs";
      return Products::kFloat32;
    case DType::kFloat64:
      if (reason) *reason = "float64 FMAs";
      return Products::kFloat64;
    case DType::kFloat16:
      if (reason) *reason = "float16 widened to float32 as tiles are packed";
      return Products::kWidened;
    case DType::kBFloat16:
      break;
  }
  if (!cpu::native_bf16_target()) {
    if (reason) *reason = "bf16 widened to float32: this build or SIMD target has no AVX512-BF16 pair kernels";
    return Products::kWidened;
  }
  const bool pairs = bf16_pairs_in_use();
  if (reason) {
    switch (bf16_products()) {
      case Bf16Products::kPairs:
        *reason = pairs ? "bf16 pairs on VDPBF16PS: set_bf16_products(\"pairs\")"
                        : "bf16 widened to float32: set_bf16_products(\"pairs\"), but this CPU "
                          "has no AVX512-BF16";
        break;
      case Bf16Products::kFloat:
        *reason = "bf16 widened to float32: set_bf16_products(\"float\")";
        break;
      case Bf16Products::kAuto:
        *reason = pairs ? "bf16 pairs on VDPBF16PS: this CPU's VDPBF16PS measured at least 1.5x "
                          "the multiply-adds a second of its FMAs"
                        : "bf16 widened to float32: this CPU's VDPBF16PS measured under 1.5x the "
                          "multiply-adds a second of its FMAs (or it has no AVX512-BF16)";
        break;
    }
  }
  return pairs ? Products::kBf16Pairs : Products::kWidened;
}

// Takes the reason as a pointer so that a call without reasons builds no string.
void refuse(KernelChoice* c, bool with_reasons, Kernel kernel, const char* reason) {
  if (with_reasons) c->refused.push_back({kernel, reason});
}

// Blocks of query vectors one pixel row apart where the window's geometry allows them: the same
// geometry the window kernels build (cpu/window/window_geometry.h).
Schedule window_schedule(const AttentionParams& p) {
  const std::int64_t lanes =
      static_cast<std::int64_t>(cpu::vector_lanes(p.dtype == DType::kFloat64));
  const cpu::WindowGeometry<float> g(*p.window, lanes, cpu::kBlockRows, cpu::kBlockOffsets);
  return g.block_rows > 1 ? Schedule::kWindowBlocked : Schedule::kWindowVectors;
}

std::string window_schedule_reason(Schedule schedule) {
  return schedule == Schedule::kWindowBlocked
             ? "; blocked rows: the window's columns are evenly spaced and its pixel rows hold "
               "whole vectors (padded by at most a third), so 4 query vectors share each key "
               "load"
             : "; one vector at a time: the window's columns are not evenly spaced, or padding "
               "each pixel row to whole vectors would add more than a third";
}

const char* kReferenceRefusal =
    "the naive oracle (double accumulation), run only when asked for (Backend::kReference)";

// The rules shared by the forward and the backward: a window on its offsets, else a layout's
// tiles, else dense tiles. Returns the family before the forward's query-lanes refinement.
Kernel choose_family(const AttentionParams& p, bool with_reasons, KernelChoice* c) {
  refuse(c, with_reasons, Kernel::kReference, kReferenceRefusal);
  std::string window_refused;
  if (p.window != nullptr) {
    window_refused = window_kernel_refusal(*p.window);
    if (window_refused.empty() || p.layout == nullptr) {
      if (with_reasons) {
        double computed, allowed;
        window_pairs(*p.window, &computed, &allowed);
        c->reason = format("a clip window of %lld offsets on one %lldx%lld grid: 16 neighbouring "
                           "queries a vector share each offset's raster distance; it computes "
                           "%.2fx the allowed pairs",
                           static_cast<long long>(p.window->count),
                           static_cast<long long>(p.window->height),
                           static_cast<long long>(p.window->width),
                           allowed > 0 ? computed / allowed : 0.0);
        if (!window_refused.empty()) c->reason += " (no layout was given for the tiles)";
        refuse(c, with_reasons, Kernel::kSparseTiles,
               "the window kernel computes fewer pairs than 8x8 tiles (about 1.05x the allowed "
               "pairs away from the border against 2.5x for a square, 4.9x for a diamond)");
        refuse(c, with_reasons, Kernel::kDenseTiles,
               "a pattern is given: dense tiles would compute every pair");
      }
      return Kernel::kWindow;
    }
  } else {
    refuse(c, with_reasons, Kernel::kWindow,
           "no window offsets: only a \"clip\" Window with queries and keys on one grid has them "
           "(pooled keys, border \"shift\" and YLG run on a layout)");
  }
  if (!window_refused.empty()) refuse(c, with_reasons, Kernel::kWindow, window_refused.c_str());
  if (p.layout != nullptr) {
    if (with_reasons) {
      c->reason = format("a block-sparse layout of %lldx%lld tiles: only the tile pairs that hold "
                         "an allowed (query, key) pair are visited, masked by one bit a pair",
                         static_cast<long long>(p.layout->block_q),
                         static_cast<long long>(p.layout->block_k));
      refuse(c, with_reasons, Kernel::kDenseTiles,
             "a pattern is given: dense tiles would compute every pair");
    }
    return Kernel::kSparseTiles;
  }
  if (with_reasons) {
    c->reason = "dense attention (no pattern): every (query tile, key tile) pair, online softmax";
    refuse(c, with_reasons, Kernel::kSparseTiles, "no pattern: no block-sparse layout");
  }
  return Kernel::kDenseTiles;
}

}  // namespace

const char* kernel_name(Kernel kernel) {
  switch (kernel) {
    case Kernel::kReference:
      return "reference";
    case Kernel::kDenseTiles:
      return "dense_tiles";
    case Kernel::kSparseTiles:
      return "sparse_tiles";
    case Kernel::kQueryLanes:
      return "query_lanes";
    case Kernel::kWindow:
      return "window";
  }
  return "unknown";
}

const char* products_name(Products products) {
  switch (products) {
    case Products::kFloat32:
      return "float32";
    case Products::kFloat64:
      return "float64";
    case Products::kWidened:
      return "float";
    case Products::kBf16Pairs:
      return "bf16 pairs";
  }
  return "unknown";
}

const char* schedule_name(Schedule schedule) {
  switch (schedule) {
    case Schedule::kNone:
      return "";
    case Schedule::kWholeHeads:
      return "whole heads";
    case Schedule::kKeyTileGroups:
      return "key-tile groups";
    case Schedule::kTwoPasses:
      return "two passes";
    case Schedule::kWindowBlocked:
      return "blocked rows";
    case Schedule::kWindowVectors:
      return "one vector at a time";
  }
  return "unknown";
}

std::string window_kernel_refusal(const WindowOffsets& window) {
  double computed, allowed;
  window_pairs(window, &computed, &allowed);
  if (computed <= 2.0 * allowed) return std::string();
  return format("the window kernel would compute %.2fx the allowed pairs (every offset for every "
                "query; most fall outside the %lldx%lld grid): above 2x the tiles waste less",
                computed / allowed, static_cast<long long>(window.height),
                static_cast<long long>(window.width));
}

KernelChoice choose_forward(const AttentionParams& p, const Host& host, bool with_reasons) {
  (void)host;
  KernelChoice c;
  c.kernel = choose_family(p, with_reasons, &c);
  std::string products_reason;
  if (c.kernel == Kernel::kWindow) {
    c.products = p.dtype == DType::kFloat64 ? Products::kFloat64
                 : p.dtype == DType::kFloat32 ? Products::kFloat32
                                               : Products::kWidened;
    refuse(&c, with_reasons, Kernel::kQueryLanes, "the window kernel serves this window");
    c.schedule = window_schedule(p);
    if (with_reasons) c.reason += window_schedule_reason(c.schedule);
  } else {
    c.products = tiled_products(p.dtype, with_reasons ? &products_reason : nullptr);
    if (c.kernel == Kernel::kSparseTiles) {
      // Heads wider than 256 were not measured on the lanes.
      const bool float32 = p.dtype == DType::kFloat32;
      const bool narrow = p.dim_qk <= 256 && p.dim_v <= 256;
      if (float32 && narrow) {
        c.kernel = Kernel::kQueryLanes;
        if (with_reasons) {
          c.reason = format("a float32 block-sparse layout with E = %lld, Ev = %lld (up to 256): "
                            "16 queries along the vector lanes keep their softmax state in "
                            "lanes, skip keys outside every lane's mask and pack no key tile",
                            static_cast<long long>(p.dim_qk), static_cast<long long>(p.dim_v));
          refuse(&c, with_reasons, Kernel::kSparseTiles,
                 "can run; the query lanes compute fewer masked pairs (1.05x the allowed pairs "
                 "of YLG's floor heads against 1.23x)");
        }
      } else if (with_reasons) {
        const std::string why =
            !float32 ? format("%s inputs: the query lanes take float32", dtype_name(p.dtype))
                     : format("E = %lld, Ev = %lld: the query lanes take heads up to 256 wide",
                              static_cast<long long>(p.dim_qk), static_cast<long long>(p.dim_v));
        refuse(&c, with_reasons, Kernel::kQueryLanes, why.c_str());
      }
    } else {
      refuse(&c, with_reasons, Kernel::kQueryLanes, "no block-sparse layout: the query lanes "
                                                    "serve patterns only");
    }
  }
  if (with_reasons && !products_reason.empty()) c.reason += "; " + products_reason;
  return c;
}

KernelChoice choose_backward(const AttentionParams& p, const Host& host, bool with_reasons) {
  KernelChoice c;
  c.kernel = choose_family(p, with_reasons, &c);
  refuse(&c, with_reasons, Kernel::kQueryLanes, "forward only");
  if (c.kernel == Kernel::kWindow) {
    c.products = p.dtype == DType::kFloat64 ? Products::kFloat64
                 : p.dtype == DType::kFloat32 ? Products::kFloat32
                                               : Products::kWidened;
    c.schedule = window_schedule(p);
    if (with_reasons) c.reason += window_schedule_reason(c.schedule);
    return c;
  }
  std::string products_reason;
  c.products = tiled_products(p.dtype, with_reasons ? &products_reason : nullptr);
  const bool dbl = p.dtype == DType::kFloat64;
  const cpu::BackwardTiling t = cpu::plan_backward_tiling(
      p, host.num_threads, cpu::vector_lanes(dbl), dbl ? sizeof(double) : sizeof(float));
  c.schedule = t.schedule;
  if (with_reasons) {
    c.reason += std::string("; ") + schedule_name(c.schedule) +
                format(": the cheapest schedule by its cost model for %lld heads on %d threads",
                       static_cast<long long>(p.batch * p.heads), std::max(host.num_threads, 1));
    if (!products_reason.empty()) c.reason += "; " + products_reason;
  }
  return c;
}

}  // namespace attn2d
