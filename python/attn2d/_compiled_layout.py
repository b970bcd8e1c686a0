"""A pattern's compiled form, as the kernels read it: the block-sparse, gathered layout of
include/attn2d/sparse_layout.h and, for windows the window kernels serve, raster offsets. The
core compiles both (attn2d/patterns.h, through binding/torch_patterns.cc); this module caches
them per (pattern, grids, heads) and counts the pairs a layout computes and allows.

Query tiles and key tiles are lists of raster rows chosen so that a pattern's allowed pairs
fall into few (query tile, key tile) blocks: 8x8 pixel blocks for windows; for YLG's floor
patterns runs of consecutive positions of its Manhattan enumeration; for its repetitive
patterns queries in raster order, with the "special" columns (one key per block of the 1-D
pattern) gathered into their own key tiles and each query tile's own keys in a run. Each
visited block either allows every pair or carries one 64-bit mask word per query row."""

from __future__ import annotations

import functools

import torch

from . import patterns as P

BLOCK_Q = 64  # rows per query tile (kPatternBlockQ in attn2d/patterns.h)
BLOCK_K = 64  # keys per key tile: one mask word per query row


def _check_pattern(pattern) -> None:
    if not isinstance(pattern, P.Pattern):
        raise TypeError("attn2d.patterns: a pattern must be an attn2d.patterns pattern; got "
                        f"{type(pattern).__name__}")


@functools.lru_cache(maxsize=32)
def build(pattern, q_hw: tuple[int, int], kv_hw: tuple[int, int], heads: int):
    """The layout's 12 tensors (attn2d::CompiledLayout's order, which binding/torch_ops.cc's
    make_layout reads) for `pattern` (cached: do not modify them)."""
    _check_pattern(pattern)
    return tuple(pattern._compile(tuple(q_hw), tuple(kv_hw), heads))


def window_offsets_on_grid(pattern, q_hw: tuple[int, int], kv_hw: tuple[int, int]):
    """A (2, count) int32 tensor of the window's (row, column) offsets in key pixels, or None
    where a window is not a fixed set of raster distances: other patterns, pooled keys (a
    query's keys are then not at a fixed raster distance) and border "shift" (the window moves
    near the border). Offsets that fall outside the map on every query are dropped."""
    _check_pattern(pattern)
    return pattern._window_offsets(tuple(q_hw), tuple(kv_hw), True)


@functools.lru_cache(maxsize=32)
def window_offsets(pattern, q_hw: tuple[int, int], kv_hw: tuple[int, int]):
    """The window's offsets (window_offsets_on_grid) where the window kernels
    (src/cpu/window/) serve it, else None. Whether they do is the core's kernel chooser's rule
    (src/core/kernel_choice.cc): that kernel computes every offset for every query, so past 2x
    the allowed pairs the block-sparse tiles waste less."""
    _check_pattern(pattern)
    return pattern._window_offsets(tuple(q_hw), tuple(kv_hw), False)


def kernel_visited_pairs(pattern, q_hw, kv_hw, layout) -> int:
    """(query, key) pairs the forward and the backward each compute for one image, summed over
    the heads: every offset of every query on the window kernels, else the layout's visited
    pairs."""
    offsets = window_offsets(pattern, tuple(q_hw), tuple(kv_hw))
    if offsets is None:
        return visited_pairs(layout)
    return int(layout[0].numel()) * offsets.shape[1] * q_hw[0] * q_hw[1]


def _popcount(words: torch.Tensor) -> torch.Tensor:
    """Set bits of each int64 word, in the words' own memory footprint (SWAR; wraps mod 2^64)."""
    x = words - ((words >> 1) & 0x5555555555555555)
    x = (x & 0x3333333333333333) + ((x >> 2) & 0x3333333333333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0F
    return (x * 0x0101010101010101) >> 56


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
        if not masks.numel():  # every visit allows all its pairs
            return q_count * k_count
        bits = _popcount(masks).sum(1)
        return torch.where(fwd_mask < 0, q_count * k_count, bits[fwd_mask.clamp(min=0)])

    return _sum_over_visits(layout, per_visit)
