// Which keys each query pixel may attend to, and their compilation into what the kernels read:
// 2-D local windows and YLG's sparse ESA patterns, the same value types as the Python package's
// attn2d.patterns.Window and attn2d.patterns.YLG, compiled into the block-sparse layout of
// attn2d/sparse_layout.h and, for windows the offsets kernels serve, into attn2d/window_offsets.h.
//
// A pattern maps a query grid (Hq, Wq) and a key grid (Hk, Wk) to a (heads, Hq*Wq, Hk*Wk)
// relation over raster-ordered pixels. Query pixel (i, j) is centred at key pixel
// (floor(i*Hk/Hq), floor(j*Wk/Wq)): with 2x2-pooled keys (SAGAN, BigGAN, YLG) four query pixels
// share a centre. Every call checks its arguments and returns a Status; none aborts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attn2d/sparse_layout.h"
#include "attn2d/status.h"
#include "attn2d/window_offsets.h"

namespace attn2d {

// A pixel grid, rows then columns (Python's (H, W) pairs).
struct GridShape {
  std::int64_t height = 0;
  std::int64_t width = 0;
};

// The tile sizes of a compiled layout: one 64-bit mask word per query row of a key tile.
inline constexpr std::int64_t kPatternBlockQ = 64;
inline constexpr std::int64_t kPatternBlockK = 64;

// The block-sparse layout of a pattern, owning its arrays (the order and element types of the
// 12 tensors binding/torch_patterns.cc returns to attn2d.patterns). view() lends them to the
// kernels as a SparseLayout; it stays valid while this object lives and is not modified.
struct CompiledLayout {
  std::int64_t block_q = kPatternBlockQ;
  std::int64_t block_k = kPatternBlockK;
  std::vector<std::int32_t> head_layout;   // (heads,)
  std::vector<std::int64_t> q_tile_begin;  // (num_layouts + 1,)
  std::vector<std::int64_t> k_tile_begin;  // (num_layouts + 1,)
  std::vector<std::int32_t> q_rows;        // (query tiles, block_q), -1 padded
  std::vector<std::int32_t> k_rows;        // (key tiles, block_k), -1 padded
  std::vector<std::int64_t> fwd_begin;     // (query tiles + 1,)
  std::vector<std::int32_t> fwd_k_tile;    // (visits,)
  std::vector<std::int64_t> fwd_mask;      // (visits,), -1: every pair allowed
  std::vector<std::int64_t> bwd_begin;     // (key tiles + 1,)
  std::vector<std::int32_t> bwd_q_tile;    // (visits,)
  std::vector<std::int64_t> bwd_mask;      // (visits,)
  std::vector<std::uint64_t> masks;        // (num_masks, block_q): bit c of row r allows key c

  std::int64_t num_layouts() const;
  std::int64_t num_masks() const;
  SparseLayout view() const;
};

// A window's offsets in key pixels on one grid (attn2d/window_offsets.h), owning them.
struct CompiledWindowOffsets {
  std::int64_t height = 0;
  std::int64_t width = 0;
  std::vector<std::int32_t> dr;  // (count,) row offsets
  std::vector<std::int32_t> dc;  // (count,) column offsets

  WindowOffsets view() const;
};

// chebyshev: a size x size square; manhattan: |di| + |dj| <= size/2 (a diamond); euclidean:
// di^2 + dj^2 <= (size/2)^2 (a disk); di, dj in dilation steps, size/2 rounded down.
enum class WindowMetric : int { kChebyshev = 0, kManhattan = 1, kEuclidean = 2 };
// clip: keys outside the map are dropped; shift (chebyshev only): the window moves inside the
// map, as NATTEN does, so every query sees size*size keys.
enum class WindowBorder : int { kClip = 0, kShift = 1 };

// The names Python uses ("chebyshev", "clip", ...); parse_* reject any other with the message
// attn2d.patterns.Window's constructor raises.
const char* window_metric_name(WindowMetric metric);
const char* window_border_name(WindowBorder border);
Status parse_window_metric(std::string_view name, WindowMetric* metric);
Status parse_window_border(std::string_view name, WindowBorder* border);

// A local window around each query's centre on the key grid (attn2d.patterns.Window). The
// square's offsets per axis run from -(size/2) to size-1-size/2, so an even size has one more
// cell before the centre than after. Aggregate-initialised in Python's argument order:
// Window{7}, Window{5, WindowMetric::kManhattan, 2}.
struct Window {
  std::int64_t size = 1;
  WindowMetric metric = WindowMetric::kChebyshev;
  std::int64_t dilation = 1;
  WindowBorder border = WindowBorder::kClip;

  // The checks of Python's constructor and of Window.check, in their order: size >= 1,
  // dilation >= 1, a known metric and border, shift only with chebyshev, heads >= 1, both grids
  // at least 1x1 (and within the int32 rows of a layout), and a window that fits the key map
  // (clip: dilation*(size-1) below the longer side; shift: dilation*size within the shorter).
  Status validate(GridShape q_hw, GridShape kv_hw, std::int64_t heads) const;

  // (heads, Hq*Wq, Hk*Wk) row-major, 1 where the query may see the key; every head the same.
  // For inspection and tests: its size is the dense attention matrix's.
  Status dense_mask(GridShape q_hw, GridShape kv_hw, std::int64_t heads,
                    std::vector<std::uint8_t>* mask) const;

  // The block-sparse layout: 8-pixel-wide blocks of 64 pixels on both grids, one layout
  // shared by every head.
  Status compile(GridShape q_hw, GridShape kv_hw, std::int64_t heads,
                 CompiledLayout* layout) const;

  // The window as raster offsets: set only for a clip window with queries and keys on one
  // grid, else nullopt (pooled keys have no fixed raster distance, a shifted window moves near
  // the border). Offsets outside the map for every query are dropped.
  Status offsets_on_grid(GridShape q_hw, GridShape kv_hw,
                         std::optional<CompiledWindowOffsets>* offsets) const;

  // offsets_on_grid where the window kernels serve it, else nullopt: the kernel chooser's rule
  // (window_kernel_refusal in attn2d/kernel_choice.h).
  Status kernel_offsets(GridShape q_hw, GridShape kv_hw,
                        std::optional<CompiledWindowOffsets>* offsets) const;
};

// YLG's 1-D patterns over the positions of the Manhattan enumeration, stride l = isqrt(n) for n
// key pixels, in the order of Python's YLG_PATTERNS. ltr-floor: the positions of r's block of
// l up to r; rtl-floor: those from r to the block's end; ltr-repetitive: the last position of
// every block, and r; rtl-repetitive: the first position of every full block, and r.
enum class YlgKind : int { kRtlFloor = 0, kRtlRepetitive = 1, kLtrFloor = 2, kLtrRepetitive = 3 };
// Which pattern row a query uses when queries lie on a finer grid than the keys. official: the
// query's raster index mod n, as the published code tiles its mask; geometric: the key cell
// the query is centred at.
enum class YlgMapping : int { kOfficial = 0, kGeometric = 1 };

const char* ylg_kind_name(YlgKind kind);  // "rtl-floor", ...
const char* ylg_mapping_name(YlgMapping mapping);
Status parse_ylg_kind(std::string_view name, YlgKind* kind);
Status parse_ylg_mapping(std::string_view name, YlgMapping* mapping);

// YLG's ESA patterns (Daras et al., CVPR 2020; attn2d.patterns.YLG): the key grid enumerated by
// Manhattan distance i + j from (0, 0), ties by smaller i, and one 1-D pattern per head laid on
// that order.
struct YLG {
  std::vector<YlgKind> patterns;  // one per head
  YlgMapping mapping = YlgMapping::kOfficial;

  // The official code's heads: each kind on heads/4 consecutive heads, in YlgKind's order
  // (Python's YLG(heads)). heads < 1 gives no heads, which validate() rejects.
  static YLG with_heads(std::int64_t heads, YlgMapping mapping = YlgMapping::kOfficial);

  std::int64_t heads() const { return static_cast<std::int64_t>(patterns.size()); }

  // At least one head, known kinds and mapping, both grids at least 1x1 (and within the int32
  // rows of a layout), and heads equal to the pattern's.
  Status validate(GridShape q_hw, GridShape kv_hw, std::int64_t heads) const;

  // (heads, Hq*Wq, Hk*Wk) row-major, 1 where the query may see the key.
  Status dense_mask(GridShape q_hw, GridShape kv_hw, std::int64_t heads,
                    std::vector<std::uint8_t>* mask) const;

  // The block-sparse layout: one layout per distinct kind, in the order the heads first use
  // them.
  Status compile(GridShape q_hw, GridShape kv_hw, std::int64_t heads,
                 CompiledLayout* layout) const;
};

}  // namespace attn2d
