"""Training images: Fashion-MNIST from its IDX files, or a folder of images.

Images are resized once, kept as uint8 (60,000 x 32 x 32 is 61 MiB; float32 would be 4x), and
turned into float batches in [-1, 1] on demand."""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                         "Shirt", "Sneaker", "Bag", "Ankle boot")


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """An IDX file (optionally gzipped) as a numpy array; only unsigned-byte data, which is
    what (Fashion-)MNIST uses."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4:
        raise ValueError(f"attn2d.gan.data: {path} is not an IDX file (only {len(data)} bytes)")
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(
            f"attn2d.gan.data: {path} is not an unsigned-byte IDX file (magic {data[:4].hex()})"
        )
    dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise ValueError(
            f"attn2d.gan.data: {path} holds {body.size} bytes of data, its header says {dims}"
        )
    return body.reshape(dims)


def _fashion_file(root: Path, stem: str) -> Path:
    for name in (stem + ".gz", stem):
        if (root / name).exists():
            return root / name
    raise FileNotFoundError(
        f"attn2d.gan.data: {root / stem}[.gz] not found; install Debian's dataset-fashion-mnist "
        "(scripts/setup.sh does) or pass --data with a folder of images"
    )


def load_fashion_mnist(split: str = "train", root: str | os.PathLike = FASHION_MNIST_DIR
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(images uint8 (N, 1, 28, 28), labels int64 (N,)) of the train or test split."""
    if split not in ("train", "test"):
        raise ValueError(f"attn2d.gan.data: split must be 'train' or 'test'; got {split!r}")
    root = Path(root)
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(_fashion_file(root, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(_fashion_file(root, f"{prefix}-labels-idx1-ubyte"))
    if images.ndim != 3 or labels.shape != (images.shape[0],):
        raise ValueError(f"attn2d.gan.data: unexpected Fashion-MNIST shapes {images.shape}, "
                         f"{labels.shape}")
    return (torch.from_numpy(images.copy()).unsqueeze(1),
            torch.from_numpy(labels.astype(np.int64)))


def load_folder(path: str | os.PathLike) -> torch.Tensor:
    """Every image in a folder (recursively) as uint8 (N, C, H, W), C = 1 if all are grayscale,
    else 3; the images must share one size (they are resized later)."""
    from .. import _tools

    _tools.require("attn2d.gan's image folders", "PIL")
    from PIL import Image

    files = sorted(p for p in Path(path).rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ValueError(f"attn2d.gan.data: no images ({', '.join(IMAGE_SUFFIXES)}) under {path}")
    images = [Image.open(p) for p in files]
    gray = all(im.mode in ("L", "1", "I;16") for im in images)
    arrays = []
    size = None
    for p, im in zip(files, images):
        im = im.convert("L" if gray else "RGB")
        if size is None:
            size = im.size
        elif im.size != size:
            # Resize to the first image's size so one batch tensor holds them; the training
            # resolution is applied afterwards.
            im = im.resize(size, Image.BILINEAR)
        a = np.asarray(im, dtype=np.uint8)
        arrays.append(a[None] if gray else a.transpose(2, 0, 1))
    return torch.from_numpy(np.stack(arrays))


def resize_uint8(images: torch.Tensor, res: int, chunk: int = 4096) -> torch.Tensor:
    """Resize uint8 (N, C, h, w) to (N, C, res, res) with antialiased bilinear filtering."""
    if images.shape[-2:] == (res, res):
        return images.contiguous()
    out = torch.empty(images.shape[0], images.shape[1], res, res, dtype=torch.uint8)
    for i in range(0, images.shape[0], chunk):
        x = images[i:i + chunk].float()
        y = F.interpolate(x, size=(res, res), mode="bilinear", antialias=True, align_corners=False)
        out[i:i + chunk] = y.round().clamp(0, 255).to(torch.uint8)
    return out


def to_float(images: torch.Tensor) -> torch.Tensor:
    """uint8 [0, 255] -> float32 [-1, 1]."""
    return images.float().div(127.5).sub(1.0)


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """float [-1, 1] -> uint8 [0, 255]."""
    return images.detach().float().add(1.0).mul(127.5).round().clamp(0, 255).to(torch.uint8)


def load_training_images(data: str | None, res: int, limit: int | None = None) -> torch.Tensor:
    """uint8 (N, C, res, res): Fashion-MNIST's train split when data is None or 'fashion-mnist',
    else a folder of images (or a folder holding Fashion-MNIST's IDX files)."""
    if res < 4 or res & (res - 1):
        raise ValueError(f"attn2d.gan.data: res must be a power of two >= 4; got {res}")
    if data is None or data == "fashion-mnist":
        images, _ = load_fashion_mnist("train")
    else:
        root = Path(data)
        if not root.is_dir():
            raise ValueError(f"attn2d.gan.data: --data must be 'fashion-mnist' or a folder; "
                             f"{data!r} is not a folder")
        if any(root.glob("train-images-idx3-ubyte*")):
            images, _ = load_fashion_mnist("train", root)
        else:
            images = load_folder(root)
    if limit is not None:
        images = images[:limit]
    return resize_uint8(images, res)
