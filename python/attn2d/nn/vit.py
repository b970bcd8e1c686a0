"""Token-sequence attention modules for vision transformers."""

from __future__ import annotations

from typing import Optional

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


class Attention(nn.Module):
    """timm's ViT `Attention` (same arguments and state_dict keys: qkv, q_norm, k_norm, proj),
    computed by attn2d's fused kernel. x (B, N, C) -> (B, N, C)."""

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type = nn.LayerNorm,
        pattern=None,
    ) -> None:
        super().__init__()
        name = "attn2d.nn.Attention"
        dim = c.check_positive_int(name, "dim", dim)
        num_heads = c.check_positive_int(name, "num_heads", num_heads)
        c.check_divisible(name, "dim", dim, "num_heads", num_heads)
        _check_dropout(name, attn_drop)
        c.check_no_pattern(name, pattern)
        self._name = name
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
                is_causal: bool = False) -> torch.Tensor:
        """x (B, N, C); attn_mask and is_causal as in scaled_dot_product_attention (timm's
        Block passes both)."""
        c.check_tokens_input(self._name, "x", x, self.dim)
        q, k, v = (c.tokens_to_heads(t, self.num_heads) for t in self.qkv(x).chunk(3, dim=-1))
        q, k = self.q_norm(q), self.k_norm(k)
        o = attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=self.scale)
        return self.proj_drop(self.proj(c.heads_to_tokens(o)))


class CrossAttention(nn.Module):
    """Queries (B, N, dim) attend to a context (B, M, context_dim) -> (B, N, dim).

    Submodules: q (dim -> dim), kv (context_dim -> 2 * dim), proj (dim -> dim). attn_mask
    broadcasts to (B, heads, N, M); a (B, 1, 1, M) bool mask is a context padding mask.
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
        c.check_no_pattern(name, pattern)
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
        o = attention(q, k, v, attn_mask=attn_mask)
        return self.proj_drop(self.proj(c.heads_to_tokens(o)))
