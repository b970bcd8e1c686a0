"""`attn2d bench --patterns`: local and sparse attention on 128x128 and 256x256 maps, side by
side in one run with attn2d's global attention, dense-masked math attention (torch SDPA's math
path with the pattern's dense mask, where its N x M matrices fit) and FlexAttention's compiled
CPU forward with the same mask (it has no CPU backward).

Per-pair time is a run's time over the (query, key) pairs it must cover: allowed pairs for the
patterns, N x M for global attention; 'visited' counts the pairs attn2d computes in the forward
and again in the backward: every offset of every query on the window kernels (clip windows on
one grid), every pair of each visited tile pair otherwise.

Every ratio is the median over reps of the two times of one rep (bench.paired_speedup): the
pattern against the global kernel in each case's fixed rounds, each peer against attn2d's
pattern step in a pair of its own whose order alternates (RATIOS)."""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from . import _compiled_layout
from .bench import _check_run_args, paired_runs, paired_speedup, time_training_steps
from .memory import available_memory_bytes, format_bytes, measure
from .peers import DENSE_MASKED, FLEX_MASKED, dense_masked_math
from . import patterns as P
from .patterns import YLG, Window

# The dense-masked peer runs where its matrices fit: at DENSE_BYTES_PER_SCORE bytes a score
# (heads * N * M of them) in at most DENSE_MEMORY_SHARE of the memory the system has available.
# SDPA's math path holds the scores, the mask made additive, the probabilities kept for the
# backward and, in the backward, their gradient and dS: YLG(8) at 128x128 over 64x64 keys peaked
# at 13.0 bytes a score above its inputs and mask; 16 leave room for the process around it. A
# machine with 24 GiB then runs it for YLG at 128x128 and not for the 128x128 windows.
DENSE_BYTES_PER_SCORE = 16
DENSE_MEMORY_SHARE = 0.6
# create_block_mask evaluates mask_mod over every (head, query, key) at once: 1.07 G elements
# (128x128, 4 heads) take several GiB, and YLG at 256x256 over 128x128 keys (8.6 G) exhausts a
# machine's memory.
FLEX_LIMIT = 1 << 30
# Untimed pattern steps between the one right after the global step and the steady one. A call
# that follows 0.5 s of other work (a global step, a matmul, a sleep) runs slower, and the calls
# after it recover over ~100 ms of pattern steps: the 8th step is the steady one, where the 4th
# still reads YLG 128x128's backward 6-8% slow (two Intel Xeon cores).
STEADY_STEPS = 7
# Least time each case's interleaved rounds (the global step, then the pattern's steps) run, reps
# going on past --reps until it has passed: the per-pair ratios are the median over reps, and a
# slow phase of the machine, seconds long, moves them, since the global step slows less than the
# pattern's (YLG 128x128's steady per-pair ratio read 1.74-1.86 in one minute and 2.04-2.19 in a
# later one on two AMD EPYC Zen 4 cores). 40 s gives a 128x128 case tens of reps, a phase a
# minority of them, and leaves the 256x256 cases, whose reps are long, at --reps.
PAIRED_SECONDS = 40.0
# What every ratio of bench_patterns.json is, written into it for its readers.
RATIOS = ("summary's per_pair_ratio_*: the median over reps of the pattern's time over the "
          "global step's in the same rep (a fixed order: the global step, then the pattern's), "
          "scaled by global pairs / allowed pairs; flex_over_attn2d_fwd, dense_over_attn2d_*: "
          "the median over reps of the peer's time over attn2d's pattern step in the same rep, "
          "the two interleaved in alternating order, attn2d's runs in the peer's "
          "attn2d_*_runs_s")


@dataclass(frozen=True)
class PatternCase:
    name: str
    heads: int
    q_hw: tuple[int, int]
    kv_hw: tuple[int, int]
    E: int
    Ev: int
    pattern: object


def default_cases() -> list[PatternCase]:
    cases = []
    for side in (128, 256):
        cases.append(PatternCase(f"window 15 (chebyshev), {side}x{side}", 4, (side, side),
                                 (side, side), 16, 16, Window(15)))
        cases.append(PatternCase(f"window 15 (manhattan), {side}x{side}", 4, (side, side),
                                 (side, side), 16, 16, Window(15, "manhattan")))
        half = side // 2
        # E = Ev: the CPU Flex kernel of torch 2.13 fails to compile for E=8, Ev=16.
        cases.append(PatternCase(f"YLG 8 heads, {side}x{side} over {half}x{half} keys", 8,
                                 (side, side), (half, half), 16, 16, YLG(8)))
    return cases


def quick_cases() -> list[PatternCase]:
    return [PatternCase("window 7, 32x32", 2, (32, 32), (32, 32), 16, 16, Window(7)),
            PatternCase("YLG, 32x32 over 16x16", 8, (32, 32), (16, 16), 8, 16, YLG(8))]


def dense_masked_skip_reason(scores: int, available: Optional[int] = None) -> Optional[str]:
    """Why the dense-masked peer cannot run `scores` (heads * N * M) scores here, or None where
    its estimated peak fits DENSE_MEMORY_SHARE of the available memory (`available` bytes, by
    default what the system reports now)."""
    available = available_memory_bytes() if available is None else available
    need = DENSE_BYTES_PER_SCORE * scores
    if available is not None and need <= DENSE_MEMORY_SHARE * available:
        return None
    have = "an unknown amount" if available is None else format_bytes(available)
    return (f"{scores / 2**30:.1f} G scores need ~{format_bytes(need)}, over "
            f"{DENSE_MEMORY_SHARE:.0%} of the {have} of memory available")


def _pair_dense_masked(case: PatternCase, ours: Callable, inputs: list[torch.Tensor],
                       flat_inputs: list[torch.Tensor], reps: int) -> tuple[dict, dict]:
    """(attn2d's runs, the dense-masked peer's runs): time_training_steps of `ours` on `inputs`
    and the peer on `flat_inputs`, interleaved rep by rep in alternating order; the peer's mask
    (a byte a score) is freed on return, before the memory probes run."""
    mask = case.pattern.dense_mask(case.q_hw, case.kv_hw, case.heads)
    ours_runs, peer_runs = time_training_steps(
        [ours, lambda a, b, c: dense_masked_math(a, b, c, mask)], [], reps,
        per_fn_inputs=[inputs, flat_inputs])
    return ours_runs, peer_runs


def _mask_mod(case: PatternCase, device="cpu"):
    """The pattern as FlexAttention's mask_mod, computed from indices (no dense mask); the
    tensors it reads live on `device`, where create_block_mask evaluates it."""
    (hq, wq), (hk, wk) = case.q_hw, case.kv_hw
    p = case.pattern
    if isinstance(p, Window):
        d, k = p.dilation, p.size
        lo, r = -(k // 2), k // 2

        def centre(q_idx):
            return (q_idx // wq) * hk // hq, (q_idx % wq) * wk // wq

        def window_mod(b, h, q_idx, kv_idx):
            ci, cj = centre(q_idx)
            dr, dc = kv_idx // wk - ci, kv_idx % wk - cj
            di, dj = dr // d, dc // d  # floor division: offsets in dilation steps
            ok = (dr % d == 0) & (dc % d == 0) & (di >= lo) & (di < lo + k) & (dj >= lo) & (dj < lo + k)
            if p.metric == "manhattan":
                ok = ok & (di.abs() + dj.abs() <= r)
            elif p.metric == "euclidean":
                ok = ok & (di * di + dj * dj <= r * r)
            return ok

        def shifted_start(c, length):
            # border="shift": the window slides inside the map within c's residue class.
            group = c % d
            count = (length - group + d - 1) // d
            t = (c - group) // d + lo
            return group + d * torch.minimum(t.clamp(min=0), count - k)

        def shifted_mod(b, h, q_idx, kv_idx):
            ci, cj = centre(q_idx)
            dr = kv_idx // wk - shifted_start(ci, hk)
            dc = kv_idx % wk - shifted_start(cj, wk)
            return ((dr >= 0) & (dr < d * k) & (dr % d == 0)
                    & (dc >= 0) & (dc < d * k) & (dc % d == 0))

        return window_mod if p.border == "clip" else shifted_mod
    n = hk * wk
    l = max(math.isqrt(n), 1)
    # YLG's enumeration: key cells ordered by i + j, ties by smaller i; rank[raster] -> position.
    cells = sorted((i + j, i, i * wk + j) for i in range(hk) for j in range(wk))
    rank = torch.empty(n, dtype=torch.long)
    rank[torch.tensor([raster for _, _, raster in cells])] = torch.arange(n)
    # The pattern row of each query: its raster index mod n ("official"), or the position of
    # the key cell it is centred at ("geometric").
    if p.mapping == "official":
        qpos = rank[torch.arange(hq * wq) % n]
    else:
        rows = (torch.arange(hq) * hk) // hq
        cols = (torch.arange(wq) * wk) // wq
        qpos = rank[(rows[:, None] * wk + cols[None, :]).flatten()]
    rank, qpos = rank.to(device), qpos.to(device)
    kinds = torch.tensor([P.YLG_PATTERNS.index(kind) for kind in p.patterns], device=device)

    def ylg_mod(b, h, q_idx, kv_idx):
        r, c, kind = qpos[q_idx], rank[kv_idx], kinds[h]
        rtl_floor = (c >= r) & (r >= c - c % l)
        rtl_rep = ((c % l == 0) & (c + l - 1 < n)) | (c == r)
        ltr_floor = (c <= r) & (c >= r - r % l)
        ltr_rep = (c % l == l - 1) | (c == r)
        return (((kind == 0) & rtl_floor) | ((kind == 1) & rtl_rep) | ((kind == 2) & ltr_floor)
                | ((kind == 3) & ltr_rep))

    return ylg_mod


def flex_forward(case: PatternCase, q, k, v) -> Optional[Callable]:
    """FlexAttention's compiled forward on q's device with the pattern as its block mask (None
    where Flex is unavailable); compiles on its first call."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    block_mask = create_block_mask(_mask_mod(case, q.device), None, case.heads, q.shape[2],
                                   k.shape[2], device=q.device)
    compiled = torch.compile(flex_attention)

    def run():
        with torch.no_grad():
            return compiled(q, k, v, block_mask=block_mask)

    return run


def run_case(case: PatternCase, reps: int, with_memory: bool, with_flex: bool,
             log: Callable[[str], None], paired_seconds: float = PAIRED_SECONDS) -> dict:
    import attn2d

    _check_run_args(reps, paired_seconds)
    if not isinstance(case, PatternCase):
        raise TypeError(f"attn2d bench --patterns: case must be a PatternCase; got "
                        f"{type(case).__name__}")
    gen = torch.Generator().manual_seed(0)
    B, H = 1, case.heads
    q = torch.randn(B, H, *case.q_hw, case.E, generator=gen)
    k = torch.randn(B, H, *case.kv_hw, case.E, generator=gen)
    v = torch.randn(B, H, *case.kv_hw, case.Ev, generator=gen)
    n, m = case.q_hw[0] * case.q_hw[1], case.kv_hw[0] * case.kv_hw[1]
    t0 = time.perf_counter()
    layout = _compiled_layout.build(case.pattern, case.q_hw, case.kv_hw, H)
    build_s = time.perf_counter() - t0
    visited = B * _compiled_layout.kernel_visited_pairs(case.pattern, case.q_hw, case.kv_hw, layout)
    allowed = B * _compiled_layout.allowed_pairs(layout)
    results = {}
    # The pattern and the global kernel interleaved (bench.time_training_steps): the per-pair
    # ratios are the target, and timed minutes apart they would carry the machine's drift. Each
    # rep runs the global step, then STEADY_STEPS + 1 pattern steps: the first is timed as
    # "attn2d-pattern", the last as "attn2d-pattern-steady". A call that follows 50 ms or more
    # of anything else (a global step, a Python busy loop, a sleep, an FMA loop that touches no
    # memory) runs slower, and the next two or three calls a little slower (the 128x128
    # diamond's forward 30-45% slower on one Intel Xeon thread): a state of the memory system
    # that a 1 s global step amortises and a 5 ms pattern step does not (memory_ramp probes it).
    log(f"    attn2d {case.pattern!r} (layout built in {build_s:.1f} s) and attn2d global, "
        "interleaved ...")
    pattern_fn = lambda a, b, c: attn2d.attention2d(a, b, c, pattern=case.pattern)  # noqa: E731
    # The order is fixed, not alternated: the step right after the global one is what
    # "attn2d-pattern" measures.
    runs = time_training_steps(
        [lambda a, b, c: attn2d.attention2d(a, b, c)] + [pattern_fn] * (STEADY_STEPS + 1),
        [q, k, v], reps, min_seconds=paired_seconds, order="fixed")
    results["attn2d-pattern"], results["attn2d-global"] = runs[1], runs[0]
    results["attn2d-pattern-steady"] = runs[-1]
    # Each peer interleaved rep by rep with the pattern's attn2d step, in alternating order: its
    # ratio is the median of per-rep ratios (a ratio of medians timed minutes apart would carry
    # the machine's drift), and attn2d's runs of the pair go into the peer's row
    # (attn2d_*_runs_s). attn2d's step there follows the peer's or its own, where
    # "attn2d-pattern" follows a global step: both after other work, as the first column is.
    q4, k4, v4 = q.flatten(2, 3), k.flatten(2, 3), v.flatten(2, 3)
    dense_skip = dense_masked_skip_reason(B * H * n * m)
    dense_ours = flex_ours = None
    if dense_skip is None:
        log("    dense-masked SDPA math, interleaved with attn2d ...")
        dense_ours, dense = _pair_dense_masked(case, pattern_fn, [q, k, v], [q4, k4, v4], reps)
        results["dense-masked-math"] = {**dense, **paired_runs(dense_ours)}
    else:
        results["dense-masked-math"] = {"skipped": dense_skip}
    if with_flex and H * n * m > FLEX_LIMIT * 1.01:
        results["flex-forward"] = {
            "skipped": f"Flex's mask evaluation takes {H * n * m / 2**30:.1f} G elements at once, "
                       f"over the {FLEX_LIMIT / 2**30:.0f} G limit"}
    elif with_flex:
        log("    FlexAttention forward (compiling), interleaved with attn2d's forward ...")
        try:
            flex = flex_forward(case, q4, k4, v4)
            if flex is None:
                results["flex-forward"] = {"skipped": "FlexAttention is unavailable in this "
                                                      "torch"}
            else:
                # Forwards only (Flex has no CPU backward); attn2d's records for autograd, as
                # the pattern rows' forwards do. Flex compiles in the warm-up.
                flex_ours, flex_runs = time_training_steps(
                    [pattern_fn, lambda *t: flex()], [q, k, v], reps, backward=False)
                results["flex-forward"] = {**flex_runs, **paired_runs(flex_ours)}
        except Exception as err:  # noqa: BLE001 -- torch.compile fails in many ways; report it
            lines = [x for x in str(err).splitlines() if "error" in x.lower()] or [str(err)]
            results["flex-forward"] = {"skipped": "Flex failed: " + lines[0].strip()[:160]}
    ours, glob = results["attn2d-pattern"], results["attn2d-global"]
    summary = {
        "allowed_pairs": allowed,
        "visited_pairs": visited,
        "global_pairs": B * H * n * m,
        "layout_build_s": build_s,
        "ns_per_allowed_pair_fwd": 1e9 * ours["forward_s"] / allowed,
        "ns_per_pair_global_fwd": 1e9 * glob["forward_s"] / (B * H * n * m),
        "ns_per_allowed_pair_bwd": 1e9 * ours["backward_s"] / allowed,
        "ns_per_pair_global_bwd": 1e9 * glob["backward_s"] / (B * H * n * m),
    }
    # Per-pair ratios from each rep's pair of runs (bench.paired_speedup), as the dense bench's.
    pairs_over_allowed = summary["global_pairs"] / allowed
    summary["per_pair_ratio_fwd"] = paired_speedup(ours, glob, "forward") * pairs_over_allowed
    summary["per_pair_ratio_bwd"] = paired_speedup(ours, glob, "backward") * pairs_over_allowed
    steady = results["attn2d-pattern-steady"]
    summary["per_pair_ratio_fwd_steady"] = (paired_speedup(steady, glob, "forward")
                                            * pairs_over_allowed)
    summary["per_pair_ratio_bwd_steady"] = (paired_speedup(steady, glob, "backward")
                                            * pairs_over_allowed)
    if flex_ours is not None:
        summary["flex_over_attn2d_fwd"] = paired_speedup(results["flex-forward"], flex_ours,
                                                         "forward")
    dense = results["dense-masked-math"]
    if dense_ours is not None:
        summary["dense_over_attn2d_fwd"] = paired_speedup(dense, dense_ours, "forward")
        summary["dense_over_attn2d_bwd"] = paired_speedup(dense, dense_ours, "backward")
    if with_memory:
        # Each implementation that ran, in a process of its own (attn2d._probe); Flex's
        # forward only, compiled in its warm-up run. The dense mask, Flex's block mask and
        # attn2d's layout are built before the baseline: inputs, as q, k and v are.
        probes = {"attn2d-pattern": "attn2d", "attn2d-global": "attn2d",
                  "dense-masked-math": DENSE_MASKED, "flex-forward": FLEX_MASKED}
        for name, impl in probes.items():
            if "forward_s" not in results.get(name, {}):
                continue
            spec = dict(impl=impl, B=B, H=H, Lq=n, Lk=m, E=case.E, Ev=case.Ev,
                        q_hw=list(case.q_hw), kv_hw=list(case.kv_hw))
            if name != "attn2d-global":
                spec["pattern"] = case.pattern.to_spec()
            if name == "flex-forward":
                spec["backward"] = False
            results[name]["peak_bytes"] = measure(spec)["peak_above_baseline_bytes"]
        if "peak_bytes" in dense and ours["peak_bytes"] > 0:
            summary["dense_peak_over_attn2d"] = dense["peak_bytes"] / ours["peak_bytes"]
    return {"case": case.name, "results": results, "summary": summary}


def memory_ramp(nbytes: int = 32 << 20, idle_s: float = 0.4, calls: int = 8,
                rounds: int = 3) -> dict:
    """Medians over `rounds` of a copy of `nbytes`, call by call, right after `idle_s` of a
    Python busy loop that touches no memory: a probe of the state the 'after global' column
    measures in. Work that streams from memory can run slower after a pause in memory traffic
    and recover over some milliseconds of streaming (up to 2.5x slower after ~0.4 s on two Intel
    Xeon cores), where a copy within the L2 or an FMA loop slows only its first call; the global
    step, bound by its arithmetic, is such a pause for the pattern step after it."""
    if nbytes < 4 or calls < 2 or rounds < 1 or not idle_s >= 0:
        raise ValueError(f"memory_ramp: expected nbytes >= 4, calls >= 2, rounds >= 1 and "
                         f"idle_s >= 0; got {nbytes}, {calls}, {rounds}, {idle_s}")
    # float32 whatever torch's default dtype: nbytes is reported as the copy's size.
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)  # both faulted in before any timing
    times: list[list[float]] = [[] for _ in range(calls)]
    for _ in range(rounds):
        end = time.perf_counter() + idle_s
        while time.perf_counter() < end:
            pass
        for i in range(calls):
            t0 = time.perf_counter()
            dst.copy_(src)
            times[i].append(time.perf_counter() - t0)
    copy_s = [statistics.median(t) for t in times]
    return {"bytes": nbytes, "idle_s": idle_s, "copy_s": copy_s,
            "first_over_last": copy_s[0] / copy_s[-1]}


def _markdown(report: dict) -> str:
    lines = [
        "# attn2d bench --patterns",
        "",
        f"{report['machine']}; {report['threads']} threads; medians of {report['reps']} "
        "training steps or more (forward with autograd recording, backward) after a warm-up, "
        "the pattern's and the global kernel's runs interleaved for at least "
        f"{report.get('paired_seconds', 0):g} s a case; Flex: forward only (no CPU "
        "backward), compiled. Peak memory: above the inputs, each implementation in a process "
        "of its own (attn2d's layout, the dense mask and Flex's block mask are built first, "
        "as inputs).",
        "",
        "| case | implementation | forward | backward | peak memory | ns per pair (fwd) |",
        "|---|---|---|---|---|---|",
    ]
    for c in report["cases"]:
        s = c["summary"]
        for name, r in c["results"].items():
            if "skipped" in r:
                lines.append(f"| {c['case']} | {name} | skipped: {r['skipped']} | | | |")
                continue
            pairs = s["global_pairs"] if name == "attn2d-global" else s["allowed_pairs"]
            bwd = f"{1e3 * r['backward_s']:.1f} ms" if "backward_s" in r else "-"
            mem = format_bytes(r["peak_bytes"]) if "peak_bytes" in r else ""
            lines.append(f"| {c['case']} | {name} | {1e3 * r['forward_s']:.1f} ms | {bwd} | "
                         f"{mem} | {1e9 * r['forward_s'] / pairs:.2f} |")
    lines += ["", "Per-pair time / global's, each the median over reps of one rep's pair: "
              "'after global' times the pattern's step right after the global one; 'steady' "
              f"its {STEADY_STEPS + 1}th step in a row (attn2d-pattern-steady above). Flex's "
              "and dense-masked's time / attn2d's: each peer interleaved rep by rep with "
              "attn2d's pattern step (the order reversed every other rep), the median over reps "
              "of the two times of one rep (both sides' runs in bench_patterns.json: the peer's "
              "*_runs_s and attn2d's attn2d_*_runs_s). Page "
              "faults: medians a step, the process's (glibc may hand freed memory back after "
              "each call, and the next one faults its outputs in anew: docs/benchmarks.md)."]
    ramp = report.get("memory_ramp")
    if ramp is not None:
        lines += [
            "", f"The machine's memory after {ramp['idle_s']:g} s without memory traffic (a busy "
            "loop; the global step before 'after global' is bound by its arithmetic): a "
            f"{format_bytes(ramp['bytes'])} copy, call by call, "
            + ", ".join(f"{1e3 * t:.2f}" for t in ramp["copy_s"])
            + f" ms (the first {ramp['first_over_last']:.2f}x the last)."]
    lines += ["", "| case | allowed pairs | visited by attn2d (forward and backward each) "
              "| per pair / global's, after global: fwd / bwd | steady: fwd / bwd "
              "| page faults a pattern step, after global: fwd / bwd (steady) "
              "| Flex fwd time / attn2d's | dense-masked time / attn2d's: fwd / bwd (peak) |",
              "|---|---|---|---|---|---|---|---|"]
    for c in report["cases"]:
        s = c["summary"]
        flex = f"{s['flex_over_attn2d_fwd']:.2f}" if "flex_over_attn2d_fwd" in s else "-"
        dense = "-"
        if "dense_over_attn2d_fwd" in s:
            dense = f"{s['dense_over_attn2d_fwd']:.1f} / {s['dense_over_attn2d_bwd']:.1f}"
            if "dense_peak_over_attn2d" in s:
                dense += f" ({s['dense_peak_over_attn2d']:.1f})"
        bwd_ratio = f"{s['per_pair_ratio_bwd']:.2f}" if "per_pair_ratio_bwd" in s else "-"
        steady = "-"
        if "per_pair_ratio_fwd_steady" in s:
            steady = (f"{s['per_pair_ratio_fwd_steady']:.2f} / "
                      f"{s['per_pair_ratio_bwd_steady']:.2f}")
        after, last = c["results"]["attn2d-pattern"], c["results"]["attn2d-pattern-steady"]
        faults = (f"{after['forward_faults']:.0f} / {after['backward_faults']:.0f} "
                  f"({last['forward_faults']:.0f} / {last['backward_faults']:.0f})")
        lines.append(f"| {c['case']} | {s['allowed_pairs']:,} | "
                     f"{s['visited_pairs'] / s['allowed_pairs']:.2f}x | "
                     f"{s['per_pair_ratio_fwd']:.2f} / {bwd_ratio} | {steady} | {faults} | "
                     f"{flex} | {dense} |")
    return "\n".join(lines) + "\n"


def run(out_dir: str = "attn2d-report", *, cases: Optional[list[PatternCase]] = None,
        reps: int = 5, with_memory: bool = True, with_flex: bool = True,
        paired_seconds: float = PAIRED_SECONDS, log: Callable[[str], None] = print) -> dict:
    import attn2d

    from ._machine import cpu_name

    _check_run_args(reps, paired_seconds)
    cases = default_cases() if cases is None else cases
    report = {"machine": f"{cpu_name()}, attn2d on {attn2d.cpu_simd_target()}, "
                         f"torch {torch.__version__}",
              "threads": torch.get_num_threads(), "reps": reps,
              "paired_seconds": paired_seconds, "ratios": RATIOS, "cases": []}
    log("memory probe: a copy right after a busy loop ...")
    report["memory_ramp"] = memory_ramp()
    for i, case in enumerate(cases, 1):
        log(f"[{i}/{len(cases)}] {case.name}")
        report["cases"].append(run_case(case, reps, with_memory, with_flex, log, paired_seconds))
        log("\n".join(x for x in _markdown({**report, "cases": [report["cases"][-1]]}).splitlines()
                      if x.startswith(f"| {case.name} |")))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "bench_patterns.json"), "w") as f:
        json.dump(report, f, indent=2, default=str)
    md = _markdown(report)
    with open(os.path.join(out_dir, "bench_patterns.md"), "w") as f:
        f.write(md)
    log(md)
    return report
