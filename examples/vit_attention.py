"""Put attn2d's fused attention inside a ViT block: attn2d.nn.Attention has timm's `Attention`
arguments and state_dict keys (qkv, q_norm, k_norm, proj), so a checkpoint's weights load
unchanged.

    .venv/bin/python examples/vit_attention.py [--tokens 1024] [--dim 768] [--heads 12]

It builds a pre-norm ViT block whose attention is written the unfused way (as timm's is with
fused_attn off), copies its weights into the same block with attn2d.nn.Attention, checks the
two against each other, and times a training step of each, interleaved (medians of 5).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import attn2d
from attn2d.bench import paired_speedup, time_training_steps


class UnfusedAttention(nn.Module):
    """timm's ViT attention with fused_attn off: q k^T, softmax, times v, in plain torch."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm, self.k_norm = nn.Identity(), nn.Identity()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B, N, C))


class Block(nn.Module):
    """A pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, dim: int, attention: nn.Module) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), attention
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1024, help="tokens (e.g. 32x32 patches)")
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    args = ap.parse_args()
    for name in ("tokens", "dim", "heads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1; got {getattr(args, name)}")
    if args.dim % args.heads:
        ap.error(f"--heads ({args.heads}) must divide --dim ({args.dim})")

    torch.manual_seed(0)
    unfused = Block(args.dim, UnfusedAttention(args.dim, args.heads))
    fused = Block(args.dim, attn2d.nn.Attention(args.dim, args.heads, qkv_bias=True))
    fused.load_state_dict(unfused.state_dict(), strict=True)

    x = torch.randn(2, args.tokens, args.dim)
    with torch.no_grad():
        err = float((fused(x) - unfused(x)).abs().max())
    print(f"{args.tokens} tokens, dim {args.dim}, {args.heads} heads: largest difference of the "
          f"two blocks' outputs {err:.1e}")
    # float32 sums in different orders over a residual stream of values ~4: ~5e-7 here; a wrong
    # kernel is off by O(1).
    if err > 1e-3:
        raise SystemExit("attn2d's block disagrees with the unfused one")

    # attn2d's own timing loop: the two blocks interleaved rep by rep, medians of 5.
    a, b = time_training_steps([unfused, fused], [x], reps=5)
    print(f"the block, batch 2, forward + backward (medians of 5): unfused "
          f"{1e3 * a['fwd_bwd_s']:.1f} ms, attn2d {1e3 * b['fwd_bwd_s']:.1f} ms "
          f"(time ratio unfused / attn2d, paired by rep: forward "
          f"{paired_speedup(a, b, 'forward'):.2f}, backward {paired_speedup(a, b, 'backward'):.2f})")


if __name__ == "__main__":
    main()
