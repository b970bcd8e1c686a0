"""The ProGAN block "SelfAttention" (LayerNorm, multi-head attention, feed-forward) on NCHW maps,
with the same state_dict keys as the original (attn2d.unfused_blocks) so its weights load with
strict=True."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..functional import attention, attention2d
from . import _common as c

_NAME = "attn2d.nn.MultiheadSelfAttention2d"


class _Projections(nn.Module):
    """The parameters of nn.MultiheadAttention (self-attention, batch_first), under its names."""

    def __init__(self, channels: int, num_heads: int, pattern=None) -> None:
        super().__init__()
        self.num_heads, self.pattern = num_heads, pattern
        self.in_proj_weight = nn.Parameter(torch.empty(3 * channels, channels))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * channels))
        self.out_proj = nn.Linear(channels, channels)
        # nn.MultiheadAttention's initialisation.
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.in_proj_bias)
        nn.init.zeros_(self.out_proj.bias)

    def forward(self, tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """tokens (B, H*W, C) in raster order of a grid = (H, W) map."""
        q, k, v = F.linear(tokens, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        q, k, v = (c.tokens_to_heads(t, self.num_heads) for t in (q, k, v))
        if self.pattern is None:
            o = attention(q, k, v)
        else:
            q, k, v = (t.unflatten(2, grid) for t in (q, k, v))
            o = attention2d(q, k, v, pattern=self.pattern).flatten(2, 3)
        return self.out_proj(c.heads_to_tokens(o))


class MultiheadSelfAttention2d(nn.Module):
    """x (B, C, H, W) -> tokens; t = t + MHA(LN(t)); t = t + FF(t); back to (B, C, H, W).

    downsample=s runs the attention sub-layer on a map shrunk by a stride-s conv and brings it
    back with a transposed conv; the residuals and the feed-forward stay at full resolution.
    """

    def __init__(self, channels: int, num_heads: int = 4, *, pattern=None, downsample: int = 1,
                 checkpoint: bool = False) -> None:
        super().__init__()
        channels = c.check_positive_int(_NAME, "channels", channels)
        num_heads = c.check_positive_int(_NAME, "num_heads", num_heads)
        downsample = c.check_positive_int(_NAME, "downsample", downsample)
        c.check_divisible(_NAME, "channels", channels, "num_heads", num_heads)
        c.check_pattern(_NAME, pattern, num_heads)
        self.channels, self.num_heads, self.checkpoint = channels, num_heads, checkpoint
        self.mha = _Projections(channels, num_heads, pattern)
        self.ln = nn.LayerNorm([channels])
        self.ff_self = nn.Sequential(
            nn.LayerNorm([channels]), nn.Linear(channels, channels), nn.GELU(),
            nn.Linear(channels, channels),
        )
        self.resample = c.Resample(channels, downsample) if downsample > 1 else None

    def _attention_map(self, x: torch.Tensor) -> torch.Tensor:
        """The attention sub-layer's output as a (B, C, h, w) map of x's size."""
        B, C, H, W = x.shape
        tokens = x.flatten(2).transpose(1, 2)
        a = self.mha(self.ln(tokens), (H, W))
        return a.transpose(1, 2).reshape(B, C, H, W)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c.check_map_input(_NAME, x, self.channels)
        B, C, H, W = x.shape
        if self.resample is not None:
            self.resample.check(_NAME, x)
            a = c.maybe_checkpoint(self.checkpoint, self._attention_map, self.resample.down(x))
            a = self.resample.upsample(a, x)
        else:
            a = c.maybe_checkpoint(self.checkpoint, self._attention_map, x)
        t = (x + a).flatten(2).transpose(1, 2)
        t = self.ff_self(t) + t
        return t.transpose(1, 2).reshape(B, C, H, W)
