"""attn2d's Triton kernels as torch.library operators (torch.compile traces them as user
Triton kernels) with their autograd: the forward returns the output and lse2, the base-2
log-sum-exp of each query row's scores, which the backward reads; the backward computes
D = rowsum(dO * O), then dK/dV per key tile and dQ per query tile."""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import torch
import triton
from torch.library import triton_op, wrap_triton

from . import kernels

# The block-sparse kernels read a layout compiled for 64-query by 64-key tiles (one 64-bit
# mask word per query row); the dense kernels use the same tiles but narrower key tiles for
# heads over 128 wide, whose four (64, width) operands would not fit in registers.
LAYOUT_BLOCK = 64


def _dense_block_n(width: int) -> int:
    return 32 if width > 128 else 64


def _padded(width: int) -> int:
    """A head width padded for tl.dot, which needs at least 16 on every side."""
    return max(16, triton.next_power_of_2(max(width, 1)))


def _mask_args(attn_mask: Optional[torch.Tensor], q: torch.Tensor, Lk: int):
    """(tensor, kind, four strides): kind 0 none, 1 bool, 2 additive; strides broadcast to
    (B, H, Lq, Lk) with 0 where the mask has size 1 or lacks the dim."""
    if attn_mask is None:
        return q, 0, (0, 0, 0, 0)
    B, H, Lq = q.shape[:3]
    full = attn_mask.expand(B, H, Lq, Lk)
    return attn_mask, (1 if attn_mask.dtype == torch.bool else 2), tuple(full.stride())


class DeviceLayout(NamedTuple):
    """A compiled layout's tensors on a device, and the programs its kernels need along the
    tile axis: [the most query tiles, the most key tiles] of any head's kind (read on the CPU
    once, so that no launch reads a device tensor, which torch.compile could not trace)."""

    tensors: list
    programs: list


@functools.lru_cache(maxsize=64)
def device_layout(pattern, q_hw: tuple, kv_hw: tuple, heads: int,
                  device: torch.device) -> DeviceLayout:
    """A pattern's compiled layout (attn2d._compiled_layout.build) on `device`, built and copied once
    per (pattern, grids, heads, device)."""
    from .. import _compiled_layout

    layout = _compiled_layout.build(pattern, q_hw, kv_hw, heads)
    programs = [int(layout[1].diff().max()), int(layout[2].diff().max())]
    return DeviceLayout([t.to(device) for t in layout], programs)


def _layout_args(layout, q):
    """The nine layout pointers the kernels take; for dense work any tensor stands in."""
    if not layout:
        return (q,) * 9
    return tuple(layout[:9])


def _tile_programs(programs: list, axis: int, dense_rows: int, block: int) -> int:
    """Programs along the tile axis: the layout's count (DeviceLayout.programs[axis]), or the
    dense tile count."""
    return programs[axis] if programs else triton.cdiv(dense_rows, block)


@triton_op("attn2d::triton_attention_forward", mutates_args=())
def triton_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             attn_mask: Optional[torch.Tensor], is_causal: bool, scale: float,
                             layout: list[torch.Tensor], programs: list[int],
                             keep_out_accum: bool
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """out, lse and out_accum: the output in float32 before its rounding where keep_out_accum
    asks for it and q is 16-bit (the backward computes D from it), else an empty tensor.
    keep_out_accum has no default: the dispatcher drops arguments equal to their defaults, and
    the backward's gradients must match the arguments passed."""
    B, H, Lq, E = q.shape
    Lk, Ev = k.shape[2], v.shape[3]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = q.new_empty((B, H, Lq, Ev))
    lse = q.new_empty((B, H, Lq), dtype=acc)
    store_accum = keep_out_accum and q.dtype in (torch.bfloat16, torch.float16)
    out_accum = q.new_empty((B, H, Lq, Ev) if store_accum else (0,), dtype=acc)
    if B * H * Lq == 0:
        return out, lse, out_accum
    mask, mask_kind, ms = _mask_args(attn_mask, q, Lk)
    head_layout, q_begin, _, q_tiles, k_tiles, visit_begin, visit_tile, visit_mask = (
        _layout_args(layout, q)[:8])
    masks = layout[11] if layout else q
    block_n = LAYOUT_BLOCK if layout else _dense_block_n(max(E, Ev))
    grid = (B * H, _tile_programs(programs, 0, Lq, LAYOUT_BLOCK))
    wrap_triton(kernels.attention_forward_kernel)[grid](
        q, k, v, out, lse, mask, out_accum if store_accum else out,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), *ms,
        *(out_accum.stride() if store_accum else out.stride()),
        H, Lq, Lk, E, Ev, scale * kernels.LOG2E,
        head_layout, q_begin, q_tiles, k_tiles, visit_begin, visit_tile, visit_mask, masks,
        BLOCK_M=LAYOUT_BLOCK, BLOCK_N=block_n, BLOCK_E=_padded(E), BLOCK_EV=_padded(Ev),
        HAS_LAYOUT=bool(layout), MASK_KIND=mask_kind, IS_CAUSAL=is_causal,
        STORE_ACCUM=store_accum)
    return out, lse, out_accum


@triton_op("attn2d::triton_attention_backward", mutates_args=())
def triton_attention_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                              v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                              attn_mask: Optional[torch.Tensor], is_causal: bool, scale: float,
                              layout: list[torch.Tensor], programs: list[int]
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, H, Lq, E = q.shape
    Lk, Ev = k.shape[2], v.shape[3]
    if B * H * Lq == 0 or Lk == 0:  # no pairs: every gradient is 0
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    # Every gradient row is written by the program of the one tile that holds it (a layout's
    # tiles of each kind cover every query and key position).
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    delta = torch.empty_like(lse)
    wrap_triton(kernels.row_dot_kernel)[(B * H, triton.cdiv(Lq, LAYOUT_BLOCK))](
        out, grad_out, delta, *out.stride(), *grad_out.stride(), H, Lq, Ev,
        BLOCK_M=LAYOUT_BLOCK, BLOCK_EV=_padded(Ev))
    mask, mask_kind, ms = _mask_args(attn_mask, q, Lk)
    (head_layout, q_begin, k_begin, q_tiles, k_tiles, visit_begin, visit_tile, visit_mask,
     back_begin) = _layout_args(layout, q)
    back_tile, back_mask, masks = (layout[9], layout[10], layout[11]) if layout else (q, q, q)
    block_n = LAYOUT_BLOCK if layout else _dense_block_n(max(E, Ev))
    common = dict(BLOCK_M=LAYOUT_BLOCK, BLOCK_N=block_n, BLOCK_E=_padded(E),
                  BLOCK_EV=_padded(Ev), HAS_LAYOUT=bool(layout), MASK_KIND=mask_kind,
                  IS_CAUSAL=is_causal)
    wrap_triton(kernels.attention_backward_kv_kernel)[
        (B * H, _tile_programs(programs, 1, Lk, block_n))](
        q, k, v, grad_out, lse, delta, dk, dv, mask,
        *q.stride(), *k.stride(), *v.stride(), *grad_out.stride(), *dk.stride(), *dv.stride(),
        *ms, H, Lq, Lk, E, Ev, scale * kernels.LOG2E, scale,
        head_layout, q_tiles, k_begin, k_tiles, back_begin, back_tile, back_mask, masks,
        **common)
    wrap_triton(kernels.attention_backward_q_kernel)[
        (B * H, _tile_programs(programs, 0, Lq, LAYOUT_BLOCK))](
        q, k, v, grad_out, lse, delta, dq, mask,
        *q.stride(), *k.stride(), *v.stride(), *grad_out.stride(), *dq.stride(),
        *ms, H, Lq, Lk, E, Ev, scale * kernels.LOG2E, scale,
        head_layout, q_begin, q_tiles, k_tiles, visit_begin, visit_tile, visit_mask, masks,
        **common)
    return dq, dk, dv


def _setup_context(ctx, inputs, output):
    q, k, v, attn_mask, is_causal, scale, layout, programs = inputs[:8]
    out, lse, out_accum = output
    # The backward's D reads the float32 output where the forward kept it.
    o = out_accum if out_accum.dim() == 4 else out
    ctx.save_for_backward(q, k, v, o, lse, attn_mask, *layout)
    ctx.is_causal, ctx.scale, ctx.programs = is_causal, scale, programs


def _backward(ctx, grad_out, grad_lse, grad_out_accum):
    q, k, v, out, lse, attn_mask, *layout = ctx.saved_tensors
    dq, dk, dv = torch.ops.attn2d.triton_attention_backward(
        grad_out, q, k, v, out, lse, attn_mask, ctx.is_causal, ctx.scale, layout, ctx.programs)
    return dq, dk, dv, None, None, None, [None] * len(layout), _no_grad(ctx.programs), None


def _no_grad(ints: list):
    """The gradient of a list of ints: torch.library reads an empty list as a list of tensors
    (a list back) and any other as a leaf (None back)."""
    return [] if not ints else None


def _save_backward_inputs(ctx, inputs, output):
    grad_out, q, k, v = inputs[:4]
    ctx.save_for_backward(grad_out, q, k, v)
    ctx.attn_mask, ctx.is_causal, ctx.scale, ctx.layout, ctx.programs = inputs[6:11]


def _backward_backward(ctx, grad_dq, grad_dk, grad_dv):
    """The double backward (attn2d/double_backward.py), in torch operations on the device."""
    from .. import double_backward as db

    grad_out, q, k, v = ctx.saved_tensors
    g_q, g_k, g_v, g_do = db.attention_double_backward(
        db.groups_for(q, k, ctx.attn_mask, ctx.is_causal, ctx.layout), q, k, v, grad_out,
        grad_dq, grad_dk, grad_dv, ctx.scale)
    return (g_do, g_q, g_k, g_v, None, None, None, None, None, [None] * len(ctx.layout),
            _no_grad(ctx.programs))


triton_attention_forward.register_autograd(_backward, setup_context=_setup_context)
triton_attention_backward.register_autograd(_backward_backward,
                                             setup_context=_save_backward_inputs)
