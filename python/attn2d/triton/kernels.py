"""Triton kernels of exact softmax attention in the FlashAttention-2 style: the forward keeps a
running max and sum per query row and saves the log-sum-exp; the backward recomputes P from it
in two kernels, one owning a key tile (dK, dV) and one a query tile (dQ), so every gradient row
is written by one program and the result is deterministic (no atomics).

One set of kernels serves both shapes of work:
- dense (HAS_LAYOUT=False): tiles are runs of BLOCK_M queries and BLOCK_N keys; a bool or
  additive mask read through its strides (0 where it broadcasts) and is_causal restrict pairs;
- block-sparse (HAS_LAYOUT=True): tiles are the rows of a compiled pattern layout
  (attn2d/_compiled_layout.py, the one the CPU kernels walk): each tile lists its raster rows, each
  query tile its visited key tiles and each key tile its visiting query tiles, and a visit
  either allows every pair or carries one 64-bit mask word per query row.

Programs run on a grid of (batch x heads, tiles): CUDA allows 2^31 - 1 programs along the
first axis and 65,535 along the second. Scores are kept in base 2 (qk_scale folds in log2(e)), and so is the saved log-sum-exp (lse2,
the log2 of the sum of exp2 of the base-2 scores: no conversion rounds it between the forward
and the backward); it is -inf for a row with no allowed key, whose output and gradients are 0. Head widths are padded to
BLOCK_E/BLOCK_EV inside the kernel by masked loads."""

from __future__ import annotations

import os

import triton
import triton.language as tl

LOG2E = 1.4426950408889634
# Triton's interpreter multiplies bfloat16 operands of tl.dot as their raw 16-bit integers; the
# float32 products of widened bf16 values are the same exact products the GPU's bf16 MMA forms.
_WIDEN_BF16_DOTS = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def _dot(a, b):
    """a @ b with float32 (or float64) accumulation; float32 operands multiplied exactly
    ("ieee"), not in TF32."""
    if _WIDEN_BF16_DOTS and a.dtype == tl.bfloat16:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        c = tl.dot(a, b, input_precision="ieee")
    return c


@triton.jit
def _load_rows(ptr, rows, valid, cols, width, row_stride, col_stride):
    """A (rows, BLOCK) tile gathered by raster row index; padding rows and columns read 0."""
    offs = rows.to(tl.int64)[:, None] * row_stride + cols.to(tl.int64)[None, :] * col_stride
    return tl.load(ptr + offs, mask=valid[:, None] & (cols[None, :] < width), other=0.0)


@triton.jit
def _store_rows(ptr, value, rows, valid, cols, width, row_stride, col_stride):
    offs = rows.to(tl.int64)[:, None] * row_stride + cols.to(tl.int64)[None, :] * col_stride
    tl.store(ptr + offs, value.to(ptr.dtype.element_ty),
             mask=valid[:, None] & (cols[None, :] < width))


@triton.jit
def _scores(q, k, q_rows, q_valid, k_rows, k_valid, qk_scale,
            mask_ptr, msq, msk, visit_mask,
            MASK_KIND: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_VISIT_MASK: tl.constexpr):
    """Base-2 scores of a (BLOCK_M, BLOCK_N) tile, -inf where a pair is not allowed.
    MASK_KIND: 0 none, 1 bool (nonzero = may attend), 2 additive. mask_ptr is already offset to
    this (batch, head); visit_mask is a layout visit's (BLOCK_M, BLOCK_N) bits."""
    s = _dot(q, tl.trans(k)) * qk_scale
    allowed = q_valid[:, None] & k_valid[None, :]
    if IS_CAUSAL:
        allowed = allowed & (k_rows[None, :] <= q_rows[:, None])
    if HAS_VISIT_MASK:
        allowed = allowed & visit_mask
    if MASK_KIND != 0:
        offs = q_rows.to(tl.int64)[:, None] * msq + k_rows.to(tl.int64)[None, :] * msk
        m = tl.load(mask_ptr + offs, mask=allowed, other=0)
        if MASK_KIND == 1:
            allowed = allowed & (m != 0)
        else:
            s = s + m.to(s.dtype) * 1.4426950408889634
    return tl.where(allowed, s, float("-inf"))


@triton.jit
def _visit_bits(masks_ptr, mask_index, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A layout visit's mask: bit c of query row r's 64-bit word allows key column c; a visit
    without mask words (index -1) allows every pair and reads nothing."""
    offs = tl.arange(0, BLOCK_M)
    words = tl.load(masks_ptr + tl.maximum(mask_index, 0) * BLOCK_M + offs,
                    mask=(mask_index >= 0) & (offs >= 0), other=-1)
    cols = tl.arange(0, BLOCK_N).to(tl.int64)
    return ((words[:, None] >> cols[None, :]) & 1) != 0


@triton.jit
def _owned_tile(pid, h, length, head_layout, tile_begin, tiles, HAS_LAYOUT: tl.constexpr,
                BLOCK: tl.constexpr):
    """The tile program `pid` owns (query tiles with q_begin/q_tiles, key tiles with
    k_begin/k_tiles): (tile index, raster rows, valid rows, live). A layout's tiles are those of
    this head's kind; dense tiles are runs of BLOCK rows."""
    offs = tl.arange(0, BLOCK)
    if HAS_LAYOUT:
        kind = tl.load(head_layout + h)
        tile = tl.load(tile_begin + kind) + pid
        live = tile < tl.load(tile_begin + kind + 1)
        rows = tl.load(tiles + tile * BLOCK + offs, mask=live & (offs >= 0), other=-1)
        valid = rows >= 0
        rows = tl.where(valid, rows, 0)
    else:
        tile = pid
        rows = pid * BLOCK + offs
        valid = rows < length
        live = pid * BLOCK < length
    return tile, rows, valid, live


@triton.jit
def _visits(tile, pid, other_length, visit_begin, HAS_LAYOUT: tl.constexpr,
            IS_CAUSAL: tl.constexpr, OWN_BLOCK: tl.constexpr, OTHER_BLOCK: tl.constexpr,
            OWNS_QUERIES: tl.constexpr):
    """[start, stop) of the tiles a tile program visits: its layout visits, or every dense tile
    of the other side, without those causal masking empties."""
    if HAS_LAYOUT:
        start = tl.load(visit_begin + tile)
        stop = tl.load(visit_begin + tile + 1)
    else:
        start = 0
        stop = tl.cdiv(other_length, OTHER_BLOCK)
        if IS_CAUSAL:
            if OWNS_QUERIES:  # keys after this tile's last query are masked
                stop = tl.minimum(stop, tl.cdiv((pid + 1) * OWN_BLOCK, OTHER_BLOCK))
            else:  # queries before this tile's first key see none of it
                start = (pid * OWN_BLOCK) // OTHER_BLOCK
    return start, stop


@triton.jit
def _visited_tile(visit, length, tiles, visit_tile, visit_mask, masks, HAS_LAYOUT: tl.constexpr,
                  BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The tile of the other side at `visit`: (raster rows, valid rows, the visit's
    (BLOCK_M, BLOCK_N) mask bits, all set where the visit allows every pair)."""
    offs = tl.arange(0, BLOCK)
    if HAS_LAYOUT:
        other = tl.load(visit_tile + visit)
        rows = tl.load(tiles + other * BLOCK + offs)
        valid = rows >= 0
        rows = tl.where(valid, rows, 0)
        bits = _visit_bits(masks, tl.load(visit_mask + visit), BLOCK_M, BLOCK_N)
    else:
        rows = visit * BLOCK + offs
        valid = rows < length
        bits = tl.full((BLOCK_M, BLOCK_N), 1, tl.int1)
    return rows, valid, bits


@triton.jit
def _head(ptr, b, h, stride_b, stride_h):
    return ptr + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h


@triton.jit
def attention_forward_kernel(
    Q, K, V, O, LSE, MASK, OA,
    sqb, sqh, sql, sqe, skb, skh, skl, ske, svb, svh, svl, sve, sob, soh, sol, soe,
    smb, smh, smq, smk, sab, sah, sal, sae,
    H, Lq, Lk, E, Ev, qk_scale,
    head_layout, q_begin, q_tiles, k_tiles, visit_begin, visit_tile, visit_mask, masks,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_EV: tl.constexpr, HAS_LAYOUT: tl.constexpr, MASK_KIND: tl.constexpr,
    IS_CAUSAL: tl.constexpr, STORE_ACCUM: tl.constexpr,
):
    """O (and LSE) of one query tile; with STORE_ACCUM, also OA: O in the accumulation dtype
    before its rounding to O's, from which the backward's D keeps dQ to one rounding."""
    bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    b = bh // H
    h = bh % H
    tile, rows, valid, live = _owned_tile(pid_m, h, Lq, head_layout, q_begin, q_tiles,
                                          HAS_LAYOUT, BLOCK_M)
    if live:
        e = tl.arange(0, BLOCK_E)
        ev = tl.arange(0, BLOCK_EV)
        Kb, Vb = _head(K, b, h, skb, skh), _head(V, b, h, svb, svh)
        Mb = _head(MASK, b, h, smb, smh)
        q = _load_rows(_head(Q, b, h, sqb, sqh), rows, valid, e, E, sql, sqe)
        acc_dtype = tl.float64 if Q.dtype.element_ty == tl.float64 else tl.float32
        m_i = tl.full((BLOCK_M,), float("-inf"), acc_dtype)
        l_i = tl.zeros((BLOCK_M,), acc_dtype)
        acc = tl.zeros((BLOCK_M, BLOCK_EV), acc_dtype)
        start, stop = _visits(tile, pid_m, Lk, visit_begin, HAS_LAYOUT, IS_CAUSAL, BLOCK_M,
                              BLOCK_N, True)
        for visit in range(start, stop):
            k_rows, k_valid, bits = _visited_tile(visit, Lk, k_tiles, visit_tile, visit_mask,
                                                  masks, HAS_LAYOUT, BLOCK_N, BLOCK_M, BLOCK_N)
            k = _load_rows(Kb, k_rows, k_valid, e, E, skl, ske)
            v = _load_rows(Vb, k_rows, k_valid, ev, Ev, svl, sve)
            s = _scores(q, k, rows, valid, k_rows, k_valid, qk_scale, Mb, smq, smk, bits,
                        MASK_KIND, IS_CAUSAL, HAS_LAYOUT)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s - m_safe[:, None])
            alpha = tl.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v)
            m_i = m_new
        empty = l_i == 0.0
        out = acc / tl.where(empty, 1.0, l_i)[:, None]
        _store_rows(_head(O, b, h, sob, soh), out, rows, valid, ev, Ev, sol, soe)
        if STORE_ACCUM:
            _store_rows(_head(OA, b, h, sab, sah), out, rows, valid, ev, Ev, sal, sae)
        lse2 = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
        tl.store(LSE + bh.to(tl.int64) * Lq + rows, lse2, mask=valid)


@triton.jit
def row_dot_kernel(O, DO, D, sob, soh, sol, soe, sdb, sdh, sdl, sde, H, Lq, Ev,
                   BLOCK_M: tl.constexpr, BLOCK_EV: tl.constexpr):
    """D = rowsum(dO * O) per query row, in the accumulation dtype: the backward's
    softmax-gradient term."""
    bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    b = bh // H
    h = bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    valid = rows < Lq
    ev = tl.arange(0, BLOCK_EV)
    o = _load_rows(_head(O, b, h, sob, soh), rows, valid, ev, Ev, sol, soe)
    do = _load_rows(_head(DO, b, h, sdb, sdh), rows, valid, ev, Ev, sdl, sde)
    acc_dtype = tl.float64 if O.dtype.element_ty == tl.float64 else tl.float32
    d = tl.sum(o.to(acc_dtype) * do.to(acc_dtype), 1)
    tl.store(D + bh.to(tl.int64) * Lq + rows, d, mask=valid)


@triton.jit
def _probabilities(s, lse2):
    """P recomputed from base-2 scores and lse2; 0 on rows with no allowed key."""
    live = lse2 != float("-inf")
    return tl.where(live[:, None], tl.exp2(s - tl.where(live, lse2, 0.0)[:, None]), 0.0)


@triton.jit
def _row_stats(LSE, D, bh, Lq, rows, valid):
    """lse2 and D of a query tile's rows (-inf and 0 past the end)."""
    offs = bh.to(tl.int64) * Lq + rows
    return (tl.load(LSE + offs, mask=valid, other=float("-inf")),
            tl.load(D + offs, mask=valid, other=0.0))


@triton.jit
def _score_gradients(q, k, v, do, lse2, delta, rows, valid, k_rows, k_valid, qk_scale,
                     mask_ptr, msq, msk, bits, MASK_KIND: tl.constexpr, IS_CAUSAL: tl.constexpr,
                     HAS_VISIT_MASK: tl.constexpr):
    """P and dS = P * (dP - D) of a (query tile, key tile) pair, recomputed from lse2."""
    acc_dtype = tl.float64 if q.dtype == tl.float64 else tl.float32
    s = _scores(q, k, rows, valid, k_rows, k_valid, qk_scale, mask_ptr, msq, msk, bits,
                MASK_KIND, IS_CAUSAL, HAS_VISIT_MASK)
    p = _probabilities(s, lse2).to(acc_dtype)
    ds = p * (_dot(do, tl.trans(v)) - delta[:, None])
    return p, ds


@triton.jit
def attention_backward_kv_kernel(
    Q, K, V, DO, LSE, D, DK, DV, MASK,
    sqb, sqh, sql, sqe, skb, skh, skl, ske, svb, svh, svl, sve, sdb, sdh, sdl, sde,
    sdkb, sdkh, sdkl, sdke, sdvb, sdvh, sdvl, sdve, smb, smh, smq, smk,
    H, Lq, Lk, E, Ev, qk_scale, scale,
    head_layout, q_tiles, k_begin, k_tiles, visit_begin, visit_tile, visit_mask, masks,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_EV: tl.constexpr, HAS_LAYOUT: tl.constexpr, MASK_KIND: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
):
    """dK and dV of one key tile, summed over the query tiles that visit it."""
    bh = tl.program_id(0)
    pid_n = tl.program_id(1)
    b = bh // H
    h = bh % H
    tile, k_rows, k_valid, live = _owned_tile(pid_n, h, Lk, head_layout, k_begin, k_tiles,
                                              HAS_LAYOUT, BLOCK_N)
    if live:
        e = tl.arange(0, BLOCK_E)
        ev = tl.arange(0, BLOCK_EV)
        Qb, DOb = _head(Q, b, h, sqb, sqh), _head(DO, b, h, sdb, sdh)
        Mb = _head(MASK, b, h, smb, smh)
        k = _load_rows(_head(K, b, h, skb, skh), k_rows, k_valid, e, E, skl, ske)
        v = _load_rows(_head(V, b, h, svb, svh), k_rows, k_valid, ev, Ev, svl, sve)
        acc_dtype = tl.float64 if Q.dtype.element_ty == tl.float64 else tl.float32
        dk = tl.zeros((BLOCK_N, BLOCK_E), acc_dtype)
        dv = tl.zeros((BLOCK_N, BLOCK_EV), acc_dtype)
        start, stop = _visits(tile, pid_n, Lq, visit_begin, HAS_LAYOUT, IS_CAUSAL, BLOCK_N,
                              BLOCK_M, False)
        for visit in range(start, stop):
            rows, valid, bits = _visited_tile(visit, Lq, q_tiles, visit_tile, visit_mask, masks,
                                              HAS_LAYOUT, BLOCK_M, BLOCK_M, BLOCK_N)
            q = _load_rows(Qb, rows, valid, e, E, sql, sqe)
            do = _load_rows(DOb, rows, valid, ev, Ev, sdl, sde)
            lse2, delta = _row_stats(LSE, D, bh, Lq, rows, valid)
            p, ds = _score_gradients(q, k, v, do, lse2, delta, rows, valid, k_rows, k_valid,
                                     qk_scale, Mb, smq, smk, bits, MASK_KIND, IS_CAUSAL,
                                     HAS_LAYOUT)
            dv += _dot(tl.trans(p.to(do.dtype)), do)
            dk += _dot(tl.trans(ds.to(q.dtype)), q)
        _store_rows(_head(DK, b, h, sdkb, sdkh), dk * scale, k_rows, k_valid, e, E, sdkl, sdke)
        _store_rows(_head(DV, b, h, sdvb, sdvh), dv, k_rows, k_valid, ev, Ev, sdvl, sdve)


@triton.jit
def attention_backward_q_kernel(
    Q, K, V, DO, LSE, D, DQ, MASK,
    sqb, sqh, sql, sqe, skb, skh, skl, ske, svb, svh, svl, sve, sdb, sdh, sdl, sde,
    sdqb, sdqh, sdql, sdqe, smb, smh, smq, smk,
    H, Lq, Lk, E, Ev, qk_scale, scale,
    head_layout, q_begin, q_tiles, k_tiles, visit_begin, visit_tile, visit_mask, masks,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_EV: tl.constexpr, HAS_LAYOUT: tl.constexpr, MASK_KIND: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
):
    """dQ of one query tile, summed over the key tiles it visits."""
    bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    b = bh // H
    h = bh % H
    tile, rows, valid, live = _owned_tile(pid_m, h, Lq, head_layout, q_begin, q_tiles,
                                          HAS_LAYOUT, BLOCK_M)
    if live:
        e = tl.arange(0, BLOCK_E)
        ev = tl.arange(0, BLOCK_EV)
        Kb, Vb = _head(K, b, h, skb, skh), _head(V, b, h, svb, svh)
        Mb = _head(MASK, b, h, smb, smh)
        q = _load_rows(_head(Q, b, h, sqb, sqh), rows, valid, e, E, sql, sqe)
        do = _load_rows(_head(DO, b, h, sdb, sdh), rows, valid, ev, Ev, sdl, sde)
        lse2, delta = _row_stats(LSE, D, bh, Lq, rows, valid)
        acc_dtype = tl.float64 if Q.dtype.element_ty == tl.float64 else tl.float32
        dq = tl.zeros((BLOCK_M, BLOCK_E), acc_dtype)
        start, stop = _visits(tile, pid_m, Lk, visit_begin, HAS_LAYOUT, IS_CAUSAL, BLOCK_M,
                              BLOCK_N, True)
        for visit in range(start, stop):
            k_rows, k_valid, bits = _visited_tile(visit, Lk, k_tiles, visit_tile, visit_mask,
                                                  masks, HAS_LAYOUT, BLOCK_N, BLOCK_M, BLOCK_N)
            k = _load_rows(Kb, k_rows, k_valid, e, E, skl, ske)
            v = _load_rows(Vb, k_rows, k_valid, ev, Ev, svl, sve)
            _, ds = _score_gradients(q, k, v, do, lse2, delta, rows, valid, k_rows, k_valid,
                                     qk_scale, Mb, smq, smk, bits, MASK_KIND, IS_CAUSAL,
                                     HAS_LAYOUT)
            dq += _dot(ds.to(k.dtype), k)
        _store_rows(_head(DQ, b, h, sdqb, sdqh), dq * scale, rows, valid, e, E, sdql, sdqe)
