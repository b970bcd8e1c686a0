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
attention.) The computation walks groups of query rows with every key, recomputing P for the
group: memory is the inputs, their gradients and a few (rows x Lk) blocks, sized by
GROUP_BYTES, never the Lq x Lk matrix. It is written in torch operations, so it runs on every
device and dtype the first backward does (16-bit in float32) and can itself be differentiated.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple, Optional

import torch

# One group's (rows x Lk) blocks, all heads and images together: about ten live at once.
GROUP_BYTES = 16 << 20


class RowGroup(NamedTuple):
    """Query rows of some heads and which keys they may see: heads (index tensor or slice),
    rows (long index tensor of raster rows), allowed ((R, Lk), (heads, R, Lk) or broadcastable
    bool, or None for all), additive (broadcastable to (B, heads, R, Lk) float, or None)."""

    heads: object
    rows: torch.Tensor
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
        yield RowGroup(slice(None), rows, allowed, additive)


def window_groups(q: torch.Tensor, k: torch.Tensor, offsets: torch.Tensor, height: int,
                  width: int) -> Iterator[RowGroup]:
    """Row groups of a window on one (height, width) grid given by its (2, count) offsets:
    query (i, j) sees key (i + di, j + dj) where that lies on the grid."""
    B, H, Lq, _ = q.shape
    Lk = k.shape[2]
    step = _group_rows(Lq, B * H, Lk)
    di, dj = (offsets[0].long().to(q.device), offsets[1].long().to(q.device))
    for r0 in range(0, Lq, step):
        rows = torch.arange(r0, min(r0 + step, Lq), device=q.device)
        ki = (rows // width)[:, None] + di[None, :]
        kj = (rows % width)[:, None] + dj[None, :]
        inside = (ki >= 0) & (ki < height) & (kj >= 0) & (kj < width)
        allowed = torch.zeros(rows.numel(), Lk, dtype=torch.bool, device=q.device)
        local = torch.arange(rows.numel(), device=q.device)[:, None].expand_as(ki)
        allowed[local[inside], (ki * width + kj)[inside]] = True
        yield RowGroup(slice(None), rows, allowed, None)


def layout_groups(q: torch.Tensor, k: torch.Tensor, layout) -> Iterator[RowGroup]:
    """Row groups of a compiled pattern layout (attn2d/_compiled_layout.py): for each of its
    kinds, the heads that use it and groups of its query tiles, with the pairs its visits
    allow."""
    head_layout, q_begin, _, q_tiles, k_tiles, visit_begin, visit_tile, visit_mask = layout[:8]
    masks = layout[11]
    B, H, _, _ = q.shape
    Lk = k.shape[2]
    device = q.device
    tile = q_tiles.shape[1]
    columns = torch.arange(k_tiles.shape[1], device=device, dtype=torch.int64)
    for kind in range(q_begin.numel() - 1):
        heads = torch.nonzero(head_layout.to(device) == kind).flatten()
        if heads.numel() == 0:
            continue
        first, last = int(q_begin[kind]), int(q_begin[kind + 1])
        per_group = max(1, _group_rows(tile * (last - first), B * heads.numel(), Lk) // tile)
        for t0 in range(first, last, per_group):
            t1 = min(t0 + per_group, last)
            tiles = q_tiles[t0:t1].to(device).long()  # (T, tile), -1 past the end
            valid = tiles.flatten() >= 0
            rows = tiles.flatten()[valid]
            v0, v1 = int(visit_begin[t0]), int(visit_begin[t1])
            owner = torch.repeat_interleave(
                torch.arange(t1 - t0, device=device), visit_begin[t0:t1 + 1].diff().to(device))
            keys = k_tiles[visit_tile[v0:v1].long()].to(device).long()  # (V, tile_k)
            index = visit_mask[v0:v1].to(device)
            bits = torch.ones(v1 - v0, tile, columns.numel(), dtype=torch.bool, device=device)
            masked = index >= 0
            if bool(masked.any()):
                words = masks.to(device)[index[masked]]  # (Vm, tile)
                bits[masked] = ((words[:, :, None] >> columns) & 1).bool()
            bits &= (keys >= 0)[:, None, :] & (tiles[owner] >= 0)[:, :, None]
            allowed = torch.zeros((t1 - t0) * tile, Lk, dtype=torch.bool, device=device)
            local = (owner[:, None] * tile + torch.arange(tile, device=device)[None, :])
            v_idx, r_idx, c_idx = torch.nonzero(bits, as_tuple=True)
            allowed[local[v_idx, r_idx], keys[v_idx, c_idx]] = True
            yield RowGroup(heads, rows, allowed[valid], None)


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
    for group in groups:
        h, rows = group.heads, group.rows
        kh, vh = k_[:, h], v_[:, h]
        qb, dob = _rows(q_, h, rows), _rows(do_, h, rows)
        s = torch.matmul(qb, kh.transpose(-1, -2)) * scale
        if group.additive is not None:
            add = group.additive
            if add.dim() == 4 and isinstance(h, torch.Tensor) and add.shape[1] != 1:
                add = add[:, h]
            s = s + add.to(acc)
        allowed = group.allowed
        if allowed is not None:
            if allowed.dim() == 4 and isinstance(h, torch.Tensor) and allowed.shape[1] != 1:
                allowed = allowed[:, h]
            s = s.masked_fill(~allowed, float("-inf"))
        m = s.amax(-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        e = torch.exp(s - m)
        total = e.sum(-1, keepdim=True)
        p = e / torch.where(total > 0, total, torch.ones_like(total))
        dp = torch.matmul(dob, vh.transpose(-1, -2))
        d = (p * dp).sum(-1, keepdim=True)
        ds = p * (dp - d)
        g = torch.zeros_like(p)
        if u_ is not None:
            ub = _rows(u_, h, rows)
            g = g + torch.matmul(ub, kh.transpose(-1, -2))
        if w_ is not None:
            wh = w_[:, h]
            g = g + torch.matmul(qb, wh.transpose(-1, -2))
        g = g * scale
        r = (p * g).sum(-1, keepdim=True)
        hmat = p * (g - r)
        t = (ds * g).sum(-1, keepdim=True) - r * d
        through_p = (dp - d) * g - r * dp
        gdo = torch.matmul(hmat, vh)
        if z_ is not None:
            zh = z_[:, h]
            pz = torch.matmul(p, zh)
            t = t + (dob * pz).sum(-1, keepdim=True)
            through_p = through_p + torch.matmul(dob, zh.transpose(-1, -2))
            gdo = gdo + pz
        ds2 = p * (through_p - t)
        gq = torch.matmul(ds2, kh)
        gk = torch.matmul(ds2.transpose(-1, -2), qb)
        if w_ is not None:
            gq = gq + torch.matmul(ds, wh)
        if u_ is not None:
            gk = gk + torch.matmul(ds.transpose(-1, -2), ub)
        gv = torch.matmul(hmat.transpose(-1, -2), dob)
        _scatter_rows(g_q, h, rows, gq * scale)
        _scatter_rows(g_do, h, rows, gdo)
        _add_heads(g_k, h, gk * scale)
        _add_heads(g_v, h, gv)
    return (g_q.to(q.dtype), g_k.to(k.dtype), g_v.to(v.dtype), g_do.to(grad_out.dtype))


def _rows(t: torch.Tensor, heads, rows: torch.Tensor) -> torch.Tensor:
    if isinstance(heads, slice):
        first, count = int(rows[0]), rows.numel()
        if int(rows[-1]) == first + count - 1:  # a run of rows: a view, no gather
            return t[:, :, first:first + count]
        return t[:, :, rows]
    return t[:, heads][:, :, rows]


def _scatter_rows(target: torch.Tensor, heads, rows: torch.Tensor, value: torch.Tensor):
    if isinstance(heads, slice):
        target[:, :, rows] = value
    else:
        target[:, heads[:, None], rows[None, :]] = value


def _add_heads(target: torch.Tensor, heads, value: torch.Tensor):
    if isinstance(heads, slice):
        target += value
    else:
        target[:, heads] += value
