"""Swap a GAN's self-attention block for attn2d's, keep its weights, and train where the original
cannot.

A ProGAN generator put a SAGAN-style block (1x1 convs; queries and keys at C/8 channels, values at
C; an unscaled softmax over every pixel) before its toRGB layer and was killed at 256x256: the
block's softmax holds an N x N matrix (N = H*W pixels), 16 GiB at 256x256 in float32 and twice
that in training. attn2d.nn.SelfAttention2d with the options below is the same block, loads its
state_dict unchanged, and never stores that matrix.

    .venv/bin/python examples/swap_progan_block.py [--res 256] [--channels 32]

It checks the two blocks against each other where the original fits (32x32), then runs one
training step of the attn2d generator tail at --res and prints the process's peak memory.
"""

from __future__ import annotations

import argparse
import resource
import time

import torch
import torch.nn.functional as F
from torch import nn

import attn2d
from attn2d.memory import format_bytes, unfused_attention_bytes
from attn2d.unfused_blocks import SelfAttention2


class GeneratorTail(nn.Module):
    """A generator's last stage: a 3x3 conv, the attention block, then toRGB."""

    def __init__(self, channels: int, attention: nn.Module) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.attention = attention
        self.to_rgb = nn.Conv2d(channels, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.to_rgb(self.attention(F.leaky_relu(self.conv(x), 0.2))))


def progan_block_in_attn2d(channels: int) -> nn.Module:
    # The ProGAN block: values at C channels, keys not pooled, no output conv, no gamma, no
    # residual, SAGAN's unscaled q.k (scale=1.0).
    return attn2d.nn.SelfAttention2d(channels, qk_ratio=8, v_channels=channels, pool_kv=1,
                                     out_conv=False, gamma=False, residual=False, scale=1.0)


def relative_error(a: torch.Tensor, b: torch.Tensor, floor: float = 0.0) -> float:
    """max |a - b| over max |b|, the latter at least `floor`."""
    return float((a - b).abs().max() / max(float(b.abs().max()), floor))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--res", type=int, default=256, help="map side of the training step")
    ap.add_argument("--channels", type=int, default=32, help="channels (a multiple of 8)")
    args = ap.parse_args()
    if args.res < 1:
        ap.error(f"--res must be >= 1; got {args.res}")
    if args.channels < 8 or args.channels % 8:
        ap.error(f"--channels must be a positive multiple of 8; got {args.channels}")
    C = args.channels

    torch.manual_seed(0)
    original = GeneratorTail(C, SelfAttention2(C))
    fused = GeneratorTail(C, progan_block_in_attn2d(C))
    fused.load_state_dict(original.state_dict(), strict=True)

    # The same function: outputs and every parameter's gradient at 32x32, where the original's
    # 1024 x 1024 matrices fit.
    x = torch.randn(2, C, 32, 32)
    for model in (original, fused):
        model(x).square().mean().backward()
    with torch.no_grad():
        out_err = relative_error(fused(x), original(x))
    # The key bias's gradient is 0 in exact arithmetic (it adds the same q.b to every score of a
    # query, which the softmax cancels), ~1e-11 in float32 here: each gradient's error is taken
    # over its own largest value, but at least 1e-4 of the largest of any parameter.
    grads = dict(original.named_parameters())
    largest = max(float(p.grad.abs().max()) for p in grads.values())
    grad_err = max(relative_error(p.grad, grads[name].grad, 1e-4 * largest)
                   for name, p in fused.named_parameters())
    print(f"32x32: attn2d vs the original block, largest relative error: output {out_err:.1e}, "
          f"parameter gradients {grad_err:.1e}")
    # float32 with different summation orders: ~1e-6 here; a wrong kernel is off by O(1).
    if out_err > 1e-4 or grad_err > 1e-3:
        raise SystemExit("attn2d and the original block disagree")

    # One training step at --res: at 256x256 the original's two 65536 x 65536 matrices alone
    # would take 32 GiB.
    n = args.res * args.res
    need = unfused_attention_bytes(1, 1, n, n, elem_bytes=4, training=True)
    print(f"{args.res}x{args.res}: the original block's score and probability matrices alone "
          f"would take {format_bytes(need)} (batch 1)")
    opt = torch.optim.Adam(fused.parameters(), lr=1e-4)
    x = torch.randn(1, C, args.res, args.res)
    # ru_maxrss is in KiB on Linux: the process's high-water mark, torch itself included.
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    loss = fused(x).square().mean()
    loss.backward()
    opt.step()
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"{args.res}x{args.res}: one attn2d training step took {seconds:.2f} s on "
          f"{torch.get_num_threads()} threads; this process's peak resident memory: "
          f"{format_bytes(before)} before it, {format_bytes(after)} after")


if __name__ == "__main__":
    main()
