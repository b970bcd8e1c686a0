"""Loads the compiled binding and registers what torch.library needs around its ops: fake
(meta) kernels for torch.compile / FakeTensor, and the backward operators' autograd (a double
backward refused). The forward operators' autograd is C++ (binding/torch_autograd.cc)."""

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


@torch.library.register_fake("attn2d::attention2d_forward")
def _attention2d_forward_fake(q, k, v, layout, block_q, scale):
    _checks.check_attention("attn2d.attention2d_forward", q, k, v, None, check_device=False)
    return _forward_outputs(q, v)


@torch.library.register_fake("attn2d::attention2d_backward")
def _attention2d_backward_fake(grad_out, q, k, v, out, lse, layout, block_q, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@torch.library.register_fake("attn2d::attention2d_window_forward")
def _attention2d_window_forward_fake(q, k, v, offsets, height, width, scale):
    _checks.check_attention("attn2d.attention2d_window_forward", q, k, v, None, check_device=False)
    return _forward_outputs(q, v)


@torch.library.register_fake("attn2d::attention2d_window_backward")
def _attention2d_window_backward_fake(grad_out, q, k, v, out, lse, offsets, height, width, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


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
