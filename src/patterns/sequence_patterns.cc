// attn2d::Window1D, attn2d::Random and attn2d::BlockMask: their checks and key lists; their dense
// masks and layouts come from the lists (pattern_node.h).
#include "attn2d/sequence_patterns.h"

#include <algorithm>
#include <string>
#include <utility>

#include "patterns/grid_checks.h"
#include "patterns/pattern_node.h"

namespace attn2d {
namespace patterns {
namespace {

std::string str(std::int64_t v) { return std::to_string(v); }

Status check_grids_and_heads(GridShape q_hw, GridShape kv_hw, std::int64_t heads) {
  Status s;
  if (!(s = check_heads(heads)).ok()) return s;
  if (!(s = check_grid("q_hw", q_hw)).ok()) return s;
  return check_grid("kv_hw", kv_hw);
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return a / b + (a % b != 0); }

// ---- Window1D ---------------------------------------------------------------------------------

class Window1DNode final : public PatternNode {
 public:
  explicit Window1DNode(Window1D w) : w_(w) {}
  const char* name() const override { return "attn2d.patterns.Window1D"; }
  Status validate(GridShape q_hw, GridShape kv_hw, std::int64_t heads) const override {
    const auto bad = [](const std::string& what) {
      return Status::InvalidArgument("attn2d.patterns.Window1D: " + what);
    };
    if (w_.size < 1) return bad("size must be >= 1; got " + str(w_.size));
    if (w_.dilation < 1) return bad("dilation must be >= 1; got " + str(w_.dilation));
    const Status s = check_grids_and_heads(q_hw, kv_hw, heads);
    if (!s.ok()) return s;
    const std::int64_t len_k = pixels(kv_hw);
    if (w_.size - 1 > (len_k - 1) / w_.dilation) {
      return bad("dilation*(size-1) must be smaller than the " + str(len_k) +
                 " keys; got size=" + str(w_.size) + ", dilation=" + str(w_.dilation));
    }
    return Status::Ok();
  }
  std::unique_ptr<KeyLister> keys(GridShape q_hw, GridShape kv_hw, std::int64_t) const override {
    class Lister final : public KeyLister {
     public:
      Lister(Window1D w, std::int64_t len_q, std::int64_t len_k)
          : w_(w), len_q_(len_q), len_k_(len_k) {}
      std::int64_t variant(std::int64_t) const override { return 0; }
      void append(std::int64_t, std::int64_t row, std::vector<std::int32_t>* keys) const override {
        const std::int64_t centre = row * len_k_ / len_q_;
        const std::int64_t first = w_.causal ? -(w_.size - 1) : -(w_.size / 2);
        for (std::int64_t o = first; o < first + w_.size; ++o) {
          const std::int64_t key = centre + w_.dilation * o;
          if (key >= 0 && key < len_k_) keys->push_back(static_cast<std::int32_t>(key));
        }
      }

     private:
      Window1D w_;
      std::int64_t len_q_, len_k_;
    };
    return std::make_unique<Lister>(w_, pixels(q_hw), pixels(kv_hw));
  }
  Tiling tiling() const override { return Tiling::kTokenRuns; }

 private:
  Window1D w_;
};

// ---- Random -----------------------------------------------------------------------------------

// SplitMix64 (Steele, Lea and Flood, 2014): 64-bit state, the same stream on every platform.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) for n >= 1, by rejection below the largest multiple of n.
  std::uint64_t below(std::uint64_t n) {
    const std::uint64_t reject_under = (0 - n) % n;  // 2^64 mod n
    for (;;) {
      const std::uint64_t x = next();
      if (x >= reject_under) return x % n;
    }
  }

 private:
  std::uint64_t state_;
};

class RandomNode final : public PatternNode {
 public:
  explicit RandomNode(Random r) : r_(r) {}
  const char* name() const override { return "attn2d.patterns.Random"; }
  Status validate(GridShape q_hw, GridShape kv_hw, std::int64_t heads) const override {
    const auto bad = [](const std::string& what) {
      return Status::InvalidArgument("attn2d.patterns.Random: " + what);
    };
    if (r_.block < 1) return bad("block must be >= 1; got " + str(r_.block));
    if (r_.blocks_per_row < 0) {
      return bad("blocks_per_row must be >= 0; got " + str(r_.blocks_per_row));
    }
    if (r_.global_tokens < 0) {
      return bad("global_tokens must be >= 0; got " + str(r_.global_tokens));
    }
    const Status s = check_grids_and_heads(q_hw, kv_hw, heads);
    if (!s.ok()) return s;
    const std::int64_t len_q = pixels(q_hw), len_k = pixels(kv_hw);
    const std::int64_t key_blocks = ceil_div(len_k, r_.block);
    if (r_.blocks_per_row > key_blocks - 1) {
      return bad("blocks_per_row must be smaller than the " + str(key_blocks) +
                 " key blocks of " + str(r_.block) + " tokens (" + str(len_k) +
                 " keys); got " + str(r_.blocks_per_row));
    }
    if (r_.global_tokens > std::min(len_q, len_k)) {
      return bad("global_tokens must be at most the queries (" + str(len_q) + ") and keys (" +
                 str(len_k) + "); got " + str(r_.global_tokens));
    }
    return Status::Ok();
  }
  std::unique_ptr<KeyLister> keys(GridShape q_hw, GridShape kv_hw, std::int64_t) const override {
    class Lister final : public KeyLister {
     public:
      Lister(const Random& r, std::int64_t len_q, std::int64_t len_k)
          : r_(r), len_k_(len_k) {
        const std::int64_t query_blocks = ceil_div(len_q, r.block);
        blocks_.reserve(static_cast<size_t>(query_blocks));
        for (std::int64_t b = 0; b < query_blocks; ++b) {
          blocks_.push_back(r.key_blocks(b, len_q, len_k));
        }
      }
      std::int64_t variant(std::int64_t) const override { return 0; }
      void append(std::int64_t, std::int64_t row, std::vector<std::int32_t>* keys) const override {
        if (row < r_.global_tokens) {
          for (std::int64_t k = 0; k < len_k_; ++k) keys->push_back(static_cast<std::int32_t>(k));
          return;
        }
        for (std::int64_t k = 0; k < r_.global_tokens; ++k) {
          keys->push_back(static_cast<std::int32_t>(k));
        }
        for (const std::int64_t b : blocks_[static_cast<size_t>(row / r_.block)]) {
          const std::int64_t end = std::min(len_k_, (b + 1) * r_.block);
          for (std::int64_t k = b * r_.block; k < end; ++k) {
            keys->push_back(static_cast<std::int32_t>(k));
          }
        }
      }

     private:
      Random r_;
      std::int64_t len_k_;
      std::vector<std::vector<std::int64_t>> blocks_;
    };
    return std::make_unique<Lister>(r_, pixels(q_hw), pixels(kv_hw));
  }
  Tiling tiling() const override { return Tiling::kTokenRuns; }

 private:
  Random r_;
};

// ---- BlockMask --------------------------------------------------------------------------------

class BlockMaskNode final : public PatternNode {
 public:
  explicit BlockMaskNode(BlockMask m) : m_(std::move(m)) {}
  const char* name() const override { return "attn2d.patterns.BlockMask"; }
  Status validate(GridShape q_hw, GridShape kv_hw, std::int64_t heads) const override {
    const auto bad = [](const std::string& what) {
      return Status::InvalidArgument("attn2d.patterns.BlockMask: " + what);
    };
    if (m_.block_q < 1 || m_.block_k < 1) {
      return bad("block sizes must be >= 1; got " + str(m_.block_q) + " x " + str(m_.block_k));
    }
    const Status s = check_grids_and_heads(q_hw, kv_hw, heads);
    if (!s.ok()) return s;
    const std::int64_t rows = ceil_div(pixels(q_hw), m_.block_q);
    const std::int64_t cols = ceil_div(pixels(kv_hw), m_.block_k);
    if (m_.mask_heads != 1 && m_.mask_heads != heads) {
      return bad("the mask holds " + str(m_.mask_heads) + " heads; it must hold 1 or " +
                 str(heads));
    }
    if (m_.rows != rows || m_.cols != cols) {
      return bad("the mask must have " + str(rows) + " x " + str(cols) + " blocks (" +
                 str(pixels(q_hw)) + " queries in blocks of " + str(m_.block_q) + ", " +
                 str(pixels(kv_hw)) + " keys in blocks of " + str(m_.block_k) + "); got " +
                 str(m_.rows) + " x " + str(m_.cols));
    }
    if (static_cast<std::int64_t>(m_.mask.size()) != m_.mask_heads * rows * cols) {
      return bad("the mask holds " + str(static_cast<std::int64_t>(m_.mask.size())) +
                 " entries, not mask_heads * rows * cols = " +
                 str(m_.mask_heads * rows * cols));
    }
    return Status::Ok();
  }
  std::unique_ptr<KeyLister> keys(GridShape, GridShape kv_hw, std::int64_t) const override {
    class Lister final : public KeyLister {
     public:
      Lister(const BlockMask& m, std::int64_t len_k) : m_(m), len_k_(len_k) {}
      std::int64_t variant(std::int64_t head) const override {
        return m_.mask_heads == 1 ? 0 : head;
      }
      void append(std::int64_t head, std::int64_t row,
                  std::vector<std::int32_t>* keys) const override {
        const std::uint8_t* blocks =
            m_.mask.data() + (variant(head) * m_.rows + row / m_.block_q) * m_.cols;
        for (std::int64_t b = 0; b < m_.cols; ++b) {
          if (!blocks[b]) continue;
          const std::int64_t end = std::min(len_k_, (b + 1) * m_.block_k);
          for (std::int64_t k = b * m_.block_k; k < end; ++k) {
            keys->push_back(static_cast<std::int32_t>(k));
          }
        }
      }

     private:
      const BlockMask& m_;
      std::int64_t len_k_;
    };
    return std::make_unique<Lister>(m_, pixels(kv_hw));
  }
  Tiling tiling() const override { return Tiling::kTokenRuns; }

 private:
  BlockMask m_;
};

}  // namespace

std::shared_ptr<const PatternNode> node_of(Window1D window) {
  return std::make_shared<Window1DNode>(window);
}
std::shared_ptr<const PatternNode> node_of(Random random) {
  return std::make_shared<RandomNode>(random);
}
std::shared_ptr<const PatternNode> node_of(BlockMask mask) {
  return std::make_shared<BlockMaskNode>(std::move(mask));
}

}  // namespace patterns

std::vector<std::int64_t> Random::key_blocks(std::int64_t query_block, std::int64_t len_q,
                                             std::int64_t len_k) const {
  const std::int64_t query_blocks = patterns::ceil_div(len_q, block);
  const std::int64_t key_blocks = patterns::ceil_div(len_k, block);
  const std::int64_t own = query_block * key_blocks / query_blocks;
  std::vector<std::int64_t> others;
  others.reserve(static_cast<size_t>(key_blocks - 1));
  for (std::int64_t b = 0; b < key_blocks; ++b) {
    if (b != own) others.push_back(b);
  }
  // One stream a query block: the seed's, advanced by the block index through SplitMix64.
  patterns::SplitMix64 rng(patterns::SplitMix64(seed).next() ^
                           static_cast<std::uint64_t>(query_block) * 0xD1B54A32D192ED03ull);
  const auto m = static_cast<std::uint64_t>(others.size());
  std::vector<std::int64_t> chosen{own};
  for (std::uint64_t i = 0; i < static_cast<std::uint64_t>(blocks_per_row); ++i) {
    const std::uint64_t j = i + rng.below(m - i);
    std::swap(others[i], others[j]);
    chosen.push_back(others[i]);
  }
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

#define ATTN2D_SEQUENCE_PATTERN_CALLS(Type)                                                   \
  Status Type::validate(GridShape q_hw, GridShape kv_hw, std::int64_t heads) const {         \
    return patterns::node_of(*this)->validate(q_hw, kv_hw, heads);                           \
  }                                                                                           \
  Status Type::dense_mask(GridShape q_hw, GridShape kv_hw, std::int64_t heads,               \
                          std::vector<std::uint8_t>* mask) const {                           \
    return patterns::generic_dense_mask(*patterns::node_of(*this), q_hw, kv_hw, heads, mask); \
  }                                                                                           \
  Status Type::compile(GridShape q_hw, GridShape kv_hw, std::int64_t heads,                  \
                       CompiledLayout* layout) const {                                       \
    return patterns::generic_compile(*patterns::node_of(*this), q_hw, kv_hw, heads, layout); \
  }

ATTN2D_SEQUENCE_PATTERN_CALLS(Window1D)
ATTN2D_SEQUENCE_PATTERN_CALLS(Random)
ATTN2D_SEQUENCE_PATTERN_CALLS(BlockMask)

#undef ATTN2D_SEQUENCE_PATTERN_CALLS

}  // namespace attn2d
