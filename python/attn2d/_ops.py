"""Loads the compiled binding and registers what torch.library needs around its ops: fake
(meta) kernels for torch.compile / FakeTensor, and the backward operators' autograd (the double
backward, attn2d/double_backward.py). The forward operators' autograd is C++
(binding/torch_autograd.cc)."""

from __future__ import annotations

import glob
import os

import torch

from . import _checks


def _load_binding() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "_C*.so")))
    if not found:
        raise ImportError(
            "attn2d: the compiled binding (attn2d/_C*.so) is missing; build it with "
            "`pip install -e . --no-build-isolation` (see README.md)"
        )
    torch.ops.load_library(found[0])


_load_binding()


def _forward_outputs(q, v, keep_out_accum):
    """out (B, H, Lq, Ev) in q's dtype, lse (B, H, Lq) in the accumulation dtype, and out_accum:
    the float32 output before rounding, (B, H, Lq, Ev) where kept (a 16-bit q), else (0,)."""
    B, H, Lq, _ = q.shape
    lse_dtype = _checks.accumulation_dtype(q.dtype)
    kept = keep_out_accum and q.dtype in (torch.bfloat16, torch.float16)
    accum_shape = (B, H, Lq, v.shape[-1]) if kept else (0,)
    return (q.new_empty((B, H, Lq, v.shape[-1])), q.new_empty((B, H, Lq), dtype=lse_dtype),
            q.new_empty(accum_shape, dtype=lse_dtype))


@torch.library.register_fake("attn2d::attention_forward")
def _attention_forward_fake(q, k, v, attn_mask, is_causal, scale, keep_out_accum=False):
    _checks.check_attention("attn2d.attention_forward", q, k, v, attn_mask, check_device=False)
    return _forward_outputs(q, v, keep_out_accum)


@torch.library.register_fake("attn2d::attention_backward")
def _attention_backward_fake(grad_out, q, k, v, out, lse, attn_mask, is_causal, scale):
    _checks.check_attention("attn2d.attention_backward", q, k, v, attn_mask, check_device=False)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@torch.library.register_fake("attn2d::attention2d_forward")
def _attention2d_forward_fake(q, k, v, layout, block_q, scale, keep_out_accum=False):
    _checks.check_attention("attn2d.attention2d_forward", q, k, v, None, check_device=False)
    return _forward_outputs(q, v, keep_out_accum)


@torch.library.register_fake("attn2d::attention2d_backward")
def _attention2d_backward_fake(grad_out, q, k, v, out, lse, layout, block_q, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@torch.library.register_fake("attn2d::attention2d_window_forward")
def _attention2d_window_forward_fake(q, k, v, offsets, height, width, scale,
                                     keep_out_accum=False):
    _checks.check_attention("attn2d.attention2d_window_forward", q, k, v, None, check_device=False)
    return _forward_outputs(q, v, keep_out_accum)


@torch.library.register_fake("attn2d::attention2d_window_backward")
def _attention2d_window_backward_fake(grad_out, q, k, v, out, lse, offsets, height, width, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _save_backward_inputs(ctx, inputs, output):
    grad_out, q, k, v = inputs[:4]
    ctx.save_for_backward(grad_out, q, k, v)
    ctx.others = inputs[4:]


def _double_backward(ctx, grad_dq, grad_dk, grad_dv, scale, **pairs):
    """(grad grad_out, grad q, grad k, grad v) of a backward op (attn2d/double_backward.py);
    `pairs` say which pairs the call allowed (double_backward.groups_for)."""
    from .double_backward import attention_double_backward, groups_for

    grad_out, q, k, v = ctx.saved_tensors
    g_q, g_k, g_v, g_do = attention_double_backward(groups_for(q, k, **pairs), q, k, v,
                                                    grad_out, grad_dq, grad_dk, grad_dv, scale)
    return g_do, g_q, g_k, g_v


def _attention_backward_backward(ctx, grad_dq, grad_dk, grad_dv):
    _, _, attn_mask, is_causal, scale = ctx.others
    grads = _double_backward(ctx, grad_dq, grad_dk, grad_dv, scale, attn_mask=attn_mask,
                             is_causal=is_causal)
    return (*grads, None, None, None, None, None)


def _attention2d_backward_backward(ctx, grad_dq, grad_dk, grad_dv):
    _, _, layout, _, scale = ctx.others
    grads = _double_backward(ctx, grad_dq, grad_dk, grad_dv, scale, layout=layout)
    return (*grads, None, None, [None] * len(layout), None, None)


def _window_backward_backward(ctx, grad_dq, grad_dk, grad_dv):
    _, _, offsets, height, width, scale = ctx.others
    grads = _double_backward(ctx, grad_dq, grad_dk, grad_dv, scale,
                             window=(offsets, height, width))
    return (*grads, None, None, None, None, None, None)


# The backward operators' own backward (attn2d/double_backward.py), for gradient penalties.
for _op, _fn in (("attn2d::attention_backward", _attention_backward_backward),
                 ("attn2d::attention2d_backward", _attention2d_backward_backward),
                 ("attn2d::attention2d_window_backward", _window_backward_backward)):
    torch.library.register_autograd(_op, _fn, setup_context=_save_backward_inputs)
