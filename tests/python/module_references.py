"""PyTorch-only references for the attn2d.nn modules, built from torch.nn parts with the same
state_dict keys, computing attention the unfused way (matmul, softmax, matmul)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


# The ProGAN blocks, as published, live in the package (the demo runs them too).
from attn2d.unfused_blocks import SelfAttention as ProganSelfAttention  # noqa: E402,F401
from attn2d.unfused_blocks import SelfAttention2 as ProganSelfAttention2  # noqa: E402,F401


def unfused(q, k, v, scale, allowed=None):
    s = (q @ k.transpose(-1, -2)) * scale
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


class Resample(nn.Module):
    def __init__(self, channels, s):
        super().__init__()
        self.down = nn.Conv2d(channels, channels, s, stride=s)
        self.up = nn.ConvTranspose2d(channels, channels, s, stride=s)


class RefSelfAttention2d(nn.Module):
    """The SAGAN/BigGAN block with the options of attn2d.nn.SelfAttention2d, unfused."""

    def __init__(self, channels, *, qk_ratio=8, v_channels=None, heads=1, pool_kv=2,
                 out_conv=True, gamma=True, residual=True, scale=1.0, groups=1,
                 spectral_norm=False, downsample=1, pattern=None):
        super().__init__()
        v_channels = channels // 2 if v_channels is None else v_channels
        sn = nn.utils.parametrizations.spectral_norm if spectral_norm else (lambda m: m)
        qk = channels // qk_ratio
        self.query = sn(nn.Conv2d(channels, qk, 1, groups=groups))
        self.key = sn(nn.Conv2d(channels, qk, 1, groups=groups))
        self.value = sn(nn.Conv2d(channels, v_channels, 1, groups=groups))
        self.out = sn(nn.Conv2d(v_channels, channels, 1, groups=groups)) if out_conv else None
        self.gamma = nn.Parameter(torch.zeros(1)) if gamma else None
        self.resample = Resample(channels, downsample) if downsample > 1 else None
        self.heads, self.pool, self.residual, self.scale = heads, pool_kv, residual, scale
        self.pattern = pattern

    def forward(self, x):
        inner = self.resample.down(x) if self.resample is not None else x
        B, _, H, W = inner.shape
        q, k, v = self.query(inner), self.key(inner), self.value(inner)
        if self.pool > 1:
            k, v = F.max_pool2d(k, self.pool), F.max_pool2d(v, self.pool)
        h = self.heads

        def split(t):  # (B, h*d, H, W) -> (B, h, HW, d)
            return t.reshape(B, h, t.shape[1] // h, -1).transpose(-1, -2)

        d = q.shape[1] // h
        scale = self.scale if self.scale is not None else d**-0.5
        allowed = None
        if self.pattern is not None:
            allowed = self.pattern.dense_mask((H, W), tuple(k.shape[-2:]), h)
        o = unfused(split(q), split(k), split(v), scale, allowed)
        o = o.transpose(-1, -2).reshape(B, -1, H, W)
        if self.out is not None:
            o = self.out(o)
        if self.resample is not None:
            o = self.resample.up(o, output_size=x.shape[-2:])
        if self.gamma is not None:
            o = self.gamma * o
        return x + o if self.residual else o


class RefMultiheadSelfAttention2d(nn.Module):
    """The ProGAN block "SelfAttention" for any H x W and heads, with nn.MultiheadAttention."""

    def __init__(self, channels, num_heads=4, downsample=1, pattern=None):
        super().__init__()
        self.pattern = pattern
        self.mha = nn.MultiheadAttention(channels, num_heads, batch_first=True)
        self.ln = nn.LayerNorm([channels])
        self.ff_self = nn.Sequential(
            nn.LayerNorm([channels]), nn.Linear(channels, channels), nn.GELU(),
            nn.Linear(channels, channels),
        )
        self.resample = Resample(channels, downsample) if downsample > 1 else None

    def forward(self, x):
        B, C, H, W = x.shape
        inner = self.resample.down(x) if self.resample is not None else x
        t = inner.flatten(2).transpose(1, 2)
        t_ln = self.ln(t)
        blocked = None
        if self.pattern is not None:  # a bool attn_mask of nn.MultiheadAttention blocks where True
            grid = tuple(inner.shape[-2:])
            blocked = ~self.pattern.dense_mask(grid, grid, 1)[0]
        a, _ = self.mha(t_ln, t_ln, t_ln, need_weights=False, attn_mask=blocked)
        a = a.transpose(1, 2).reshape(inner.shape)
        if self.resample is not None:
            a = self.resample.up(a, output_size=x.shape[-2:])
        t = (x + a).flatten(2).transpose(1, 2)
        t = self.ff_self(t) + t
        return t.transpose(1, 2).reshape(B, C, H, W)


class RefAttention(nn.Module):
    """timm's ViT Attention (its non-fused path)."""

    def __init__(self, dim, num_heads=8, qkv_bias=False, qk_norm=False, proj_bias=True):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim, bias=proj_bias)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        x = unfused(q, k, v, self.scale)
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


class RefCrossAttention(nn.Module):
    def __init__(self, dim, context_dim=None, num_heads=8, qkv_bias=False, proj_bias=True):
        super().__init__()
        context_dim = dim if context_dim is None else context_dim
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(context_dim, 2 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)

    def forward(self, x, context):
        B, N, C = x.shape
        h, d = self.num_heads, C // self.num_heads
        q = self.q(x).reshape(B, N, h, d).transpose(1, 2)
        k, v = self.kv(context).reshape(B, -1, 2, h, d).permute(2, 0, 3, 1, 4).unbind(0)
        o = unfused(q, k, v, d**-0.5)
        return self.proj(o.transpose(1, 2).reshape(B, N, C))
