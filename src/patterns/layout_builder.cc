// Cost: the visits are found from the allowed pairs themselves, each query's keys listed once
// by its pattern, never from the candidate tiles' full blocks. Every visit holds at least one
// allowed pair, so there are at most as many visits as allowed pairs, and a visit costs one
// block_q-word mask (64 words) to build and test. Time and memory are thus
// O(len_q + len_k + heads + block_q * allowed pairs), plus the keys the patterns list beyond the
// allowed ones (a clipped window lists at most twice its keys, see window_keys.h). The visits of a
// query tile are put in key-tile order by sorting that tile's visited key tiles, at most one per
// allowed pair.
#include "patterns/layout_builder.h"

#include <algorithm>
#include <utility>

namespace attn2d {
namespace patterns {

LayoutBuilder::LayoutBuilder(std::int64_t len_k) : len_k_(len_k) {
  layout_.q_tile_begin.push_back(0);
  layout_.k_tile_begin.push_back(0);
  layout_.fwd_begin.push_back(0);
}

void LayoutBuilder::add(const TilePlan& plan) {
  constexpr std::int64_t kBlockQ = kPatternBlockQ, kBlockK = kPatternBlockK;
  const std::int64_t q_tiles = static_cast<std::int64_t>(plan.q_rows.size()) / kBlockQ;
  const std::int64_t k_tiles = static_cast<std::int64_t>(plan.k_rows.size()) / kBlockK;
  const std::int64_t k_tile_base = layout_.k_tile_begin.back();

  // Where each key sits, and which columns of each key tile hold a key.
  std::vector<std::int32_t> tile_of(static_cast<size_t>(len_k_), -1);
  std::vector<std::int8_t> column_of(static_cast<size_t>(len_k_), -1);
  std::vector<std::uint64_t> valid_columns(static_cast<size_t>(k_tiles), 0);
  for (std::int64_t t = 0; t < k_tiles; ++t) {
    for (std::int64_t c = 0; c < kBlockK; ++c) {
      const std::int32_t key = plan.k_rows[static_cast<size_t>(t * kBlockK + c)];
      if (key < 0) continue;
      tile_of[static_cast<size_t>(key)] = static_cast<std::int32_t>(t);
      column_of[static_cast<size_t>(key)] = static_cast<std::int8_t>(c);
      valid_columns[static_cast<size_t>(t)] |= std::uint64_t{1} << c;
    }
  }

  // Per query tile: the key tiles its queries reach (slot_of_tile: their slot in `words`, -1
  // for none), each with one word a query row.
  std::vector<std::int32_t> slot_of_tile(static_cast<size_t>(k_tiles), -1);
  std::vector<std::int32_t> touched;
  std::vector<std::uint64_t> words;
  std::vector<std::int32_t> keys;
  for (std::int64_t t = 0; t < q_tiles; ++t) {
    const std::int32_t* rows = plan.q_rows.data() + t * kBlockQ;
    std::int64_t valid_rows = 0;
    for (; valid_rows < kBlockQ && rows[valid_rows] >= 0; ++valid_rows) {
      keys.clear();
      plan.allowed_keys(rows[valid_rows], &keys);
      for (const std::int32_t key : keys) {
        const std::int32_t tile = tile_of[static_cast<size_t>(key)];
        std::int32_t& slot = slot_of_tile[static_cast<size_t>(tile)];
        if (slot < 0) {
          slot = static_cast<std::int32_t>(touched.size());
          touched.push_back(tile);
          words.resize(words.size() + kBlockQ, 0);
        }
        words[static_cast<size_t>(slot * kBlockQ + valid_rows)] |=
            std::uint64_t{1} << column_of[static_cast<size_t>(key)];
      }
    }
    std::sort(touched.begin(), touched.end());
    for (const std::int32_t tile : touched) {
      const std::uint64_t* block =
          words.data() + slot_of_tile[static_cast<size_t>(tile)] * kBlockQ;
      // Every pair of valid rows and valid columns allowed: the visit needs no mask.
      const bool full = std::all_of(block, block + valid_rows, [&](std::uint64_t w) {
        return w == valid_columns[static_cast<size_t>(tile)];
      });
      std::int64_t mask = -1;
      if (!full) {
        mask = static_cast<std::int64_t>(layout_.masks.size()) / kBlockQ;
        layout_.masks.insert(layout_.masks.end(), block, block + kBlockQ);
      }
      layout_.fwd_k_tile.push_back(static_cast<std::int32_t>(k_tile_base + tile));
      layout_.fwd_mask.push_back(mask);
      slot_of_tile[static_cast<size_t>(tile)] = -1;
    }
    layout_.fwd_begin.push_back(static_cast<std::int64_t>(layout_.fwd_k_tile.size()));
    touched.clear();
    words.clear();
  }

  layout_.q_rows.insert(layout_.q_rows.end(), plan.q_rows.begin(), plan.q_rows.end());
  layout_.k_rows.insert(layout_.k_rows.end(), plan.k_rows.begin(), plan.k_rows.end());
  layout_.q_tile_begin.push_back(layout_.q_tile_begin.back() + q_tiles);
  layout_.k_tile_begin.push_back(k_tile_base + k_tiles);
}

void LayoutBuilder::finish(std::vector<std::int32_t> head_layout, CompiledLayout* out) {
  layout_.head_layout = std::move(head_layout);
  // The forward's visits transposed by a counting sort on the key tile: the forward lists them
  // by ascending query tile, so each key tile's list comes out in query-tile order.
  const std::int64_t q_tiles = layout_.q_tile_begin.back();
  const std::int64_t k_tiles = layout_.k_tile_begin.back();
  const size_t visits = layout_.fwd_k_tile.size();
  layout_.bwd_begin.assign(static_cast<size_t>(k_tiles) + 1, 0);
  for (const std::int32_t tile : layout_.fwd_k_tile) {
    ++layout_.bwd_begin[static_cast<size_t>(tile) + 1];
  }
  for (std::int64_t k = 0; k < k_tiles; ++k) {
    layout_.bwd_begin[static_cast<size_t>(k) + 1] += layout_.bwd_begin[static_cast<size_t>(k)];
  }
  std::vector<std::int64_t> next(layout_.bwd_begin.begin(), layout_.bwd_begin.end() - 1);
  layout_.bwd_q_tile.assign(visits, 0);
  layout_.bwd_mask.assign(visits, 0);
  for (std::int64_t t = 0; t < q_tiles; ++t) {
    for (std::int64_t v = layout_.fwd_begin[static_cast<size_t>(t)];
         v < layout_.fwd_begin[static_cast<size_t>(t) + 1]; ++v) {
      const size_t tile = static_cast<size_t>(layout_.fwd_k_tile[static_cast<size_t>(v)]);
      const size_t slot = static_cast<size_t>(next[tile]++);
      layout_.bwd_q_tile[slot] = static_cast<std::int32_t>(t);
      layout_.bwd_mask[slot] = layout_.fwd_mask[static_cast<size_t>(v)];
    }
  }
  *out = std::move(layout_);
  layout_ = CompiledLayout();
}

}  // namespace patterns
}  // namespace attn2d
