"""Checks the planner's memory model against memory measured on a CUDA GPU.

Runs the ProGAN generator's two unfused attention blocks (attn2d.unfused_blocks) forward and
backward at several resolutions and compares torch.cuda.max_memory_allocated growth with
attn2d.planner's prediction. Needs a CUDA build of torch and a GPU:

    python scripts/validate_planner_gpu.py [--channels 64] [--res 32 48 64 96 128]
"""

import argparse
import sys

import torch

from attn2d import planner
from attn2d.unfused_blocks import make_pair


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--res", type=int, nargs="+", default=[32, 48, 64, 96, 128])
    parser.add_argument("--tolerance", type=float, default=0.15)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to validate", file=sys.stderr)
        return 2
    blocks = {b.kind: b for b in planner.progan_blocks(args.channels)}
    worst = 0.0
    for kind, name in (("conv", "SelfAttention2"), ("tokens", "SelfAttention")):
        for res in args.res:
            original, _ = make_pair(name, args.channels)
            original = original.cuda()
            x = torch.randn(1, args.channels, res, res, device="cuda")
            grad = torch.randn_like(x)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            try:
                original(x).backward(grad)
                torch.cuda.synchronize()
            except torch.cuda.OutOfMemoryError:
                print(f"{name} {res}x{res}: out of memory")
                continue
            measured = torch.cuda.max_memory_allocated() - base
            predicted = planner.estimate(
                blocks[kind], planner.Setting(res, res), "pytorch-unfused").memory_bytes
            err = abs(measured - predicted) / measured
            worst = max(worst, err)
            print(f"{name} {res}x{res}: predicted {predicted / 2**20:.1f} MiB, measured "
                  f"{measured / 2**20:.1f} MiB ({100 * err:.1f}% off)")
            del original, x, grad
            torch.cuda.empty_cache()
    print(f"worst error {100 * worst:.1f}% (bound {100 * args.tolerance:.0f}%)")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
