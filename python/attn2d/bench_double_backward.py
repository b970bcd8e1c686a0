"""`attn2d bench --double-backward`: an R1 discriminator step through attention, attn2d against
the only peer that can take it, torch's math path (SDPA's fused CPU and CUDA kernels and
FlexAttention have no double backward).

The step: a SAGAN attention block (attn2d.nn.SelfAttention2d, q/k at C/8, v at C/2, keys pooled
2x2), global or YLG-SAGAN's (8 heads, YLG(8)), as the discriminator's block, its output read out
by fixed weights as the score D(x); the R1 penalty |dD/dx|^2 from autograd.grad(...,
create_graph=True); the penalty's backward to the weights and the input. Both implementations
run the same module and weights: the peer is the block under attn2d.use_backend("sdpa") with
SDPA's math kernel, a pattern given to it as its dense mask (SDPA has no sparse patterns). The
two penalties are checked to agree before timing. Times are interleaved rep by rep
in one process, the order reversed every other rep (attn2d.bench.time_training_steps), and
reported as each side's median and the median of per-rep ratios, with both sides' per-rep times
(runs_s); peak memory is the resident set's growth over one step in a fresh process per
implementation (attn2d._probe)."""

from __future__ import annotations

import contextlib
from typing import Optional

import torch

from .memory import format_bytes, measure

IMPLS = ("attn2d", "math")
PATTERNS = ("global", "ylg")
# What the ratio of bench_double_backward.json is, written into it for its readers.
RATIOS = ("speedup_median_of_ratios: the median over reps of math's step time over attn2d's in "
          "the same rep, the two interleaved in alternating order; median_s: each side's median "
          "of its own runs_s")


def _context(impl: str):
    if impl == "attn2d":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from .backends import use_backend

    stack = contextlib.ExitStack()
    stack.enter_context(use_backend("sdpa"))
    stack.enter_context(sdpa_kernel(SDPBackend.MATH))
    return stack


def make_block(channels: int, seed: int = 0, pattern: str = "global") -> torch.nn.Module:
    """The block: global with one head, or "ylg": 8 heads with YLG(8), as YLG-SAGAN's."""
    from .nn import SelfAttention2d
    from .patterns import YLG

    if pattern not in PATTERNS:
        raise ValueError(f"attn2d.bench_double_backward: pattern must be one of {PATTERNS}; got "
                         f"{pattern!r}")
    torch.manual_seed(seed)
    block = SelfAttention2d(channels) if pattern == "global" else \
        SelfAttention2d(channels, heads=8, pattern=YLG(8))
    with torch.no_grad():
        block.gamma.fill_(0.5)  # 0 at initialisation would cut attention out of the gradient
    return block


def r1_penalty_fn(impl: str, module: torch.nn.Module, readout: torch.Tensor):
    """f(x) -> the R1 penalty |d D(x) / dx|^2 with D(x) = <module(x), readout>, computed through
    `impl`'s attention; its backward is the rest of the step."""
    if impl not in IMPLS:
        raise ValueError(f"attn2d.bench_double_backward: impl must be one of {IMPLS}; got "
                         f"{impl!r}")

    masks = {}

    def fn(x):
        with _context(impl), _dense_mask_peer(impl, module, masks):
            score = (module(x) * readout).sum()
            grad_x, = torch.autograd.grad(score, (x,), create_graph=True)
            return grad_x.square().sum()

    return fn


@contextlib.contextmanager
def _dense_mask_peer(impl: str, module: torch.nn.Module, masks: dict):
    """For the math peer of a block with a pattern: the block's attention call as SDPA over the
    pattern's dense mask (what torch offers for a sparse pattern), the rest of the block
    unchanged. `masks` keeps the masks built, by grid, so that steps do not time building
    them."""
    if impl == "attn2d" or module.pattern is None:
        yield
        return
    from unittest import mock

    import torch.nn.functional as F

    from .nn import self_attention2d

    def dense_attention2d(q, k, v, pattern, scale):
        grids = (pattern, tuple(q.shape[2:4]), tuple(k.shape[2:4]))
        if grids not in masks:
            masks[grids] = pattern.dense_mask(grids[1], grids[2], q.shape[1])
        o = F.scaled_dot_product_attention(q.flatten(2, 3), k.flatten(2, 3), v.flatten(2, 3),
                                           attn_mask=masks[grids], scale=scale)
        return o.unflatten(2, q.shape[2:4])

    with mock.patch.object(self_attention2d, "attention2d", dense_attention2d):
        yield


def _inputs(channels: int, res: int, batch: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, channels, res, res, generator=gen)
    return x, torch.randn(channels, res, res, generator=gen)


def r1_step(impl: str, channels: int, res: int, batch: int = 1, seed: int = 0,
            pattern: str = "global"):
    """(fn, module, x) for one R1 step in a process of its own (attn2d._probe): fn() returns
    the penalty."""
    _check_sizes(channels, res, 1)
    module = make_block(channels, seed, pattern)
    x, readout = _inputs(channels, res, batch, seed)
    x.requires_grad_()
    penalty = r1_penalty_fn(impl, module, readout)
    return (lambda: penalty(x)), module, x


def _check_sizes(channels: int, res: int, reps: int) -> None:
    fn = "attn2d.bench_double_backward"
    for name, value, least in (("channels", channels, 8), ("res", res, 2), ("reps", reps, 1)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{fn}: {name} must be an int; got {type(value).__name__}")
        if value < least:
            raise ValueError(f"{fn}: {name} must be >= {least}; got {value}")
    if channels % 8:
        raise ValueError(f"{fn}: channels must be a multiple of 8 (q and k at channels // 8); "
                         f"got {channels}")


def check_agreement(fns, x: torch.Tensor) -> float:
    """The relative difference of the two implementations' penalties on x; raises RuntimeError
    past float32 noise (a peer that computes something else would make the timing meaningless)."""
    values = [fn(x.detach().requires_grad_()).item() for fn in fns]
    diff = abs(values[0] - values[1]) / max(abs(values[1]), 1e-30)
    if not diff <= 1e-3:
        raise RuntimeError(f"attn2d.bench_double_backward: the penalties disagree: {values}")
    return diff


def run_case(channels: int, res: int, reps: int, with_memory: bool = True,
             pattern: str = "global") -> dict:
    _check_sizes(channels, res, reps)
    from .bench import paired_speedup, time_training_steps

    module = make_block(channels, pattern=pattern)
    x, readout = _inputs(channels, res, 1, 0)
    fns = [r1_penalty_fn(impl, module, readout) for impl in IMPLS]
    agreement = check_agreement(fns, x)
    attn2d_run, math_run = time_training_steps(fns, [x], reps)
    row = {"pattern": pattern, "heads": module.heads, "penalty_relative_difference": agreement,
           "channels": channels, "res": res, "queries": res * res,
           "keys": (res // 2) * (res // 2), "reps": reps,
           "median_s": {"attn2d": attn2d_run["fwd_bwd_s"], "math": math_run["fwd_bwd_s"]},
           "speedup_median_of_ratios": paired_speedup(math_run, attn2d_run, "fwd_bwd"),
           "runs_s": {"attn2d": attn2d_run["fwd_bwd_runs_s"], "math": math_run["fwd_bwd_runs_s"]}}
    if with_memory:
        row["peak_bytes"], row["peak_failed"] = {}, {}
        for impl in IMPLS:
            try:
                row["peak_bytes"][impl] = measure(
                    {"r1": True, "impl": impl, "channels": channels, "res": res,
                     "pattern": pattern}, timeout=900)["peak_above_baseline_bytes"]
            except RuntimeError as e:  # e.g. the kernel's OOM killer: the step did not fit
                row["peak_bytes"][impl] = None
                row["peak_failed"][impl] = str(e).splitlines()[0]
    return row


def run(resolutions=(64, 128), channels: int = 64, reps: int = 5, with_memory: bool = True,
        patterns=PATTERNS, log=lambda line: None) -> list[dict]:
    """run_case for every pattern and resolution, each announced through `log`."""
    rows = []
    for pattern in patterns:
        for res in resolutions:
            log(f"R1 step through a {pattern} block at {res}x{res}: attn2d and the math path "
                f"interleaved, {reps} reps")
            rows.append(run_case(channels, res, reps, with_memory, pattern))
    return rows


def machine_name() -> str:
    """The CPU (attn2d._machine.cpu_name) and the kernels' SIMD target."""
    import attn2d

    from ._machine import cpu_name

    return f"{cpu_name()}, {attn2d.cpu_simd_target()} kernels"


def write(out_dir: str, rows: list[dict]) -> str:
    """Writes bench_double_backward.json and .md under out_dir; returns the markdown."""
    import json
    import os

    os.makedirs(out_dir, exist_ok=True)
    text = markdown(rows, machine_name())
    with open(os.path.join(out_dir, "bench_double_backward.json"), "w") as f:
        json.dump({"machine": machine_name(), "torch": torch.__version__, "ratios": RATIOS,
                   "rows": rows}, f, indent=2)
    with open(os.path.join(out_dir, "bench_double_backward.md"), "w") as f:
        f.write(text)
    return text


def markdown(rows: list[dict], machine: str) -> str:
    lines = [f"R1 step (forward, grad with create_graph, penalty backward) through "
             f"SelfAttention2d, on {machine}, torch {torch.__version__}, "
             f"{torch.get_num_threads()} threads. attn2d and math interleaved rep by rep, the "
             "order reversed every other rep; medians of each side's own steps; the speed-up is "
             "the median over reps of math's time over attn2d's in the same rep; the math path "
             "takes a pattern as its dense mask.", "",
             "| block | map | queries x keys | attn2d median | math median | speed-up (median of "
             "per-rep ratios) | attn2d peak | math peak |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        block = "global" if r.get("pattern", "global") == "global" else \
            f"YLG(8), {r.get('heads', 8)} heads"
        lines.append(
            f"| {block} | {r['res']}x{r['res']} (C={r['channels']}) | "
            f"{r['queries']:,} x {r['keys']:,} | "
            f"{r['median_s']['attn2d']:.3f} s | {r['median_s']['math']:.3f} s | "
            f"{r['speedup_median_of_ratios']:.2f}x | "
            f"{_peak_cell(r, 'attn2d')} | {_peak_cell(r, 'math')} |")
    return "\n".join(lines) + "\n"


def _peak_cell(row: dict, impl: str) -> str:
    peak = row.get("peak_bytes", {})
    if impl not in peak:
        return "-"
    if peak[impl] is None:
        failed = row.get("peak_failed", {}).get(impl, "")
        return "killed (out of memory)" if "exit -9" in failed else "failed"
    return format_bytes(peak[impl])
