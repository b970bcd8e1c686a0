"""The `attn2d` command line."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="attn2d", description="Exact, memory-efficient attention for images."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="self-attention forward+backward on maps up to 256x256: time and measured memory",
    )
    demo.add_argument("--out", default="attn2d-report", help="folder for the markdown report")
    _add_plan_parser(sub)
    bench = sub.add_parser("bench", help="attn2d side by side with PyTorch's CPU attention")
    bench.add_argument("--out", default="attn2d-report", help="folder for bench.json/.md/.png")
    bench.add_argument("--reps", type=int, default=5, help="timed runs per measurement")
    bench.add_argument("--quick", action="store_true", help="two small cases only")
    bench.add_argument("--no-memory", action="store_true", help="skip the subprocess memory runs")
    bench.add_argument("--patterns", action="store_true",
                       help="local/sparse patterns against global, dense-masked and Flex")
    args = parser.parse_args(argv)
    if args.command == "plan":
        return _plan(parser, args)
    if args.command == "bench":
        from . import bench as bench_module
        from . import bench_patterns

        module = bench_patterns if args.patterns else bench_module
        try:
            module.run(args.out, cases=module.quick_cases() if args.quick else None,
                       reps=args.reps, with_memory=not args.no_memory,
                       log=lambda line: print(line, flush=True))
        except ValueError as err:
            print(f"attn2d bench: error: {err}", file=sys.stderr)
            return 2
        return 0
    if args.command == "demo":
        from . import demo as demo_module

        def log(line: str) -> None:
            print(line, flush=True)

        demo_module.run(out_dir=args.out, log=log)
    return 0


def _add_plan_parser(sub) -> None:
    from .planner import DEVICES

    p = sub.add_parser(
        "plan",
        help="will an attention block fit on a GPU? memory, FLOPs, max batch, recommendation",
    )
    p.add_argument("--res", type=int, required=False, default=None,
                   help="feature-map height (and width unless --width)")
    p.add_argument("--width", type=int, default=None, help="feature-map width (default: --res)")
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--block", choices=("seed000", "sagan", "custom"), default="seed000",
                   help="seed000: both of seed 000's blocks; sagan: the SAGAN/BigGAN block; "
                   "custom: a conv block from --heads/--qk-channels/--v-channels/--pool")
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--qk-channels", type=int, default=None, help="q/k width, all heads (C/8)")
    p.add_argument("--v-channels", type=int, default=None, help="v width, all heads (C)")
    p.add_argument("--pool", type=int, default=1, help="key/value pooling factor")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="fp32", help="fp32, fp16 or bf16")
    p.add_argument("--inference", action="store_true", help="forward only")
    p.add_argument("--pattern", default="global", help="global, ylg or window:SIZE[:METRIC]")
    p.add_argument("--downsample", type=int, default=1)
    p.add_argument("--checkpoint", action="store_true", help="gradient checkpointing")
    p.add_argument("--gpu", default=None, help="device preset: " + ", ".join(DEVICES))
    p.add_argument("--memory", type=float, default=None, help="device memory in GiB")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--seed004", action="store_true",
                   help="print seed 004's memory and hardware tables, computed")


def _plan(parser, args) -> int:
    import json

    from . import planner

    try:
        if args.seed004:
            print(planner.seed004_tables(args.channels))
            return 0
        if args.res is None:
            parser.error("plan: --res is required (or --seed004)")
        setting = planner.Setting(
            args.res, args.width if args.width is not None else args.res, args.batch,
            args.dtype, not args.inference, planner.Pattern.parse(args.pattern),
            args.downsample, args.checkpoint,
        )
        if args.block == "seed000":
            blocks = planner.seed000_blocks(args.channels)
        elif args.block == "sagan":
            blocks = [planner.sagan_block(args.channels)]
        else:
            blocks = [planner.Block("custom conv block", "conv", args.channels, heads=args.heads,
                                    qk_channels=args.qk_channels, v_channels=args.v_channels,
                                    pool_kv=args.pool)]
        plans = [planner.plan(b, setting, device=args.gpu, memory_gib=args.memory)
                 for b in blocks]
    except (ValueError, TypeError) as err:
        print(f"attn2d plan: error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([planner.plan_to_dict(p) for p in plans], indent=2))
    else:
        print("\n\n".join(planner.format_plan(p) for p in plans))
    return 0


if __name__ == "__main__":
    sys.exit(main())
