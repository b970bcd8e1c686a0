"""Runs one case in a fresh process and prints its time and peak memory as JSON.

A case is either bare attention ({"impl": "attn2d" or a name in attn2d.peers.PEERS, "B", "H",
"Lq", "Lk", "E", "Ev"}; with "q_hw", "kv_hw" and an optional "pattern" spec, attn2d.attention2d;
with impl "sdpa-math-masked", a pattern and its grids, SDPA's math path under the pattern's dense
mask; with impl "flex-masked" and "backward": false, FlexAttention's compiled forward under its
block mask) or one of the ProGAN blocks of attn2d.unfused_blocks ({"block": "SelfAttention" |
"SelfAttention2", "impl": "attn2d" | "original", "res", "channels", "batch"}), forward and (by
default) backward.

Peak memory is the resident set's high-water mark (VmHWM) after the inputs exist and one
warm-up run has finished, minus the resident set at that moment: what the attention itself
added, measured, not computed. The mark is reset first (/proc/self/clear_refs), so importing
torch does not count, and malloc's free memory is handed back before the baseline (it could
otherwise be reused unseen). Run it through attn2d.memory.measure, which fixes malloc's mmap
threshold so that freed buffers leave the resident set.

    python -m attn2d._probe '{"impl": "attn2d", "B": 1, "H": 1, "Lq": 4096, ...}'
    python -m attn2d._probe '{"block": "SelfAttention2", "impl": "original", "res": 64, ...}'
"""

from __future__ import annotations

import ctypes
import gc
import json
import math
import sys
import time


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status")


def _release_free_memory() -> None:
    """Hands malloc's free memory back to the system, so that the measured run cannot reuse
    resident pages unseen. The fixed mmap threshold (attn2d.memory.measure) applies only when
    the heap has to grow: a large request that fits the heap's free memory is carved from it,
    and the warm-up's freed output would stay resident there, hiding the measured run's own
    output (a 256x256 window forward's peak, its output alone 16 MiB, could read 0.0 MiB)."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim this way
        pass


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


from .peers import DENSE_MASKED, FLEX_MASKED, PEERS, dense_masked_math  # noqa: E402


def _attention_case(case):
    """The function to run for a bare attention case, its output gradient and its leaves."""
    import torch

    import attn2d

    dtype = getattr(torch, case.get("dtype", "float32"))
    B, H, Lq, Lk = case["B"], case["H"], case["Lq"], case["Lk"]
    E, Ev = case["E"], case["Ev"]
    backward = bool(case.get("backward", True))
    scale = case.get("scale", 1.0 / math.sqrt(E))
    gen = torch.Generator().manual_seed(int(case.get("seed", 0)))
    q = torch.randn(B, H, Lq, E, generator=gen, dtype=dtype).requires_grad_(backward)
    k = torch.randn(B, H, Lk, E, generator=gen, dtype=dtype).requires_grad_(backward)
    v = torch.randn(B, H, Lk, Ev, generator=gen, dtype=dtype).requires_grad_(backward)
    grad = torch.randn(B, H, Lq, Ev, generator=gen, dtype=dtype)
    impl = case["impl"]
    if "q_hw" in case:  # a pixel grid, optionally with a pattern
        from attn2d.patterns import from_spec

        q_hw, kv_hw = tuple(case["q_hw"]), tuple(case["kv_hw"])
        pattern = from_spec(case["pattern"]) if "pattern" in case else None
        if impl == DENSE_MASKED:
            # SDPA's math path under the pattern's dense (H, Lq, Lk) bool mask: an input built
            # before the baseline, as attn2d's cached layout is below.
            mask = pattern.dense_mask(q_hw, kv_hw, H)
            return (lambda: dense_masked_math(q, k, v, mask, scale)), grad, [q, k, v]
        if impl == FLEX_MASKED:
            # FlexAttention's compiled forward under the pattern's block mask (no CPU backward:
            # run with "backward": false); the block mask is an input, compiled in the warm-up.
            from attn2d.bench_patterns import PatternCase, flex_forward

            run = flex_forward(PatternCase("probe", H, q_hw, kv_hw, E, Ev, pattern),
                               q.detach(), k.detach(), v.detach())
            if run is None:
                raise SystemExit("FlexAttention or this pattern's mask_mod is unavailable")
            return run, grad, [q, k, v]
        # attn2d.attention2d
        q5, k5, v5 = (t.detach().unflatten(2, hw).requires_grad_(backward)
                      for t, hw in ((q, q_hw), (k, kv_hw), (v, kv_hw)))
        if pattern is not None:  # the cached layout is part of the set-up, not the run
            from attn2d import _compiled_layout

            _compiled_layout.build(pattern, q_hw, kv_hw, H)
        grad = grad.unflatten(2, q_hw)
        return ((lambda: attn2d.attention2d(q5, k5, v5, pattern=pattern, scale=scale)), grad,
                [q5, k5, v5])
    if impl == "attn2d":
        return (lambda: attn2d.attention(q, k, v, scale=scale)), grad, [q, k, v]
    if impl in PEERS:
        return (lambda: PEERS[impl](q, k, v, scale)), grad, [q, k, v]
    raise SystemExit(f"unknown impl {impl!r}")


def _block_case(case):
    """The function to run for one of the ProGAN blocks, its output gradient and parameters."""
    import torch

    from attn2d.unfused_blocks import make_pair

    original, ours = make_pair(case["block"], int(case["channels"]))
    module = {"original": original, "attn2d": ours}[case["impl"]]
    gen = torch.Generator().manual_seed(int(case.get("seed", 0)))
    shape = (int(case.get("batch", 1)), int(case["channels"]), int(case["res"]), int(case["res"]))
    x = torch.randn(shape, generator=gen)
    grad = torch.randn(shape, generator=gen)
    return (lambda: module(x)), grad, list(module.parameters())


def _r1_case(case):
    """An R1 step (attn2d.bench_double_backward.r1_step) as the probe runs it: fn returns the
    penalty, whose backward is the measured backward."""
    import torch

    from attn2d.bench_double_backward import r1_step

    penalty, module, x = r1_step(case["impl"], int(case["channels"]), int(case["res"]),
                                 int(case.get("batch", 1)), int(case.get("seed", 0)),
                                 case.get("pattern", "global"))
    return penalty, torch.ones(()), list(module.parameters()) + [x]


def main(argv: list[str]) -> int:
    case = json.loads(argv[1])
    import torch

    if "threads" in case:
        torch.set_num_threads(int(case["threads"]))
    if "block" in case:
        fn, grad, leaves = _block_case(case)
    elif case.get("r1"):
        fn, grad, leaves = _r1_case(case)
    else:
        fn, grad, leaves = _attention_case(case)
    backward = bool(case.get("backward", True))
    impl = case["impl"]

    if case.get("warmup", True):
        # One untimed run first, as a training loop's second step: code pages faulted in,
        # thread pools and autograd's engine started. Its buffers are freed before the baseline;
        # the parent runs this process with a fixed 64 KiB mmap threshold, so freed buffers leave
        # the resident set instead of sitting in malloc's free lists, where the measured run
        # could reuse them unseen.
        warm = fn()
        if backward:
            warm.backward(grad)
        del warm
        for t in leaves:
            t.grad = None
    _release_free_memory()
    baseline_kib = _status_kib("VmRSS")
    reset = _reset_peak()
    t0 = time.perf_counter()
    out = fn()
    t1 = time.perf_counter()
    if backward:
        out.backward(grad)
    t2 = time.perf_counter()
    peak_kib = _status_kib("VmHWM")
    result = {
        "impl": impl,
        "forward_s": t1 - t0,
        "backward_s": t2 - t1 if backward else None,
        "baseline_bytes": baseline_kib * 1024,
        "peak_above_baseline_bytes": max(peak_kib - baseline_kib, 0) * 1024,
        "peak_reset": reset,
        "threads": torch.get_num_threads(),
    }
    if case.get("checksum"):
        result["out_sum"] = float(out.detach().double().sum())
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
