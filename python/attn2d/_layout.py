"""Turns a pattern into the block-sparse, gathered layout the C++ kernels walk
(include/attn2d/sparse_layout.h), and caches it per (pattern, grids, heads).

Query tiles and key tiles are lists of raster rows chosen so that a pattern's allowed pairs
fall into few (query tile, key tile) blocks: 8x8 pixel blocks for windows; runs of consecutive
positions of YLG's Manhattan enumeration for its patterns, with the "repetitive" columns (one
key per block of the 1-D pattern) gathered into their own key tiles. Each visited block either
allows every pair or carries one 64-bit mask word per query row."""

from __future__ import annotations

import functools
import math

import torch

from . import patterns as P

BLOCK_Q = 64
BLOCK_K = 64  # one mask word per query row
_ROWS_PER_CHUNK = 4096  # query rows whose allowed keys are materialised at once (x Nk bools)


def _pixel_blocks(hw: tuple[int, int], size: int) -> list[torch.Tensor]:
    """Raster indices of the grid cut into blocks of at most `size` pixels, 8 wide where the
    grid is that wide (a square-ish 2-D neighbourhood)."""
    h, w = hw
    bw = min(w, 8)
    bh = max(size // bw, 1)
    tiles = []
    for r0 in range(0, h, bh):
        for c0 in range(0, w, bw):
            rows = torch.arange(r0, min(r0 + bh, h))[:, None] * w + torch.arange(c0, min(c0 + bw, w))[None, :]
            tiles.append(rows.flatten())
    return tiles


def _chunks(order: torch.Tensor, size: int) -> list[torch.Tensor]:
    return [order[i:i + size] for i in range(0, order.numel(), size)]


def _ylg_plan(pattern: P.YLG, kind: str, q_hw, kv_hw):
    """Query tiles and key tiles of one YLG head pattern: both in enumeration order."""
    n = kv_hw[0] * kv_hw[1]
    l = max(math.isqrt(n), 1)
    order = torch.argsort(P.manhattan_order(kv_hw))  # position -> key raster
    query_pos = pattern.query_positions(q_hw, kv_hw)
    q_tiles = _chunks(torch.argsort(query_pos, stable=True), BLOCK_Q)
    positions = torch.arange(n)
    if kind == "ltr-repetitive":
        special = positions[positions % l == l - 1]
    elif kind == "rtl-repetitive":
        special = positions[(positions % l == 0) & (positions + l - 1 < n)]
    else:
        special = positions[:0]
    rest = positions[~torch.isin(positions, special)]
    k_tiles = [order[c] for c in _chunks(special, BLOCK_K) + _chunks(rest, BLOCK_K)]
    return q_tiles, k_tiles


def _pack_tiles(tiles: list[torch.Tensor], block: int) -> torch.Tensor:
    out = torch.full((len(tiles), block), -1, dtype=torch.int32)
    for i, t in enumerate(tiles):
        out[i, : t.numel()] = t.to(torch.int32)
    return out


def _bits(block: torch.Tensor) -> torch.Tensor:
    """(..., 64) bool -> (...,) int64 holding the 64 bits (bit c = column c)."""
    weights = torch.ones(64, dtype=torch.int64) << torch.arange(64, dtype=torch.int64)
    return (block.to(torch.int64) * weights).sum(-1)  # distinct bits: no carries


def _visits(q_rows: torch.Tensor, k_rows: torch.Tensor, allowed):
    """For every query tile: the key tiles holding an allowed pair, each with a mask (a
    (BLOCK_Q,) int64 word tensor) or None when every valid pair is allowed."""
    key_index = k_rows.to(torch.long).clamp(min=0).flatten()
    key_valid = (k_rows >= 0).flatten()
    per_tile = []
    tiles_per_chunk = max(_ROWS_PER_CHUNK // BLOCK_Q, 1)
    for t0 in range(0, q_rows.shape[0], tiles_per_chunk):
        chunk = q_rows[t0:t0 + tiles_per_chunk]  # (tiles, BLOCK_Q)
        q_valid = chunk >= 0
        a = allowed(chunk.to(torch.long).clamp(min=0).flatten())  # (tiles*BLOCK_Q, Nk)
        blocks = a[:, key_index] & key_valid[None, :]
        blocks = blocks.view(chunk.shape[0], BLOCK_Q, k_rows.shape[0], BLOCK_K)
        blocks &= q_valid[:, :, None, None]
        any_pair = blocks.any(dim=3).any(dim=1)  # (tiles, k tiles)
        valid = q_valid[:, :, None, None] & (k_rows >= 0)[None, None, :, :]
        full = (blocks == valid).all(dim=3).all(dim=1)
        for i in range(chunk.shape[0]):
            visits = []
            for kt in torch.nonzero(any_pair[i]).flatten().tolist():
                visits.append((kt, None if bool(full[i, kt]) else _bits(blocks[i, :, kt, :])))
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
            allowed = functools.partial(pattern.allowed_rows, q_hw, kv_hw)
        else:
            q_tiles, k_tiles = _ylg_plan(pattern, kind, q_hw, kv_hw)
            allowed = functools.partial(pattern.allowed_rows, kind, q_hw, kv_hw)
        q_rows, k_rows = _pack_tiles(q_tiles, BLOCK_Q), _pack_tiles(k_tiles, BLOCK_K)
        for visits in _visits(q_rows, k_rows, allowed):
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


def visited_pairs(layout) -> int:
    """(query, key) pairs the kernel computes for one image, summed over the heads."""
    head_layout, q_begin, q_rows, k_rows, fwd_begin, fwd_k = (
        layout[0], layout[1], layout[3], layout[4], layout[5], layout[6])
    q_count = (q_rows >= 0).sum(1)
    k_count = (k_rows >= 0).sum(1)
    tiles = torch.repeat_interleave(torch.arange(q_rows.shape[0]), fwd_begin.diff())
    per_visit = q_count[tiles] * k_count[fwd_k.long()]
    per_tile = torch.zeros(q_rows.shape[0], dtype=torch.int64).index_add_(0, tiles, per_visit)
    per_layout = [int(per_tile[q_begin[i]:q_begin[i + 1]].sum()) for i in range(q_begin.numel() - 1)]
    return sum(per_layout[int(i)] for i in head_layout)
