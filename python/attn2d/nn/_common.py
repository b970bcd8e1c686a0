"""Pieces the attn2d.nn modules share: argument checks, map <-> heads views,
and the downsample-attend-upsample wrapper."""

from __future__ import annotations

import torch
from torch import nn


def check_positive_int(module: str, name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{module}: {name} must be an int; got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{module}: {name} must be >= 1; got {value}")
    return value


def check_divisible(module: str, name: str, value: int, by_name: str, by: int) -> None:
    if value % by != 0:
        raise ValueError(f"{module}: {name} ({value}) must be divisible by {by_name} ({by})")


def check_pattern(module: str, pattern: object, heads: int) -> None:
    """None (global) or an attn2d.patterns pattern; one that fixes its heads (YLG) must have
    the module's."""
    from .. import patterns

    if pattern is None:
        return
    if not isinstance(pattern, patterns.Pattern):
        raise TypeError(
            f"{module}: pattern must be None or an attn2d.patterns pattern (Window, YLG, "
            f"Window1D, Random, BlockMask, Union, Intersection); got {type(pattern).__name__}"
        )
    fixed = getattr(pattern, "heads", None)
    if fixed is not None and fixed != heads:
        raise ValueError(
            f"{module}: pattern {pattern!r} has {fixed} heads but the module has {heads}"
        )


def map_to_grid_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, heads*d, H, W) -> (B, heads, H, W, d) as a view: no copy; last-dim stride H*W."""
    B, C, H, W = t.shape
    return t.reshape(B, heads, C // heads, H, W).permute(0, 1, 3, 4, 2)


def grid_heads_to_map(t: torch.Tensor) -> torch.Tensor:
    """(B, heads, H, W, d) -> (B, heads*d, H, W)."""
    B, heads, H, W, d = t.shape
    return t.permute(0, 1, 4, 2, 3).reshape(B, heads * d, H, W)


def check_map_input(module: str, x: object, channels: int) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{module}: input must be a torch.Tensor; got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(
            f"{module}: input must be 4-D (B, C, H, W); got shape {tuple(x.shape)}"
        )
    if x.shape[1] != channels:
        raise ValueError(
            f"{module}: input has {x.shape[1]} channels but the module was built for "
            f"channels={channels}; got shape {tuple(x.shape)}"
        )
    return x


def check_tokens_input(module: str, name: str, x: object, channels: int) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{module}: {name} must be a torch.Tensor; got {type(x).__name__}")
    if x.dim() != 3:
        raise ValueError(f"{module}: {name} must be 3-D (B, N, C); got shape {tuple(x.shape)}")
    if x.shape[-1] != channels:
        raise ValueError(
            f"{module}: {name} has {x.shape[-1]} channels but the module expects {channels}; "
            f"got shape {tuple(x.shape)}"
        )
    return x


def tokens_to_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, N, heads*d) -> (B, heads, N, d) as a view."""
    B, N, C = t.shape
    return t.view(B, N, heads, C // heads).transpose(1, 2)


def heads_to_tokens(t: torch.Tensor) -> torch.Tensor:
    """(B, heads, N, d) -> (B, N, heads*d)."""
    B, heads, N, d = t.shape
    return t.transpose(1, 2).reshape(B, N, heads * d)


class Resample(nn.Module):
    """A stride-s conv down, attention on the smaller map, a transposed conv
    back up. Attention memory and time fall by s^4."""

    def __init__(self, channels: int, factor: int) -> None:
        super().__init__()
        self.down = nn.Conv2d(channels, channels, kernel_size=factor, stride=factor)
        self.up = nn.ConvTranspose2d(channels, channels, kernel_size=factor, stride=factor)

    def check(self, module: str, x: torch.Tensor) -> None:
        s = self.down.stride[0]
        if x.shape[-2] < s or x.shape[-1] < s:
            raise ValueError(
                f"{module}: downsample={s} needs a map of at least {s}x{s}; got "
                f"{x.shape[-2]}x{x.shape[-1]}"
            )

    def upsample(self, y: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return self.up(y, output_size=like.shape[-2:])


def maybe_checkpoint(enabled: bool, fn, *args: torch.Tensor) -> torch.Tensor:
    if enabled and torch.is_grad_enabled():
        from torch.utils.checkpoint import checkpoint

        return checkpoint(fn, *args, use_reentrant=False)
    return fn(*args)


def optional_spectral_norm(module: nn.Module, enabled: bool) -> nn.Module:
    if enabled:
        return nn.utils.parametrizations.spectral_norm(module)
    return module

