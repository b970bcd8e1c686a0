// attn2d::Window: its checks, its dense mask and its compilation into a layout.
#include <algorithm>
#include <string>
#include <utility>

#include "attn2d/patterns.h"
#include "patterns/allocation_guard.h"
#include "patterns/dense_mask_size.h"
#include "patterns/grid_checks.h"
#include "patterns/layout_builder.h"
#include "patterns/pattern_names.h"
#include "patterns/pixel_blocks.h"
#include "patterns/window_keys.h"

namespace attn2d {
namespace {

Status bad(const std::string& what) {
  return Status::InvalidArgument("attn2d.patterns.Window: " + what);
}

// a*b in decimal for a message, exact for any int64 factors.
std::string product_text(std::int64_t a, std::int64_t b) {
  __int128 p = static_cast<__int128>(a) * b;
  const bool negative = p < 0;
  if (negative) p = -p;
  std::string digits;
  do {
    digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(p % 10)));
    p /= 10;
  } while (p > 0);
  return negative ? "-" + digits : digits;
}

}  // namespace

Status Window::validate(GridShape q_hw, GridShape kv_hw, std::int64_t heads) const {
  if (size < 1) return bad("size must be >= 1; got " + std::to_string(size));
  if (dilation < 1) return bad("dilation must be an int >= 1; got " + std::to_string(dilation));
  Status s;
  if (!(s = patterns::check_option(metric)).ok()) return s;
  if (!(s = patterns::check_option(border)).ok()) return s;
  if (border == WindowBorder::kShift && metric != WindowMetric::kChebyshev) {
    const std::string name = window_metric_name(metric);
    return bad("border='shift' needs metric='chebyshev' (a shifted " + name +
               " window is not defined); got metric='" + name + "'");
  }
  if (!(s = patterns::check_heads(heads)).ok()) return s;
  if (!(s = patterns::check_grid("q_hw", q_hw)).ok()) return s;
  if (!(s = patterns::check_grid("kv_hw", kv_hw)).ok()) return s;
  const std::int64_t hk = kv_hw.height, wk = kv_hw.width, d = dilation, k = size;
  const std::string map = std::to_string(hk) + "x" + std::to_string(wk);
  const std::string got = "; got size=" + std::to_string(k) + ", dilation=" + std::to_string(d);
  // The products are compared through divisions: size and dilation may be any int64.
  if (border == WindowBorder::kShift && k > std::min(hk, wk) / d) {
    return bad("border='shift' needs dilation*size = " + product_text(d, k) +
               " <= both sides of the key map (" + map + ")" + got);
  }
  if (border == WindowBorder::kClip && k - 1 > (std::max(hk, wk) - 1) / d) {
    return bad("dilation*(size-1) = " + product_text(d, k - 1) +
               " must be smaller than the key map's longer side (" + map + ")" + got);
  }
  return Status::Ok();
}

Status Window::dense_mask(GridShape q_hw, GridShape kv_hw, std::int64_t heads,
                          std::vector<std::uint8_t>* mask) const {
  Status s = validate(q_hw, kv_hw, heads);
  if (!s.ok()) return s;
  const std::int64_t len_q = patterns::pixels(q_hw), len_k = patterns::pixels(kv_hw);
  if (!(s = patterns::check_dense_mask_size("attn2d.patterns.Window", heads, len_q, len_k)).ok()) {
    return s;
  }
  return patterns::guard_allocation("attn2d.patterns.Window.dense_mask", [&] {
    mask->assign(static_cast<size_t>(heads * len_q * len_k), 0);
    const patterns::WindowKeys window_keys(*this, q_hw, kv_hw);
    std::vector<std::int32_t> keys;
    for (std::int64_t q = 0; q < len_q; ++q) {
      keys.clear();
      window_keys.append(q, &keys);
      for (const std::int32_t key : keys) (*mask)[static_cast<size_t>(q * len_k + key)] = 1;
    }
    // Every head sees the same window.
    const auto head0 = mask->begin();
    for (std::int64_t h = 1; h < heads; ++h) {
      std::copy(head0, head0 + len_q * len_k, head0 + h * len_q * len_k);
    }
    return Status::Ok();
  });
}

Status Window::compile(GridShape q_hw, GridShape kv_hw, std::int64_t heads,
                       CompiledLayout* layout) const {
  const Status s = validate(q_hw, kv_hw, heads);
  if (!s.ok()) return s;
  return patterns::guard_allocation("attn2d.patterns.Window.compile", [&] {
    // A query's window covers a 2-D neighbourhood of its centre: 8-pixel-wide blocks of 64
    // pixels on both grids put it into few key tiles.
    patterns::TilePlan plan;
    plan.q_rows = patterns::pixel_block_rows(q_hw, kPatternBlockQ);
    plan.k_rows = patterns::pixel_block_rows(kv_hw, kPatternBlockK);
    const patterns::WindowKeys window_keys(*this, q_hw, kv_hw);
    plan.allowed_keys = [&window_keys](std::int64_t row, std::vector<std::int32_t>* keys) {
      window_keys.append(row, keys);
    };
    patterns::LayoutBuilder builder(patterns::pixels(kv_hw));
    builder.add(plan);
    builder.finish(std::vector<std::int32_t>(static_cast<size_t>(heads), 0), layout);
    return Status::Ok();
  });
}

}  // namespace attn2d
