"""The small Fashion-MNIST classifier whose features FID and KID are computed over.

Inception features mean little for 32x32 grayscale clothing, and downloading Inception is not
possible offline, so attn2d ships this network (trained by `python -m attn2d.gan.classifier` /
scripts/train_fid_classifier.py; ~356k parameters, 1.4 MiB) and uses its 128-d penultimate
activations. Inputs are 32x32 single-channel images in [-1, 1]."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from . import data

WEIGHTS = Path(__file__).with_name("fmnist_classifier.pt")
FEATURES = 128
INPUT_RES = 32


class FashionClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),      # 16x16
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),     # 8x8
            nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),    # 4x4
        )
        self.features = nn.Sequential(nn.Flatten(), nn.Linear(128 * 16, FEATURES), nn.ReLU())
        self.classify = nn.Linear(FEATURES, 10)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(self.convs(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.embed(x))


def prepare(images: torch.Tensor) -> torch.Tensor:
    """Float images in [-1, 1], (N, C, H, W) -> the classifier's (N, 1, 32, 32): channels are
    averaged (RGB folders), sizes resized."""
    if images.dim() != 4:
        raise ValueError(f"attn2d.gan.classifier: images must be (N, C, H, W); got "
                         f"{tuple(images.shape)}")
    x = images.float()
    if x.shape[1] != 1:
        x = x.mean(1, keepdim=True)
    if x.shape[-2:] != (INPUT_RES, INPUT_RES):
        x = F.interpolate(x, size=(INPUT_RES, INPUT_RES), mode="bilinear", antialias=True,
                          align_corners=False)
    return x


def load(path: str | Path = WEIGHTS) -> FashionClassifier:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"attn2d.gan.classifier: {path} not found; train it with "
            "scripts/train_fid_classifier.py")
    model = FashionClassifier()
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return model.eval()


@torch.no_grad()
def embed(model: FashionClassifier, images: torch.Tensor, batch: int = 1000) -> torch.Tensor:
    """(N, 128) float64 features of float images in [-1, 1]."""
    out = [model.embed(prepare(images[i:i + batch])).double()
           for i in range(0, images.shape[0], batch)]
    return torch.cat(out) if out else torch.empty(0, FEATURES, dtype=torch.float64)


@torch.no_grad()
def accuracy(model: FashionClassifier, images: torch.Tensor, labels: torch.Tensor,
             batch: int = 1000) -> float:
    correct = 0
    for i in range(0, images.shape[0], batch):
        logits = model(prepare(images[i:i + batch]))
        correct += int((logits.argmax(1) == labels[i:i + batch]).sum())
    return correct / max(1, images.shape[0])


def train(out: str | Path = WEIGHTS, epochs: int = 4, batch: int = 128, seed: int = 0,
          log=print) -> float:
    """Train on Fashion-MNIST's train split (resized to 32x32, random horizontal flips), save
    the weights, return test accuracy."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    train_u8, train_y = data.load_fashion_mnist("train")
    test_u8, test_y = data.load_fashion_mnist("test")
    train_x = data.to_float(data.resize_uint8(train_u8, INPUT_RES))
    test_x = data.to_float(data.resize_uint8(test_u8, INPUT_RES))
    model = FashionClassifier()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    steps = epochs * (train_x.shape[0] // batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps)
    for epoch in range(epochs):
        t0 = time.perf_counter()
        model.train()
        order = torch.randperm(train_x.shape[0], generator=gen)
        for i in range(0, train_x.shape[0] - batch + 1, batch):
            idx = order[i:i + batch]
            x = train_x[idx]
            flip = torch.rand(batch, generator=gen) < 0.5
            x = torch.where(flip[:, None, None, None], x.flip(-1), x)
            loss = F.cross_entropy(model(x), train_y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        model.eval()
        acc = accuracy(model, test_x, test_y)
        log(f"epoch {epoch + 1}/{epochs}: loss {loss.item():.3f}, test accuracy {acc:.4f} "
            f"({time.perf_counter() - t0:.0f} s)")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out)
    return acc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Train the Fashion-MNIST classifier used for FID/KID")
    p.add_argument("--out", default=str(WEIGHTS))
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    acc = train(args.out, epochs=args.epochs, seed=args.seed)
    print(f"saved {args.out}; test accuracy {acc:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
