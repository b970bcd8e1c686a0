#include "patterns/window_keys.h"

#include <algorithm>

#include "patterns/grid_checks.h"

namespace attn2d {
namespace patterns {

WindowKeys::WindowKeys(const Window& window, GridShape q_hw, GridShape kv_hw)
    : window_(window), q_hw_(q_hw), kv_hw_(kv_hw) {}

std::int64_t WindowKeys::shifted_start(std::int64_t centre, std::int64_t length) const {
  const std::int64_t d = window_.dilation, k = window_.size;
  const std::int64_t group = centre % d;
  const std::int64_t count = (length - group + d - 1) / d;  // positions in the residue class
  const std::int64_t t = std::min(std::max((centre - group) / d - k / 2, std::int64_t{0}),
                                  count - k);
  return group + d * t;
}

void WindowKeys::append(std::int64_t row, std::vector<std::int32_t>* keys) const {
  const std::int64_t ci = centre_row(row / q_hw_.width, q_hw_, kv_hw_);
  const std::int64_t cj = centre_col(row % q_hw_.width, q_hw_, kv_hw_);
  const std::int64_t d = window_.dilation, k = window_.size, hk = kv_hw_.height,
                     wk = kv_hw_.width;
  if (window_.border == WindowBorder::kShift) {
    const std::int64_t r0 = shifted_start(ci, hk), c0 = shifted_start(cj, wk);
    for (std::int64_t a = 0; a < k; ++a) {
      for (std::int64_t b = 0; b < k; ++b) {
        keys->push_back(static_cast<std::int32_t>((r0 + d * a) * wk + c0 + d * b));
      }
    }
    return;
  }
  // Steps lo .. lo+k-1 per axis, those that land in [0, length): centre + d*step >= 0 from
  // step -floor(centre/d) on, <= length-1 up to floor((length-1-centre)/d).
  const std::int64_t lo = -(k / 2), hi = lo + k - 1, radius = k / 2;
  const std::int64_t di0 = std::max(lo, -(ci / d)), di1 = std::min(hi, (hk - 1 - ci) / d);
  const std::int64_t dj0 = std::max(lo, -(cj / d)), dj1 = std::min(hi, (wk - 1 - cj) / d);
  for (std::int64_t di = di0; di <= di1; ++di) {
    for (std::int64_t dj = dj0; dj <= dj1; ++dj) {
      if (window_.metric == WindowMetric::kManhattan &&
          (di < 0 ? -di : di) + (dj < 0 ? -dj : dj) > radius) {
        continue;
      }
      if (window_.metric == WindowMetric::kEuclidean && di * di + dj * dj > radius * radius) {
        continue;
      }
      keys->push_back(static_cast<std::int32_t>((ci + d * di) * wk + cj + d * dj));
    }
  }
}

}  // namespace patterns
}  // namespace attn2d
