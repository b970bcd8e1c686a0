"""Token-sequence attention modules for vision transformers."""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn

from ..functional import attention
from . import _common as c


def _check_dropout(name: str, p: float) -> None:
    if p != 0.0:
        raise ValueError(
            f"{name}: attn_drop must be 0.0 (attention-probability dropout would need the "
            f"probability matrix); got {p}"
        )


def _check_bool(module: str, name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{module}: {name} must be a bool; got {type(value).__name__}")
    return value


def _check_optional_positive_int(module: str, name: str, value: object) -> Optional[int]:
    return None if value is None else c.check_positive_int(module, name, value)


def _check_probability(module: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{module}: {name} must be a float; got {type(value).__name__}")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{module}: {name} must be in [0, 1]; got {value}")
    return float(value)


def _check_factory(module: str, device: object, dtype: object) -> dict:
    """device and dtype as torch's module constructors take them; returns the non-None ones."""
    if device is not None:
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"{module}: device {device!r} is not a torch device ({e})") from None
    if dtype is not None:
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"{module}: dtype must be a torch.dtype; got {type(dtype).__name__}")
        if not dtype.is_floating_point:
            raise ValueError(f"{module}: dtype must be a floating-point dtype; got {dtype}")
    return {k: v for k, v in (("device", device), ("dtype", dtype)) if v is not None}


class Attention(nn.Module):
    """timm's ViT `Attention` (``timm.layers.Attention``, which timm's VisionTransformer uses),
    computed by attn2d's fused kernel. x (B, N, dim) -> (B, N, dim_out).

    The constructor takes the arguments of timm 1.0.31's Attention, in its order (earlier timm
    1.0 releases ordered them differently; timm passes them by keyword), and the submodules and
    state_dict keys are timm's: qkv, q_norm, k_norm, norm (scale_norm), gate (gated), proj. So
    ``timm.create_model(name, attn_layer=attn2d.nn.Attention)`` builds a model whose weights
    load strictly from the timm model's, and an attn2d Attention loads strictly from a timm one
    built with the same arguments.

    Arguments as in timm: dim, num_heads, attn_head_dim (per-head width; default
    dim // num_heads), dim_out (default dim), qkv_bias, qk_norm (norm_layer on each head's q and
    k), scale_norm (norm_layer on the attention output before proj), proj_bias, gated (a sigmoid
    gate, computed from x by a Linear with qkv_bias, multiplies the attention output before
    proj), proj_drop, device and dtype (of the parameters). Where it differs from timm:

    - attn_drop must be 0.0: the fused kernel never forms the attention probabilities that
      dropout would act on (timm applies it in training only; timm's models default to 0).
    - norm_layer None with qk_norm or scale_norm means torch.nn.LayerNorm (timm requires one).
    - forward's attn_mask and is_causal may be given together (see forward).

    pattern (keyword only; attn2d.patterns, e.g. Window1D, Random or their union) restricts each
    token to its pattern's keys over the token sequence; attn_mask and is_causal are then
    refused.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        attn_head_dim: Optional[int] = None,
        dim_out: Optional[int] = None,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        gated: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: Optional[Callable[..., nn.Module]] = None,
        device=None,
        dtype=None,
        *,
        pattern=None,
    ) -> None:
        super().__init__()
        name = "attn2d.nn.Attention"
        dim = c.check_positive_int(name, "dim", dim)
        num_heads = c.check_positive_int(name, "num_heads", num_heads)
        head_dim = _check_optional_positive_int(name, "attn_head_dim", attn_head_dim)
        if head_dim is None:
            c.check_divisible(name, "dim", dim, "num_heads", num_heads)
            head_dim = dim // num_heads
        dim_out = _check_optional_positive_int(name, "dim_out", dim_out)
        dim_out = dim if dim_out is None else dim_out
        for flag, value in (("qkv_bias", qkv_bias), ("qk_norm", qk_norm),
                            ("scale_norm", scale_norm), ("proj_bias", proj_bias),
                            ("gated", gated)):
            _check_bool(name, flag, value)
        _check_dropout(name, _check_probability(name, "attn_drop", attn_drop))
        proj_drop = _check_probability(name, "proj_drop", proj_drop)
        if norm_layer is not None and not callable(norm_layer):
            raise TypeError(
                f"{name}: norm_layer must be a callable that builds a module (a class such as "
                f"torch.nn.LayerNorm) or None; got {type(norm_layer).__name__}"
            )
        # Modules get device/dtype only when they are given, so norm layers that do not take
        # them still work (timm always passes them, as None by default).
        dd = _check_factory(name, device, dtype)
        c.check_pattern(name, pattern, num_heads)
        self.pattern = pattern
        # timm asserts that a norm_layer comes with qk_norm/scale_norm; attn2d has always
        # defaulted to LayerNorm there, and keeps doing so.
        norm_layer = nn.LayerNorm if norm_layer is None else norm_layer

        self._name = name
        self.dim, self.dim_out, self.num_heads, self.head_dim = dim, dim_out, num_heads, head_dim
        self.attn_dim = num_heads * head_dim
        self.scale = head_dim**-0.5
        self.qkv = nn.Linear(dim, self.attn_dim * 3, bias=qkv_bias, **dd)
        self.q_norm = norm_layer(head_dim, **dd) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(head_dim, **dd) if qk_norm else nn.Identity()
        self.norm = norm_layer(self.attn_dim, **dd) if scale_norm else nn.Identity()
        self.gate = nn.Linear(dim, self.attn_dim, bias=qkv_bias, **dd) if gated else None
        self.proj = nn.Linear(self.attn_dim, dim_out, bias=proj_bias, **dd)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
                is_causal: bool = False) -> torch.Tensor:
        """x (B, N, dim) -> (B, N, dim_out). attn_mask broadcasts to (B, num_heads, N, N): a
        bool one is True where attention is allowed, a float one is added to the scores.
        is_causal lets token i attend to tokens j <= i. Given both, both apply, as in torch's
        scaled_dot_product_attention and so timm's default (fused) path; timm's unfused path
        ignores attn_mask then. A token that may attend to no token gets a zero attention
        output."""
        c.check_tokens_input(self._name, "x", x, self.dim)
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        q, k, v = (c.tokens_to_heads(t, self.num_heads) for t in self.qkv(x).chunk(3, dim=-1))
        q, k = self.q_norm(q), self.k_norm(k)
        if self.pattern is not None:
            if attn_mask is not None or is_causal:
                raise ValueError(f"{self._name}: attn_mask and is_causal cannot be combined with "
                                 f"the module's pattern {self.pattern!r}")
            o = attention(q, k, v, scale=self.scale, pattern=self.pattern)
        else:
            o = attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=self.scale)
        o = self.norm(c.heads_to_tokens(o))
        if gate is not None:
            o = o * gate
        return self.proj_drop(self.proj(o))


class CrossAttention(nn.Module):
    """Queries (B, N, dim) attend to a context (B, M, context_dim) -> (B, N, dim).

    Submodules: q (dim -> dim), kv (context_dim -> 2 * dim), proj (dim -> dim). attn_mask
    broadcasts to (B, heads, N, M); a (B, 1, 1, M) bool mask is a context padding mask. A
    pattern (attn2d.patterns, over the N queries and M context tokens) excludes attn_mask.
    """

    def __init__(
        self,
        dim: int,
        context_dim: Optional[int] = None,
        num_heads: int = 8,
        qkv_bias: bool = False,
        proj_bias: bool = True,
        proj_drop: float = 0.0,
        pattern=None,
    ) -> None:
        super().__init__()
        name = "attn2d.nn.CrossAttention"
        dim = c.check_positive_int(name, "dim", dim)
        context_dim = dim if context_dim is None else context_dim
        context_dim = c.check_positive_int(name, "context_dim", context_dim)
        num_heads = c.check_positive_int(name, "num_heads", num_heads)
        c.check_divisible(name, "dim", dim, "num_heads", num_heads)
        c.check_pattern(name, pattern, num_heads)
        self.pattern = pattern
        self._name = name
        self.dim, self.context_dim, self.num_heads = dim, context_dim, num_heads
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(context_dim, 2 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor, context: torch.Tensor,
                attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        c.check_tokens_input(self._name, "x", x, self.dim)
        c.check_tokens_input(self._name, "context", context, self.context_dim)
        if context.shape[0] != x.shape[0]:
            raise ValueError(
                f"{self._name}: context batch {context.shape[0]} != x batch {x.shape[0]}"
            )
        q = c.tokens_to_heads(self.q(x), self.num_heads)
        k, v = (c.tokens_to_heads(t, self.num_heads) for t in self.kv(context).chunk(2, dim=-1))
        if self.pattern is not None:
            if attn_mask is not None:
                raise ValueError(f"{self._name}: attn_mask cannot be combined with the module's "
                                 f"pattern {self.pattern!r}")
            o = attention(q, k, v, pattern=self.pattern)
        else:
            o = attention(q, k, v, attn_mask=attn_mask)
        return self.proj_drop(self.proj(c.heads_to_tokens(o)))
