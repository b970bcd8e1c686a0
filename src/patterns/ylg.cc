// attn2d::YLG: its heads, checks, dense mask and compilation into a layout.
#include <algorithm>
#include <string>
#include <utility>

#include "attn2d/patterns.h"
#include "patterns/allocation_guard.h"
#include "patterns/dense_mask_size.h"
#include "patterns/grid_checks.h"
#include "patterns/layout_builder.h"
#include "patterns/pattern_names.h"
#include "patterns/ylg_enumeration.h"
#include "patterns/ylg_tiles.h"

namespace attn2d {
namespace {

// The distinct kinds in the order the heads first use them, and each head's index among them.
void distinct_kinds(const std::vector<YlgKind>& patterns, std::vector<YlgKind>* kinds,
                    std::vector<std::int32_t>* head_layout) {
  for (const YlgKind kind : patterns) {
    auto it = std::find(kinds->begin(), kinds->end(), kind);
    if (it == kinds->end()) it = kinds->insert(kinds->end(), kind);
    head_layout->push_back(static_cast<std::int32_t>(it - kinds->begin()));
  }
}

}  // namespace

YLG YLG::with_heads(std::int64_t heads, YlgMapping mapping) {
  YLG ylg;
  ylg.mapping = mapping;
  for (std::int64_t h = 0; h < heads; ++h) {
    ylg.patterns.push_back(static_cast<YlgKind>(h * 4 / heads));
  }
  return ylg;
}

Status YLG::validate(GridShape q_hw, GridShape kv_hw, std::int64_t heads) const {
  Status s;
  for (const YlgKind kind : patterns) {
    if (!(s = patterns::check_option(kind)).ok()) return s;
  }
  if (patterns.empty()) {
    return Status::InvalidArgument("attn2d.patterns.YLG: needs at least one head");
  }
  if (!(s = patterns::check_option(mapping)).ok()) return s;
  if (!(s = patterns::check_grid("q_hw", q_hw)).ok()) return s;
  if (!(s = patterns::check_grid("kv_hw", kv_hw)).ok()) return s;
  if (heads != this->heads()) {
    return Status::InvalidArgument("attn2d.patterns.YLG: the pattern has " +
                                   std::to_string(this->heads()) +
                                   " heads but the tensors have " + std::to_string(heads));
  }
  return Status::Ok();
}

Status YLG::dense_mask(GridShape q_hw, GridShape kv_hw, std::int64_t heads,
                       std::vector<std::uint8_t>* mask) const {
  Status s = validate(q_hw, kv_hw, heads);
  if (!s.ok()) return s;
  const std::int64_t len_q = patterns::pixels(q_hw), len_k = patterns::pixels(kv_hw);
  if (!(s = patterns::check_dense_mask_size("attn2d.patterns.YLG", heads, len_q, len_k)).ok()) {
    return s;
  }
  return patterns::guard_allocation("attn2d.patterns.YLG.dense_mask", [&] {
    mask->assign(static_cast<size_t>(heads * len_q * len_k), 0);
    const patterns::YlgEnumeration e = patterns::enumerate_ylg(mapping, q_hw, kv_hw);
    std::vector<std::int32_t> keys;
    for (std::int64_t h = 0; h < heads; ++h) {
      std::uint8_t* head = mask->data() + h * len_q * len_k;
      for (std::int64_t q = 0; q < len_q; ++q) {
        keys.clear();
        patterns::append_ylg_keys(patterns[static_cast<size_t>(h)], e, q, &keys);
        for (const std::int32_t key : keys) head[q * len_k + key] = 1;
      }
    }
    return Status::Ok();
  });
}

Status YLG::compile(GridShape q_hw, GridShape kv_hw, std::int64_t heads,
                    CompiledLayout* layout) const {
  const Status s = validate(q_hw, kv_hw, heads);
  if (!s.ok()) return s;
  return patterns::guard_allocation("attn2d.patterns.YLG.compile", [&] {
    std::vector<YlgKind> kinds;
    std::vector<std::int32_t> head_layout;
    distinct_kinds(patterns, &kinds, &head_layout);
    const patterns::YlgEnumeration e = patterns::enumerate_ylg(mapping, q_hw, kv_hw);
    patterns::LayoutBuilder builder(patterns::pixels(kv_hw));
    for (const YlgKind kind : kinds) builder.add(patterns::ylg_tile_plan(kind, e));
    builder.finish(std::move(head_layout), layout);
    return Status::Ok();
  });
}

}  // namespace attn2d
