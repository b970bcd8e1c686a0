"""The SAGAN / BigGAN self-attention block on NCHW maps, with attn2d's fused attention."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..functional import attention2d
from . import _common as c

_NAME = "attn2d.nn.SelfAttention2d"


class SelfAttention2d(nn.Module):
    """SAGAN / BigGAN self-attention over an NCHW feature map.

    theta = query(x), phi = key(x), g = value(x) (1x1 convs; q/k at channels // qk_ratio, v at
    v_channels, default channels // 2); phi and g are max-pooled by pool_kv (keys on an
    (H/pool)x(W/pool) grid); o = attention(theta, phi, g) with `heads` heads; o is projected
    back to `channels` by a 1x1 conv when out_conv; y = x + gamma * o (gamma starts at 0).
    scale=1.0 is SAGAN's unscaled dot product; None means 1/sqrt(head width).

    The defaults are the published SAGAN/BigGAN block. pattern=attn2d.patterns.Window(...) makes
    it local; SelfAttention2d(C, heads=8, pattern=attn2d.patterns.YLG(8)) is the YLG-SAGAN
    block. The ProGAN block "SelfAttention2" (attn2d.unfused_blocks) is SelfAttention2d(C,
    v_channels=C, pool_kv=1, out_conv=False, gamma=False, residual=False) and loads its
    state_dict with strict=True.
    """

    def __init__(
        self,
        channels: int,
        *,
        qk_ratio: int = 8,
        v_channels: Optional[int] = None,
        heads: int = 1,
        pool_kv: int = 2,
        out_conv: bool = True,
        gamma: bool = True,
        residual: bool = True,
        scale: Optional[float] = 1.0,
        groups: int = 1,
        spectral_norm: bool = False,
        pattern=None,
        downsample: int = 1,
        checkpoint: bool = False,
    ) -> None:
        super().__init__()
        channels = c.check_positive_int(_NAME, "channels", channels)
        qk_ratio = c.check_positive_int(_NAME, "qk_ratio", qk_ratio)
        heads = c.check_positive_int(_NAME, "heads", heads)
        pool_kv = c.check_positive_int(_NAME, "pool_kv", pool_kv)
        groups = c.check_positive_int(_NAME, "groups", groups)
        downsample = c.check_positive_int(_NAME, "downsample", downsample)
        v_channels = channels // 2 if v_channels is None else v_channels
        v_channels = c.check_positive_int(_NAME, "v_channels", v_channels)
        c.check_divisible(_NAME, "channels", channels, "qk_ratio", qk_ratio)
        qk_channels = channels // qk_ratio
        c.check_divisible(_NAME, "channels // qk_ratio", qk_channels, "heads", heads)
        c.check_divisible(_NAME, "v_channels", v_channels, "heads", heads)
        for name, n in (("channels", channels), ("channels // qk_ratio", qk_channels),
                        ("v_channels", v_channels)):
            c.check_divisible(_NAME, name, n, "groups", groups)
        if not out_conv and v_channels != channels and residual:
            raise ValueError(
                f"{_NAME}: residual=True without out_conv needs v_channels == channels; got "
                f"v_channels={v_channels}, channels={channels}"
            )
        c.check_pattern(_NAME, pattern, heads)
        self.channels, self.qk_channels, self.v_channels = channels, qk_channels, v_channels
        self.heads, self.pool_kv, self.residual = heads, pool_kv, residual
        self.scale, self.checkpoint, self.pattern = scale, checkpoint, pattern

        def conv(cin: int, cout: int) -> nn.Module:
            return c.optional_spectral_norm(nn.Conv2d(cin, cout, 1, groups=groups), spectral_norm)

        self.query = conv(channels, qk_channels)
        self.key = conv(channels, qk_channels)
        self.value = conv(channels, v_channels)
        self.out = conv(v_channels, channels) if out_conv else None
        self.gamma = nn.Parameter(torch.zeros(1)) if gamma else None
        self.resample = c.Resample(channels, downsample) if downsample > 1 else None

    def set_pattern(self, pattern) -> None:
        """Change where the block attends (None, a Window or a YLG with the block's heads), as
        training schedules do; the weights do not depend on the pattern."""
        c.check_pattern(_NAME, pattern, self.heads)
        self.pattern = pattern

    def _attend(self, x: torch.Tensor) -> torch.Tensor:
        B, _, H, W = x.shape
        q, k, v = self.query(x), self.key(x), self.value(x)
        if self.pool_kv > 1:
            k, v = F.max_pool2d(k, self.pool_kv), F.max_pool2d(v, self.pool_kv)
        o = attention2d(
            c.map_to_grid_heads(q, self.heads), c.map_to_grid_heads(k, self.heads),
            c.map_to_grid_heads(v, self.heads), pattern=self.pattern, scale=self.scale,
        )
        o = c.grid_heads_to_map(o)
        return self.out(o) if self.out is not None else o

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c.check_map_input(_NAME, x, self.channels)
        inner = x
        if self.resample is not None:
            self.resample.check(_NAME, x)
            inner = self.resample.down(x)
        if inner.shape[-2] < self.pool_kv or inner.shape[-1] < self.pool_kv:
            raise ValueError(
                f"{_NAME}: pool_kv={self.pool_kv} needs an attended map of at least "
                f"{self.pool_kv}x{self.pool_kv}; got {inner.shape[-2]}x{inner.shape[-1]}"
            )
        o = c.maybe_checkpoint(self.checkpoint, self._attend, inner)
        if self.resample is not None:
            o = self.resample.upsample(o, x)
        if self.gamma is not None:
            o = self.gamma * o
        return x + o if self.residual else o

    def extra_repr(self) -> str:
        return (
            f"channels={self.channels}, qk_channels={self.qk_channels}, "
            f"v_channels={self.v_channels}, heads={self.heads}, pool_kv={self.pool_kv}, "
            f"scale={self.scale}"
        )
