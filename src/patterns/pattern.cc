// attn2d::Pattern: Window and YLG as nodes, unions and intersections of nodes, and the dense
// masks and layouts built from any node's key lists.
#include "attn2d/pattern.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <string>
#include <utility>

#include "patterns/allocation_guard.h"
#include "patterns/dense_mask_size.h"
#include "patterns/grid_checks.h"
#include "patterns/layout_builder.h"
#include "patterns/pattern_node.h"
#include "patterns/pixel_blocks.h"
#include "patterns/window_keys.h"
#include "patterns/ylg_enumeration.h"

namespace attn2d {
namespace patterns {
namespace {

// Raster indices 0 .. len-1 in runs of `block`, the last padded with -1: (tiles, block).
std::vector<std::int32_t> token_runs(std::int64_t len, std::int64_t block) {
  const std::int64_t tiles = (len + block - 1) / block;
  std::vector<std::int32_t> rows(static_cast<size_t>(tiles * block), -1);
  for (std::int64_t i = 0; i < len; ++i) {
    rows[static_cast<size_t>(i)] = static_cast<std::int32_t>(i);
  }
  return rows;
}

class WindowNode final : public PatternNode {
 public:
  explicit WindowNode(Window window) : window_(window) {}
  const Window& window() const { return window_; }
  const char* name() const override { return "attn2d.patterns.Window"; }
  Status validate(GridShape q_hw, GridShape kv_hw, std::int64_t heads) const override {
    return window_.validate(q_hw, kv_hw, heads);
  }
  std::unique_ptr<KeyLister> keys(GridShape q_hw, GridShape kv_hw, std::int64_t) const override {
    class Lister final : public KeyLister {
     public:
      Lister(const Window& w, GridShape q, GridShape kv) : keys_(w, q, kv) {}
      std::int64_t variant(std::int64_t) const override { return 0; }
      void append(std::int64_t, std::int64_t row, std::vector<std::int32_t>* keys) const override {
        keys_.append(row, keys);
      }

     private:
      WindowKeys keys_;
    };
    return std::make_unique<Lister>(window_, q_hw, kv_hw);
  }
  Tiling tiling() const override { return Tiling::kPixelBlocks; }
  Status compile(GridShape q_hw, GridShape kv_hw, std::int64_t heads,
                 CompiledLayout* layout) const override {
    return window_.compile(q_hw, kv_hw, heads, layout);
  }

 private:
  Window window_;
};

class YlgNode final : public PatternNode {
 public:
  explicit YlgNode(YLG ylg) : ylg_(std::move(ylg)) {}
  const char* name() const override { return "attn2d.patterns.YLG"; }
  Status validate(GridShape q_hw, GridShape kv_hw, std::int64_t heads) const override {
    return ylg_.validate(q_hw, kv_hw, heads);
  }
  std::unique_ptr<KeyLister> keys(GridShape q_hw, GridShape kv_hw, std::int64_t) const override {
    class Lister final : public KeyLister {
     public:
      Lister(const YLG& y, GridShape q, GridShape kv)
          : kinds_(y.patterns), e_(enumerate_ylg(y.mapping, q, kv)) {}
      std::int64_t variant(std::int64_t head) const override {
        return static_cast<std::int64_t>(kinds_[static_cast<size_t>(head)]);
      }
      void append(std::int64_t head, std::int64_t row,
                  std::vector<std::int32_t>* keys) const override {
        append_ylg_keys(kinds_[static_cast<size_t>(head)], e_, row, keys);
      }

     private:
      std::vector<YlgKind> kinds_;
      YlgEnumeration e_;
    };
    return std::make_unique<Lister>(ylg_, q_hw, kv_hw);
  }
  Tiling tiling() const override { return Tiling::kPixelBlocks; }
  Status compile(GridShape q_hw, GridShape kv_hw, std::int64_t heads,
                 CompiledLayout* layout) const override {
    return ylg_.compile(q_hw, kv_hw, heads, layout);
  }

 private:
  YLG ylg_;
};

// A union (any part allows a pair) or an intersection (every part does).
class CombinationNode final : public PatternNode {
 public:
  CombinationNode(std::vector<std::shared_ptr<const PatternNode>> parts, bool intersect)
      : parts_(std::move(parts)), intersect_(intersect) {}
  const char* name() const override {
    return intersect_ ? "attn2d.patterns.Intersection" : "attn2d.patterns.Union";
  }
  Status validate(GridShape q_hw, GridShape kv_hw, std::int64_t heads) const override {
    if (parts_.empty()) {
      return Status::InvalidArgument(std::string(name()) + ": needs at least one pattern");
    }
    for (const auto& part : parts_) {
      const Status s = part->validate(q_hw, kv_hw, heads);
      if (!s.ok()) return s;
    }
    return Status::Ok();
  }
  std::unique_ptr<KeyLister> keys(GridShape q_hw, GridShape kv_hw,
                                  std::int64_t heads) const override {
    class Lister final : public KeyLister {
     public:
      Lister(const std::vector<std::shared_ptr<const PatternNode>>& parts, bool intersect,
             GridShape q, GridShape kv, std::int64_t heads)
          : intersect_(intersect) {
        for (const auto& part : parts) listers_.push_back(part->keys(q, kv, heads));
        // A head's variant: the index of its parts' variants, in the order heads first use them.
        std::map<std::vector<std::int64_t>, std::int64_t> ids;
        for (std::int64_t h = 0; h < heads; ++h) {
          std::vector<std::int64_t> tuple;
          for (const auto& lister : listers_) tuple.push_back(lister->variant(h));
          const auto it = ids.emplace(std::move(tuple), static_cast<std::int64_t>(ids.size()));
          variants_.push_back(it.first->second);
        }
      }
      std::int64_t variant(std::int64_t head) const override {
        return variants_[static_cast<size_t>(head)];
      }
      void append(std::int64_t head, std::int64_t row,
                  std::vector<std::int32_t>* keys) const override {
        if (!intersect_) {
          for (const auto& lister : listers_) lister->append(head, row, keys);
          return;
        }
        part_.clear();
        listers_[0]->append(head, row, &part_);
        sorted_unique(&part_);
        common_.swap(part_);
        for (size_t i = 1; i < listers_.size() && !common_.empty(); ++i) {
          part_.clear();
          listers_[i]->append(head, row, &part_);
          sorted_unique(&part_);
          next_.clear();
          std::set_intersection(common_.begin(), common_.end(), part_.begin(), part_.end(),
                                std::back_inserter(next_));
          common_.swap(next_);
        }
        keys->insert(keys->end(), common_.begin(), common_.end());
      }

     private:
      static void sorted_unique(std::vector<std::int32_t>* v) {
        std::sort(v->begin(), v->end());
        v->erase(std::unique(v->begin(), v->end()), v->end());
      }
      bool intersect_;
      std::vector<std::unique_ptr<KeyLister>> listers_;
      std::vector<std::int64_t> variants_;
      // Scratch of append (a lister serves one thread).
      mutable std::vector<std::int32_t> part_, common_, next_;
    };
    return std::make_unique<Lister>(parts_, intersect_, q_hw, kv_hw, heads);
  }
  Tiling tiling() const override {
    for (const auto& part : parts_) {
      if (part->tiling() == Tiling::kPixelBlocks) return Tiling::kPixelBlocks;
    }
    return Tiling::kTokenRuns;
  }
  // Parts that prefer different tilings (a 2-D window beside BigBird's runs of tokens): both
  // are compiled and the one with fewer visits kept, each visit costing about a tile of scores;
  // a 9x9 window with random blocks at 128x128 visited 2.0x as many tiles on pixel blocks.
  Status compile(GridShape q_hw, GridShape kv_hw, std::int64_t heads,
                 CompiledLayout* layout) const override {
    bool blocks = false, runs = false;
    for (const auto& part : parts_) {
      (part->tiling() == Tiling::kPixelBlocks ? blocks : runs) = true;
    }
    Status s = generic_compile(*this, tiling(), q_hw, kv_hw, heads, layout);
    if (!s.ok() || !(blocks && runs)) return s;
    CompiledLayout other;
    s = generic_compile(*this, Tiling::kTokenRuns, q_hw, kv_hw, heads, &other);
    if (!s.ok()) return s;
    if (other.fwd_k_tile.size() < layout->fwd_k_tile.size()) *layout = std::move(other);
    return Status::Ok();
  }

 private:
  std::vector<std::shared_ptr<const PatternNode>> parts_;
  bool intersect_;
};

}  // namespace

Status PatternNode::compile(GridShape q_hw, GridShape kv_hw, std::int64_t heads,
                            CompiledLayout* layout) const {
  return generic_compile(*this, q_hw, kv_hw, heads, layout);
}

Status generic_dense_mask(const PatternNode& node, GridShape q_hw, GridShape kv_hw,
                          std::int64_t heads, std::vector<std::uint8_t>* mask) {
  Status s = node.validate(q_hw, kv_hw, heads);
  if (!s.ok()) return s;
  const std::int64_t len_q = pixels(q_hw), len_k = pixels(kv_hw);
  if (!(s = check_dense_mask_size(node.name(), heads, len_q, len_k)).ok()) return s;
  return guard_allocation((std::string(node.name()) + ".dense_mask").c_str(), [&] {
    mask->assign(static_cast<size_t>(heads * len_q * len_k), 0);
    const std::unique_ptr<KeyLister> lister = node.keys(q_hw, kv_hw, heads);
    std::map<std::int64_t, std::int64_t> first_head;  // variant -> the first head with it
    std::vector<std::int32_t> keys;
    for (std::int64_t h = 0; h < heads; ++h) {
      std::uint8_t* head = mask->data() + h * len_q * len_k;
      const auto seen = first_head.emplace(lister->variant(h), h);
      if (!seen.second) {
        const std::uint8_t* same = mask->data() + seen.first->second * len_q * len_k;
        std::copy(same, same + len_q * len_k, head);
        continue;
      }
      for (std::int64_t q = 0; q < len_q; ++q) {
        keys.clear();
        lister->append(h, q, &keys);
        for (const std::int32_t key : keys) head[q * len_k + key] = 1;
      }
    }
    return Status::Ok();
  });
}

Status generic_compile(const PatternNode& node, GridShape q_hw, GridShape kv_hw,
                       std::int64_t heads, CompiledLayout* layout) {
  return generic_compile(node, node.tiling(), q_hw, kv_hw, heads, layout);
}

Status generic_compile(const PatternNode& node, Tiling tiling, GridShape q_hw, GridShape kv_hw,
                       std::int64_t heads, CompiledLayout* layout) {
  const Status s = node.validate(q_hw, kv_hw, heads);
  if (!s.ok()) return s;
  return guard_allocation((std::string(node.name()) + ".compile").c_str(), [&] {
    const std::unique_ptr<KeyLister> lister = node.keys(q_hw, kv_hw, heads);
    TilePlan plan;
    if (tiling == Tiling::kPixelBlocks) {
      plan.q_rows = pixel_block_rows(q_hw, kPatternBlockQ);
      plan.k_rows = pixel_block_rows(kv_hw, kPatternBlockK);
    } else {
      plan.q_rows = token_runs(pixels(q_hw), kPatternBlockQ);
      plan.k_rows = token_runs(pixels(kv_hw), kPatternBlockK);
    }
    LayoutBuilder builder(pixels(kv_hw));
    std::map<std::int64_t, std::int32_t> layout_of;  // variant -> layout, in first-use order
    std::vector<std::int32_t> head_layout;
    for (std::int64_t h = 0; h < heads; ++h) {
      const auto it = layout_of.emplace(lister->variant(h),
                                        static_cast<std::int32_t>(layout_of.size()));
      head_layout.push_back(it.first->second);
      if (!it.second) continue;
      plan.allowed_keys = [&lister, h](std::int64_t row, std::vector<std::int32_t>* keys) {
        lister->append(h, row, keys);
      };
      builder.add(plan);
    }
    builder.finish(std::move(head_layout), layout);
    return Status::Ok();
  });
}

}  // namespace patterns

Pattern::Pattern(std::shared_ptr<const patterns::PatternNode> node) : node_(std::move(node)) {}
Pattern::Pattern(Window window) : node_(std::make_shared<patterns::WindowNode>(window)) {}
Pattern::Pattern(YLG ylg) : node_(std::make_shared<patterns::YlgNode>(std::move(ylg))) {}
Pattern::Pattern(Window1D window) : node_(patterns::node_of(window)) {}
Pattern::Pattern(Random random) : node_(patterns::node_of(random)) {}
Pattern::Pattern(BlockMask mask) : node_(patterns::node_of(std::move(mask))) {}

const Window* Pattern::as_window() const {
  const auto* node = dynamic_cast<const patterns::WindowNode*>(node_.get());
  return node != nullptr ? &node->window() : nullptr;
}

Pattern Pattern::Union(std::vector<Pattern> parts) {
  std::vector<std::shared_ptr<const patterns::PatternNode>> nodes;
  for (Pattern& part : parts) nodes.push_back(std::move(part.node_));
  return Pattern(std::make_shared<patterns::CombinationNode>(std::move(nodes), false));
}

Pattern Pattern::Intersection(std::vector<Pattern> parts) {
  std::vector<std::shared_ptr<const patterns::PatternNode>> nodes;
  for (Pattern& part : parts) nodes.push_back(std::move(part.node_));
  return Pattern(std::make_shared<patterns::CombinationNode>(std::move(nodes), true));
}

Status Pattern::validate(GridShape q_hw, GridShape kv_hw, std::int64_t heads) const {
  return node_->validate(q_hw, kv_hw, heads);
}

Status Pattern::dense_mask(GridShape q_hw, GridShape kv_hw, std::int64_t heads,
                           std::vector<std::uint8_t>* mask) const {
  return patterns::generic_dense_mask(*node_, q_hw, kv_hw, heads, mask);
}

Status Pattern::compile(GridShape q_hw, GridShape kv_hw, std::int64_t heads,
                        CompiledLayout* layout) const {
  return node_->compile(q_hw, kv_hw, heads, layout);
}

}  // namespace attn2d
