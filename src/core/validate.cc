#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "attn2d/attention.h"

namespace attn2d {
namespace {

std::string str(std::int64_t v) { return std::to_string(v); }

Status check_pointer(const void* ptr, bool needed, const char* name) {
  if (needed && ptr == nullptr) {
    return Status::InvalidArgument(std::string(name) + " is null but the tensor is not empty");
  }
  return Status::Ok();
}

// A layout is trusted only after these checks: every index the kernels follow is in range,
// each layout's tiles partition the rows (so no two tasks write one gradient row, and every
// row is written by one), and the backward's visit lists are exactly the forward's,
// transposed.
Status validate_layout(const AttentionParams& p) {
  const SparseLayout& lay = *p.layout;
  auto bad = [](const std::string& what) {
    return Status::InvalidArgument("layout: " + what);
  };
  if (p.mask_kind != MaskKind::kNone || p.is_causal) {
    return bad("a sparse layout excludes mask and is_causal");
  }
  if (lay.block_k != 64) return bad("block_k must be 64, got " + str(lay.block_k));
  if (lay.block_q < 4 || lay.block_q > 256 || lay.block_q % 4 != 0) {
    return bad("block_q must be a multiple of 4 in [4, 256], got " + str(lay.block_q));
  }
  if (lay.num_layouts < 1) return bad("num_layouts must be >= 1");
  if (!lay.head_layout || !lay.q_tile_begin || !lay.k_tile_begin || !lay.fwd_begin ||
      !lay.bwd_begin) {
    return bad("a required array is null");
  }
  for (std::int64_t h = 0; h < p.heads; ++h) {
    if (lay.head_layout[h] < 0 || lay.head_layout[h] >= lay.num_layouts) {
      return bad("head_layout[" + str(h) + "] out of range");
    }
  }
  const struct Side {
    const std::int64_t* begin;
    const std::int32_t* rows;
    std::int64_t block, len;
    const char* name;
  } sides[] = {{lay.q_tile_begin, lay.q_rows, lay.block_q, p.len_q, "query"},
               {lay.k_tile_begin, lay.k_rows, lay.block_k, p.len_k, "key"}};
  // Every range before any row: the rows array holds the last range's end of tiles, and a
  // range past that end would be read past the array. And tiles enough for every row before
  // `seen` takes len bytes, which a wrong len_q or len_k could make any size.
  for (const Side& side : sides) {
    if (side.begin[0] != 0) return bad(std::string(side.name) + " tiles must start at 0");
    const std::int64_t tiles_needed = side.len / side.block + (side.len % side.block != 0);
    for (std::int64_t l = 0; l < lay.num_layouts; ++l) {
      if (side.begin[l + 1] < side.begin[l]) return bad(std::string(side.name) + " tile ranges must not decrease");
      if (side.begin[l + 1] - side.begin[l] < tiles_needed) {
        return bad("layout " + str(l) + "'s " + str(side.begin[l + 1] - side.begin[l]) + " " +
                   side.name + " tiles of " + str(side.block) + " rows cannot hold its " +
                   str(side.len) + " rows");
      }
    }
    if (side.rows == nullptr && side.begin[lay.num_layouts] > 0) {
      return bad(std::string(side.name) + " rows are null");
    }
  }
  for (const Side& side : sides) {
    std::vector<char> seen(static_cast<size_t>(side.len));
    for (std::int64_t l = 0; l < lay.num_layouts; ++l) {
      std::fill(seen.begin(), seen.end(), 0);
      for (std::int64_t t = side.begin[l]; t < side.begin[l + 1]; ++t) {
        bool padding = false;
        for (std::int64_t r = 0; r < side.block; ++r) {
          const std::int32_t row = side.rows[t * side.block + r];
          if (row < 0) {
            padding = true;
            continue;
          }
          if (padding || row >= side.len || seen[static_cast<size_t>(row)]) {
            return bad(std::string(side.name) + " tile " + str(t) +
                       ": rows must be distinct, in range, with -1 padding only at the end");
          }
          seen[static_cast<size_t>(row)] = 1;
        }
      }
      // The kernels write a row's output and gradients only from the tile that holds it.
      const auto missing = std::find(seen.begin(), seen.end(), 0);
      if (missing != seen.end()) {
        return bad("layout " + str(l) + "'s " + side.name + " tiles must hold every row 0.." +
                   str(side.len - 1) + "; row " + str(missing - seen.begin()) + " is in none");
      }
    }
  }
  const std::int64_t q_tiles = lay.q_tile_begin[lay.num_layouts];
  const std::int64_t k_tiles = lay.k_tile_begin[lay.num_layouts];
  const struct Csr {
    const std::int64_t* begin;
    const std::int32_t* other;
    const std::int64_t* mask;
    std::int64_t tiles, other_tiles;
  } csrs[] = {{lay.fwd_begin, lay.fwd_k_tile, lay.fwd_mask, q_tiles, k_tiles},
              {lay.bwd_begin, lay.bwd_q_tile, lay.bwd_mask, k_tiles, q_tiles}};
  for (const Csr& c : csrs) {
    // Every offset before any visit, as for the tile ranges: the visit arrays hold the last
    // offset's count of visits.
    if (c.begin[0] != 0) return bad("visit lists must start at 0");
    for (std::int64_t t = 0; t < c.tiles; ++t) {
      if (c.begin[t + 1] < c.begin[t]) return bad("visit offsets must not decrease");
    }
    if (c.begin[c.tiles] > 0 && (c.other == nullptr || c.mask == nullptr)) {
      return bad("a visit array is null");
    }
    for (std::int64_t t = 0; t < c.tiles; ++t) {
      for (std::int64_t v = c.begin[t]; v < c.begin[t + 1]; ++v) {
        if (c.other[v] < 0 || c.other[v] >= c.other_tiles) return bad("visited tile out of range");
        if (c.mask[v] < -1 || c.mask[v] >= lay.num_masks) return bad("mask index out of range");
        if (c.mask[v] >= 0 && lay.masks == nullptr) return bad("masks is null");
      }
    }
  }
  // The forward lists transposed by a counting sort on the key tile (each key tile's visits in
  // query-tile order, as the Python builder writes the backward's), then compared with the
  // backward lists key tile by key tile; a key tile whose lists differ in order only is sorted,
  // so that the check does not sort every visit on every call.
  const std::int64_t visits = lay.fwd_begin[q_tiles];
  // A lambda, so that a valid layout builds no message.
  auto fail = [&] { return bad("the backward visit lists must be the forward ones, transposed"); };
  if (lay.bwd_begin[k_tiles] != visits) return fail();
  using Visit = std::pair<std::int64_t, std::int64_t>;  // (other tile, mask)
  std::vector<std::int64_t> next(static_cast<size_t>(k_tiles) + 1, 0);
  for (std::int64_t v = 0; v < visits; ++v) ++next[static_cast<size_t>(lay.fwd_k_tile[v]) + 1];
  for (std::int64_t k = 0; k < k_tiles; ++k) {
    next[static_cast<size_t>(k) + 1] += next[static_cast<size_t>(k)];
    if (next[static_cast<size_t>(k) + 1] != lay.bwd_begin[k + 1]) return fail();
  }
  std::vector<Visit> transposed(static_cast<size_t>(visits));
  for (std::int64_t t = 0; t < q_tiles; ++t) {
    for (std::int64_t v = lay.fwd_begin[t]; v < lay.fwd_begin[t + 1]; ++v) {
      transposed[static_cast<size_t>(next[static_cast<size_t>(lay.fwd_k_tile[v])]++)] = {
          t, lay.fwd_mask[v]};
    }
  }
  std::vector<Visit> a, b;
  for (std::int64_t k = 0; k < k_tiles; ++k) {
    const std::int64_t v0 = lay.bwd_begin[k], v1 = lay.bwd_begin[k + 1];
    bool same = true;
    for (std::int64_t v = v0; v < v1 && same; ++v) {
      same = transposed[static_cast<size_t>(v)] == Visit{lay.bwd_q_tile[v], lay.bwd_mask[v]};
    }
    if (same) continue;
    a.assign(transposed.begin() + v0, transposed.begin() + v1);
    b.clear();
    for (std::int64_t v = v0; v < v1; ++v) b.emplace_back(lay.bwd_q_tile[v], lay.bwd_mask[v]);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    if (a != b) return fail();
  }
  return Status::Ok();
}

// The window kernel reads keys at fixed raster offsets from each query, so the grid must be
// one map of len_q = len_k pixels, and a repeated offset would count a key twice.
Status validate_window(const AttentionParams& p) {
  const WindowOffsets& w = *p.window;
  auto bad = [](const std::string& what) {
    return Status::InvalidArgument("window: " + what);
  };
  if (p.mask_kind != MaskKind::kNone || p.is_causal) {
    return bad("a window excludes mask and is_causal");
  }
  if (w.height < 1 || w.width < 1) {
    return bad("height and width must be >= 1, got " + str(w.height) + "x" + str(w.width));
  }
  // At most 2^31 - 1 pixels, as a compiled pattern's grid (attn2d/patterns.h): the window
  // kernels' geometry (cpu/window/window_geometry.h) sizes its packed rows from the pixel
  // count in int64, and a larger map overflows there (and height * width here).
  constexpr std::int64_t kMaxPixels = std::numeric_limits<std::int32_t>::max();
  if (w.height > kMaxPixels / w.width) {
    return bad("height * width must be at most " + str(kMaxPixels) + ", got " + str(w.height) +
               "x" + str(w.width));
  }
  if (p.len_q != w.height * w.width || p.len_k != p.len_q) {
    return bad("len_q and len_k must both be height * width = " + str(w.height * w.width) +
               ", got " + str(p.len_q) + " and " + str(p.len_k));
  }
  if (w.count < 1) return bad("count must be >= 1, got " + str(w.count));
  if (w.dr == nullptr || w.dc == nullptr) return bad("dr and dc must not be null");
  std::vector<std::pair<std::int32_t, std::int32_t>> seen;
  seen.reserve(static_cast<size_t>(w.count));
  for (std::int64_t o = 0; o < w.count; ++o) {
    if (std::abs(static_cast<std::int64_t>(w.dr[o])) >= w.height ||
        std::abs(static_cast<std::int64_t>(w.dc[o])) >= w.width) {
      return bad("offset " + str(o) + " = (" + str(w.dr[o]) + ", " + str(w.dc[o]) +
                 ") must be smaller than the map (" + str(w.height) + "x" + str(w.width) +
                 ") in each axis");
    }
    seen.emplace_back(w.dr[o], w.dc[o]);
  }
  std::sort(seen.begin(), seen.end());
  if (std::adjacent_find(seen.begin(), seen.end()) != seen.end()) {
    return bad("offsets must be distinct");
  }
  return Status::Ok();
}

// The checks of the forward's params; the backward reads O from out_accum where it is set, so
// there `out` may be null beside it.
Status validate_params(const AttentionParams& p, bool backward) {
  if (p.dtype != DType::kFloat32 && p.dtype != DType::kFloat64 && p.dtype != DType::kBFloat16 &&
      p.dtype != DType::kFloat16) {
    return Status::Unsupported("dtype must be float32, float64, bfloat16 or float16");
  }
  const struct {
    std::int64_t value;
    const char* name;
  } sizes[] = {{p.batch, "batch"}, {p.heads, "heads"},   {p.len_q, "len_q"},
               {p.len_k, "len_k"}, {p.dim_qk, "dim_qk"}, {p.dim_v, "dim_v"}};
  for (const auto& s : sizes) {
    if (s.value < 0) {
      return Status::InvalidArgument(std::string(s.name) + " must be >= 0, got " + str(s.value));
    }
  }
  if (!std::isfinite(p.scale)) {
    return Status::InvalidArgument("scale must be finite, got " + std::to_string(p.scale));
  }
  const bool rows = p.batch > 0 && p.heads > 0 && p.len_q > 0;
  const bool keys = p.batch > 0 && p.heads > 0 && p.len_k > 0;
  Status s;
  if (!(s = check_pointer(p.q, rows && p.dim_qk > 0, "q")).ok()) return s;
  if (!(s = check_pointer(p.k, keys && p.dim_qk > 0, "k")).ok()) return s;
  if (!(s = check_pointer(p.v, keys && p.dim_v > 0, "v")).ok()) return s;
  const void* out = backward && p.out_accum != nullptr ? p.out_accum : p.out;
  if (!(s = check_pointer(out, rows && p.dim_v > 0, backward ? "out (or out_accum)" : "out"))
           .ok()) {
    return s;
  }
  if (p.out_accum != nullptr && p.dtype != DType::kBFloat16 && p.dtype != DType::kFloat16) {
    return Status::InvalidArgument(
        "out_accum is for bfloat16 and float16 only (the float32 and float64 outputs are not "
        "rounded); pass null");
  }
  switch (p.mask_kind) {
    case MaskKind::kNone:
      break;
    case MaskKind::kBool:
    case MaskKind::kAdditive:
      if (!(s = check_pointer(p.mask, rows && keys, "mask")).ok()) return s;
      break;
    default:
      return Status::InvalidArgument("mask_kind must be kNone, kBool or kAdditive");
  }
  if (p.window != nullptr && !(s = validate_window(p)).ok()) return s;
  if (p.layout != nullptr) return validate_layout(p);
  return Status::Ok();
}

}  // namespace

Status validate(const AttentionParams& p) { return validate_params(p, /*backward=*/false); }

Status validate(const AttentionBackwardParams& p) {
  Status s = validate_params(p.fwd, /*backward=*/true);
  if (!s.ok()) return s;
  const AttentionParams& f = p.fwd;
  const bool rows = f.batch > 0 && f.heads > 0 && f.len_q > 0;
  const bool keys = f.batch > 0 && f.heads > 0 && f.len_k > 0;
  if (!(s = check_pointer(f.lse, rows, "lse")).ok()) return s;
  if (!(s = check_pointer(p.dout, rows && f.dim_v > 0, "dout")).ok()) return s;
  if (!(s = check_pointer(p.dq, rows && f.dim_qk > 0, "dq")).ok()) return s;
  if (!(s = check_pointer(p.dk, keys && f.dim_qk > 0, "dk")).ok()) return s;
  if (!(s = check_pointer(p.dv, keys && f.dim_v > 0, "dv")).ok()) return s;
  return Status::Ok();
}

}  // namespace attn2d
