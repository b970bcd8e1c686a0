// libFuzzer target: windows given as offsets (attn2d/window_offsets.h), as any caller may pass
// them (patterns_fuzz.cc covers the offsets the core's pattern compiler makes): the offsets'
// validation, the geometry the window kernels build from them (src/cpu/window/window_geometry.h)
// and the kernel chooser's window-or-layout decision. The input draws a grid and a window (a
// dilated rectangle or diamond with offsets dropped, or free offsets, then edited), validates
// it, checks the geometry's invariants for several vector widths, asks the chooser (sometimes
// with a dense layout beside the window) and, where small, runs the forward and the backward.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <utility>
#include <vector>

#include "cpu/window/window_geometry.h"
#include "fuzz_util.h"

namespace attn2d {
namespace fuzz {
namespace {

constexpr std::int64_t kMaxOffsets = 256;

std::int64_t grid_size(Input& in) {
  const std::uint8_t b = in.byte();
  return b < 0xF0 ? 1 + b % 12 : in.size();
}

// The geometry's promises to the kernels (window_geometry.h), for a validated window.
template <typename T>
void check_geometry(const WindowOffsets& w, std::int64_t L, std::int64_t rows, std::int64_t cols) {
  const cpu::WindowGeometry<T> g(w, L, rows, cols);
  auto require = [](bool ok, const char* what) {
    if (!ok) fail("window geometry:", what);
  };
  const std::size_t n = static_cast<std::size_t>(w.count);
  require(g.off.size() == n && g.dr.size() == n && g.dc.size() == n, "one entry per offset");
  require(std::is_sorted(g.off.begin(), g.off.end()), "raster distances ascending");
  std::int64_t reach = 0;
  std::multiset<std::pair<std::int64_t, std::int64_t>> given, built;
  for (std::size_t o = 0; o < n; ++o) {
    given.emplace(w.dr[o], w.dc[o]);
    const auto dr = static_cast<std::int64_t>(g.dr[o]), dc = static_cast<std::int64_t>(g.dc[o]);
    built.emplace(dr, dc);
    require(g.off[o] == dr * g.pitch + dc, "raster distance of its row and column");
    reach = std::max(reach, std::abs(g.off[o]));
  }
  require(given == built, "the same offsets");
  require(g.pitch == g.width || (g.pitch % L == 0 && g.pitch > g.width &&
                                 g.pitch * cpu::kMaxPitchRatioDen <=
                                     g.width * cpu::kMaxPitchRatioNum),
          "pitch: the width, or rounded up to whole vectors within 4/3");
  require(g.block_rows == 1 || (g.block_rows == rows && g.block_stride % L == 0 &&
                                g.block_stride > 0),
          "blocks one whole vector stride apart");
  require(g.margin % L == 0 && g.margin >= reach + (g.block_rows - 1) * g.block_stride + L,
          "margin covers every offset, block and vector");
  require(g.vectors * L >= g.positions() && (g.vectors - 1) * L < g.positions(),
          "vectors cover the positions");
  require(g.ld >= 2 * g.margin + g.vectors * L && g.ld % L == 0 && (g.ld / L) % 2 == 1,
          "packed row: margins, vectors, an odd count");
  require(g.per_row * L >= g.pitch, "vectors per pixel row");
  std::int64_t in_columns = 0, in_sweeps = 0;
  for (const auto& c : g.columns) {
    require(c.n >= 1 && c.first >= 0 && c.first + c.n <= w.count, "column in range");
    in_columns += c.n;
    if (g.block_rows > 1) {
      // A block reads its column's m-th offset at base + m * block_stride.
      for (std::int64_t m = 0; m < c.n; ++m) {
        const std::size_t t = static_cast<std::size_t>(c.first + m);
        const std::int64_t off = static_cast<std::int64_t>(g.col_dr[t]) * g.pitch +
                                 static_cast<std::int64_t>(g.col_dc[t]);
        require(off == c.base + m * g.block_stride, "evenly spaced column");
      }
    }
  }
  for (const auto& s : g.sweeps) {
    require(s.n >= 1 && s.n <= cols && s.first >= 0 && s.first + s.n <= w.count, "sweep in range");
    in_sweeps += s.n;
  }
  require(in_columns == w.count && in_sweeps == w.count, "columns and sweeps hold every offset");
  // interior(): every lane's every offset lands inside the map, in one pixel row (on maps small
  // enough to walk).
  const std::int64_t walk = g.positions() <= (1 << 14) ? g.positions() : 0;
  for (std::int64_t q0 = 0; q0 < walk; q0 += std::max<std::int64_t>(1, L / 2)) {
    if (g.valid_lanes(q0) > static_cast<std::size_t>(L)) require(false, "valid lanes");
    if (!g.interior(q0)) continue;
    for (std::int64_t lane = 0; lane < L; ++lane) {
      const std::int64_t pos = q0 + lane, i = pos / g.pitch, j = pos % g.pitch;
      require(j < g.width, "interior lane on a pad column");
      for (std::size_t o = 0; o < n; ++o) {
        const std::int64_t r = i + w.dr[o], c = j + w.dc[o];
        require(r >= 0 && r < g.height && c >= 0 && c < g.width, "interior offset outside");
      }
    }
  }
}

// Dense attention as a layout: query tiles of 4 consecutive rows, key tiles of 64, every pair
// visited. Beside the window, it lets the chooser send the call to the tiles.
struct DenseLayout {
  std::vector<std::int32_t> head_layout, q_rows, k_rows, fwd_k_tile, bwd_q_tile;
  std::vector<std::int64_t> q_begin, k_begin, fwd_begin, fwd_mask, bwd_begin, bwd_mask;
  SparseLayout view;

  DenseLayout(std::int64_t heads, std::int64_t len) {
    const std::int64_t qt = (len + 3) / 4, kt = (len + 63) / 64;
    head_layout.assign(static_cast<std::size_t>(heads), 0);
    auto row = [len](std::int64_t r) { return r < len ? static_cast<std::int32_t>(r) : -1; };
    for (std::int64_t r = 0; r < qt * 4; ++r) q_rows.push_back(row(r));
    for (std::int64_t r = 0; r < kt * 64; ++r) k_rows.push_back(row(r));
    q_begin = {0, qt};
    k_begin = {0, kt};
    fwd_begin = {0};
    for (std::int64_t t = 0; t < qt; ++t) {
      for (std::int64_t k = 0; k < kt; ++k) fwd_k_tile.push_back(static_cast<std::int32_t>(k));
      fwd_begin.push_back(static_cast<std::int64_t>(fwd_k_tile.size()));
    }
    bwd_begin = {0};
    for (std::int64_t k = 0; k < kt; ++k) {
      for (std::int64_t t = 0; t < qt; ++t) bwd_q_tile.push_back(static_cast<std::int32_t>(t));
      bwd_begin.push_back(static_cast<std::int64_t>(bwd_q_tile.size()));
    }
    fwd_mask.assign(fwd_k_tile.size(), -1);
    bwd_mask.assign(bwd_q_tile.size(), -1);
    view.block_q = 4;
    view.block_k = 64;
    view.num_layouts = 1;
    view.head_layout = head_layout.data();
    view.q_tile_begin = q_begin.data();
    view.k_tile_begin = k_begin.data();
    view.q_rows = q_rows.data();
    view.k_rows = k_rows.data();
    view.fwd_begin = fwd_begin.data();
    view.fwd_k_tile = fwd_k_tile.data();
    view.fwd_mask = fwd_mask.data();
    view.bwd_begin = bwd_begin.data();
    view.bwd_q_tile = bwd_q_tile.data();
    view.bwd_mask = bwd_mask.data();
  }
};

void run(Input& in) {
  WindowOffsets w;
  w.height = grid_size(in);
  w.width = grid_size(in);
  std::vector<std::int32_t> dr, dc;
  const std::uint8_t shape = in.byte();
  if (shape % 4 < 3) {
    // A dilated rectangle (or diamond) of half-extents rh x rw, with offsets dropped at random.
    const std::int64_t rh = in.below(6), rw = in.below(6);
    const std::int64_t sh = 1 + in.below(3), sw = 1 + in.below(3);
    const bool diamond = shape % 4 == 1;
    const std::uint8_t drop = in.byte();
    for (std::int64_t a = -rh; a <= rh; ++a) {
      for (std::int64_t b = -rw; b <= rw; ++b) {
        if (diamond && std::abs(a) * std::max<std::int64_t>(rw, 1) +
                               std::abs(b) * std::max<std::int64_t>(rh, 1) >
                           rh * std::max<std::int64_t>(rw, 1)) {
          continue;
        }
        if (drop != 0 && in.below(256) < drop / 4) continue;
        dr.push_back(static_cast<std::int32_t>(a * sh));
        dc.push_back(static_cast<std::int32_t>(b * sw));
      }
    }
  } else {
    const std::int64_t count = in.below(40);
    for (std::int64_t o = 0; o < count; ++o) {
      dr.push_back(static_cast<std::int8_t>(in.byte()) % 12);
      dc.push_back(static_cast<std::int8_t>(in.byte()) % 12);
    }
  }
  // Edits: a wild offset or a repeated one.
  const std::int64_t edits = in.below(8) < 5 ? 0 : 1 + in.below(3);
  for (std::int64_t e = 0; e < edits && !dr.empty(); ++e) {
    const std::size_t at = in.byte() % dr.size();
    if (in.flag()) {
      dr[at] = in.raw<std::int32_t>();
      dc[at] = in.raw<std::int32_t>();
    } else {
      const std::size_t from = in.byte() % dr.size();
      dr[at] = dr[from];
      dc[at] = dc[from];
    }
  }
  if (dr.size() > static_cast<std::size_t>(kMaxOffsets)) return;
  // Exactly count entries, so that a read past them is a sanitizer report.
  w.count = static_cast<std::int64_t>(dr.size());
  std::unique_ptr<std::int32_t[]> dr_exact(new std::int32_t[dr.size()]);
  std::unique_ptr<std::int32_t[]> dc_exact(new std::int32_t[dc.size()]);
  std::copy(dr.begin(), dr.end(), dr_exact.get());
  std::copy(dc.begin(), dc.end(), dc_exact.get());
  w.dr = dr_exact.get();
  w.dc = dc_exact.get();

  AttentionParams p;
  p.dtype = static_cast<DType>(in.below(4));
  const std::uint8_t flags = in.byte();
  const bool backward = flags & 1;
  const bool wild = flags & 2;
  p.batch = 1 + in.below(2);
  p.heads = 1 + in.below(2);
  p.dim_qk = in.below(9);
  p.dim_v = in.below(9);
  p.scale = 0.25;
  std::int64_t len;
  if (!mul_ok(w.height, w.width, &len)) len = in.size();
  p.len_q = p.len_k = len;
  // Params the window excludes or that do not match its grid.
  if (flags & 4) p.len_k = in.size();
  if (flags & 8) p.is_causal = true;
  if ((flags & 0x30) == 0x30) p.mask_kind = MaskKind::kAdditive;
  if (flags & 0x40) w.count = -static_cast<std::int64_t>(in.below(2));  // none, or negative
  if ((flags & 0x80) && in.flag()) w.dr = nullptr;
  p.window = &w;
  p.q = p.k = p.v = p.mask = Buffer().pointer(false);
  p.out = Buffer().pointer(false);

  const Status s = validate(p);
  check_status(s, "validate(window)");
  if (!s.ok()) return;
  for (const std::int64_t L : {1, 2, 4, 8, 16}) {
    check_geometry<float>(w, L, 1, 1);
    check_geometry<float>(w, L, static_cast<std::int64_t>(cpu::kBlockRows),
                          static_cast<std::int64_t>(cpu::kBlockOffsets));
  }
  check_geometry<double>(w, 8, static_cast<std::int64_t>(cpu::kBlockRows),
                         static_cast<std::int64_t>(cpu::kBlockOffsets));
  const std::string refusal = window_kernel_refusal(w);
  std::unique_ptr<DenseLayout> layout;
  if (in.flag() && len <= 4096) {
    layout.reset(new DenseLayout(p.heads, len));
    p.layout = &layout->view;
    const Status with_layout = validate(p);
    if (!with_layout.ok()) fail("a dense layout beside the window refused", with_layout.message());
  }
  FuzzHost fuzz_host;
  const Host host = fuzz_host.make(in);
  check_choice(p, host);
  const KernelChoice c = choose_forward(p, host);
  if (p.layout == nullptr && c.kernel != Kernel::kWindow) fail("a lone window not on its kernel");
  if (p.layout != nullptr && (c.kernel == Kernel::kWindow) != refusal.empty()) {
    fail("window or layout against window_kernel_refusal", refusal);
  }
  if (dense_work(p) > kMaxWork) return;
  DenseRun().run(in, p, backward, wild);
}

}  // namespace
}  // namespace fuzz
}  // namespace attn2d

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  attn2d::fuzz::Input in(data, size);
  attn2d::fuzz::run(in);
  return 0;
}
