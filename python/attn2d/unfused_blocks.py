"""The two attention blocks of a ProGAN generator killed at 256x256, as published, in plain
PyTorch (the unfused side of `attn2d demo` and of the tests). Their debug prints are left out;
their state_dicts load into attn2d.nn.MultiheadSelfAttention2d and attn2d.nn.SelfAttention2d."""

from __future__ import annotations

import torch
import torch.nn as nn


class SelfAttention(nn.Module):
    """LayerNorm, nn.MultiheadAttention (4 heads), residual, feed-forward, residual (square
    maps only: it views the map as size * size with size = width)."""

    def __init__(self, channels):
        super(SelfAttention, self).__init__()
        self.channels = channels
        num_heads = 4
        self.mha = nn.MultiheadAttention(channels, num_heads, batch_first=True)
        self.ln = nn.LayerNorm([channels])
        self.ff_self = nn.Sequential(
            nn.LayerNorm([channels]),
            nn.Linear(channels, channels),
            nn.GELU(),
            nn.Linear(channels, channels),
        )

    def forward(self, x):
        size = x.shape[3]
        x = x.view(-1, self.channels, size * size).swapaxes(1, 2)
        x_ln = self.ln(x)
        attention_value, _ = self.mha(x_ln, x_ln, x_ln)
        attention_value = attention_value + x
        attention_value = self.ff_self(attention_value) + attention_value
        return attention_value.swapaxes(2, 1).view(-1, self.channels, size, size)


class SelfAttention2(nn.Module):
    """1x1 convs to C/8 (query, key) and C (value), unscaled q.k, softmax over keys."""

    def __init__(self, channels):
        super(SelfAttention2, self).__init__()
        self.query = nn.Conv2d(channels, channels // 8, kernel_size=1)
        self.key = nn.Conv2d(channels, channels // 8, kernel_size=1)
        self.value = nn.Conv2d(channels, channels, kernel_size=1)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x):
        N, C, H, W = x.size()
        query = self.query(x).view(N, -1, W * H).permute(0, 2, 1)  # (N, H*W, C/8)
        key = self.key(x).view(N, -1, W * H)  # (N, C/8, H*W)
        energy = torch.bmm(query, key)  # (N, H*W, H*W)
        attention = self.softmax(energy)
        value = self.value(x).view(N, -1, W * H)  # (N, C, H*W)
        out = torch.bmm(value, attention.permute(0, 2, 1))
        out = out.view(N, C, H, W)
        return out


def make_pair(block: str, channels: int, seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """(original, attn2d) with the same weights. block: "SelfAttention" or "SelfAttention2"."""
    from . import nn as ann

    torch.manual_seed(seed)
    if block == "SelfAttention":
        original = SelfAttention(channels)
        ours = ann.MultiheadSelfAttention2d(channels, 4)
    elif block == "SelfAttention2":
        original = SelfAttention2(channels)
        ours = ann.SelfAttention2d(channels, qk_ratio=8, v_channels=channels, pool_kv=1,
                                   out_conv=False, gamma=False, residual=False, scale=1.0)
    else:
        raise ValueError(f"block must be 'SelfAttention' or 'SelfAttention2'; got {block!r}")
    ours.load_state_dict(original.state_dict(), strict=True)
    return original, ours
