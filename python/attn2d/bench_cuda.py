"""`attn2d bench --device cuda`: attn2d on a CUDA GPU side by side with the GPU's own attention
kernels, in one run, on one device.

- SAGAN attention (the CPU bench's SAGAN cases with 2x2-pooled keys, E=8, Ev=64, at batch
  GPU_BATCH), forward + backward, float32 and bfloat16, against every kernel of torch's SDPA,
  each forced (a kernel that refuses the shapes is reported with torch's reason).
- Local patterns at 128x128 (a 15x15 window, clipped and shifted, and YLG with 8 heads), forward,
  bfloat16, against FlexAttention compiled with the same mask as its block mask, and the shifted
  window against NATTEN's fused kernel where natten is installed with its CUDA kernels.
- Memory of the SAGAN block (attn2d.nn.SelfAttention2d) forward + backward: the growth of
  torch.cuda.max_memory_allocated over the inputs, against attn2d.planner's prediction.

Timing: a rep runs every implementation of a case in turn (rep 1 of each, then rep 2, ...; the
order reversed every other rep, bench.rep_order), each as CALLS_PER_REP back-to-back calls
between CUDA events, so the GPU's speed of the moment is shared within a rep; reps go on past
`reps` until `paired_seconds` have passed. A ratio is the median over reps of the peer's time
over attn2d's in the same rep (bench.paired_speedup).
Every table names the device its figures come from.

run(device="cpu") runs the same method on CPU tensors (no memory cases): a check of the harness
on a machine without a GPU, not a benchmark."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from . import _checks, bench, bench_patterns, planner
from .memory import cuda_peak_bytes, format_bytes
from .patterns import Window

GPU_BATCH = 8
# Back-to-back calls a rep times: a short call's kernels can take less time on the GPU than
# Python takes to launch them; back to back, they queue behind the last call's.
CALLS_PER_REP = 10
PAIRED_SECONDS = 1.0
# Where the planner's prediction should land: |measured - predicted| <= this share of measured
# (plan --validate --device cuda holds its rows to the same bound).
MEMORY_TOLERANCE = planner.CUDA_BOUND
# FlexAttention's kernels need head widths of at least 16 (tl.dot's smallest side).
FLEX_MIN_WIDTH = 16
DENSE_DTYPES = ("float32", "bfloat16")
PATTERN_DTYPE = "bfloat16"


@dataclass(frozen=True)
class DenseCase:
    """Global attention of `shape` in `dtype`, forward + backward, against SDPA's kernels."""

    shape: bench.Case
    dtype: str

    @property
    def name(self) -> str:
        return f"{self.shape.name}, {self.dtype}"


@dataclass(frozen=True)
class PatternGpuCase:
    """attn2d.attention2d under `shape`'s pattern at `batch`, forward, against FlexAttention and,
    for a shifted window, NATTEN."""

    shape: bench_patterns.PatternCase
    batch: int
    dtype: str

    @property
    def name(self) -> str:
        return f"{self.shape.name}, batch {self.batch}, {self.dtype}"


@dataclass(frozen=True)
class MemoryCase:
    """The SAGAN block (attn2d.planner.sagan_block, attn2d.nn.SelfAttention2d's defaults) at
    res x res, forward + backward in float32, measured against the planner."""

    res: int
    batch: int
    channels: int = 64

    @property
    def name(self) -> str:
        return f"SAGAN block {self.res}x{self.res}, C={self.channels}, batch {self.batch}"


AnyCase = Union[DenseCase, PatternGpuCase, MemoryCase]


def _sagan_pooled(cases: list[bench.Case], batch: int) -> list[bench.Case]:
    return [dataclasses.replace(c, B=batch, name=f"{c.name}, batch {batch}") for c in cases
            if c.name.startswith("SAGAN") and c.E == 8 and c.Ev == 64 and 4 * c.Lk == c.Lq]


def _shifted(case: bench_patterns.PatternCase) -> bench_patterns.PatternCase:
    """The window of `case` moved inside the map at its borders, as NATTEN's neighbourhoods are."""
    p = case.pattern
    return dataclasses.replace(case, name=f"{case.name}, shifted at the borders",
                               pattern=Window(p.size, p.metric, p.dilation, border="shift"))


def default_cases() -> list[AnyCase]:
    dense = [DenseCase(c, dt) for c in _sagan_pooled(bench.default_cases(), GPU_BATCH)
             for dt in DENSE_DTYPES]
    pattern_shapes = [c for c in bench_patterns.default_cases() if c.q_hw == (128, 128)
                      and (isinstance(c.pattern, bench_patterns.YLG)
                           or c.pattern.metric == "chebyshev")]
    windows = [c for c in pattern_shapes if isinstance(c.pattern, Window)]
    pattern_shapes += [_shifted(c) for c in windows]
    patterns = [PatternGpuCase(c, GPU_BATCH, PATTERN_DTYPE) for c in pattern_shapes]
    return dense + patterns + [MemoryCase(64, GPU_BATCH), MemoryCase(128, GPU_BATCH)]


def quick_cases() -> list[AnyCase]:
    dense = [DenseCase(c, dt) for c in _sagan_pooled(
        [bench.Case("SAGAN 32x32 E=8 Ev=64 pooled keys", 1, 1, 1024, 256, 8, 64)], 2)
        for dt in DENSE_DTYPES]
    shapes = bench_patterns.quick_cases()
    shapes += [_shifted(c) for c in shapes if isinstance(c.pattern, Window)]
    return dense + [PatternGpuCase(c, 2, PATTERN_DTYPE) for c in shapes] + [MemoryCase(32, 2)]


def is_pattern_case(case: AnyCase) -> bool:
    return isinstance(case, PatternGpuCase)


# ---------------------------------------------------------------------------------------------
# Timing


class _Clock:
    """Marks on the device's timeline: CUDA events on CUDA (each interval is GPU time, launch
    gaps included where the GPU waits for Python), perf_counter on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start, end) -> float:
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start


def time_interleaved(fns: list[Callable[..., torch.Tensor]], inputs: list[list[torch.Tensor]],
                     reps: int, *, backward: bool, min_seconds: float = 0.0,
                     calls: int = CALLS_PER_REP) -> list[dict]:
    """Times each fns[i](*inputs[i]) rep by rep, in turn (in bench.rep_order: the order
    reversed every other rep, so that no function always runs first): per rep and function,
    `calls` back-to-back calls (forward, then backward when `backward`), their mean per call kept in
    forward_runs_s (and backward_runs_s, fwd_bwd_runs_s), medians in forward_s (backward_s,
    fwd_bwd_s). Reps go on past `reps` until `min_seconds` have passed. Leaves' .grad is cleared
    before each call, as optimizer.zero_grad() does, so no call sums into the last one's."""
    if len(fns) != len(inputs):
        raise ValueError(f"time_interleaved: {len(fns)} functions but {len(inputs)} input lists")
    if reps < 1 or calls < 1:
        raise ValueError(f"time_interleaved: reps and calls must be >= 1; got {reps}, {calls}")
    if not fns:
        return []
    leaves = [[t.detach().requires_grad_(backward) for t in ts] for ts in inputs]
    clock = _Clock(leaves[0][0].device)
    grads = []
    with torch.set_grad_enabled(backward):
        for fn, ls in zip(fns, leaves):
            out = fn(*ls)
            grads.append(torch.randn_like(out) if backward else None)
            if backward:
                out.backward(grads[-1])
    keys = ("forward", "backward", "fwd_bwd") if backward else ("forward",)
    runs = [{key: [] for key in keys} for _ in fns]
    start, rep = time.perf_counter(), 0
    with torch.set_grad_enabled(backward):
        while rep < reps or time.perf_counter() - start < min_seconds:
            order = bench.rep_order(len(fns), rep)
            rep += 1
            for i in order:
                fn = fns[i]
                for ls in leaves:
                    for t in ls:
                        t.grad = None
                marks = []
                clock.sync()
                for _ in range(calls):
                    for t in leaves[i]:
                        t.grad = None
                    m0 = clock.mark()
                    out = fn(*leaves[i])
                    m1 = clock.mark()
                    if backward:
                        out.backward(grads[i])
                    marks.append((m0, m1, clock.mark()))
                clock.sync()
                fwd = sum(clock.seconds(a, b) for a, b, _ in marks) / calls
                runs[i]["forward"].append(fwd)
                if backward:
                    bwd = sum(clock.seconds(b, c) for _, b, c in marks) / calls
                    runs[i]["backward"].append(bwd)
                    runs[i]["fwd_bwd"].append(fwd + bwd)
    return [{**{f"{key}_runs_s": r[key] for key in keys},
             **{f"{key}_s": statistics.median(r[key]) for key in keys}} for r in runs]


def _refusal(err: Exception, caught: list) -> str:
    """torch's reason for refusing a call: SDPA's forced kernels warn why, then raise."""
    if isinstance(err, torch.cuda.OutOfMemoryError):
        return "out of memory"
    reasons = [str(w.message) for w in caught if "kernel not used" not in str(w.message)]
    return (reasons[-1] if reasons else str(err)).strip().splitlines()[0][:200]


def _try_call(fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor], backward: bool):
    """(output, "") where fn runs (forward and, when `backward`, backward on random gradients),
    or (None, torch's reason) where it refuses; compiles what compiles on first call."""
    leaves = [t.detach().requires_grad_(backward) for t in inputs]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.set_grad_enabled(backward):
                out = fn(*leaves)
                if backward:
                    out.backward(torch.randn_like(out))
        except RuntimeError as err:
            if leaves[0].device.type == "cuda":
                torch.cuda.empty_cache()
            return None, _refusal(err, caught)
    return out.detach(), ""


def _failure(err: Exception) -> str:
    """The lines of an exception that name its error: torch.compile's reports run to pages."""
    text = str(err).strip().splitlines() or [""]
    errors = [x.strip() for x in text if "error" in x.lower()] or text[:1]
    return f"{type(err).__name__}: {'; '.join(errors[:2])[:200]}"


def _max_difference(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours.float() - theirs.float()).abs().max())


def _add_ratios(results: dict, keys: tuple[str, ...]) -> None:
    """peer / attn2d, the median over reps of the two times of one rep, on every timed peer."""
    ours = results.get("attn2d", {})
    if "forward_runs_s" not in ours:
        return
    for name, r in results.items():
        if name != "attn2d" and "forward_runs_s" in r:
            for key in keys:
                r[f"over_attn2d_{key}"] = bench.paired_speedup(r, ours, key)


def _random(shape: tuple[int, ...], gen: torch.Generator, device, dtype) -> torch.Tensor:
    # Drawn on the CPU: the same numbers on every device.
    return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# The cases


def run_dense_case(case: DenseCase, device: torch.device, reps: int, paired_seconds: float,
                   with_memory: bool, log: Callable[[str], None]) -> dict:
    import attn2d

    from .backends import choose_backend
    from .peers import CUDA_PEERS

    s, dtype = case.shape, getattr(torch, case.dtype)
    gen = torch.Generator().manual_seed(0)
    q = _random((s.B, s.H, s.Lq, s.E), gen, device, dtype)
    k = _random((s.B, s.H, s.Lk, s.E), gen, device, dtype)
    v = _random((s.B, s.H, s.Lk, s.Ev), gen, device, dtype)
    scale = 1.0 / math.sqrt(s.E)
    impls = {"attn2d": lambda q, k, v: attn2d.attention(q, k, v, scale=scale)}
    impls.update({name: (lambda q, k, v, f=f: f(q, k, v, scale)) for name, f in CUDA_PEERS.items()})
    results: dict = {}
    accepted: dict = {}
    reference = None
    for name, fn in impls.items():
        out, refusal = _try_call(fn, [q, k, v], backward=True)
        if refusal:
            results[name] = {"refused": refusal}
            log(f"    {name}: refused: {refusal}")
            continue
        accepted[name] = fn
        if name == "attn2d":
            reference = out
        results[name] = ({} if reference is None or name == "attn2d"
                         else {"max_abs_difference": _max_difference(reference, out)})
        del out
    log(f"    timing {', '.join(accepted)} interleaved ...")
    timed = time_interleaved(list(accepted.values()), [[q, k, v]] * len(accepted), reps,
                             backward=True, min_seconds=paired_seconds)
    for name, r in zip(accepted, timed):
        results[name].update(r)
        if with_memory and device.type == "cuda":
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            grad = torch.randn(s.B, s.H, s.Lq, s.Ev, device=device, dtype=dtype)
            results[name]["peak_bytes"] = cuda_peak_bytes(
                lambda fn=accepted[name]: fn(*leaves).backward(grad), device)
            del leaves, grad
    _add_ratios(results, ("forward", "backward", "fwd_bwd"))
    backend = choose_backend("attn2d.attention", q, k, v, None, False, pattern=False)
    return {"kind": "dense", "name": case.name, "case": dataclasses.asdict(s),
            "dtype": case.dtype, "attn2d_backend": backend.backend, "results": results}


def flex_padded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> list[torch.Tensor]:
    """q, k and v with their head widths zero-padded to what FlexAttention's kernels take (at
    least FLEX_MIN_WIDTH, a power of two). Zero columns add nothing to q.k, and padded value
    columns give zero outputs, sliced off; the scale is passed, so it stays 1/sqrt(E)."""
    def pad(t: torch.Tensor) -> torch.Tensor:
        width = max(FLEX_MIN_WIDTH, 1 << (t.shape[-1] - 1).bit_length())
        return F.pad(t, (0, width - t.shape[-1])) if width != t.shape[-1] else t

    return [pad(q), pad(k), pad(v)]


def flex_peer(shape: bench_patterns.PatternCase, q: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor, scale: float, compile: bool = True):
    """(fn, inputs) for FlexAttention under the pattern's block mask, on q's device: q, k, v
    are (B, H, L, width), flattened from the grids; fn(*inputs) gives (B, H, Lq, Ev). Raises
    ImportError where this torch has no FlexAttention."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    block_mask = create_block_mask(bench_patterns._mask_mod(shape, q.device), None, shape.heads,
                                   q.shape[2], k.shape[2], device=q.device)
    attend = torch.compile(flex_attention) if compile else flex_attention
    ev = v.shape[-1]

    def run(qp, kp, vp):
        return attend(qp, kp, vp, block_mask=block_mask, scale=scale)[..., :ev]

    return run, flex_padded(q, k, v)


def natten_peer(q5: torch.Tensor, k5: torch.Tensor, v5: torch.Tensor, pattern):
    """(fn, inputs) for NATTEN's fused 2-D neighbourhood attention (fn(*inputs) in attn2d's
    (B, H, Hq, Wq, Ev) layout), or the reason it cannot run as a str."""
    if not (isinstance(pattern, Window) and pattern.border == "shift"):
        return "NATTEN's neighbourhoods are square windows shifted inside the map"
    try:
        import natten
    except ImportError as err:
        return f"natten is not installed ({err})"
    na2d = getattr(natten, "na2d", None) or getattr(getattr(natten, "functional", None),
                                                   "na2d", None)
    if na2d is None:
        return f"natten {getattr(natten, '__version__', '?')} has no na2d"
    size, dilation = pattern.size, pattern.dilation
    # NATTEN's fused kernels take heads-last maps (B, H', W', heads, width): permuted before
    # timing, as a model built for NATTEN would hold them.
    heads_last = [t.permute(0, 2, 3, 1, 4).contiguous() for t in (q5, k5, v5)]

    def run(q, k, v):
        out = na2d(q, k, v, kernel_size=(size, size), dilation=(dilation, dilation))
        return out.permute(0, 3, 1, 2, 4)

    return run, heads_last


def run_pattern_case(case: PatternGpuCase, device: torch.device, reps: int,
                     paired_seconds: float, with_flex: bool, log: Callable[[str], None]) -> dict:
    import attn2d

    s, dtype = case.shape, getattr(torch, case.dtype)
    B, H = case.batch, s.heads
    gen = torch.Generator().manual_seed(0)
    q5 = _random((B, H, *s.q_hw, s.E), gen, device, dtype)
    k5 = _random((B, H, *s.kv_hw, s.E), gen, device, dtype)
    v5 = _random((B, H, *s.kv_hw, s.Ev), gen, device, dtype)
    scale = 1.0 / math.sqrt(s.E)
    pattern = s.pattern
    impls: dict = {"attn2d": (lambda q, k, v: attn2d.attention2d(q, k, v, pattern=pattern,
                                                                  scale=scale), [q5, k5, v5])}
    results: dict = {}
    if with_flex:
        log("    FlexAttention (compiling) ...")
        try:
            fn, inputs = flex_peer(s, *(t.flatten(2, 3) for t in (q5, k5, v5)), scale)
            impls["flex"] = (lambda *t, fn=fn: fn(*t).unflatten(2, s.q_hw), inputs)
        except ImportError as err:
            results["flex"] = {"refused": f"this torch has no FlexAttention ({err})"}
        except Exception as err:  # noqa: BLE001 -- create_block_mask can fail (memory, tracing)
            results["flex"] = {"refused": _failure(err)}
    natten = natten_peer(q5, k5, v5, pattern)
    if isinstance(natten, str):
        if isinstance(pattern, Window) and pattern.border == "shift":
            results["natten"] = {"refused": natten}
    else:
        impls["natten"] = natten
    accepted: dict = {}
    reference = None
    for name, (fn, inputs) in impls.items():
        try:
            out, refusal = _try_call(fn, inputs, backward=False)
        except Exception as err:  # noqa: BLE001 -- torch.compile and NATTEN fail in many ways
            out, refusal = None, _failure(err)
        if refusal:
            results[name] = {"refused": refusal}
            log(f"    {name}: refused: {refusal}")
            continue
        accepted[name] = (fn, inputs)
        if name == "attn2d":
            reference = out
        results[name] = ({} if reference is None or name == "attn2d"
                         else {"max_abs_difference": _max_difference(reference, out)})
    log(f"    timing {', '.join(accepted)} interleaved ...")
    timed = time_interleaved([fn for fn, _ in accepted.values()],
                             [inputs for _, inputs in accepted.values()], reps, backward=False,
                             min_seconds=paired_seconds)
    for name, r in zip(accepted, timed):
        results[name].update(r)
    _add_ratios(results, ("forward",))
    results = {name: results[name] for name in ("attn2d", "flex", "natten") if name in results}
    return {"kind": "pattern", "name": case.name, "pattern": repr(pattern), "batch": B,
            "heads": H, "q_hw": list(s.q_hw), "kv_hw": list(s.kv_hw), "E": s.E, "Ev": s.Ev,
            "dtype": case.dtype, "results": results}


def memory_case_module(case: MemoryCase):
    """(the planner's SAGAN block, the attn2d.nn module it models)."""
    from .nn import SelfAttention2d

    return planner.sagan_block(case.channels), SelfAttention2d(case.channels)


def run_memory_case(case: MemoryCase, device: torch.device, log: Callable[[str], None]) -> dict:
    """Measured and predicted memory of one training step of the SAGAN block: attn2d's global
    attention (auto: Triton for these widths) and SDPA's math kernel ("sdpa-math", the planner's
    row for it)."""
    import attn2d

    out = {"kind": "memory", "name": case.name, "res": case.res, "batch": case.batch,
           "channels": case.channels, "results": {}}
    if device.type != "cuda":
        out["skipped"] = "memory is measured on CUDA (torch.cuda.max_memory_allocated)"
        return out
    block, module = memory_case_module(case)
    module = module.to(device)
    setting = planner.Setting(case.res, case.res, case.batch)
    gen = torch.Generator().manual_seed(0)
    x = _random((case.batch, case.channels, case.res, case.res), gen, device, torch.float32)
    grad = _random(tuple(x.shape), gen, device, torch.float32)
    for impl, backend in (("attn2d-global", "auto"), ("sdpa-math", "sdpa")):
        def step():
            math_only = (sdpa_kernel(SDPBackend.MATH) if impl == "sdpa-math"
                         else contextlib.nullcontext())
            with attn2d.use_backend(backend), math_only:
                module(x).backward(grad)

        try:
            step()  # warm-up: kernels compiled, cuDNN's algorithms chosen
            module.zero_grad(set_to_none=True)
            measured = cuda_peak_bytes(step, device)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            out["results"][impl] = {"refused": "out of memory"}
            continue
        finally:
            module.zero_grad(set_to_none=True)
        predicted = planner.estimate(block, setting, impl).memory_bytes
        error = abs(measured - predicted) / measured if measured else math.inf
        out["results"][impl] = {"measured_bytes": measured, "predicted_bytes": predicted,
                                "error": error, "within_tolerance": error <= MEMORY_TOLERANCE}
        log(f"    {impl}: measured {format_bytes(measured)}, planner {format_bytes(predicted)} "
            f"({100 * error:.1f}% off)")
    return out


# ---------------------------------------------------------------------------------------------
# The report


def device_description(device: torch.device) -> tuple[str, str]:
    """(the device's name, a line naming it with the software that ran on it)."""
    try:
        import triton

        versions = f"torch {torch.__version__}, triton {triton.__version__}"
    except ImportError:
        versions = f"torch {torch.__version__}, no triton"
    if device.type != "cuda":
        from ._machine import cpu_name

        name = f"CPU: {cpu_name()}"
        return name, f"{name}, {torch.get_num_threads()} threads, {versions}"
    props = torch.cuda.get_device_properties(device)
    name = torch.cuda.get_device_name(device)
    return name, (f"{name} ({props.total_memory / 2**30:.0f} GiB, compute capability "
                  f"{props.major}.{props.minor}, {props.multi_processor_count} SMs), CUDA "
                  f"{torch.version.cuda}, {versions}")


def _ms(seconds: Optional[float]) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.3f} ms"


def _label(name: str, case: dict) -> str:
    backend = case.get("attn2d_backend")
    return f"attn2d ({backend})" if name == "attn2d" and backend else name


def _difference(r: dict) -> str:
    return f"{r['max_abs_difference']:.1e}" if "max_abs_difference" in r else ""


def markdown(report: dict) -> str:
    device = report["device"]
    lines = [
        "# attn2d bench --device cuda",
        "",
        f"Device: {report['device_description']}. A rep runs every implementation of a case in "
        "turn, the order reversed every other rep, "
        f"{report['calls_per_rep']} back-to-back calls each, timed with "
        f"{'CUDA events' if report['device_type'] == 'cuda' else 'perf_counter'}; reps go on "
        f"for at least {report['paired_seconds']:g} s a case and {report['reps']} reps. Times "
        "are medians per call; 'peer / attn2d' is the median over reps of the peer's time over "
        "attn2d's in the same rep (above 1: attn2d is faster). Peak memory: "
        "torch.cuda.max_memory_allocated growth over the inputs in one training step.",
    ]
    dense = [c for c in report["cases"] if c["kind"] == "dense"]
    if dense:
        lines += ["", "## SAGAN attention against SDPA's kernels, forward + backward", "",
                  f"On {device}; every SDPA kernel forced (torch.nn.attention.sdpa_kernel).", "",
                  "| case | implementation | forward | backward | fwd+bwd | peer / attn2d: fwd / "
                  "bwd / fwd+bwd | peak memory | max abs difference from attn2d |",
                  "|---|---|---|---|---|---|---|---|"]
        for c in dense:
            for name, r in c["results"].items():
                if "refused" in r:
                    lines.append(f"| {c['name']} | {name} | refused: {r['refused'][:160]} "
                                 "| | | | | |")
                    continue
                ratio = ("" if "over_attn2d_forward" not in r else
                         f"{r['over_attn2d_forward']:.2f} / {r['over_attn2d_backward']:.2f} / "
                         f"{r['over_attn2d_fwd_bwd']:.2f}")
                mem = format_bytes(r["peak_bytes"]) if "peak_bytes" in r else ""
                lines.append(f"| {c['name']} | {_label(name, c)} | {_ms(r['forward_s'])} | "
                             f"{_ms(r['backward_s'])} | {_ms(r['fwd_bwd_s'])} | {ratio} | {mem} | "
                             f"{_difference(r)} |")
    pattern = [c for c in report["cases"] if c["kind"] == "pattern"]
    if pattern:
        lines += ["", "## Local patterns against FlexAttention and NATTEN, forward", "",
                  f"On {device}; FlexAttention compiled (torch.compile) with the pattern as its "
                  "block mask (create_block_mask over the same mask_mod), head widths "
                  f"zero-padded to {FLEX_MIN_WIDTH} where Flex needs it; NATTEN's fused na2d on "
                  "the shifted window, whose neighbourhoods are NATTEN's.", "",
                  "| case | implementation | forward | peer / attn2d | max abs difference "
                  "from attn2d |", "|---|---|---|---|---|"]
        for c in pattern:
            for name, r in c["results"].items():
                if "refused" in r:
                    lines.append(f"| {c['name']} | {name} | unavailable: {r['refused'][:160]} "
                                 "| | |")
                    continue
                ratio = f"{r['over_attn2d_forward']:.2f}" if "over_attn2d_forward" in r else ""
                lines.append(f"| {c['name']} | {name} | {_ms(r['forward_s'])} | {ratio} | "
                             f"{_difference(r)} |")
    memory = [c for c in report["cases"] if c["kind"] == "memory"]
    if memory:
        lines += ["", "## Memory of the SAGAN block against the planner", "",
                  f"On {device}; one training step (forward + backward, float32) of "
                  "attn2d.nn.SelfAttention2d with its defaults, the planner's SAGAN block "
                  "(attn2d.planner.sagan_block): torch.cuda.max_memory_allocated growth over "
                  f"the input, against attn2d.planner.estimate (target: within "
                  f"{MEMORY_TOLERANCE:.0%} of the measured).", "",
                  "| block | implementation | measured | planner | off by | within "
                  f"{MEMORY_TOLERANCE:.0%} |", "|---|---|---|---|---|---|"]
        for c in memory:
            if "skipped" in c:
                lines.append(f"| {c['name']} | | skipped: {c['skipped']} | | | |")
                continue
            for name, r in c["results"].items():
                if "refused" in r:
                    lines.append(f"| {c['name']} | {name} | {r['refused']} | | | |")
                    continue
                lines.append(f"| {c['name']} | {name} | {format_bytes(r['measured_bytes'])} | "
                             f"{format_bytes(r['predicted_bytes'])} | {100 * r['error']:.1f}% | "
                             f"{'yes' if r['within_tolerance'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def run(out_dir: str = "attn2d-report", *, cases: Optional[list[AnyCase]] = None, reps: int = 5,
        with_memory: bool = True, with_flex: bool = True,
        paired_seconds: float = PAIRED_SECONDS, device: str = "cuda",
        log: Callable[[str], None] = print) -> dict:
    """Runs the cases and writes bench_cuda.json and bench_cuda.md under out_dir."""
    if reps < 1:
        raise ValueError(f"attn2d bench: reps must be >= 1; got {reps}")
    if not paired_seconds >= 0:
        raise ValueError(f"attn2d bench: paired_seconds must be >= 0; got {paired_seconds}")
    _checks.check_run_device("attn2d bench", device)
    dev = (torch.device("cuda", torch.cuda.current_device()) if device == "cuda"
           else torch.device("cpu"))
    cases = default_cases() if cases is None else cases
    name, description = device_description(dev)
    report = {"device": name, "device_description": description, "device_type": dev.type,
              "reps": reps, "paired_seconds": paired_seconds, "calls_per_rep": CALLS_PER_REP,
              "cases": []}
    log(f"attn2d bench on {description}")
    for i, case in enumerate(cases, 1):
        log(f"[{i}/{len(cases)}] {case.name}")
        if isinstance(case, DenseCase):
            result = run_dense_case(case, dev, reps, paired_seconds, with_memory, log)
        elif isinstance(case, PatternGpuCase):
            result = run_pattern_case(case, dev, reps, paired_seconds, with_flex, log)
        elif isinstance(case, MemoryCase):
            if not with_memory:
                continue
            result = run_memory_case(case, dev, log)
        else:
            raise TypeError(f"attn2d bench: cases must be DenseCase, PatternGpuCase or "
                            f"MemoryCase; got {type(case).__name__}")
        result["device"] = name
        report["cases"].append(result)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "bench_cuda.json"), "w") as f:
        json.dump(report, f, indent=2)
    md = markdown(report)
    with open(os.path.join(out_dir, "bench_cuda.md"), "w") as f:
        f.write(md)
    log(md)
    log(f"written: {out_dir}/bench_cuda.json, bench_cuda.md")
    return report


# ---------------------------------------------------------------------------------------------
# docs/benchmarks.md

BEGIN_MARKER = "<!-- gpu-check:begin -->"
END_MARKER = "<!-- gpu-check:end -->"


def splice_between_markers(text: str, body: str) -> str:
    """`text` with what lies between BEGIN_MARKER and END_MARKER replaced by `body`. Raises
    ValueError unless each marker occurs once, the begin marker first."""
    begins, ends = text.count(BEGIN_MARKER), text.count(END_MARKER)
    if begins != 1 or ends != 1:
        raise ValueError(f"splice_between_markers: text must hold {BEGIN_MARKER} and "
                         f"{END_MARKER} once each; found {begins} and {ends}")
    head, rest = text.split(BEGIN_MARKER)
    if END_MARKER not in rest:
        raise ValueError(f"splice_between_markers: {END_MARKER} comes before {BEGIN_MARKER}")
    tail = rest.split(END_MARKER)[1]
    return f"{head}{BEGIN_MARKER}\n{body.strip()}\n{END_MARKER}{tail}"


def splice_file(doc_path: str, body_path: str) -> None:
    """Writes body_path's text between the markers of doc_path (scripts/gpu_check.sh)."""
    with open(doc_path) as f:
        text = f.read()
    with open(body_path) as f:
        body = f.read()
    with open(doc_path, "w") as f:
        f.write(splice_between_markers(text, body))
