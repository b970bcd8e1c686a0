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
    _add_device_option(demo)
    _add_plan_parser(sub)
    bench = sub.add_parser("bench", help="attn2d side by side with PyTorch's attention (and, "
                           "with --device cuda, FlexAttention and NATTEN on the GPU)")
    bench.add_argument("--out", default="attn2d-report",
                       help="folder for bench.json/.md/.png (bench_cuda.json/.md with --device "
                       "cuda)")
    bench.add_argument("--reps", type=int, default=5, help="timed runs per measurement")
    bench.add_argument("--quick", action="store_true",
                       help="small cases only (two on the CPU; one of each kind on CUDA)")
    bench.add_argument("--no-memory", action="store_true",
                       help="skip the memory runs (subprocesses on the CPU; on CUDA, the peak "
                       "memory columns and the planner's cases)")
    bench.add_argument("--thread-scaling", action="store_true",
                       help="also time attn2d on one thread (the threads target)")
    bench.add_argument("--paired-seconds", type=float, default=None,
                       help="least time for each of attn2d's interleaved pairs (fp32/bf16, "
                       "1/all threads) whose ratios are targets (default 4); with --patterns, "
                       "for each case's global and pattern steps (default 40); with --device "
                       "cuda, for each case's interleaved implementations (default 1)")
    bench.add_argument("--cases", default=None,
                       help="comma-separated substrings: run only the cases whose names match")
    bench.add_argument("--patterns", action="store_true",
                       help="local/sparse patterns against global, dense-masked and Flex")
    bench.add_argument("--double-backward", action="store_true",
                       help="an R1 penalty step through a SAGAN block at 64x64 and 128x128 "
                       "against torch's math path (time and peak memory)")
    _add_device_option(bench)
    _add_train_gan_parser(sub)
    args = parser.parse_args(argv)
    if args.command in ("demo", "bench", "train-gan") and _cuda_missing(args.command, args.device):
        return 2
    if args.command == "train-gan":
        return _train_gan(parser, args)
    if args.command == "plan":
        return _plan(parser, args)
    if args.command == "bench" and args.double_backward:
        return _bench_double_backward(args)
    if args.command == "bench":
        on_cpu = args.device == "cpu"
        if on_cpu and not args.patterns and not _tools_present("bench", "matplotlib"):
            return 2
        if args.thread_scaling and not on_cpu:
            print("attn2d bench: error: --thread-scaling times CPU threads; it does not go with "
                  "--device cuda", file=sys.stderr)
            return 2
        from . import bench as bench_module
        from . import bench_cuda, bench_patterns

        module = bench_cuda if not on_cpu else bench_patterns if args.patterns else bench_module
        try:
            cases = module.quick_cases() if args.quick else module.default_cases()
            if args.patterns and not on_cpu:
                cases = [c for c in cases if bench_cuda.is_pattern_case(c)]
            if args.cases:
                wanted = [w.strip() for w in args.cases.split(",") if w.strip()]
                cases = [c for c in cases if any(w in c.name for w in wanted)]
                if not cases:
                    raise ValueError(f"--cases {args.cases!r} matches no case")
            extra = {"thread_scaling": True} if args.thread_scaling and not args.patterns else {}
            if args.paired_seconds is not None:
                extra["paired_seconds"] = args.paired_seconds
            if not on_cpu:
                extra["device"] = args.device
            module.run(args.out, cases=cases, reps=args.reps, with_memory=not args.no_memory,
                       log=lambda line: print(line, flush=True), **extra)
        except ValueError as err:
            print(f"attn2d bench: error: {err}", file=sys.stderr)
            return 2
        return 0
    if args.command == "demo":
        if not _tools_present("demo", "matplotlib"):
            return 2
        from . import demo as demo_module

        def log(line: str) -> None:
            print(line, flush=True)

        demo_module.run(out_dir=args.out, log=log, device=args.device)
    return 0


def _bench_double_backward(args) -> int:
    if args.device != "cpu" or args.patterns or args.thread_scaling:
        print("attn2d bench: error: --double-backward runs on the CPU alone, without "
              "--patterns or --thread-scaling", file=sys.stderr)
        return 2
    if args.reps < 1:
        print(f"attn2d bench: error: --reps must be >= 1; got {args.reps}", file=sys.stderr)
        return 2
    from . import bench_double_backward

    resolutions = (32,) if args.quick else (64, 128)
    rows = bench_double_backward.run(resolutions, 64, args.reps, not args.no_memory,
                                     log=lambda line: print(line, flush=True))
    print(bench_double_backward.write(args.out, rows))
    return 0


def _add_device_option(parser) -> None:
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where tensors and modules live (default: cpu); cuda times with "
                        "CUDA events and measures memory with torch.cuda.max_memory_allocated")


def _cuda_missing(command: str, device: str) -> bool:
    """Whether `--device cuda` was asked for where torch sees no CUDA device; if so, says so on
    stderr before any work starts."""
    from ._checks import check_run_device

    try:
        check_run_device(f"attn2d {command}: error", device)
    except ValueError as err:
        print(err, file=sys.stderr)
        return True
    return False


def _tools_present(command: str, *modules: str) -> bool:
    """Whether the `tools` extra's `modules` are installed; if not, says so on stderr, naming
    `pip install attn2d[tools]`, before any work starts."""
    from . import _tools

    try:
        _tools.require(f"attn2d {command}", *modules)
    except _tools.MissingToolError as err:
        print(f"attn2d {command}: error: {err}", file=sys.stderr)
        return False
    return True


def _add_train_gan_parser(sub) -> None:
    from .gan.train import TrainConfig, VARIANTS

    d = TrainConfig()
    p = sub.add_parser(
        "train-gan",
        help="train a SAGAN-style GAN with global vs YLG (or other) attention on real images; "
        "report time, memory, SWD, FID/KID",
        description="SAGAN (global attention) against YLG-SAGAN and other attention schedules, "
        "trained on the CPU or, with --device cuda, a GPU. Each variant trains in its own "
        "process; under torchrun (gloo; NCCL with --device cuda) every rank trains with "
        "DistributedDataParallel.")
    p.add_argument("--variants", default="global,ylg",
                   help=f"comma-separated, from {', '.join(VARIANTS)} (default: global,ylg)")
    p.add_argument("--steps", type=int, default=None,
                   help=f"training steps (default {d.steps}); not with --budget-minutes")
    p.add_argument("--budget-minutes", type=float, default=None, metavar="M",
                   help="train each run for M minutes of training steps instead of a step "
                   "count (evaluation, samples and checkpoints are timed apart and not counted), "
                   "evaluating FID/KID/SWD at --eval-fractions; writes OUT/budget_report.md")
    p.add_argument("--eval-fractions", default=None, metavar="F,F,...",
                   help="fractions of the budget in (0, 1], increasing, at which to evaluate "
                   "(default 0.1,0.2,...,1.0)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="what a budget's minutes count: wall-clock time of the training steps "
                   "(default), or the process's CPU time in them, so that runs sharing a "
                   "machine get the same compute (CPU only)")
    p.add_argument("--pause-after-minutes", type=float, default=None, metavar="M",
                   help="stop this invocation after M minutes of training, checkpointed; "
                   "--resume continues the budget with its clock and evaluations")
    p.add_argument("--seeds", default=None, metavar="S,S,...",
                   help="train every variant once per seed, in OUT/<variant>/seed<S> (instead "
                   "of --seed in OUT/<variant>)")
    p.add_argument("--report", default=None, metavar="DIR",
                   help="train nothing: merge the budget runs under DIR (every seed and "
                   "sitting) into DIR/budget_report.md, budget_report.json and "
                   "fid_vs_time_*.png")
    p.add_argument("--batch", type=int, default=d.batch, help="per process")
    p.add_argument("--res", "--image-size", dest="res", type=int, default=d.res,
                   help="image size (32 or 64, ...)")
    p.add_argument("--width", type=int, default=d.width, help="channels at full resolution")
    p.add_argument("--attn-res", type=int, default=d.attn_res,
                   help="map size of the attention block in G and D (a power of two up to the "
                   "image size: 32 or 64 for 64x64 images)")
    p.add_argument("--heads", type=int, default=d.heads)
    p.add_argument("--pool-kv", type=int, default=d.pool_kv, help="key/value pooling (SAGAN: 2)")
    p.add_argument("--window-sizes", default=None,
                   help="comma-separated Manhattan window sizes for window/progressive/plateau/"
                   "mixed (default: 8,16,24 scaled to the key grid)")
    p.add_argument("--lr-g", type=float, default=d.lr_g)
    p.add_argument("--lr-d", type=float, default=d.lr_d)
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast")
    p.add_argument("--r1", type=float, default=d.r1, metavar="GAMMA",
                   help="R1 gradient penalty on real images with this gamma (0: off), lazily "
                   "every --r1-every steps as in StyleGAN2")
    p.add_argument("--r1-every", type=int, default=d.r1_every,
                   help=f"steps between R1 penalty steps (default {d.r1_every})")
    p.add_argument("--gp", type=float, default=d.gp, metavar="LAMBDA",
                   help="WGAN-GP gradient penalty weight, at points between real and fake "
                   "(0: off; 10 is the paper's)")
    p.add_argument("--grad-checkpoint", action="store_true",
                   help="recompute the attention blocks in backward")
    p.add_argument("--data", default=None,
                   help="'fashion-mnist' (default) or a folder of images")
    p.add_argument("--data-limit", type=int, default=None, help="use the first N images")
    p.add_argument("--out", default=d.out)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--sample-every", type=int, default=d.sample_every)
    p.add_argument("--ckpt-every", type=int, default=d.ckpt_every)
    p.add_argument("--eval-every", type=int, default=d.eval_every,
                   help="evaluate FID/SWD every N steps (the plateau schedule needs it, or "
                   "a budget's --eval-fractions; 0: at the end only)")
    p.add_argument("--eval-samples", type=int, default=d.eval_samples)
    p.add_argument("--swd-samples", type=int, default=d.swd_samples)
    p.add_argument("--log-every", type=int, default=d.log_every)
    p.add_argument("--resume", action="store_true",
                   help="continue each run from its checkpoint.pt (a budget keeps its clock "
                   "and the evaluations already done)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per process")
    p.add_argument("--in-process", action="store_true",
                   help="train the variants in this process (no subprocess per variant)")
    p.add_argument("--no-reference", action="store_true",
                   help="skip the real-vs-real reference row (and line) of the report")
    _add_device_option(p)


def _train_gan(parser, args) -> int:
    import dataclasses
    import os

    def fail(msg: str) -> int:
        msg = msg.removeprefix("attn2d train-gan: ")
        print(f"attn2d train-gan: error: {msg}", file=sys.stderr)
        return 2

    if args.report is not None:
        if not _tools_present("train-gan --report", "matplotlib"):
            return 2
        from .gan import budget_report

        try:
            budget_report.write(args.report, reference=not args.no_reference)
        except (ValueError, FileNotFoundError) as err:
            return fail(str(err))
        return 0
    if not _tools_present("train-gan", "PIL"):
        return 2
    if args.budget_minutes is not None and not _tools_present("train-gan --budget-minutes",
                                                              "matplotlib"):
        return 2
    from .gan import budget, train

    if args.budget_minutes is not None and args.steps is not None:
        return fail("--steps and --budget-minutes: a budget run stops on time, not at a step "
                    "count; give one of them")
    if args.eval_fractions is not None and args.budget_minutes is None:
        return fail("--eval-fractions are fractions of --budget-minutes; add --budget-minutes")
    try:
        fractions = (budget.parse_fractions(args.eval_fractions)
                     if args.eval_fractions is not None else budget.DEFAULT_FRACTIONS)
        seeds = budget.parse_seeds(args.seeds) if args.seeds is not None else None
    except ValueError as err:
        return fail(str(err))

    try:
        sizes = None
        if args.window_sizes:
            sizes = tuple(int(s) for s in args.window_sizes.split(","))
    except ValueError:
        return fail(f"--window-sizes must be comma-separated ints; got {args.window_sizes!r}")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants:
        return fail("--variants is empty")
    if args.threads is not None:
        if args.threads < 1:
            return fail(f"--threads must be >= 1; got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)
    cfg = train.TrainConfig(
        steps=args.steps if args.steps is not None else train.TrainConfig.steps,
        budget_minutes=args.budget_minutes, eval_fractions=fractions, clock=args.clock,
        pause_after_minutes=args.pause_after_minutes, batch=args.batch, res=args.res,
        width=args.width, attn_res=args.attn_res, heads=args.heads, pool_kv=args.pool_kv, window_sizes=sizes,
        lr_g=args.lr_g, lr_d=args.lr_d, bf16=args.bf16, r1=args.r1, r1_every=args.r1_every,
        gp=args.gp, grad_checkpoint=args.grad_checkpoint,
        data=args.data, data_limit=args.data_limit, out=args.out, seed=args.seed,
        sample_every=args.sample_every, ckpt_every=args.ckpt_every,
        eval_every=args.eval_every, eval_samples=args.eval_samples,
        swd_samples=args.swd_samples, log_every=args.log_every, resume=args.resume,
        device=args.device)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        import torch
        import torch.distributed as dist

        if args.device == "cuda":
            # One GPU a rank: torchrun's LOCAL_RANK picks it before NCCL starts.
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    try:
        for v in variants:
            for seed in seeds or (cfg.seed,):
                dataclasses.replace(cfg, variant=v, seed=seed).check()
        train.run(cfg, variants, subprocesses=not args.in_process,
                  reference=not args.no_reference, seeds=seeds)
        if distributed:
            # Both ranks finish their collectives before either tears gloo down: otherwise a
            # rank can abort in teardown ("terminate called without an active exception",
            # SIGABRT).
            import torch.distributed as dist

            dist.barrier()
    except (ValueError, FileNotFoundError) as err:
        return fail(str(err))
    finally:
        if distributed:
            import torch.distributed as dist

            dist.destroy_process_group()
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
    p.add_argument("--block", choices=("progan", "sagan", "custom"), default="progan",
                   help="progan: both attention blocks of the ProGAN generator (LayerNorm + "
                   "nn.MultiheadAttention, and the conv block); sagan: the SAGAN/BigGAN block; "
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
    p.add_argument("--validate", action="store_true",
                   help="measure the model on this machine instead of planning: on --device cpu "
                   "the ProGAN blocks' peak memory in fp32 training; on --device cuda every "
                   "exact row that runs on this GPU (torch.cuda.max_memory_allocated, time)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="where --validate measures (default: cpu)")
    p.add_argument("--tables", type=_tables_arg, default=None, metavar="resolution,hardware",
                   help="print the SAGAN block's reference tables, computed: resolution (memory "
                   "against resolution), hardware (what each device preset trains); a comma list")


def _tables_arg(text: str) -> tuple[str, ...]:
    from .planner import REFERENCE_TABLES

    items = tuple(t.strip() for t in text.split(","))
    bad = [t for t in items if t not in REFERENCE_TABLES]
    if bad or not items:
        raise argparse.ArgumentTypeError(
            f"expected a comma list of {', '.join(REFERENCE_TABLES)}; got {text!r}")
    return items


def _plan(parser, args) -> int:
    import json

    from . import planner

    try:
        if args.tables:
            print(planner.reference_tables(args.channels, args.tables))
            return 0
        if args.res is None:
            parser.error("plan: --res is required (or --tables)")
        setting = planner.Setting(
            args.res, args.width if args.width is not None else args.res, args.batch,
            args.dtype, not args.inference, planner.Pattern.parse(args.pattern),
            args.downsample, args.checkpoint,
        )
        if args.block == "progan":
            blocks = planner.progan_blocks(args.channels)
        elif args.block == "sagan":
            blocks = [planner.sagan_block(args.channels)]
        else:
            blocks = [planner.Block("custom conv block", "conv", args.channels, heads=args.heads,
                                    qk_channels=args.qk_channels, v_channels=args.v_channels,
                                    pool_kv=args.pool)]
        if args.device is not None and not args.validate:
            raise ValueError("--device says where --validate measures; add --validate")
        if args.validate:
            if args.gpu is not None or args.memory is not None:
                raise ValueError("--validate measures this machine: leave out --gpu and --memory")
            validations = [planner.validate(b, setting, args.device or "cpu") for b in blocks]
        else:
            plans = [planner.plan(b, setting, device=args.gpu, memory_gib=args.memory)
                     for b in blocks]
    except (ValueError, TypeError) as err:
        print(f"attn2d plan: error: {err}", file=sys.stderr)
        return 2
    if args.validate:
        if args.json:
            print(json.dumps([planner.validation_to_dict(v) for v in validations], indent=2))
        else:
            print("\n\n".join(planner.format_validation(v) for v in validations))
        return 1 if any(v.problems for v in validations) else 0
    if args.json:
        print(json.dumps([planner.plan_to_dict(p) for p in plans], indent=2))
    else:
        print("\n\n".join(planner.format_plan(p) for p in plans))
    return 0


if __name__ == "__main__":
    sys.exit(main())
