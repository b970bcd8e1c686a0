"""A small SAGAN-style generator and discriminator (spectral norm, hinge loss) with one
attn2d.nn.SelfAttention2d block at a chosen resolution, in each network.

Sizes follow DCGAN/SAGAN at low resolution: the generator doubles the map with nearest
upsampling + 3x3 conv + BatchNorm + ReLU from 4x4; the discriminator halves it with 4x4 stride-2
convs + LeakyReLU(0.1). Both have spectral norm on every conv/linear (SAGAN applies it to G too)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn.utils import spectral_norm

from ..nn import SelfAttention2d


@dataclass
class AttentionConfig:
    """How the attention block attends: pattern None is global; downsample > 1 attends on a
    pooled map (attention cost falls by downsample^4)."""

    pattern: object = None
    heads: int = 4
    downsample: int = 1
    pool_kv: int = 2
    checkpoint: bool = False

    def describe(self) -> str:
        what = "global" if self.pattern is None else repr(self.pattern)
        extra = f", downsample={self.downsample}" if self.downsample > 1 else ""
        return f"{what}, heads={self.heads}, pool_kv={self.pool_kv}{extra}"


@dataclass
class GANConfig:
    res: int = 32
    channels: int = 1          # image channels
    z_dim: int = 128
    width: int = 32            # channels at full resolution; doubles per halving, capped at 8x
    attn_res: int = 32         # map size where each network has its attention block
    attention: AttentionConfig = field(default_factory=AttentionConfig)

    def check(self) -> None:
        if self.res < 8 or self.res & (self.res - 1):
            raise ValueError(f"attn2d.gan: res must be a power of two >= 8; got {self.res}")
        if self.attn_res < 4 or self.attn_res > self.res or self.attn_res & (self.attn_res - 1):
            raise ValueError(
                f"attn2d.gan: attn_res must be a power of two between 4 and res={self.res}; "
                f"got {self.attn_res}")
        for name in ("channels", "z_dim", "width"):
            if getattr(self, name) < 1:
                raise ValueError(f"attn2d.gan: {name} must be >= 1; got {getattr(self, name)}")

    def channels_at(self, size: int) -> int:
        return self.width * min(8, self.res // size)


def _attention_block(cfg: GANConfig, channels: int) -> SelfAttention2d:
    a = cfg.attention
    qk_ratio = 8
    # SAGAN's C/8 query/key width must split into `heads` heads; narrow blocks use C/4.
    while qk_ratio > 1 and (channels // qk_ratio) % a.heads:
        qk_ratio //= 2
    return SelfAttention2d(channels, heads=a.heads, qk_ratio=qk_ratio, pool_kv=a.pool_kv,
                           spectral_norm=True, pattern=a.pattern, downsample=a.downsample,
                           checkpoint=a.checkpoint)


class Generator(nn.Module):
    def __init__(self, cfg: GANConfig) -> None:
        super().__init__()
        cfg.check()
        self.cfg = cfg
        c4 = cfg.channels_at(4)
        self.project = spectral_norm(nn.Linear(cfg.z_dim, c4 * 16))
        self.bn0 = nn.BatchNorm2d(c4)
        blocks: list[nn.Module] = []
        size = 4
        if cfg.attn_res == 4:
            blocks.append(_attention_block(cfg, c4))
        while size < cfg.res:
            cin, cout = cfg.channels_at(size), cfg.channels_at(size * 2)
            size *= 2
            blocks.append(nn.Sequential(
                nn.Upsample(scale_factor=2, mode="nearest"),
                spectral_norm(nn.Conv2d(cin, cout, 3, padding=1)),
                nn.BatchNorm2d(cout), nn.ReLU(inplace=True)))
            if size == cfg.attn_res:
                blocks.append(_attention_block(cfg, cout))
        self.blocks = nn.Sequential(*blocks)
        self.to_image = spectral_norm(nn.Conv2d(cfg.channels_at(cfg.res), cfg.channels, 3,
                                                padding=1))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        c4 = self.cfg.channels_at(4)
        x = torch.relu(self.bn0(self.project(z).view(z.shape[0], c4, 4, 4)))
        return torch.tanh(self.to_image(self.blocks(x)))


class Discriminator(nn.Module):
    def __init__(self, cfg: GANConfig) -> None:
        super().__init__()
        cfg.check()
        self.cfg = cfg
        layers: list[nn.Module] = [spectral_norm(nn.Conv2d(cfg.channels, cfg.channels_at(cfg.res),
                                                           3, padding=1)),
                                   nn.LeakyReLU(0.1, inplace=True)]
        size = cfg.res
        if size == cfg.attn_res:
            layers.append(_attention_block(cfg, cfg.channels_at(size)))
        while size > 4:
            cin, cout = cfg.channels_at(size), cfg.channels_at(size // 2)
            size //= 2
            layers += [spectral_norm(nn.Conv2d(cin, cout, 4, stride=2, padding=1)),
                       nn.LeakyReLU(0.1, inplace=True)]
            if size == cfg.attn_res:
                layers.append(_attention_block(cfg, cout))
        self.features = nn.Sequential(*layers)
        self.head = spectral_norm(nn.Linear(cfg.channels_at(4) * 16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1)).squeeze(1)


def attention_blocks(*models: nn.Module) -> list[SelfAttention2d]:
    return [m for model in models for m in model.modules() if isinstance(m, SelfAttention2d)]


def hinge_d_loss(real_logits: torch.Tensor, fake_logits: torch.Tensor) -> torch.Tensor:
    return torch.relu(1.0 - real_logits).mean() + torch.relu(1.0 + fake_logits).mean()


def hinge_g_loss(fake_logits: torch.Tensor) -> torch.Tensor:
    return -fake_logits.mean()


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
