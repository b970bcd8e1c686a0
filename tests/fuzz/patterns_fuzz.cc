// libFuzzer target: the core's pattern compiler (attn2d/patterns.h, attn2d/pattern.h). The input
// picks a Window (size, metric, dilation, border, any of them out of range), a YLG (kinds per
// head and a mapping, unknown values included) or, with bit 0x10 of its first byte, an
// attn2d::Pattern: a Window1D, Random or BlockMask (sizes, seeds and mask shapes drawn wild) or a
// union or intersection of drawn patterns; then a query grid, a key grid (pooled or not) and
// heads, and calls every entry point: validate, dense_mask, compile, offsets_on_grid,
// kernel_offsets. Each
// must answer with a Status and agree with validate; where they succeed, the compiled layout
// must pass attn2d::validate and allow exactly the dense mask's pairs, the offsets must pass it
// and allow the same pairs, and, where small, the kernels run on the layout.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include "attn2d/pattern.h"
#include "attn2d/patterns.h"
#include "fuzz_util.h"

namespace attn2d {
namespace fuzz {
namespace {

// Grids and heads past these are validated, and compiled only when validate refuses them (the
// refusal must come before any work); accepted, they would only be slow.
constexpr std::int64_t kMaxPixels = 1024;
constexpr std::int64_t kMaxMaskEntries = 1 << 18;

std::int64_t side(Input& in) {
  const std::uint8_t b = in.byte();
  return b < 0xF0 ? 1 + b % 24 : in.size();
}

bool same_failure(const Status& a, const Status& b) {
  return a.code() == b.code() && a.message() == b.message();
}

// Every (head, query, key) pair the layout allows, as a dense mask.
std::vector<std::uint8_t> layout_pairs(const CompiledLayout& c, std::int64_t heads,
                                       std::int64_t len_q, std::int64_t len_k) {
  std::vector<std::uint8_t> mask(static_cast<std::size_t>(heads * len_q * len_k), 0);
  for (std::int64_t h = 0; h < heads; ++h) {
    const std::int64_t l = c.head_layout[static_cast<std::size_t>(h)];
    for (std::int64_t qt = c.q_tile_begin[l]; qt < c.q_tile_begin[l + 1]; ++qt) {
      for (std::int64_t v = c.fwd_begin[qt]; v < c.fwd_begin[qt + 1]; ++v) {
        const std::int64_t kt = c.fwd_k_tile[v], m = c.fwd_mask[v];
        for (std::int64_t r = 0; r < c.block_q; ++r) {
          const std::int32_t i = c.q_rows[static_cast<std::size_t>(qt * c.block_q + r)];
          if (i < 0) continue;
          for (std::int64_t col = 0; col < c.block_k; ++col) {
            const std::int32_t j = c.k_rows[static_cast<std::size_t>(kt * c.block_k + col)];
            if (j < 0) continue;
            const bool allowed =
                m < 0 || (c.masks[static_cast<std::size_t>(m * c.block_q + r)] >> col & 1) != 0;
            if (allowed) mask[static_cast<std::size_t>((h * len_q + i) * len_k + j)] = 1;
          }
        }
      }
    }
  }
  return mask;
}

template <typename Pattern>
void exercise(Input& in, const Pattern& pattern, GridShape q_hw, GridShape kv_hw,
              std::int64_t heads) {
  const Status valid = pattern.validate(q_hw, kv_hw, heads);
  check_status(valid, "pattern validate");
  std::int64_t len_q = 0, len_k = 0, entries = 0;
  const bool small = valid.ok() && q_hw.height * q_hw.width <= kMaxPixels &&
                     kv_hw.height * kv_hw.width <= kMaxPixels &&
                     mul_ok(q_hw.height, q_hw.width, &len_q) &&
                     mul_ok(kv_hw.height, kv_hw.width, &len_k) &&
                     mul_ok(len_q, len_k, &entries) && mul_ok(entries, heads, &entries) &&
                     entries <= kMaxMaskEntries;
  if (valid.ok() && !small) return;

  std::vector<std::uint8_t> dense;
  const Status dense_status = pattern.dense_mask(q_hw, kv_hw, heads, &dense);
  check_status(dense_status, "dense_mask");
  CompiledLayout compiled;
  const Status compile_status = pattern.compile(q_hw, kv_hw, heads, &compiled);
  check_status(compile_status, "compile");
  if (!valid.ok()) {
    if (!same_failure(dense_status, valid) || !same_failure(compile_status, valid)) {
      fail("a pattern validate refuses was not refused the same way", compile_status.message());
    }
    return;
  }
  if (!dense_status.ok() || !compile_status.ok()) {
    fail("a valid pattern failed", dense_status.message() + compile_status.message());
  }
  if (dense.size() != static_cast<std::size_t>(entries)) fail("dense mask size");

  // The compiled layout is one the validator accepts and allows exactly the dense mask's pairs.
  const SparseLayout view = compiled.view();
  AttentionParams p;
  p.batch = 1;
  p.heads = heads;
  p.len_q = len_q;
  p.len_k = len_k;
  p.dim_qk = 1 + in.below(8);
  p.dim_v = 1 + in.below(8);
  p.dtype = static_cast<DType>(in.below(4));
  p.scale = 0.5;
  p.layout = &view;
  p.q = p.k = p.v = Buffer().pointer(false);
  p.out = Buffer().pointer(false);
  const Status layout_valid = validate(p);
  if (!layout_valid.ok()) fail("a compiled layout was refused", layout_valid.message());
  if (layout_pairs(compiled, heads, len_q, len_k) != dense) fail("layout and dense mask differ");

  if constexpr (std::is_same<Pattern, Window>::value) {
    std::optional<CompiledWindowOffsets> offsets, kernel;
    const Status o = pattern.offsets_on_grid(q_hw, kv_hw, &offsets);
    const Status k = pattern.kernel_offsets(q_hw, kv_hw, &kernel);
    if (!o.ok() || !k.ok()) fail("offsets of a valid window failed", o.message() + k.message());
    if (kernel.has_value() && !offsets.has_value()) fail("kernel offsets without offsets");
    if (offsets.has_value()) {
      const WindowOffsets w = offsets->view();
      AttentionParams pw = p;
      pw.layout = nullptr;
      pw.window = &w;
      const Status window_valid = validate(pw);
      if (!window_valid.ok()) fail("compiled offsets were refused", window_valid.message());
      // Query (i, j) sees (i + dr, j + dc) wherever that lands in the map: the dense mask.
      std::vector<std::uint8_t> pairs(dense.size(), 0);
      for (std::int64_t h = 0; h < heads; ++h) {
        for (std::int64_t q = 0; q < len_q; ++q) {
          for (std::size_t o2 = 0; o2 < offsets->dr.size(); ++o2) {
            const std::int64_t i = q / w.width + offsets->dr[o2], j = q % w.width + offsets->dc[o2];
            if (i < 0 || i >= w.height || j < 0 || j >= w.width) continue;
            pairs[static_cast<std::size_t>((h * len_q + q) * len_k + i * w.width + j)] = 1;
          }
        }
      }
      if (pairs != dense) fail("window offsets and dense mask differ");
      if (kernel.has_value() != window_kernel_refusal(w).empty()) {
        fail("kernel_offsets disagrees with window_kernel_refusal");
      }
      if (in.flag()) pw.layout = &view;  // the chooser's window-or-layout decision
      if (dense_work(pw) <= kMaxWork && in.flag()) {
        DenseRun().run(in, pw, in.flag(), false);
        return;
      }
    }
  }
  if (dense_work(p) <= kMaxWork && in.flag()) DenseRun().run(in, p, in.flag(), false);
}

// A drawn pattern of any kind; combinations nest two deep at most.
Pattern draw_pattern(Input& in, int depth) {
  switch (in.below(depth < 2 ? 7 : 5)) {
    case 0: {
      Window w;
      w.size = 1 + in.below(9);
      w.metric = static_cast<WindowMetric>(in.below(3));
      w.dilation = 1 + in.below(3);
      w.border = static_cast<WindowBorder>(in.below(2));
      return Pattern(w);
    }
    case 1:
      return Pattern(YLG::with_heads(1 + in.below(8), static_cast<YlgMapping>(in.below(2))));
    case 2: {
      const std::uint8_t b = in.byte();
      const std::int64_t size = b < 0xF0 ? 1 + b % 20 : in.size();
      return Pattern(Window1D{size, in.byte() < 0xF0 ? 1 + in.below(4) : in.size(), in.flag()});
    }
    case 3: {
      Random r;
      r.blocks_per_row = in.byte() < 0xF0 ? in.below(6) : in.size();
      r.block = in.byte() < 0xF0 ? 1 + in.below(70) : in.size();
      r.seed = in.raw<std::uint64_t>();
      r.global_tokens = in.byte() < 0xF0 ? in.below(5) : in.size();
      return Pattern(r);
    }
    case 4: {
      BlockMask m;
      m.block_q = in.byte() < 0xF0 ? 1 + in.below(70) : in.size();
      m.block_k = in.byte() < 0xF0 ? 1 + in.below(70) : in.size();
      m.mask_heads = in.byte() < 0xF0 ? 1 + in.below(3) : in.size();
      m.rows = in.size();
      m.cols = in.size();
      // Usually the entries the shape asks for; sometimes another count, which validate names.
      std::int64_t entries = 0;
      if (!mul_ok(m.mask_heads, m.rows, &entries) || !mul_ok(entries, m.cols, &entries) ||
          entries < 0 || entries > 4096 || in.flag()) {
        entries = in.below(64);
      }
      for (std::int64_t i = 0; i < entries; ++i) m.mask.push_back(in.byte() & 1);
      return Pattern(std::move(m));
    }
    default: {
      std::vector<Pattern> parts;
      const std::int64_t n = in.below(4);  // 0 parts: refused by validate
      for (std::int64_t i = 0; i < n; ++i) parts.push_back(draw_pattern(in, depth + 1));
      return in.flag() ? Pattern::Union(std::move(parts))
                       : Pattern::Intersection(std::move(parts));
    }
  }
}

void run(Input& in) {
  const std::uint8_t which = in.byte();
  GridShape q_hw{side(in), side(in)};
  GridShape kv_hw = q_hw;
  switch (in.below(4)) {
    case 1:  // 2x2-pooled keys, as SAGAN, BigGAN and YLG
      kv_hw = {std::max<std::int64_t>(1, q_hw.height / 2),
               std::max<std::int64_t>(1, q_hw.width / 2)};
      break;
    case 2:
      kv_hw = {side(in), side(in)};
      break;
    default:
      break;
  }
  if (which & 0x10) {
    const Pattern pattern = draw_pattern(in, 0);
    const std::int64_t heads = (which & 4) ? in.size() : 1 + in.below(8);
    exercise(in, pattern, q_hw, kv_hw, heads);
  } else if (which & 1) {
    YLG ylg;
    const std::int64_t n = in.below(9);
    for (std::int64_t h = 0; h < n; ++h) ylg.patterns.push_back(static_cast<YlgKind>(in.below(5)));
    ylg.mapping = static_cast<YlgMapping>(in.below(3));
    if (which & 2) {
      // with_heads builds one entry a head and returns no Status: a count past memory throws
      // std::bad_alloc out of it, so counts stay where the vector fits.
      const std::int64_t count = in.size();
      if (count > 4096) return;
      ylg = YLG::with_heads(count, static_cast<YlgMapping>(in.below(2)));
    }
    const std::int64_t heads = (which & 4) ? in.size() : ylg.heads();
    exercise(in, ylg, q_hw, kv_hw, heads);
  } else {
    Window window;
    const std::uint8_t s = in.byte();
    window.size = s < 0xF0 ? 1 + s % 16 : in.size();
    window.metric = static_cast<WindowMetric>(in.below(4));
    const std::uint8_t d = in.byte();
    window.dilation = d < 0xF0 ? 1 + d % 4 : in.size();
    window.border = static_cast<WindowBorder>(in.below(3));
    const std::int64_t heads = (which & 4) ? in.size() : 1 + in.below(3);
    exercise(in, window, q_hw, kv_hw, heads);
  }
}

}  // namespace
}  // namespace fuzz
}  // namespace attn2d

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  attn2d::fuzz::Input in(data, size);
  attn2d::fuzz::run(in);
  return 0;
}
