// The core's patterns (attn2d/pattern.h) as operators: attn2d.patterns' classes describe
// themselves here (SpecParser's grammar) and get back the core's checks, dense masks, compiled
// layouts and window offsets as tensors, so that Python and C++ callers compile a pattern with
// the same code.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attn2d/pattern.h"
#include "layout_tensors.h"
#include "errors.h"

namespace attn2d {
namespace binding {
namespace {

GridShape grid(at::IntArrayRef hw, const char* name) {
  TORCH_CHECK_VALUE(hw.size() == 2, "attn2d.patterns: ", name,
                    " must be a pair of ints (H, W); got ", hw.size(), " values");
  return GridShape{hw[0], hw[1]};
}

Window make_window(std::int64_t size, c10::string_view metric, std::int64_t dilation,
                   c10::string_view border) {
  Window w;
  w.size = size;
  w.dilation = dilation;
  raise_unless_ok(
      parse_window_metric(std::string_view(metric.data(), metric.size()), &w.metric));
  raise_unless_ok(
      parse_window_border(std::string_view(border.data(), border.size()), &w.border));
  return w;
}

// The mask as a tensor that owns the core's buffer: a dense mask is as large as the attention
// matrix, and a copy would double the peak.
at::Tensor mask_tensor(std::vector<std::uint8_t>&& mask, std::int64_t heads, GridShape q,
                       GridShape kv) {
  auto* owned = new std::vector<std::uint8_t>(std::move(mask));
  return at::from_blob(
      owned->data(), {heads, q.height * q.width, kv.height * kv.width},
      [owned](void*) { delete owned; }, at::dtype(at::kBool));
}

// ---- patterns as attn2d.patterns describes them -----------------------------------------------
//
// pattern := window(size,metric,dilation,border) | ylg(mapping,kind,...)
//          | window1d(size,dilation,causal) | random(blocks_per_row,block,seed,global_tokens)
//          | blockmask(mask index,block_q,block_k) | union(pattern,...) | intersection(pattern,...)
// written by the classes' _spec(); a block mask's bool tensor is masks[index].
class SpecParser {
 public:
  SpecParser(c10::string_view spec, const std::vector<at::Tensor>& masks)
      : spec_(spec.data(), spec.size()), masks_(masks) {}

  Pattern parse() {
    Pattern p = pattern();
    expect_end();
    return p;
  }

 private:
  [[noreturn]] void malformed() const {
    TORCH_CHECK_VALUE(false, "attn2d.patterns: malformed pattern description '", spec_,
                      "' at character ", at_);
  }
  std::string word() {
    const size_t start = at_;
    while (at_ < spec_.size() && std::string(",()").find(spec_[at_]) == std::string::npos) ++at_;
    if (at_ == start) malformed();
    return spec_.substr(start, at_ - start);
  }
  std::int64_t integer() {
    const std::string w = word();
    size_t used = 0;
    std::int64_t v = 0;
    try {
      v = std::stoll(w, &used);
    } catch (const std::exception&) {
      malformed();
    }
    if (used != w.size()) malformed();
    return v;
  }
  bool take(char c) {
    if (at_ < spec_.size() && spec_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!take(c)) malformed();
  }
  void expect_end() const {
    if (at_ != spec_.size()) malformed();
  }

  Pattern pattern() {
    const std::string name = word();
    expect('(');
    if (name == "union" || name == "intersection") {
      std::vector<Pattern> parts{pattern()};
      while (take(',')) parts.push_back(pattern());
      expect(')');
      return name == "union" ? Pattern::Union(std::move(parts))
                             : Pattern::Intersection(std::move(parts));
    }
    if (name == "window") {
      Window w;
      w.size = integer();
      expect(',');
      raise_unless_ok(parse_window_metric(word(), &w.metric));
      expect(',');
      w.dilation = integer();
      expect(',');
      raise_unless_ok(parse_window_border(word(), &w.border));
      expect(')');
      return Pattern(w);
    }
    if (name == "ylg") {
      YLG y;
      raise_unless_ok(parse_ylg_mapping(word(), &y.mapping));
      while (take(',')) {
        YlgKind kind;
        raise_unless_ok(parse_ylg_kind(word(), &kind));
        y.patterns.push_back(kind);
      }
      expect(')');
      return Pattern(std::move(y));
    }
    if (name == "window1d") {
      Window1D w;
      w.size = integer();
      expect(',');
      w.dilation = integer();
      expect(',');
      w.causal = integer() != 0;
      expect(')');
      return Pattern(w);
    }
    if (name == "random") {
      Random r;
      r.blocks_per_row = integer();
      expect(',');
      r.block = integer();
      expect(',');
      r.seed = static_cast<std::uint64_t>(integer());
      expect(',');
      r.global_tokens = integer();
      expect(')');
      return Pattern(r);
    }
    if (name == "blockmask") {
      const std::int64_t index = integer();
      BlockMask m;
      expect(',');
      m.block_q = integer();
      expect(',');
      m.block_k = integer();
      expect(')');
      if (index < 0 || index >= static_cast<std::int64_t>(masks_.size())) malformed();
      const at::Tensor& t = masks_[static_cast<size_t>(index)];
      TORCH_CHECK_TYPE(t.scalar_type() == at::kBool && t.device().is_cpu(),
                       "attn2d.patterns.BlockMask: mask must be a CPU bool tensor; got ",
                       t.scalar_type(), " on ", t.device());
      TORCH_CHECK_VALUE(t.dim() == 2 || t.dim() == 3,
                        "attn2d.patterns.BlockMask: mask must be 2-D or 3-D; got shape ",
                        t.sizes());
      const at::Tensor c = t.contiguous();
      m.mask_heads = c.dim() == 3 ? c.size(0) : 1;
      m.rows = c.size(-2);
      m.cols = c.size(-1);
      const auto* bytes = reinterpret_cast<const std::uint8_t*>(c.data_ptr<bool>());
      m.mask.assign(bytes, bytes + c.numel());
      return Pattern(std::move(m));
    }
    malformed();
  }

  std::string spec_;
  const std::vector<at::Tensor>& masks_;
  size_t at_ = 0;
};

Pattern parse_pattern(c10::string_view spec, const std::vector<at::Tensor>& masks) {
  return SpecParser(spec, masks).parse();
}

void check_pattern(c10::string_view spec, std::vector<at::Tensor> masks, at::IntArrayRef q_hw,
                   at::IntArrayRef kv_hw, std::int64_t heads) {
  raise_unless_ok(
      parse_pattern(spec, masks).validate(grid(q_hw, "q_hw"), grid(kv_hw, "kv_hw"), heads));
}

at::Tensor pattern_dense_mask(c10::string_view spec, std::vector<at::Tensor> masks,
                              at::IntArrayRef q_hw, at::IntArrayRef kv_hw, std::int64_t heads) {
  const GridShape q = grid(q_hw, "q_hw"), kv = grid(kv_hw, "kv_hw");
  std::vector<std::uint8_t> mask;
  raise_unless_ok(parse_pattern(spec, masks).dense_mask(q, kv, heads, &mask));
  return mask_tensor(std::move(mask), heads, q, kv);
}

std::vector<at::Tensor> compile_pattern(c10::string_view spec, std::vector<at::Tensor> masks,
                                        at::IntArrayRef q_hw, at::IntArrayRef kv_hw,
                                        std::int64_t heads) {
  CompiledLayout layout;
  raise_unless_ok(parse_pattern(spec, masks).compile(grid(q_hw, "q_hw"), grid(kv_hw, "kv_hw"),
                                                     heads, &layout));
  return layout_tensors(layout);
}

// A (2, count) int32 tensor (row offsets, then column offsets), or None: on_grid_only picks
// Window::offsets_on_grid, else Window::kernel_offsets.
std::optional<at::Tensor> window_offsets(std::int64_t size, c10::string_view metric,
                                         std::int64_t dilation, c10::string_view border,
                                         at::IntArrayRef q_hw, at::IntArrayRef kv_hw,
                                         bool on_grid_only) {
  const Window w = make_window(size, metric, dilation, border);
  const GridShape q = grid(q_hw, "q_hw"), kv = grid(kv_hw, "kv_hw");
  std::optional<CompiledWindowOffsets> offsets;
  raise_unless_ok(on_grid_only ? w.offsets_on_grid(q, kv, &offsets)
                               : w.kernel_offsets(q, kv, &offsets));
  if (!offsets) return std::nullopt;
  return offsets_tensor(*offsets);
}

}  // namespace
}  // namespace binding
}  // namespace attn2d

TORCH_LIBRARY_FRAGMENT(attn2d, m) {
  m.def("check_pattern(str spec, Tensor[] masks, int[] q_hw, int[] kv_hw, int heads) -> ()",
        &attn2d::binding::check_pattern);
  m.def("pattern_dense_mask(str spec, Tensor[] masks, int[] q_hw, int[] kv_hw, int heads) "
        "-> Tensor",
        &attn2d::binding::pattern_dense_mask);
  m.def("compile_pattern(str spec, Tensor[] masks, int[] q_hw, int[] kv_hw, int heads) "
        "-> Tensor[]",
        &attn2d::binding::compile_pattern);
  m.def("window_offsets(int size, str metric, int dilation, str border, int[] q_hw, "
        "int[] kv_hw, bool on_grid_only) -> Tensor?",
        &attn2d::binding::window_offsets);
}
