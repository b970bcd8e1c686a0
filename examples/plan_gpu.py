"""Before training: will a SAGAN block fit on your GPU, at what batch, and with which attention?

    .venv/bin/python examples/plan_gpu.py [--gpu rtx3090] [--channels 64]

attn2d.planner models the peak activation memory of one forward and backward of an attention
block for each implementation (the unfused PyTorch block, SDPA's math path, attn2d global,
attn2d local, attn2d on a downsampled map), checked against memory measured on the CPU
(tests/python/test_planner.py). `attn2d plan` is the same on the command line.
"""

from __future__ import annotations

import argparse

from attn2d import planner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="rtx3090", choices=sorted(planner.DEVICES))
    ap.add_argument("--channels", type=int, default=64)
    args = ap.parse_args()
    if args.channels < 8:
        ap.error(f"--channels must be >= 8 (queries and keys get channels // 8); got {args.channels}")

    block = planner.sagan_block(args.channels)
    # By resolution: the largest training batch of the unfused block and of attn2d (its memory
    # is linear in the pixels whatever the pattern), and the training GFLOP of one sample under
    # global attention and the local patterns, which is what a pattern buys.
    patterns = {"15x15 window": planner.Pattern("window", 15), "YLG": planner.Pattern("ylg")}
    header = ["unfused max batch", "attn2d max batch", "GFLOP global",
              *(f"GFLOP {name}" for name in patterns)]
    print(f"{block.name}, {args.channels} channels, fp32 training on "
          f"{planner.DEVICES[args.gpu][0]}:")
    print("| map | " + " | ".join(header) + " |")
    print("|---" * (len(header) + 1) + "|")
    for res in (64, 128, 256, 512):
        by = {e.implementation: e
              for e in planner.plan(block, planner.Setting(res, res), device=args.gpu).estimates}
        cells = [str(by["pytorch-unfused"].max_batch), str(by["attn2d-global"].max_batch),
                 f"{by['attn2d-global'].flops / 1e9:,.1f}"]
        for pattern in patterns.values():
            local = planner.estimate(block, planner.Setting(res, res, pattern=pattern),
                                     "attn2d-local")
            cells.append(f"{local.flops / 1e9:,.1f}")
        print(f"| {res}x{res} | " + " | ".join(cells) + " |")

    # The full answer for one setting, as `attn2d plan --res 256 --batch 8` prints it.
    print()
    print(planner.format_plan(planner.plan(block, planner.Setting(256, 256, batch=8),
                                           device=args.gpu)))


if __name__ == "__main__":
    main()
