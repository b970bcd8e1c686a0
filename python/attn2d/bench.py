"""`attn2d bench`: attn2d side by side with PyTorch's CPU attention paths, in one run.

Every case runs attn2d and each peer (attn2d.peers) on the same inputs, in the same process:
forward (recording for autograd), backward and forward+backward of training steps after a
warm-up. attn2d on fp32 and on bf16 inputs run interleaved rep by rep for at least
`paired_seconds` and `reps` reps; each peer runs interleaved with attn2d of its own for `reps`
reps; every interleave reverses its order every other rep (rep_order). Each time is the median
of that implementation's own runs; each ratio is the median over reps of the two times of one
rep (paired_speedup), never a ratio of two medians. Rates are
GFLOP/s (forward 2*B*H*Lq*Lk*(E+Ev), backward 2.5x that) and the fraction of the FMA peak that
the harness measures on this machine first. Peak memory comes from a fresh subprocess per case
and implementation (attn2d.memory.measure). A peer that refuses the input (the CPU flash kernel
when Ev != E) is reported with torch's reason. Writes bench.json, bench.md and bench.png."""

from __future__ import annotations

import gc
import json
import math
import os
import resource
import statistics
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import torch

from ._machine import cpu_name
from .memory import format_bytes, measure
from .peers import PEERS


@dataclass(frozen=True)
class Case:
    name: str
    B: int
    H: int
    Lq: int
    Lk: int
    E: int
    Ev: int

    def forward_flops(self) -> float:
        return 2.0 * self.B * self.H * self.Lq * self.Lk * (self.E + self.Ev)


def default_cases() -> list[Case]:
    cases = []
    for side in (64, 128):
        n = side * side
        for ev in (64, 32):
            cases.append(Case(f"SAGAN {side}x{side} E=8 Ev={ev}", 1, 1, n, n, 8, ev))
            cases.append(Case(f"SAGAN {side}x{side} E=8 Ev={ev} pooled keys", 1, 1, n, n // 4, 8, ev))
        cases.append(Case(f"ProGAN MHA {side}x{side} 4x16", 1, 4, n, n, 16, 16))
    for n in (196, 1024, 4096):
        cases.append(Case(f"ViT-B N={n}", 1, 12, n, n, 64, 64))
    for m in (77, 1024):
        cases.append(Case(f"cross-attention 4096 over {m}", 1, 8, 4096, m, 64, 64))
    return cases


def quick_cases() -> list[Case]:
    return [Case("SAGAN 32x32 E=8 Ev=64", 1, 1, 1024, 1024, 8, 64),
            Case("ViT-B N=196", 1, 12, 196, 196, 64, 64)]


def time_training_step(fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor],
                       reps: int) -> dict:
    """Medians over `reps` training steps (after one warm-up) of the forward (with autograd
    recording, as in training), the backward, and the two together, all from the same runs."""
    return time_training_steps([fn], inputs, reps)[0]


def _minor_faults() -> int:
    """Page faults the process has taken that needed no disk (every thread's): memory that
    malloc handed back to the system and a step then touches anew (docs/benchmarks.md)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


ORDERS = ("alternate", "fixed")
# The paired runs' times that paired_speedup takes a ratio of.
RUN_KEYS = ("forward", "backward", "fwd_bwd")


def rep_order(count: int, rep: int, order: str = "alternate") -> list[int]:
    """The order in which `count` interleaved implementations run in rep `rep` (counted from 0).
    "alternate": as listed in even reps, reversed in odd ones (A B, B A, A B, ...: ABBA for a
    pair), so that over two reps each implementation runs once in each position, and a cost of
    the position (what ran just before: the caches, the memory system's state after a long
    step) is shared out instead of landing on one side of every ratio. "fixed": as listed in
    every rep, where the order is what is measured (the pattern bench's step right after a
    global one)."""
    for name, value in (("count", count), ("rep", rep)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"rep_order: {name} must be an int; got {type(value).__name__}")
    if count < 0 or rep < 0:
        raise ValueError(f"rep_order: count and rep must be >= 0; got {count} and {rep}")
    if order not in ORDERS:
        raise ValueError(f"rep_order: order must be one of {ORDERS}; got {order!r}")
    forward = list(range(count))
    return forward[::-1] if order == "alternate" and rep % 2 else forward


def time_training_steps(fns: list[Callable[..., torch.Tensor]], inputs: list[torch.Tensor],
                        reps: int, per_fn_inputs: Optional[list[list[torch.Tensor]]] = None,
                        min_seconds: float = 0.0, *, order: str = "alternate",
                        backward: bool = True,
                        clock: Callable[[], float] = time.perf_counter) -> list[dict]:
    """time_training_step of each of fns, their runs interleaved (rep 1 of every fn, then rep 2,
    ...; within a rep in rep_order(len(fns), rep, order), by default reversed every other rep):
    a shared machine's speed drifts over seconds to minutes (by up to 30% on two AMD Zen 5
    cores of a virtual machine), and a ratio of two implementations timed minutes apart carries
    that drift, where interleaved runs share it. per_fn_inputs, if given, holds each fn's own
    inputs (e.g. fp32 and bf16 copies) in place of the shared `inputs`. Reps go on past `reps`
    until the timed loop has run `min_seconds`: a slow phase of the machine (seconds long, while
    other work takes a core) then covers a minority of the reps of a short case instead of all
    of them. Each result keeps its per-rep times (forward_runs_s, backward_runs_s,
    fwd_bwd_runs_s; rep i of every fn at index i) for paired_speedup, their medians (forward_s,
    backward_s, fwd_bwd_s), and the medians of the page faults the process took during each
    timed forward and backward (forward_faults, backward_faults, counted outside the timed
    spans): glibc may give the top of its heap back after every call, and then each step faults
    its outputs in anew, which can cost a short step more than its arithmetic
    (docs/benchmarks.md), so a run can show whether its steps paid that. With backward=False
    only forwards run (still recording for autograd where the inputs ask for it), for a peer
    without a backward, and the results hold the forward keys alone. `clock` (seconds) times the
    steps and the loop."""
    if not isinstance(fns, (list, tuple)) or not fns or not all(callable(f) for f in fns):
        raise TypeError("time_training_steps: fns must be a non-empty list of callables")
    if isinstance(reps, bool) or not isinstance(reps, int):
        raise TypeError(f"time_training_steps: reps must be an int; got {type(reps).__name__}")
    if reps < 1:
        raise ValueError(f"time_training_steps: reps must be >= 1; got {reps}")
    if not min_seconds >= 0:
        raise ValueError(f"time_training_steps: min_seconds must be >= 0; got {min_seconds}")
    if order not in ORDERS:
        raise ValueError(f"time_training_steps: order must be one of {ORDERS}; got {order!r}")
    if not callable(clock):
        raise TypeError(f"time_training_steps: clock must be callable; got "
                        f"{type(clock).__name__}")
    if per_fn_inputs is not None and len(per_fn_inputs) != len(fns):
        raise ValueError(f"time_training_steps: per_fn_inputs has {len(per_fn_inputs)} lists for "
                         f"{len(fns)} functions")
    sources = per_fn_inputs if per_fn_inputs is not None else [inputs] * len(fns)
    leaves = [[t.detach().requires_grad_() for t in ts] for ts in sources]
    grads = []
    for fn, ls in zip(fns, leaves):
        out = fn(*ls)  # warm-up (and the refusal, if any)
        if backward:
            grads.append(torch.randn(out.shape, dtype=out.dtype))
            out.backward(grads[-1])
    # Each backward reads its output gradient from a buffer written just before it (untimed), as
    # a network's backward finds it, just written by the layer above. A gradient last written a
    # whole interleaved round earlier has left the caches and slows the short steps (the 128x128
    # YLG backward by ~12% on two Intel Xeon cores); every function of the round gets the same
    # treatment.
    fresh = [torch.empty_like(g) for g in grads]
    fwd: list[list[float]] = [[] for _ in fns]
    bwd: list[list[float]] = [[] for _ in fns]
    fwd_faults: list[list[int]] = [[] for _ in fns]
    bwd_faults: list[list[int]] = [[] for _ in fns]
    # Python's cyclic collector off while timing, as timeit does: a full collection walks every
    # object torch has loaded (112 ms on an AMD Zen 5 core) and lands in whichever step happens
    # to allocate past its threshold.
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        start = clock()
        rep = 0
        while rep < reps or clock() - start < min_seconds:
            for i in rep_order(len(fns), rep, order):
                fn = fns[i]
                # Each step starts with the leaves' .grad cleared, as optimizer.zero_grad() does by
                # default (set_to_none): the backward's gradients then become .grad as they are,
                # where summing them into the last step's .grad would cost a pass over three
                # inputs' worth of memory that a network, whose q, k, v come out of earlier
                # layers, never pays. Every function's leaves, not only this one's: a network's
                # gradients of q, k and v live until the layer below has used them, not through
                # the steps of other layers, and kept alive they would put each step's new
                # buffers in memory last touched rounds earlier (YLG 128x128's backward ~12%
                # slower on two Intel Xeon cores).
                for ls in leaves:
                    for t in ls:
                        t.grad = None
                f0 = _minor_faults()
                t0 = clock()
                out = fn(*leaves[i])
                t1 = clock()
                f1 = _minor_faults()
                fwd[i].append(t1 - t0)
                fwd_faults[i].append(f1 - f0)
                if not backward:
                    continue
                fresh[i].copy_(grads[i])  # untimed: the layer above writing the gradient
                b0 = _minor_faults()
                t2 = clock()
                out.backward(fresh[i])
                t3 = clock()
                b1 = _minor_faults()
                bwd[i].append(t3 - t2)
                bwd_faults[i].append(b1 - b0)
            rep += 1
    finally:
        if gc_was_enabled:
            gc.enable()
    if not backward:
        return [{"forward_s": statistics.median(f), "forward_runs_s": f,
                 "forward_faults": statistics.median(ff)} for f, ff in zip(fwd, fwd_faults)]
    return [{"forward_s": statistics.median(f), "backward_s": statistics.median(b),
             "fwd_bwd_s": statistics.median([x + y for x, y in zip(f, b)]),
             "forward_runs_s": f, "backward_runs_s": b,
             "fwd_bwd_runs_s": [x + y for x, y in zip(f, b)],
             "forward_faults": statistics.median(ff), "backward_faults": statistics.median(bf)}
            for f, b, ff, bf in zip(fwd, bwd, fwd_faults, bwd_faults)]


def paired_speedup(slow: dict, fast: dict, key: str) -> float:
    """The median over reps of slow's time / fast's time in the same rep, for two results of
    one time_training_steps call (key: "forward", "backward" or "fwd_bwd"; their
    "{key}_runs_s" lists, rep i at index i). Each pair ran seconds apart at most and shares the
    machine's speed of the moment; the ratio of the two medians mixes reps from different
    moments."""
    if key not in RUN_KEYS:
        raise ValueError(f"paired_speedup: key must be one of {RUN_KEYS}; got {key!r}")
    name = f"{key}_runs_s"
    if name not in slow or name not in fast:
        raise ValueError(f"paired_speedup: both results need {name}")
    a, b = slow[name], fast[name]
    if len(a) != len(b):
        raise ValueError(f"paired_speedup: {len(a)} and {len(b)} runs are not paired")
    if not a:
        raise ValueError("paired_speedup: no runs")
    return statistics.median(x / y for x, y in zip(a, b))


def paired_runs(ours: dict) -> dict:
    """attn2d's per-rep times `ours` under the keys attn2d_forward_runs_s, ... (those it has),
    for the row of a peer whose ratios were taken against them where they are not the report's
    own attn2d row: a reader of the JSON can recompute the ratios from that row alone."""
    return {f"attn2d_{key}_runs_s": ours[f"{key}_runs_s"] for key in RUN_KEYS
            if f"{key}_runs_s" in ours}


def _add_rates(r: dict, case: Case) -> dict:
    """GFLOP/s of a timing: forward 2*B*H*Lq*Lk*(E+Ev) FLOPs, backward 2.5x that."""
    fl = case.forward_flops()
    r["forward_gflops"] = fl / r["forward_s"] / 1e9
    r["backward_gflops"] = 2.5 * fl / r["backward_s"] / 1e9
    return r


# attn2d's interleaved pairs (fp32 / bf16, 1 / all threads) whose ratios are targets run at least
# this long, so that a slow phase of the machine, seconds long, covers a minority of their reps
# (a 64x64 SAGAN step takes 10 ms on two AMD Zen 5 cores). Each peer's pair with attn2d runs
# `reps` reps: those ratios are not targets, and a peer's step, over its score matrices, is long.
PAIRED_SECONDS = 4.0

# What every ratio of bench.json is, written into it for its readers.
RATIOS = ("attn2d_speedup_*, bf16_speedup_*, attn2d_scaling_*: the median over reps of the two "
          "times of one rep, the two sides interleaved rep by rep in alternating order; a peer's "
          "attn2d side is its row's attn2d_*_runs_s, attn2d-bf16's the attn2d row's runs, "
          "attn2d-1thread's the all-thread runs in its attn2d_*_runs_s")

ACCURACY_ROWS = 256  # query rows checked against float64 (rows are independent)


def bf16_accuracy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> dict:
    """Forward error of attn2d's bfloat16 kernel and of naive bfloat16 attention against
    float64 attention on the same rounded inputs, over the first ACCURACY_ROWS query rows."""
    import attn2d

    qb, kb, vb = q[:, :, :ACCURACY_ROWS].bfloat16(), k.bfloat16(), v.bfloat16()
    ref = torch.softmax(qb.double() @ kb.double().transpose(-1, -2) * scale, -1) @ vb.double()
    naive = torch.softmax(qb @ kb.transpose(-1, -2) * scale, -1) @ vb
    ours = attn2d.attention(qb, kb, vb, scale=scale)
    err = float((ours.double() - ref).abs().max())
    naive_err = float((naive.double() - ref).abs().max())
    return {"error": err, "naive_bf16_error": naive_err, "within_2x_rule": err <= 2 * naive_err}


def _check_run_args(reps: int, paired_seconds: float) -> None:
    if isinstance(reps, bool) or not isinstance(reps, int):
        raise TypeError(f"attn2d bench: reps must be an int; got {type(reps).__name__}")
    if reps < 1:
        raise ValueError(f"attn2d bench: reps must be >= 1; got {reps}")
    if not paired_seconds >= 0:
        raise ValueError(f"attn2d bench: paired_seconds must be >= 0; got {paired_seconds}")


def _add_paired_ratios(r: dict, ours: dict) -> None:
    """r's attn2d_speedup_{forward,backward,fwd_bwd}: the median over reps of r's time over
    attn2d's in the same rep, `ours` being attn2d's runs interleaved with r's."""
    for key in RUN_KEYS:
        r[f"attn2d_speedup_{key}"] = paired_speedup(r, ours, key)


def run_case(case: Case, reps: int, peers: list[str], with_memory: bool,
             thread_scaling: bool = False, paired_seconds: float = PAIRED_SECONDS) -> dict:
    """attn2d (fp32 and bf16, interleaved), each of `peers` interleaved with attn2d, and with
    thread_scaling attn2d on one thread interleaved with all threads, on `case`."""
    import attn2d

    _check_run_args(reps, paired_seconds)
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise ValueError(f"attn2d bench: unknown peers {unknown}; choose from {list(PEERS)}")
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(case.B, case.H, case.Lq, case.E, generator=gen)
    k = torch.randn(case.B, case.H, case.Lk, case.E, generator=gen)
    v = torch.randn(case.B, case.H, case.Lk, case.Ev, generator=gen)
    scale = 1.0 / math.sqrt(case.E)

    fp32 = [q, k, v]

    def ours_fn(*t):
        return attn2d.attention(*t, scale=scale)

    # attn2d on fp32 and on bf16 inputs interleaved rep by rep: their ratio is a target (1.5x),
    # and timed apart, with the peers in between, it would carry the machine's drift. bf16
    # inputs are leaves, as under autocast: the cast is not timed.
    ours_fp32, ours_bf16 = time_training_steps(
        [ours_fn, ours_fn], [], reps, per_fn_inputs=[fp32, [t.bfloat16() for t in fp32]],
        min_seconds=paired_seconds)
    ours_bf16["bf16_speedup_forward"] = paired_speedup(ours_fp32, ours_bf16, "forward")
    ours_bf16["bf16_speedup_backward"] = paired_speedup(ours_fp32, ours_bf16, "backward")
    _add_paired_ratios(ours_bf16, ours_fp32)
    results = {"attn2d": ours_fp32}
    for name in peers:
        # Each peer interleaved with attn2d of its own: a ratio of the peer's median over
        # attn2d's, timed minutes apart, would carry the machine's drift between them. attn2d's
        # runs of the pair go into the peer's row (attn2d_*_runs_s); the attn2d row keeps the
        # runs of its pair with bf16.
        peer = PEERS[name]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                ours, r = time_training_steps(
                    [ours_fn, lambda *t, f=peer: f(*t, scale)], fp32, reps)
            except RuntimeError as err:
                reasons = [str(w.message) for w in caught if "kernel not used" not in str(w.message)]
                results[name] = {"refused": (reasons[-1] if reasons else str(err)).splitlines()[0]}
                continue
        _add_paired_ratios(r, ours)
        r.update(paired_runs(ours))
        results[name] = r
    results["attn2d-bf16"] = ours_bf16
    for name, r in results.items():
        if "refused" in r:
            continue
        _add_rates(r, case)
        if with_memory:
            impl, dtype = ("attn2d", "bfloat16") if name == "attn2d-bf16" else (name, "float32")
            m = measure(dict(impl=impl, dtype=dtype, B=case.B, H=case.H, Lq=case.Lq, Lk=case.Lk,
                             E=case.E, Ev=case.Ev))
            r["peak_bytes"] = m["peak_above_baseline_bytes"]
    ours_bf16["accuracy"] = bf16_accuracy(q, k, v, scale)
    if thread_scaling:
        # One thread and all of them interleaved rep by rep, as fp32 and bf16 are: the scaling
        # is their ratio (attn2d_scaling_*), the 1-thread row's times are from these runs, and
        # so is its ratio against attn2d (attn2d_speedup_*: against the all-thread runs of the
        # pair, kept in the row as attn2d_*_runs_s).
        threads = torch.get_num_threads()

        def on_threads(n):
            def fn(*t):
                torch.set_num_threads(n)
                return ours_fn(*t)
            return fn

        try:
            many, one = time_training_steps([on_threads(threads), on_threads(1)], fp32, reps,
                                            min_seconds=paired_seconds)
        finally:
            torch.set_num_threads(threads)
        one["attn2d_scaling_forward"] = paired_speedup(one, many, "forward")
        one["attn2d_scaling_backward"] = paired_speedup(one, many, "backward")
        _add_paired_ratios(one, many)
        one.update(paired_runs(many))
        results["attn2d-1thread"] = _add_rates(one, case)
    return {"case": asdict(case), "results": results}


def _markdown(report: dict) -> str:
    peak = report["fma_peak_gflops"]
    lines = [
        "# attn2d bench",
        "",
        f"{report['machine']}; FMA peak measured {peak:.0f} GFLOP/s (float32, "
        f"{report['threads']} threads, the best of 10 probes). Each time is the median of the "
        f"implementation's own runs, at least {report['reps']} after a warm-up. Each "
        "peer runs interleaved with attn2d rep by rep (the order reversed every other rep); "
        "'x attn2d' is the median over reps of the peer's time over attn2d's in the same rep "
        "(above 1: attn2d is faster), never a ratio of two medians: bench.json holds both "
        "sides' runs (the peer's *_runs_s, attn2d's of the pair attn2d_*_runs_s; bf16's against "
        "the attn2d row's own runs, 1 thread's against all threads').",
        "",
        "| case | implementation | forward | backward | fwd+bwd | fwd GFLOP/s (% peak) | "
        "bwd GFLOP/s | x attn2d fwd / bwd | peak memory |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in report["cases"]:
        for name, r in c["results"].items():
            if "refused" in r:
                lines.append(f"| {c['case']['name']} | {name} | refused: {r['refused'][:90]} "
                             "| | | | | | |")
                continue
            ratio = ("" if name == "attn2d" else
                     f"{r['attn2d_speedup_forward']:.2f} / {r['attn2d_speedup_backward']:.2f}")
            mem = format_bytes(r["peak_bytes"]) if "peak_bytes" in r else ""
            lines.append(
                f"| {c['case']['name']} | {name} | {1e3 * r['forward_s']:.1f} ms | "
                f"{1e3 * r['backward_s']:.1f} ms | {1e3 * r['fwd_bwd_s']:.1f} ms | "
                f"{r['forward_gflops']:.1f} ({100 * r['forward_gflops'] / peak:.0f}%) | "
                f"{r['backward_gflops']:.1f} | {ratio} | {mem} |"
            )
    lines += ["", "attn2d's own variants, each pair interleaved rep by rep for at least "
              f"{report['paired_seconds']:g} s, its ratio the median over reps of the two "
              "times of one rep: bf16 speed = fp32 time / bf16 time (the 1.5x target); error of the first "
              "256 output rows against float64 on the same bf16 inputs vs naive bf16 "
              "attention's (the 2x rule); thread scaling = 1-thread time / "
              f"{report['threads']}-thread time.", "",
              "| case | bf16 speed fwd / bwd | bf16 error / naive bf16 error | "
              "thread scaling fwd / bwd |", "|---|---|---|---|"]
    for c in report["cases"]:
        r = c["results"]
        fp32, b = r["attn2d"], r.get("attn2d-bf16", {})
        if "forward_s" not in b:
            continue
        acc = b["accuracy"]
        one = r.get("attn2d-1thread")
        scaling = (f"{one['attn2d_scaling_forward']:.2f} / {one['attn2d_scaling_backward']:.2f}"
                   if one else "not measured")
        lines.append(
            f"| {c['case']['name']} | {b['bf16_speedup_forward']:.2f} / "
            f"{b['bf16_speedup_backward']:.2f} | {acc['error']:.2e} / "
            f"{acc['naive_bf16_error']:.2e} ({'ok' if acc['within_2x_rule'] else 'FAILS'}) | "
            f"{scaling} |")
    return "\n".join(lines) + "\n"


def _relative_speed(results: dict, impl: str) -> float:
    """impl's forward + backward speed relative to attn2d's for the plot: the median over reps
    of attn2d's time over impl's in the same rep (1 for attn2d, 0 where impl refused or did not
    run)."""
    if impl == "attn2d":
        return 1.0
    r = results.get(impl, {})
    if "fwd_bwd_runs_s" not in r:
        return 0.0
    return paired_speedup({"fwd_bwd_runs_s": r["attn2d_fwd_bwd_runs_s"]}, r, "fwd_bwd")


def _plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [c["case"]["name"] for c in report["cases"]]
    impls = ["attn2d"] + report["peers"]
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(names)), 4.5))
    width = 0.8 / len(impls)
    for i, impl in enumerate(impls):
        ax.bar([x + i * width for x in range(len(names))],
               [_relative_speed(c["results"], impl) for c in report["cases"]], width, label=impl)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(names))], names, rotation=35,
                  ha="right", fontsize=7)
    ax.set_ylabel("speed relative to attn2d (fwd+bwd, median of per-rep ratios)")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.legend(fontsize=8)
    ax.set_title("forward + backward speed relative to attn2d (higher is faster; 0 = refused)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(out_dir: str = "attn2d-report", *, cases: Optional[list[Case]] = None, reps: int = 5,
        peers: Optional[list[str]] = None, with_memory: bool = True,
        thread_scaling: bool = False, paired_seconds: float = PAIRED_SECONDS,
        log: Callable[[str], None] = print) -> dict:
    import attn2d

    from . import _tools

    _check_run_args(reps, paired_seconds)
    _tools.require("attn2d bench", "matplotlib")  # for bench.png, before the cases run
    cases = default_cases() if cases is None else cases
    peers = list(PEERS) if peers is None else peers
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise ValueError(f"attn2d bench: unknown peers {unknown}; choose from {list(PEERS)}")
    # The best of 5 probes before the cases and 5 after: a peak, and on a shared machine a core
    # is at times taken for seconds (one probe read 245 GFLOP/s where two AMD Zen 5 cores run
    # 450).
    probes = [float(torch.ops.attn2d.fma_peak_gflops(0.2)) for _ in range(5)]
    peak = max(probes)
    report = {
        "machine": f"{cpu_name()}, attn2d on "
                   f"{attn2d.cpu_simd_target()} (bf16 on {attn2d.bf16_products()} products), "
                   f"torch {torch.__version__}",
        "threads": torch.get_num_threads(),
        "fma_peak_gflops": peak,
        "reps": reps,
        "paired_seconds": paired_seconds,
        "peers": peers,
        "ratios": RATIOS,
        "cases": [],
    }
    log(f"FMA peak: {peak:.0f} GFLOP/s on {torch.get_num_threads()} threads")
    for i, case in enumerate(cases, 1):
        log(f"[{i}/{len(cases)}] {case.name} ...")
        report["cases"].append(run_case(case, reps, peers, with_memory, thread_scaling,
                                        paired_seconds))
    probes += [float(torch.ops.attn2d.fma_peak_gflops(0.2)) for _ in range(5)]
    report["fma_peak_gflops"] = max(probes)
    report["fma_peak_probes_gflops"] = probes
    log(f"FMA peak: {max(probes):.0f} GFLOP/s, the best of 5 probes before the cases and 5 after")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "bench.json"), "w") as f:
        json.dump(report, f, indent=2)
    md = _markdown(report)
    with open(os.path.join(out_dir, "bench.md"), "w") as f:
        f.write(md)
    _plot(report, os.path.join(out_dir, "bench.png"))
    log(md)
    log(f"written: {out_dir}/bench.json, bench.md, bench.png")
    return report
