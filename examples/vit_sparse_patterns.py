"""Sparse attention for a high-resolution ViT: a 512x512 image in 16x16 patches is 1,024 tokens,
a 2048x2048 one 16,384. This times a training step of one transformer block (self-attention
over the patch tokens, cross-attention to 77 text tokens, an MLP) with four self-attention
patterns, and measures each step's peak memory in its own process:

- global: every patch sees every patch;
- window: a 2-D window of 9x9 patches on the patch grid (attn2d.patterns.Window);
- random: BigBird's random blocks, 3 key blocks of 64 tokens a query block and 2 global tokens
  (attn2d.patterns.Random);
- window ∪ random: their union.

    .venv/bin/python examples/vit_sparse_patterns.py [--sides 32,128] [--dim 384] [--heads 6]

Step times are medians of interleaved reps (every pattern once a rep); the ratios against
global are medians of per-rep ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch
from torch import nn

import attn2d
from attn2d.bench import paired_speedup, time_training_steps
from attn2d.patterns import Random, Window

TEXT_TOKENS = 77


def patterns() -> dict:
    window, random = Window(9), Random(blocks_per_row=3, block=64, seed=0, global_tokens=2)
    return {"global": None, "window": window, "random": random,
            "window ∪ random": window | random}


class Block(nn.Module):
    """Pre-norm: x + self-attention over the patches, x + cross-attention to the text, x + MLP.
    The self-attention is attn2d.nn.Attention on the patch tokens; a 2-D window reads them as
    the side x side patch grid in raster order."""

    def __init__(self, dim: int, heads: int, side: int, pattern) -> None:
        super().__init__()
        self.side, self.heads, self.pattern = side, heads, pattern
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.cross = attn2d.nn.CrossAttention(dim, context_dim=dim, num_heads=heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def self_attention(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        q, k, v = (t.unflatten(-1, (self.heads, C // self.heads)).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, dim=-1))
        if self.pattern is None:
            o = attn2d.attention(q, k, v)
        else:
            grid = (self.side, self.side)
            o = attn2d.attention2d(*(t.unflatten(2, grid) for t in (q, k, v)),
                                   pattern=self.pattern).flatten(2, 3)
        return self.proj(o.transpose(1, 2).flatten(2))

    def forward(self, x: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attention(self.norm1(x))
        x = x + self.cross(self.norm2(x), text)
        return x + self.mlp(self.norm3(x))


def inputs(side: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(1, side * side, dim, generator=g, requires_grad=True),
            torch.randn(1, TEXT_TOKENS, dim, generator=g))


def peak_child(name: str, side: int, dim: int, heads: int) -> None:
    """In a fresh process: the peak resident memory a training step adds above its inputs."""

    def high_water() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))

    torch.manual_seed(0)
    block = Block(dim, heads, side, patterns()[name])
    x, text = inputs(side, dim)
    if block.pattern is not None:  # the compiled layout (cached) is set-up, as the weights are
        block.pattern.allowed_pairs((side, side), (side, side), heads)
    base = high_water()
    block(x, text).sum().backward()
    print(json.dumps({"peak_bytes": high_water() - base}))


def check_against_dense_masks(heads: int, side: int = 16) -> None:
    """Each pattern's attention on a 16x16 patch grid against dense-masked SDPA (math) in
    float64; exits non-zero if one differs."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, heads, side * side, 8, generator=g, dtype=torch.float64)
               for _ in range(3))
    grid = (side, side)
    for name, p in patterns().items():
        if p is None:
            ours, mask = attn2d.attention(q, k, v), None
        else:
            ours = attn2d.attention2d(*(t.unflatten(2, grid) for t in (q, k, v)),
                                      pattern=p).flatten(2, 3)
            mask = p.dense_mask(grid, grid, heads)
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        err = float((ours - ref).abs().max())
        if err > 1e-10:
            raise SystemExit(f"{name}: attn2d differs from dense-masked attention by {err:.1e}")
    print(f"every pattern matches dense-masked attention on a {side}x{side} grid (float64)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sides", default="32,128",
                    help="patch-grid sides, comma-separated (32: 512x512 images, 128: 2048x2048)")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--peak-child", nargs=2, metavar=("PATTERN", "SIDE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.dim < 1 or args.heads < 1 or args.dim % args.heads:
        ap.error(f"--heads ({args.heads}) must divide --dim ({args.dim}), both >= 1")
    if args.reps < 1:
        ap.error(f"--reps must be >= 1; got {args.reps}")
    try:
        sides = [int(s) for s in args.sides.split(",")]
    except ValueError:
        ap.error(f"--sides must be comma-separated ints; got {args.sides!r}")
    if any(s < 16 for s in sides):
        ap.error(f"--sides must be at least 16 (4 blocks of 64 tokens for the random pattern); "
                 f"got {args.sides}")
    if args.peak_child:
        peak_child(args.peak_child[0], int(args.peak_child[1]), args.dim, args.heads)
        return

    check_against_dense_masks(args.heads)
    names = list(patterns())
    print(f"one block, dim {args.dim}, {args.heads} heads, cross-attention to {TEXT_TOKENS} "
          f"text tokens, batch 1, {torch.get_num_threads()} threads, attn2d on "
          f"{attn2d.cpu_simd_target()}")
    print("| tokens | pattern | allowed pairs | step (fwd+bwd) | vs global | peak memory |")
    print("|---|---|---|---|---|---|")
    for side in sides:
        torch.manual_seed(0)
        blocks = [Block(args.dim, args.heads, side, patterns()[n]) for n in names]
        for b in blocks[1:]:
            b.load_state_dict(blocks[0].state_dict())
        x, text = inputs(side, args.dim)
        runs = time_training_steps([lambda a, t, b=b: b(a, t) for b in blocks], [x, text],
                                   reps=args.reps)
        for name, run in zip(names, runs):
            env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
            child = subprocess.run(
                [sys.executable, __file__, "--dim", str(args.dim), "--heads", str(args.heads),
                 "--peak-child", name, str(side)],
                env=env, capture_output=True, text=True, check=True)
            peak = json.loads(child.stdout.strip().splitlines()[-1])["peak_bytes"]
            p, n = patterns()[name], side * side
            pairs = n * n if p is None else p.allowed_pairs((side, side), (side, side))
            ratio = paired_speedup(runs[0], run, "fwd_bwd")
            print(f"| {n:,} | {name} | {pairs / (n * n):.1%} | {run['fwd_bwd_s'] * 1e3:.0f} ms | "
                  f"{ratio:.2f}x | {peak / 2**20:.0f} MiB |")


if __name__ == "__main__":
    main()
