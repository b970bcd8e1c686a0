"""The operations users call."""

from __future__ import annotations

from typing import Optional

import torch

from . import _checks, _ops  # noqa: F401  (_ops loads the binding and registers autograd)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_mask: Optional[torch.Tensor] = None,
    is_causal: bool = False,
    scale: Optional[float] = None,
) -> torch.Tensor:
    """Exact softmax attention that never stores the Lq x Lk score matrix.

    q (B, H, Lq, E), k (B, H, Lk, E), v (B, H, Lk, Ev) -> (B, H, Lq, Ev). The meaning is that of
    ``torch.nn.functional.scaled_dot_product_attention`` without dropout: ``scale`` defaults to
    1/sqrt(E); a bool ``attn_mask`` is True where attention is allowed, a float one is added to
    the scores; it broadcasts to (B, H, Lq, Lk). ``is_causal`` lets query i see keys j <= i
    (top-left aligned) and may be combined with ``attn_mask``. E may differ from Ev and any
    strides are accepted without a copy. A query row with no allowed key gives 0 (and gradient 0).
    """
    fn = "attn2d.attention"
    _checks.check_attention(fn, q, k, v, attn_mask)
    if not isinstance(is_causal, bool):
        raise TypeError(f"{fn}: is_causal must be a bool; got {type(is_causal).__name__}")
    scale = _checks.resolve_scale(fn, scale, q.shape[-1])
    out, _ = torch.ops.attn2d.attention_forward(q, k, v, attn_mask, is_causal, scale)
    return out
