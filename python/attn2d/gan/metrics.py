"""Sample-quality metrics computed offline: ProGAN's sliced Wasserstein distance on
Laplacian-pyramid patches, and FID / KID over the shipped Fashion-MNIST classifier's features.

All take float images in [-1, 1], (N, C, H, W)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# ProGAN's SWD settings (Karras et al. 2018, metrics/sliced_wasserstein.py): 7x7 patches,
# 128 per image and level, pyramid down to 16x16, 4 repeats of 128 random directions.
PATCH = 7
SWD_MIN_RES = 16


def _check_images(name: str, x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"attn2d.gan.metrics: {name} must be a tensor; got {type(x).__name__}")
    if x.dim() != 4 or x.shape[0] < 2:
        raise ValueError(f"attn2d.gan.metrics: {name} must be (N >= 2, C, H, W); got "
                         f"{tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"attn2d.gan.metrics: {name} must be floating point in [-1, 1]; got "
                        f"{x.dtype}")


def _gaussian_kernel(channels: int) -> torch.Tensor:
    k1 = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0]) / 16.0
    k2 = torch.outer(k1, k1)
    return k2.expand(channels, 1, 5, 5).contiguous()


def _pyr_down(x: torch.Tensor) -> torch.Tensor:
    k = _gaussian_kernel(x.shape[1]).to(x)
    return F.conv2d(F.pad(x, (2, 2, 2, 2), mode="reflect"), k, stride=2, groups=x.shape[1])


def _pyr_up(x: torch.Tensor) -> torch.Tensor:
    n, c, h, w = x.shape
    up = torch.zeros(n, c, 2 * h, 2 * w, dtype=x.dtype)
    up[:, :, ::2, ::2] = x
    k = _gaussian_kernel(c).to(x) * 4.0
    return F.conv2d(F.pad(up, (2, 2, 2, 2), mode="reflect"), k, groups=c)


def laplacian_pyramid(x: torch.Tensor, min_res: int = SWD_MIN_RES) -> list[torch.Tensor]:
    """Band-pass levels from full resolution down to min_res; the last level is the low-pass
    residual, as in ProGAN."""
    levels = []
    cur = x
    while cur.shape[-1] > min_res and cur.shape[-2] > min_res:
        down = _pyr_down(cur)
        levels.append(cur - _pyr_up(down))
        cur = down
    levels.append(cur)
    return levels


def _descriptors(level: torch.Tensor, per_image: int, gen: torch.Generator) -> torch.Tensor:
    n, c, h, w = level.shape
    if h < PATCH or w < PATCH:
        raise ValueError(f"attn2d.gan.metrics: SWD needs levels of at least {PATCH}x{PATCH}; "
                         f"got {h}x{w}")
    ys = torch.randint(0, h - PATCH + 1, (n, per_image), generator=gen)
    xs = torch.randint(0, w - PATCH + 1, (n, per_image), generator=gen)
    off = torch.arange(PATCH)
    rows = (ys[..., None] + off)[..., :, None]                  # (n, p, 7, 1)
    cols = (xs[..., None] + off)[..., None, :]                  # (n, p, 1, 7)
    img = torch.arange(n)[:, None, None, None]
    patches = level.permute(0, 2, 3, 1)[img, rows, cols]        # (n, p, 7, 7, c)
    d = patches.permute(0, 1, 4, 2, 3).reshape(n * per_image, c, PATCH * PATCH).double()
    # ProGAN normalises each set's descriptors per channel.
    d = d - d.mean(dim=(0, 2), keepdim=True)
    d = d / d.std(dim=(0, 2), keepdim=True).clamp_min(1e-12)
    return d.reshape(d.shape[0], -1).float()


def _sliced_wasserstein(a: torch.Tensor, b: torch.Tensor, repeats: int, dirs: int,
                        gen: torch.Generator) -> float:
    m = min(a.shape[0], b.shape[0])
    results = []
    for _ in range(repeats):
        u = torch.randn(dirs, a.shape[1], generator=gen, dtype=torch.float64)
        u = (u / u.norm(dim=1, keepdim=True)).float()
        # (dirs, m) rows sorted along the contiguous axis: sorting (m, dirs) columns is many
        # times slower.
        pa = torch.sort(u @ a[:m].T, dim=1).values
        pb = torch.sort(u @ b[:m].T, dim=1).values
        results.append((pa - pb).abs().double().mean().item())
    return sum(results) / len(results)


def swd(real: torch.Tensor, fake: torch.Tensor, per_image: int = 64, repeats: int = 4,
        dirs: int = 128, seed: int = 0) -> dict:
    """ProGAN's SWD (x 1e3, as ProGAN reports it) per pyramid level, finest first, and their
    mean. Lower is better; the same images give 0 up to patch sampling."""
    _check_images("real", real)
    _check_images("fake", fake)
    if real.shape[1:] != fake.shape[1:]:
        raise ValueError(f"attn2d.gan.metrics: real and fake must have the same (C, H, W); got "
                         f"{tuple(real.shape[1:])} and {tuple(fake.shape[1:])}")
    gen = torch.Generator().manual_seed(seed)
    levels_r = laplacian_pyramid(real.double())
    levels_f = laplacian_pyramid(fake.double())
    out = {}
    for lr_, lf in zip(levels_r, levels_f):
        dr = _descriptors(lr_, per_image, gen)
        df = _descriptors(lf, per_image, gen)
        out[f"{lr_.shape[-2]}x{lr_.shape[-1]}"] = 1e3 * _sliced_wasserstein(dr, df, repeats,
                                                                            dirs, gen)
    out["mean"] = sum(out.values()) / len(out)
    return out


def _sqrtm_psd(m: torch.Tensor) -> torch.Tensor:
    vals, vecs = torch.linalg.eigh((m + m.T) / 2)
    return (vecs * vals.clamp_min(0).sqrt()) @ vecs.T


def frechet_distance(f1: torch.Tensor, f2: torch.Tensor) -> float:
    """||mu1 - mu2||^2 + tr(S1 + S2 - 2 (S1^1/2 S2 S1^1/2)^1/2), in float64."""
    f1, f2 = f1.double(), f2.double()
    mu1, mu2 = f1.mean(0), f2.mean(0)
    s1, s2 = torch.cov(f1.T), torch.cov(f2.T)
    r1 = _sqrtm_psd(s1)
    covmean_tr = torch.linalg.eigvalsh(r1 @ s2 @ r1).clamp_min(0).sqrt().sum()
    return float((mu1 - mu2).square().sum() + s1.trace() + s2.trace() - 2 * covmean_tr)


def kernel_inception_distance(f1: torch.Tensor, f2: torch.Tensor, subsets: int = 10,
                              subset_size: int = 1000, seed: int = 0) -> float:
    """KID: unbiased MMD^2 with the cubic polynomial kernel (x.y/d + 1)^3, averaged over random
    subsets (Binkowski et al. 2018)."""
    f1, f2 = f1.double(), f2.double()
    d = f1.shape[1]
    m = min(subset_size, f1.shape[0], f2.shape[0])
    if m < 2:
        raise ValueError("attn2d.gan.metrics: KID needs at least 2 samples per set")
    gen = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(subsets):
        x = f1[torch.randperm(f1.shape[0], generator=gen)[:m]]
        y = f2[torch.randperm(f2.shape[0], generator=gen)[:m]]
        kxx = (x @ x.T / d + 1) ** 3
        kyy = (y @ y.T / d + 1) ** 3
        kxy = (x @ y.T / d + 1) ** 3
        total += float((kxx.sum() - kxx.diagonal().sum()) / (m * (m - 1))
                       + (kyy.sum() - kyy.diagonal().sum()) / (m * (m - 1))
                       - 2 * kxy.mean())
    return total / subsets


def fid_kid(real: torch.Tensor, fake: torch.Tensor, classifier=None) -> dict:
    """FID and KID between two image sets over the Fashion-MNIST classifier's features."""
    from . import classifier as cls

    _check_images("real", real)
    _check_images("fake", fake)
    model = classifier if classifier is not None else cls.load()
    fr, ff = cls.embed(model, real), cls.embed(model, fake)
    return {"fid": frechet_distance(fr, ff), "kid": kernel_inception_distance(fr, ff)}
