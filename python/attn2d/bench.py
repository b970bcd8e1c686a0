"""`attn2d bench`: attn2d side by side with PyTorch's CPU attention paths, in one run.

Every case runs attn2d and each peer (attn2d.peers) on the same inputs, in the same process:
forward (recording for autograd), backward and forward+backward of `reps` training steps after a
warm-up, medians of each. Rates are
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


def time_training_steps(fns: list[Callable[..., torch.Tensor]], inputs: list[torch.Tensor],
                        reps: int, per_fn_inputs: Optional[list[list[torch.Tensor]]] = None,
                        min_seconds: float = 0.0) -> list[dict]:
    """time_training_step of each of fns, their runs interleaved (rep 1 of every fn, then rep 2,
    ...): a shared machine's speed drifts over seconds to minutes (by up to 30% on two AMD Zen 5
    cores of a virtual machine), and a ratio of two implementations timed minutes apart carries
    that drift, where interleaved runs share it. per_fn_inputs, if given, holds each fn's own
    inputs (e.g. fp32 and bf16 copies) in place of the shared `inputs`. Reps go on past `reps`
    until the timed loop has run `min_seconds`: a slow phase of the machine (seconds long, while
    other work takes a core) then covers a minority of the reps of a short case instead of all
    of them. Each result keeps its per-rep times (forward_runs_s, backward_runs_s) for
    paired_speedup, and the medians of the page faults the process took during each timed
    forward and backward (forward_faults, backward_faults, counted outside the timed spans):
    glibc may give the top of its heap back after every call, and then each step faults its
    outputs in anew, which can cost a short step more than its arithmetic (docs/benchmarks.md),
    so a run can show whether its steps paid that."""
    if per_fn_inputs is not None and len(per_fn_inputs) != len(fns):
        raise ValueError(f"time_training_steps: per_fn_inputs has {len(per_fn_inputs)} lists for "
                         f"{len(fns)} functions")
    sources = per_fn_inputs if per_fn_inputs is not None else [inputs] * len(fns)
    leaves = [[t.detach().requires_grad_() for t in ts] for ts in sources]
    grads = []
    for fn, ls in zip(fns, leaves):
        out = fn(*ls)
        grads.append(torch.randn(out.shape, dtype=out.dtype))
        out.backward(grads[-1])  # warm-up (and the refusal, if any)
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
        start = time.perf_counter()
        rep = 0
        while rep < reps or time.perf_counter() - start < min_seconds:
            rep += 1
            for i, fn in enumerate(fns):
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
                t0 = time.perf_counter()
                out = fn(*leaves[i])
                t1 = time.perf_counter()
                f1 = _minor_faults()
                fresh[i].copy_(grads[i])  # untimed: the layer above writing the gradient
                b0 = _minor_faults()
                t2 = time.perf_counter()
                out.backward(fresh[i])
                t3 = time.perf_counter()
                b1 = _minor_faults()
                fwd[i].append(t1 - t0)
                bwd[i].append(t3 - t2)
                fwd_faults[i].append(f1 - f0)
                bwd_faults[i].append(b1 - b0)
    finally:
        if gc_was_enabled:
            gc.enable()
    return [{"forward_s": statistics.median(f), "backward_s": statistics.median(b),
             "fwd_bwd_s": statistics.median([x + y for x, y in zip(f, b)]),
             "forward_runs_s": f, "backward_runs_s": b,
             "fwd_bwd_runs_s": [x + y for x, y in zip(f, b)],
             "forward_faults": statistics.median(ff), "backward_faults": statistics.median(bf)}
            for f, b, ff, bf in zip(fwd, bwd, fwd_faults, bwd_faults)]


def paired_speedup(slow: dict, fast: dict, key: str) -> float:
    """The median over reps of slow's time / fast's time in the same rep, for two results of
    one time_training_steps call (key: "forward", "backward" or "fwd_bwd"). Each pair ran
    seconds apart at most and shares the machine's speed of the moment; the ratio of the two
    medians mixes reps from different moments."""
    a, b = slow[f"{key}_runs_s"], fast[f"{key}_runs_s"]
    if len(a) != len(b):
        raise ValueError(f"paired_speedup: {len(a)} and {len(b)} runs are not paired")
    return statistics.median(x / y for x, y in zip(a, b))


def _add_rates(r: dict, case: Case) -> dict:
    """GFLOP/s of a timing: forward 2*B*H*Lq*Lk*(E+Ev) FLOPs, backward 2.5x that."""
    fl = case.forward_flops()
    r["forward_gflops"] = fl / r["forward_s"] / 1e9
    r["backward_gflops"] = 2.5 * fl / r["backward_s"] / 1e9
    return r


# attn2d's interleaved pairs (fp32 / bf16, 1 / all threads) whose ratios are targets run at least
# this long, so that a slow phase of the machine, seconds long, covers a minority of their reps
# (a 64x64 SAGAN step takes 10 ms on two AMD Zen 5 cores).
PAIRED_SECONDS = 4.0

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


def run_case(case: Case, reps: int, peers: list[str], with_memory: bool,
             thread_scaling: bool = False, paired_seconds: float = PAIRED_SECONDS) -> dict:
    import attn2d

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(case.B, case.H, case.Lq, case.E, generator=gen)
    k = torch.randn(case.B, case.H, case.Lk, case.E, generator=gen)
    v = torch.randn(case.B, case.H, case.Lk, case.Ev, generator=gen)
    scale = 1.0 / math.sqrt(case.E)

    fp32 = [q, k, v]
    # bf16 inputs are leaves, as under autocast: the cast is not timed.
    impls = {"attn2d": (lambda q, k, v, s: attn2d.attention(q, k, v, scale=s), fp32)}
    impls.update({name: (PEERS[name], fp32) for name in peers})
    impls["attn2d-bf16"] = (impls["attn2d"][0], [t.bfloat16() for t in fp32])
    # attn2d on fp32 and on bf16 inputs interleaved rep by rep: their ratio is a target (1.5x),
    # and timed apart, with the peers in between, it would carry the machine's drift.
    ours_fp32, ours_bf16 = time_training_steps(
        [lambda *t, f=impls[name][0]: f(*t, scale) for name in ("attn2d", "attn2d-bf16")], [], reps,
        per_fn_inputs=[impls["attn2d"][1], impls["attn2d-bf16"][1]], min_seconds=paired_seconds)
    ours_bf16["bf16_speedup_forward"] = paired_speedup(ours_fp32, ours_bf16, "forward")
    ours_bf16["bf16_speedup_backward"] = paired_speedup(ours_fp32, ours_bf16, "backward")
    timed = {"attn2d": ours_fp32, "attn2d-bf16": ours_bf16}
    results = {}
    for name, (fn, inputs) in impls.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                r = timed[name] if name in timed else time_training_step(
                    lambda *t: fn(*t, scale), inputs, reps)
            except RuntimeError as err:
                reasons = [str(w.message) for w in caught if "kernel not used" not in str(w.message)]
                results[name] = {"refused": (reasons[-1] if reasons else str(err)).splitlines()[0]}
                continue
        _add_rates(r, case)
        if with_memory:
            impl, dtype = ("attn2d", "bfloat16") if name == "attn2d-bf16" else (name, "float32")
            m = measure(dict(impl=impl, dtype=dtype, B=case.B, H=case.H, Lq=case.Lq, Lk=case.Lk,
                             E=case.E, Ev=case.Ev))
            r["peak_bytes"] = m["peak_above_baseline_bytes"]
        results[name] = r
    results["attn2d-bf16"]["accuracy"] = bf16_accuracy(q, k, v, scale)
    if thread_scaling:
        # One thread and all of them interleaved rep by rep, as fp32 and bf16 are: the scaling
        # is their ratio (attn2d_scaling_*), the 1-thread row's times are from these runs.
        threads = torch.get_num_threads()
        ours = impls["attn2d"][0]

        def on_threads(n):
            def fn(*t):
                torch.set_num_threads(n)
                return ours(*t, scale)
            return fn

        try:
            many, one = time_training_steps([on_threads(threads), on_threads(1)], fp32, reps,
                                            min_seconds=paired_seconds)
        finally:
            torch.set_num_threads(threads)
        one["attn2d_scaling_forward"] = paired_speedup(one, many, "forward")
        one["attn2d_scaling_backward"] = paired_speedup(one, many, "backward")
        results["attn2d-1thread"] = _add_rates(one, case)
    ours = results["attn2d"]
    for name, r in results.items():
        if name != "attn2d" and "refused" not in r:
            r["attn2d_speedup_forward"] = r["forward_s"] / ours["forward_s"]
            r["attn2d_speedup_backward"] = r["backward_s"] / ours["backward_s"]
            r["attn2d_speedup_fwd_bwd"] = r["fwd_bwd_s"] / ours["fwd_bwd_s"]
    return {"case": asdict(case), "results": results}


def _markdown(report: dict) -> str:
    peak = report["fma_peak_gflops"]
    lines = [
        "# attn2d bench",
        "",
        f"{report['machine']}; FMA peak measured {peak:.0f} GFLOP/s (float32, "
        f"{report['threads']} threads, the best of 10 probes). Times are medians of at least "
        f"{report['reps']} runs after a warm-up; 'x attn2d' is the peer's time over attn2d's "
        "(above 1: attn2d is faster).",
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


def _plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [c["case"]["name"] for c in report["cases"]]
    impls = ["attn2d"] + report["peers"]
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(names)), 4.5))
    width = 0.8 / len(impls)
    for i, impl in enumerate(impls):
        vals = [c["results"].get(impl, {}).get("fwd_bwd_s", float("nan")) for c in report["cases"]]
        base = [c["results"]["attn2d"]["fwd_bwd_s"] for c in report["cases"]]
        ax.bar([x + i * width for x in range(len(names))],
               [b / v if v == v else 0 for v, b in zip(vals, base)], width, label=impl)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(names))], names, rotation=35,
                  ha="right", fontsize=7)
    ax.set_ylabel("speed relative to attn2d (fwd+bwd)")
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
    import platform

    import attn2d

    from . import _tools

    if reps < 1:
        raise ValueError(f"attn2d bench: reps must be >= 1; got {reps}")
    if not paired_seconds >= 0:
        raise ValueError(f"attn2d bench: paired_seconds must be >= 0; got {paired_seconds}")
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
        "machine": f"{platform.processor() or platform.machine()}, attn2d on "
                   f"{attn2d.cpu_simd_target()} (bf16 on {attn2d.bf16_products()} products), "
                   f"torch {torch.__version__}",
        "threads": torch.get_num_threads(),
        "fma_peak_gflops": peak,
        "reps": reps,
        "paired_seconds": paired_seconds,
        "peers": peers,
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
