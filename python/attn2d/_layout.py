"""Turns a pattern into the block-sparse, gathered layout the C++ kernels walk
(include/attn2d/sparse_layout.h), and caches it per (pattern, grids, heads).

Query tiles and key tiles are lists of raster rows chosen so that a pattern's allowed pairs
fall into few (query tile, key tile) blocks: 8x8 pixel blocks for windows; for YLG's floor
patterns runs of consecutive positions of its Manhattan enumeration; for its repetitive
patterns queries in raster order, with the "special" columns (one key per block of the 1-D
pattern) gathered into their own key tiles and each query tile's own keys in a run. Each
visited block either allows every pair or carries one 64-bit mask word per query row."""

from __future__ import annotations

import functools
import math

import torch

from . import patterns as P

BLOCK_Q = 64
BLOCK_K = 64  # one mask word per query row


def _block_shape(hw: tuple[int, int], size: int) -> tuple[int, int]:
    """Blocks of at most `size` pixels, 8 wide where the grid is that wide: square-ish 2-D
    neighbourhoods."""
    bw = min(hw[1], 8)
    return max(size // bw, 1), bw


def _pixel_blocks(hw: tuple[int, int], size: int) -> list[torch.Tensor]:
    """Raster indices of the grid cut into blocks, in block-raster order."""
    h, w = hw
    bh, bw = _block_shape(hw, size)
    tiles = []
    for r0 in range(0, h, bh):
        for c0 in range(0, w, bw):
            rows = torch.arange(r0, min(r0 + bh, h))[:, None] * w + torch.arange(c0, min(c0 + bw, w))[None, :]
            tiles.append(rows.flatten())
    return tiles


def _window_candidates(pattern: P.Window, q_hw, kv_hw):
    """Key tiles (of _pixel_blocks) that can hold a key of a query tile's windows: those in the
    bounding box of its windows."""
    hk, wk = kv_hw
    bh, bw = _block_shape(kv_hw, BLOCK_K)
    tiles_per_row = (wk + bw - 1) // bw
    ci_all, cj_all = P.key_centres(q_hw, kv_hw)
    d, k = pattern.dilation, pattern.size
    lo = -(k // 2)

    def span(c: torch.Tensor, length: int) -> tuple[int, int]:
        if pattern.border == "shift":
            starts = pattern._shifted_starts(c, length)
            first, last = int(starts.min()), int(starts.max()) + d * (k - 1)
        else:
            first, last = int(c.min()) + d * lo, int(c.max()) + d * (lo + k - 1)
        return max(first, 0), min(last, length - 1)

    def candidates(query_rows: torch.Tensor) -> torch.Tensor:
        r0, r1 = span(ci_all[query_rows], hk)
        c0, c1 = span(cj_all[query_rows], wk)
        rows = torch.arange(r0 // bh, r1 // bh + 1)
        cols = torch.arange(c0 // bw, c1 // bw + 1)
        return (rows[:, None] * tiles_per_row + cols[None, :]).flatten()

    return candidates


def _chunks(order: torch.Tensor, size: int) -> list[torch.Tensor]:
    return [order[i:i + size] for i in range(0, order.numel(), size)]


def _ylg_plan(pattern: P.YLG, kind: str, q_hw, kv_hw):
    """Query tiles, key tiles and candidate key tiles of one YLG head pattern. Floor patterns:
    both in enumeration order. Repetitive patterns: queries in raster order; key tiles first
    the "special" columns (one key per block of the 1-D pattern, seen by every query), then
    the other positions in runs that follow the query tiles."""
    n = kv_hw[0] * kv_hw[1]
    l = max(math.isqrt(n), 1)
    order = torch.argsort(P.manhattan_order(kv_hw))  # position -> key raster
    query_pos = pattern.query_positions(q_hw, kv_hw)
    repetitive = kind.endswith("repetitive")
    # A floor pattern's query sees the keys of its block of l positions, so its tiles follow
    # the enumeration. Every query of a repetitive pattern sees the same special keys and one
    # key of its own, so any order serves, and raster order makes a tile's rows, outputs and
    # log-sum-exps contiguous where the enumeration puts them one anti-diagonal step (a line
    # each) apart.
    if repetitive:
        q_order = torch.arange(query_pos.numel())
    else:
        q_order = torch.argsort(query_pos, stable=True)
    q_tiles = _chunks(q_order, BLOCK_Q)
    positions = torch.arange(n)
    if kind == "ltr-repetitive":
        special = positions[positions % l == l - 1]
    elif kind == "rtl-repetitive":
        special = positions[(positions % l == 0) & (positions + l - 1 < n)]
    else:
        special = positions[:0]
    is_special = torch.zeros(n, dtype=torch.bool)
    is_special[special] = True
    rest = positions[~is_special]
    n_special_tiles = (special.numel() + BLOCK_K - 1) // BLOCK_K
    if repetitive:
        # A query's own key (outside the special columns) is the cell of its pattern row: the
        # other positions are cut into runs, one for each query tile, of the keys whose first
        # user is that tile, in raster order. With 2x2-pooled keys (official mapping) a raster
        # tile of 64 queries uses 64 consecutive key cells, one each (a single-key visit: one
        # score a query, see VisitSingleKeys); positions no query uses go last.
        tile_of_query = torch.arange(query_pos.numel()) // BLOCK_Q
        first_user = torch.full((n,), len(q_tiles), dtype=torch.long).scatter_reduce(
            0, query_pos, tile_of_query, reduce="amin")
        rest = rest[torch.argsort(first_user[rest] * n + order[rest])]
        counts = torch.unique_consecutive(first_user[rest], return_counts=True)[1]
        rest_tiles = [c for r in torch.split(rest, counts.tolist()) for c in _chunks(r, BLOCK_K)]
    elif kind == "rtl-floor":
        # A query sees the keys of its block at or after its own position: listed backwards,
        # a query tile's keys lead its key tile, and the kernels compute only the leading
        # columns a visit's masks reach (VisitColumns in src/cpu/common/masks-inl.h), as they do
        # for ltr-floor's tiles in ascending order.
        rest_tiles = [c.flip(0) for c in _chunks(rest, BLOCK_K)]
    else:
        rest_tiles = _chunks(rest, BLOCK_K)
    k_tiles = [order[c] for c in _chunks(special, BLOCK_K) + rest_tiles]
    tile_of = torch.empty(n, dtype=torch.long)  # position -> key tile, for the other positions
    for i, c in enumerate(rest_tiles):
        tile_of[c] = n_special_tiles + i
    specials = torch.arange(n_special_tiles)

    def candidates(query_rows: torch.Tensor) -> torch.Tensor:
        r = query_pos[query_rows]
        if kind.endswith("floor"):  # keys in the query's block of l positions
            lo = int(r.min()) - int(r.min()) % l
            hi = min(int(r.max()) - int(r.max()) % l + l - 1, n - 1)
            return torch.unique(tile_of[lo:hi + 1])
        own = r[~is_special[r]]  # the diagonal, where it is not a special column
        return torch.cat([specials, torch.unique(tile_of[own])])

    return q_tiles, k_tiles, candidates


def _pack_tiles(tiles: list[torch.Tensor], block: int) -> torch.Tensor:
    out = torch.full((len(tiles), block), -1, dtype=torch.int32)
    for i, t in enumerate(tiles):
        out[i, : t.numel()] = t.to(torch.int32)
    return out


def _bits(block: torch.Tensor) -> torch.Tensor:
    """(..., 64) bool -> (...,) int64 holding the 64 bits (bit c = column c)."""
    weights = torch.ones(64, dtype=torch.int64) << torch.arange(64, dtype=torch.int64)
    return (block.to(torch.int64) * weights).sum(-1)  # distinct bits: no carries


def _visits(q_rows: torch.Tensor, k_rows: torch.Tensor, allowed, candidates):
    """For every query tile: the key tiles holding an allowed pair, in ascending order, each
    with a mask (a (BLOCK_Q,) int64 word tensor) or None when every valid pair is allowed.
    Only the candidate key tiles are examined, so building costs about the visited pairs."""
    per_tile = []
    for i in range(q_rows.shape[0]):
        q_valid = q_rows[i] >= 0
        rows = q_rows[i][q_valid].long()
        cand = torch.sort(candidates(rows)).values
        tile_rows = k_rows[cand]  # (c, BLOCK_K)
        k_valid = tile_rows >= 0
        keys = tile_rows.long().clamp(min=0).flatten()
        block = torch.zeros(BLOCK_Q, cand.numel() * BLOCK_K, dtype=torch.bool)
        block[: rows.numel()] = allowed(rows, keys)
        block = block.view(BLOCK_Q, cand.numel(), BLOCK_K) & k_valid[None, :, :]
        valid = q_valid[:, None, None] & k_valid[None, :, :]
        any_pair = block.any(dim=2).any(dim=0)
        full = (block == valid).all(dim=2).all(dim=0)
        visits = []
        for j in torch.nonzero(any_pair).flatten().tolist():
            visits.append((int(cand[j]), None if bool(full[j]) else _bits(block[:, j, :])))
        per_tile.append(visits)
    return per_tile


@functools.lru_cache(maxsize=32)
def build(pattern, q_hw: tuple[int, int], kv_hw: tuple[int, int], heads: int):
    """The layout tensors (the order of binding/torch_ops.cc's make_layout) for `pattern`."""
    pattern.check(q_hw, kv_hw, heads)
    if isinstance(pattern, P.Window):
        kinds = [None]
        head_layout = [0] * heads
    else:
        kinds = sorted(set(pattern.patterns), key=pattern.patterns.index)
        head_layout = [kinds.index(kind) for kind in pattern.patterns]
    q_begin, k_begin, q_all, k_all = [0], [0], [], []
    fwd = []  # per global query tile: [(global key tile, mask index)]
    masks = []
    for kind in kinds:
        if kind is None:
            q_tiles = _pixel_blocks(q_hw, BLOCK_Q)
            k_tiles = _pixel_blocks(kv_hw, BLOCK_K)
            candidates = _window_candidates(pattern, q_hw, kv_hw)
            allowed = functools.partial(pattern.allowed_rows, q_hw, kv_hw)
        else:
            q_tiles, k_tiles, candidates = _ylg_plan(pattern, kind, q_hw, kv_hw)
            allowed = functools.partial(pattern.allowed_rows, kind, q_hw, kv_hw)
        q_rows, k_rows = _pack_tiles(q_tiles, BLOCK_Q), _pack_tiles(k_tiles, BLOCK_K)
        for visits in _visits(q_rows, k_rows, allowed, candidates):
            entry = []
            for kt, words in visits:
                m = -1
                if words is not None:
                    m = len(masks)
                    masks.append(words)
                entry.append((k_begin[-1] + kt, m))
            fwd.append(entry)
        q_all.append(q_rows)
        k_all.append(k_rows)
        q_begin.append(q_begin[-1] + q_rows.shape[0])
        k_begin.append(k_begin[-1] + k_rows.shape[0])
    fwd_begin = torch.tensor([0] + [len(v) for v in fwd], dtype=torch.int64).cumsum(0)
    fwd_pairs = [(qt, kt, m) for qt, visits in enumerate(fwd) for kt, m in visits]
    bwd_pairs = sorted(fwd_pairs, key=lambda x: (x[1], x[0]))
    n_k_tiles = k_begin[-1]
    counts = torch.zeros(n_k_tiles + 1, dtype=torch.int64)
    for _, kt, _ in bwd_pairs:
        counts[kt + 1] += 1
    return (
        torch.tensor(head_layout, dtype=torch.int32),
        torch.tensor(q_begin, dtype=torch.int64),
        torch.tensor(k_begin, dtype=torch.int64),
        torch.cat(q_all).contiguous(),
        torch.cat(k_all).contiguous(),
        fwd_begin,
        torch.tensor([kt for _, kt, _ in fwd_pairs], dtype=torch.int32),
        torch.tensor([m for _, _, m in fwd_pairs], dtype=torch.int64),
        counts.cumsum(0),
        torch.tensor([qt for qt, _, _ in bwd_pairs], dtype=torch.int32),
        torch.tensor([m for _, _, m in bwd_pairs], dtype=torch.int64),
        torch.stack(masks) if masks else torch.zeros(0, BLOCK_Q, dtype=torch.int64),
    )


def window_offsets_on_grid(pattern, q_hw: tuple[int, int], kv_hw: tuple[int, int]):
    """A (2, count) int32 tensor of the window's (row, column) offsets in key pixels, or None
    where a window is not a fixed set of raster distances: other patterns, pooled keys (a
    query's keys are then not at a fixed raster distance) and border "shift" (the window moves
    near the border). Offsets that fall outside the map on every query are dropped."""
    if not isinstance(pattern, P.Window) or q_hw != kv_hw or pattern.border != "clip":
        return None
    h, w = kv_hw
    d = pattern.dilation
    offsets = [(di * d, dj * d) for di, dj in pattern.offsets()
               if abs(di * d) < h and abs(dj * d) < w]
    return torch.tensor(offsets, dtype=torch.int32).t().contiguous()


@functools.lru_cache(maxsize=32)
def window_offsets(pattern, q_hw: tuple[int, int], kv_hw: tuple[int, int]):
    """The window's offsets (window_offsets_on_grid) where the window kernels
    (src/cpu/window/) serve it, else None. Whether they do is the core's kernel chooser's rule
    (src/core/kernel_choice.cc): that kernel computes every offset for every query, so past 2x
    the allowed pairs the block-sparse tiles waste less."""
    offsets = window_offsets_on_grid(pattern, q_hw, kv_hw)
    if offsets is None:
        return None
    from . import _ops  # noqa: F401  (loads the binding)

    if torch.ops.attn2d.window_kernel_refusal(offsets, q_hw[0], q_hw[1]):
        return None
    return offsets


def kernel_visited_pairs(pattern, q_hw, kv_hw, layout) -> int:
    """(query, key) pairs the forward and the backward each compute for one image, summed over
    the heads: every offset of every query on the window kernels, else the layout's visited
    pairs."""
    offsets = window_offsets(pattern, tuple(q_hw), tuple(kv_hw))
    if offsets is None:
        return visited_pairs(layout)
    return int(layout[0].numel()) * offsets.shape[1] * q_hw[0] * q_hw[1]


def _mask_bits(masks: torch.Tensor) -> torch.Tensor:
    """(num_masks, BLOCK_Q) words -> (num_masks, BLOCK_Q, 64) bool: bit c of row r."""
    return ((masks[:, :, None] >> torch.arange(64, dtype=torch.int64)) & 1).bool()


def _sum_over_visits(layout, per_visit) -> int:
    """Sum over the heads of per_visit(q_count, k_count, fwd_mask, masks), a (visits,) int64
    count given each visit's query rows, key rows (k_count), mask index and the mask words."""
    head_layout, q_begin, q_rows, k_rows = layout[0], layout[1], layout[3], layout[4]
    fwd_begin, fwd_k, fwd_mask, masks = layout[5], layout[6], layout[7], layout[11]
    tiles = torch.repeat_interleave(torch.arange(q_rows.shape[0]), fwd_begin.diff())
    q_count = (q_rows >= 0).sum(1)[tiles]
    k_count = (k_rows >= 0).sum(1)[fwd_k.long()]
    counts = per_visit(q_count, k_count, fwd_mask, masks)
    per_tile = torch.zeros(q_rows.shape[0], dtype=torch.int64).index_add_(0, tiles, counts)
    per_layout = [int(per_tile[q_begin[i]:q_begin[i + 1]].sum()) for i in range(q_begin.numel() - 1)]
    return sum(per_layout[int(i)] for i in head_layout)


def visited_pairs(layout) -> int:
    """(query, key) pairs the kernel computes for one image, summed over the heads: a masked
    visit computes its key tile's leading columns up to the last one its masks allow
    (VisitColumns in src/cpu/common/masks-inl.h), and one that allows at most one key a row
    computes just those keys (VisitSingleKeys; the bf16 kernels on AVX512-BF16 compute such a
    visit as a tile)."""

    def per_visit(q_count, k_count, fwd_mask, masks):
        computed = q_count * k_count
        if masks.numel():
            bits = _mask_bits(masks)  # (num_masks, BLOCK_Q, 64)
            reach = (bits.any(1) * torch.arange(1, 65)).amax(1)  # the last allowed column + 1
            per_row = bits.sum(2)
            single = (per_row <= 1).all(1)  # a single-key visit: its allowed keys, one a row
            m = fwd_mask.clamp(min=0)
            tile = q_count * torch.minimum(k_count, reach[m])
            masked = torch.where(single[m], per_row.sum(1)[m], tile)
            computed = torch.where(fwd_mask >= 0, masked, computed)
        return computed

    return _sum_over_visits(layout, per_visit)


def allowed_pairs(layout) -> int:
    """(query, key) pairs the pattern allows for one image, summed over the heads: full visits
    count every valid pair, masked ones their set bits."""

    def per_visit(q_count, k_count, fwd_mask, masks):
        bits = torch.zeros(masks.shape[0], dtype=torch.int64)
        if masks.numel():
            bits = _mask_bits(masks).sum((1, 2))
        return torch.where(fwd_mask < 0, q_count * k_count, bits[fwd_mask.clamp(min=0)])

    return _sum_over_visits(layout, per_visit)
