"""The backward of attention's backward: what a gradient penalty (R1, WGAN-GP, path length)
differentiates.

Attention: S = scale * Q K^T (+ an additive mask), P = softmax(S) over the allowed keys,
O = P V. Its backward, given dO: dP = dO V^T, D = rowsum(P * dP), dS = P * (dP - D),
dQ = scale * dS K, dK = scale * dS^T Q, dV = P^T dO.

Given the cotangents u, w, z of dQ, dK, dV, this module returns the gradients of
L = <u, dQ> + <w, dK> + <z, dV> with respect to Q, K, V and dO, with P a function of Q and K
(the backward operator's O and lse inputs get none: their dependence on Q, K, V is counted
here). With G = scale * (u K^T + Q w^T), the gradient of L with respect to dS:

    r = rowsum(P * G)                     H = P * (G - r)        (the gradient through dP)
    Pz = P z                              t = rowsum(dS * G) - r * D + rowsum(dO * Pz)
    dS2 = P * ((dP - D) * G - r * dP + dO z^T - t)               (through P, by softmax)

    grad Q  = scale * (dS w + dS2 K)      grad K = scale * (dS^T u + dS2^T Q)
    grad V  = H^T dO                      grad dO = Pz + H V

(tests/python/test_double_backward.py checks these against torch.autograd on float64 naive
attention.) The computation walks groups of query rows, recomputing P for each group against
the keys the group may see: every key for global attention, the band of map rows a window
reaches, the visited key tiles of a compiled layout (so a sparse pattern costs its visited
pairs). Memory is the inputs, their gradients and a few (rows x keys) blocks, sized by
GROUP_BYTES, never the Lq x Lk matrix. It is written in torch operations, so it runs on every
device and dtype the first backward does (16-bit in float32) and can itself be differentiated.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple, Optional

import torch

# One group's (rows x keys) blocks, all heads and images together: about ten live at once.
GROUP_BYTES = 16 << 20


class RowGroup(NamedTuple):
    """Query rows of some heads and the keys they may see.

    heads: None (every head) with (R,) rows, or a long index tensor of heads with (T, R) rows
    for T tiles. rows: long raster rows, -1 past a tile's end. keys: None for every key, a
    slice of keys every row may see, or (T, K) long key indices per tile, -1 for none.
    allowed: a bool mask broadcastable to the (R, keys) scores, or (T, R, K) for tiles, or None
    for all; additive: a float mask broadcastable to (B, heads, R, keys), or None."""

    heads: Optional[torch.Tensor]
    rows: torch.Tensor
    keys: object
    allowed: Optional[torch.Tensor]
    additive: Optional[torch.Tensor]


def _group_rows(n_rows: int, batch_heads: int, n_keys: int, itemsize: int = 4) -> int:
    per_row = max(batch_heads * max(n_keys, 1) * itemsize * 10, 1)
    return max(16, min(n_rows, GROUP_BYTES // per_row))


def dense_groups(q: torch.Tensor, k: torch.Tensor, attn_mask: Optional[torch.Tensor],
                 is_causal: bool) -> Iterator[RowGroup]:
    """Row groups of global attention with an optional broadcast mask and is_causal."""
    B, H, Lq, _ = q.shape
    Lk = k.shape[2]
    step = _group_rows(Lq, B * H, Lk)
    mask = None
    if attn_mask is not None:
        mask = attn_mask.expand(*attn_mask.shape[:-2], Lq, Lk) if attn_mask.dim() >= 2 else \
            attn_mask.expand(Lq, Lk)
    keys = torch.arange(Lk, device=q.device)
    for r0 in range(0, Lq, step):
        rows = torch.arange(r0, min(r0 + step, Lq), device=q.device)
        allowed = additive = None
        if is_causal:
            allowed = keys[None, :] <= rows[:, None]
        if mask is not None:
            block = mask[..., r0:r0 + rows.numel(), :]
            if block.dtype == torch.bool:
                allowed = block if allowed is None else allowed & block
            else:
                additive = block
        yield RowGroup(None, rows, None, allowed, additive)


def window_groups(q: torch.Tensor, k: torch.Tensor, offsets: torch.Tensor, height: int,
                  width: int) -> Iterator[RowGroup]:
    """Row groups of a window on one (height, width) grid given by its (2, count) offsets:
    query (i, j) sees key (i + di, j + dj) where that lies on the grid. A group of whole map
    rows sees the band of key rows its offsets reach, not every key."""
    B, H = q.shape[:2]
    di, dj = (offsets[0].long().to(q.device), offsets[1].long().to(q.device))
    if di.numel() == 0:  # no offsets: no pairs, every second derivative is 0
        return
    lo, hi = int(di.min()), int(di.max())
    # m map rows see m + hi - lo key rows: the most rows whose blocks fit GROUP_BYTES.
    per_row_pair = B * H * width * width * 4 * 10
    map_rows = 1
    while map_rows < height and \
            (map_rows + 1) * (map_rows + 1 + hi - lo) * per_row_pair <= GROUP_BYTES:
        map_rows += 1
    for i0 in range(0, height, map_rows):
        i1 = min(i0 + map_rows, height)
        k0, k1 = max(0, i0 + lo), min(height, i1 + hi)  # key rows [k0, k1)
        if k1 <= k0:  # the offsets reach past the map from every row: no pairs
            continue
        rows = torch.arange(i0 * width, i1 * width, device=q.device)
        ki = (rows // width)[:, None] + di[None, :]
        kj = (rows % width)[:, None] + dj[None, :]
        inside = (ki >= 0) & (ki < height) & (kj >= 0) & (kj < width)
        allowed = torch.zeros(rows.numel(), (k1 - k0) * width, dtype=torch.bool,
                              device=q.device)
        local = torch.arange(rows.numel(), device=q.device)[:, None].expand_as(ki)
        allowed[local[inside], ((ki - k0) * width + kj)[inside]] = True
        yield RowGroup(None, rows, slice(k0 * width, k1 * width), allowed, None)


def layout_groups(q: torch.Tensor, k: torch.Tensor, layout) -> Iterator[RowGroup]:
    """Tile groups of a compiled pattern layout (attn2d/_compiled_layout.py): for each of its
    kinds, the heads that use it and groups of its query tiles, each tile with the keys of the
    key tiles it visits, so the work is the layout's visited pairs, not every key. Tiles are
    grouped by their number of visits, which bounds the padding."""
    # Decoded on the CPU: the Triton path keeps its layouts on the GPU.
    layout = [t.cpu() for t in layout]
    head_layout, q_begin, _, q_tiles, k_tiles, visit_begin, visit_tile, visit_mask = layout[:8]
    masks = layout[11]
    B = q.shape[0]
    device = q.device
    tile, tile_k = q_tiles.shape[1], k_tiles.shape[1]
    columns = torch.arange(tile_k, dtype=torch.int64)
    counts = visit_begin.diff().long()
    for kind in range(q_begin.numel() - 1):
        heads = torch.nonzero(head_layout == kind).flatten()
        if heads.numel() == 0:
            continue
        first, last = int(q_begin[kind]), int(q_begin[kind + 1])
        for count in torch.unique(counts[first:last]).tolist():
            if count == 0:  # tiles with no visits: no keys, every second derivative is 0
                continue
            same = first + torch.nonzero(counts[first:last] == count).flatten()
            per_group = max(1, GROUP_BYTES // max(
                B * heads.numel() * tile * count * tile_k * 4 * 10, 1))
            for g0 in range(0, same.numel(), per_group):
                tiles = same[g0:g0 + per_group]
                visits = visit_begin[tiles].long()[:, None] + torch.arange(count)  # (T, count)
                keys = k_tiles[visit_tile[visits].long()].long()  # (T, count, tile_k)
                bits = torch.ones(*visits.shape, tile, tile_k, dtype=torch.bool)
                index = visit_mask[visits].long()
                masked = index >= 0
                if bool(masked.any()):
                    words = masks[index[masked]]  # (Vm, tile)
                    bits[masked] = ((words[:, :, None] >> columns) & 1).bool()
                rows = q_tiles[tiles].long()  # (T, tile)
                bits &= (keys >= 0)[:, :, None, :] & (rows >= 0)[:, None, :, None]
                allowed = bits.permute(0, 2, 1, 3).flatten(2)  # (T, tile, count * tile_k)
                yield RowGroup(heads.to(device), rows.to(device), keys.flatten(1).to(device),
                               allowed.to(device), None)


def groups_for(q, k, attn_mask=None, is_causal=False, layout=None, window=None):
    """The row groups of a call: a compiled layout's, a window's ((offsets, height, width)),
    or global attention's with its mask and is_causal."""
    if layout:
        return layout_groups(q, k, layout)
    if window is not None:
        return window_groups(q, k, *window)
    return dense_groups(q, k, attn_mask, is_causal)


def attention_double_backward(groups, q, k, v, grad_out, grad_dq, grad_dk, grad_dv,
                              scale: float):
    """(grad q, grad k, grad v, grad grad_out) of <grad_dq, dQ> + <grad_dk, dK> + <grad_dv, dV>
    (module docstring); any of the three cotangents may be None (zero). Computed in float32
    (float64 for float64 inputs) whatever autocast is on: a penalty's backward runs inside
    the training step's autocast block."""
    if k.shape[2] == 0 or q.shape[2] == 0:  # no pairs: every second derivative is 0
        return (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v),
                torch.zeros_like(grad_out))
    with torch.autocast(q.device.type, enabled=False):
        return _double_backward(groups, q, k, v, grad_out, grad_dq, grad_dk, grad_dv, scale)


def _double_backward(groups, q, k, v, grad_out, grad_dq, grad_dk, grad_dv, scale: float):
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32

    def rows_contiguous(t):  # channels-first views would send every matmul down a slow path
        return None if t is None else t.to(acc).contiguous()

    q_, k_, v_, do_ = (rows_contiguous(t) for t in (q, k, v, grad_out))
    u_, w_, z_ = (rows_contiguous(t) for t in (grad_dq, grad_dk, grad_dv))
    g_q, g_k = torch.zeros_like(q_), torch.zeros_like(k_)
    g_v, g_do = torch.zeros_like(v_), torch.zeros_like(do_)

    def gather(t, heads, index):
        # The -1 past a tile's end reads row 0: its pairs are masked and its results dropped.
        return t[:, heads[:, None, None], index.clamp(min=0)[None]]

    for group in groups:
        h, rows, keys = group.heads, group.rows, group.keys
        if rows.dim() == 2:  # tiles: rows (T, R) and keys (T, K)
            qb, dob = gather(q_, h, rows), gather(do_, h, rows)
            kb, vb = gather(k_, h, keys), gather(v_, h, keys)
            ub = None if u_ is None else gather(u_, h, rows)
            wb = None if w_ is None else gather(w_, h, keys)
            zb = None if z_ is None else gather(z_, h, keys)
        else:
            key_range = slice(None) if keys is None else keys
            qb, dob = _rows(q_, rows), _rows(do_, rows)
            kb, vb = k_[:, :, key_range], v_[:, :, key_range]
            ub = None if u_ is None else _rows(u_, rows)
            wb = None if w_ is None else w_[:, :, key_range]
            zb = None if z_ is None else z_[:, :, key_range]
        gq, gk, gv, gdo = _block_grads(qb, kb, vb, dob, ub, wb, zb, group.allowed,
                                       group.additive, scale, acc)
        if rows.dim() == 2:
            _scatter_tiles(g_q, h, rows, gq)
            _scatter_tiles(g_do, h, rows, gdo)
            _add_tiles(g_k, h, keys, gk)
            _add_tiles(g_v, h, keys, gv)
        else:
            g_q[:, :, rows] = gq
            g_do[:, :, rows] = gdo
            key_range = slice(None) if keys is None else keys
            g_k[:, :, key_range] += gk
            g_v[:, :, key_range] += gv
    return (g_q.to(q.dtype), g_k.to(k.dtype), g_v.to(v.dtype), g_do.to(grad_out.dtype))


def _block_grads(qb, kb, vb, dob, ub, wb, zb, allowed, additive, scale: float, acc):
    """The module docstring's formulas on one block: queries qb, dob, ub (..., R, E or Ev)
    against keys kb, vb, wb, zb (..., K, E or Ev). Returns (grad q, grad k, grad v,
    grad grad_out) of the block; ub, wb, zb may be None (zero)."""
    s = torch.matmul(qb, kb.transpose(-1, -2)) * scale
    if additive is not None:
        s = s + additive.to(acc)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    total = e.sum(-1, keepdim=True)
    p = e / torch.where(total > 0, total, torch.ones_like(total))
    dp = torch.matmul(dob, vb.transpose(-1, -2))
    d = (p * dp).sum(-1, keepdim=True)
    ds = p * (dp - d)
    g = torch.zeros_like(p)
    if ub is not None:
        g = g + torch.matmul(ub, kb.transpose(-1, -2))
    if wb is not None:
        g = g + torch.matmul(qb, wb.transpose(-1, -2))
    g = g * scale
    r = (p * g).sum(-1, keepdim=True)
    hmat = p * (g - r)
    t = (ds * g).sum(-1, keepdim=True) - r * d
    through_p = (dp - d) * g - r * dp
    gdo = torch.matmul(hmat, vb)
    if zb is not None:
        pz = torch.matmul(p, zb)
        t = t + (dob * pz).sum(-1, keepdim=True)
        through_p = through_p + torch.matmul(dob, zb.transpose(-1, -2))
        gdo = gdo + pz
    ds2 = p * (through_p - t)
    gq = torch.matmul(ds2, kb)
    gk = torch.matmul(ds2.transpose(-1, -2), qb)
    if wb is not None:
        gq = gq + torch.matmul(ds, wb)
    if ub is not None:
        gk = gk + torch.matmul(ds.transpose(-1, -2), ub)
    gv = torch.matmul(hmat.transpose(-1, -2), dob)
    return gq * scale, gk * scale, gv, gdo


def _rows(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    first, count = int(rows[0]), rows.numel()
    if int(rows[-1]) == first + count - 1:  # a run of rows: a view, no gather
        return t[:, :, first:first + count]
    return t[:, :, rows]


def _scatter_tiles(target: torch.Tensor, heads, rows: torch.Tensor, value: torch.Tensor):
    """target[:, heads, rows] = value for tiles (each row in at most one tile of a group),
    skipping the -1 past a tile's end."""
    valid = rows.flatten() >= 0
    target[:, heads[:, None], rows.flatten()[valid][None, :]] = value.flatten(2, 3)[:, :, valid]


def _add_tiles(target: torch.Tensor, heads, keys: torch.Tensor, value: torch.Tensor):
    """target[:, heads, keys] += value, summing over the tiles that share a key, skipping -1;
    target is contiguous (B, H, Lk, E)."""
    B, H, Lk, E = target.shape
    flat = keys.flatten()
    valid = flat >= 0
    index = (heads[:, None] * Lk + flat[valid][None, :]).flatten()
    target.view(B, H * Lk, E).index_add_(1, index, value.flatten(2, 3)[:, :, valid].flatten(1, 2))
