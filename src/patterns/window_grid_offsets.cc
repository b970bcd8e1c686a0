// A clip window on one grid as fixed raster offsets, for the window kernels
// (attn2d/window_offsets.h), and whether those kernels serve it.
#include <algorithm>

#include "attn2d/kernel_choice.h"
#include "attn2d/patterns.h"
#include "patterns/allocation_guard.h"

namespace attn2d {

Status Window::offsets_on_grid(GridShape q_hw, GridShape kv_hw,
                               std::optional<CompiledWindowOffsets>* offsets) const {
  const Status s = validate(q_hw, kv_hw, /*heads=*/1);
  if (!s.ok()) return s;
  offsets->reset();
  // Pooled keys put a query's keys at no fixed raster distance; a shifted window moves near the
  // border.
  const bool one_grid = q_hw.height == kv_hw.height && q_hw.width == kv_hw.width;
  if (!one_grid || border != WindowBorder::kClip) return Status::Ok();
  return patterns::guard_allocation("attn2d.patterns.Window.offsets_on_grid", [&] {
    const std::int64_t h = kv_hw.height, w = kv_hw.width, d = dilation;
    const std::int64_t lo = -(size / 2), hi = lo + size - 1, radius = size / 2;
    // The steps of the window, row-major, that some query keeps inside the map: |step*d| < side.
    const std::int64_t di0 = std::max(lo, -((h - 1) / d)), di1 = std::min(hi, (h - 1) / d);
    const std::int64_t dj0 = std::max(lo, -((w - 1) / d)), dj1 = std::min(hi, (w - 1) / d);
    CompiledWindowOffsets out;
    out.height = h;
    out.width = w;
    for (std::int64_t di = di0; di <= di1; ++di) {
      for (std::int64_t dj = dj0; dj <= dj1; ++dj) {
        if (metric == WindowMetric::kManhattan &&
            (di < 0 ? -di : di) + (dj < 0 ? -dj : dj) > radius) {
          continue;
        }
        if (metric == WindowMetric::kEuclidean && di * di + dj * dj > radius * radius) continue;
        out.dr.push_back(static_cast<std::int32_t>(di * d));
        out.dc.push_back(static_cast<std::int32_t>(dj * d));
      }
    }
    *offsets = std::move(out);
    return Status::Ok();
  });
}

Status Window::kernel_offsets(GridShape q_hw, GridShape kv_hw,
                              std::optional<CompiledWindowOffsets>* offsets) const {
  const Status s = offsets_on_grid(q_hw, kv_hw, offsets);
  if (!s.ok() || !offsets->has_value()) return s;
  if (!window_kernel_refusal((*offsets)->view()).empty()) offsets->reset();
  return Status::Ok();
}

}  // namespace attn2d
