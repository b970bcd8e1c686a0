"""Loads the compiled binding and registers what torch.library needs around its ops: fake
(meta) kernels for torch.compile / FakeTensor, and autograd for attention_forward."""

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


def _forward_outputs(q, v):
    """out (B, H, Lq, Ev) in q's dtype and lse (B, H, Lq) in the accumulation dtype."""
    B, H, Lq, _ = q.shape
    lse_dtype = _checks.accumulation_dtype(q.dtype)
    return q.new_empty((B, H, Lq, v.shape[-1])), q.new_empty((B, H, Lq), dtype=lse_dtype)


@torch.library.register_fake("attn2d::attention_forward")
def _attention_forward_fake(q, k, v, attn_mask, is_causal, scale):
    _checks.check_attention("attn2d.attention_forward", q, k, v, attn_mask, check_device=False)
    return _forward_outputs(q, v)


@torch.library.register_fake("attn2d::attention_backward")
def _attention_backward_fake(grad_out, q, k, v, out, lse, attn_mask, is_causal, scale):
    _checks.check_attention("attn2d.attention_backward", q, k, v, attn_mask, check_device=False)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _skip_zero_grads(ctx) -> None:
    # Autograd would otherwise hand the backward a zero-filled gradient for lse, which no loss
    # can reach (non-differentiable) and the backward ignores: a (B, H, Lq) tensor allocated and
    # zeroed each step: 1-2% of a YLG(8) step at B = 16 over 32x32 pixels (11.44-11.67 ->
    # 11.29-11.45 ms, forward and backward, two threads). The output's own gradient then
    # arrives as None where no loss reached it (gradcheck's undefined-gradient check does
    # that), and the backwards return no gradients.
    ctx.set_materialize_grads(False)


def _forward_setup_context(ctx, inputs, output):
    q, k, v, attn_mask, is_causal, scale = inputs
    if attn_mask is not None and attn_mask.requires_grad:
        # Its gradient would be an Lq x Lk tensor; returning none would be silently wrong.
        raise ValueError(
            "attn2d.attention: attn_mask requires grad, but gradients with respect to the mask "
            "are not supported; pass attn_mask.detach()"
        )
    out, lse = output
    ctx.mark_non_differentiable(lse)
    _skip_zero_grads(ctx)
    ctx.save_for_backward(q, k, v, out, lse, attn_mask)
    ctx.is_causal = is_causal
    ctx.scale = scale


def _forward_backward(ctx, grad_out, grad_lse):
    if grad_out is None:
        return None, None, None, None, None, None
    q, k, v, out, lse, attn_mask = ctx.saved_tensors
    dq, dk, dv = torch.ops.attn2d.attention_backward(
        grad_out, q, k, v, out, lse, attn_mask, ctx.is_causal, ctx.scale
    )
    return dq, dk, dv, None, None, None


torch.library.register_autograd(
    "attn2d::attention_forward", _forward_backward, setup_context=_forward_setup_context
)


@torch.library.register_fake("attn2d::attention2d_forward")
def _attention2d_forward_fake(q, k, v, layout, block_q, scale):
    _checks.check_attention("attn2d.attention2d_forward", q, k, v, None, check_device=False)
    return _forward_outputs(q, v)


@torch.library.register_fake("attn2d::attention2d_backward")
def _attention2d_backward_fake(grad_out, q, k, v, out, lse, layout, block_q, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _forward2d_setup_context(ctx, inputs, output):
    q, k, v, layout, block_q, scale = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    _skip_zero_grads(ctx)
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.layout, ctx.block_q, ctx.scale = layout, block_q, scale


def _forward2d_backward(ctx, grad_out, grad_lse):
    if grad_out is None:
        return None, None, None, [None] * len(ctx.layout), None, None
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.attn2d.attention2d_backward(
        grad_out, q, k, v, out, lse, ctx.layout, ctx.block_q, ctx.scale
    )
    return dq, dk, dv, [None] * len(ctx.layout), None, None


torch.library.register_autograd(
    "attn2d::attention2d_forward", _forward2d_backward, setup_context=_forward2d_setup_context
)


@torch.library.register_fake("attn2d::attention2d_window_forward")
def _attention2d_window_forward_fake(q, k, v, offsets, height, width, scale):
    _checks.check_attention("attn2d.attention2d_window_forward", q, k, v, None, check_device=False)
    return _forward_outputs(q, v)


@torch.library.register_fake("attn2d::attention2d_window_backward")
def _attention2d_window_backward_fake(grad_out, q, k, v, out, lse, offsets, height, width, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _window_setup_context(ctx, inputs, output):
    q, k, v, offsets, height, width, scale = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    _skip_zero_grads(ctx)
    ctx.save_for_backward(q, k, v, out, lse, offsets)
    ctx.height, ctx.width, ctx.scale = height, width, scale


def _window_backward(ctx, grad_out, grad_lse):
    if grad_out is None:
        return None, None, None, None, None, None, None
    q, k, v, out, lse, offsets = ctx.saved_tensors
    dq, dk, dv = torch.ops.attn2d.attention2d_window_backward(
        grad_out, q, k, v, out, lse, offsets, ctx.height, ctx.width, ctx.scale
    )
    return dq, dk, dv, None, None, None, None


torch.library.register_autograd(
    "attn2d::attention2d_window_forward", _window_backward, setup_context=_window_setup_context
)


def _backward_setup_context(ctx, inputs, output):
    pass


def _backward_backward(ctx, *grads):
    # Registered so that a double backward fails loudly instead of PyTorch's autograd fallback
    # treating the backward op as constant (a silently wrong R1 penalty).
    raise NotImplementedError(
        "attn2d: double backward (e.g. an R1 / gradient penalty) through attn2d.attention or "
        "attn2d.attention2d is not supported yet"
    )


for _op in ("attn2d::attention_backward", "attn2d::attention2d_backward",
            "attn2d::attention2d_window_backward"):
    torch.library.register_autograd(_op, _backward_backward, setup_context=_backward_setup_context)
