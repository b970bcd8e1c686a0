"""`attn2d demo`: seed 000's failing case (self-attention on a 256x256 feature map), run.

Each row runs in its own subprocess so that its peak memory is measured, not computed; the
unfused figure beside it is the lower bound that path would need (scores + probabilities).
"""

from __future__ import annotations

import math
import os
import time
from typing import Callable

import torch

from .memory import format_bytes, measure, unfused_attention_bytes


def _max_difference(side: int, E: int, Ev: int) -> float:
    """attn2d against the unfused matmul-softmax-matmul path, outputs and gradients."""
    import attn2d

    n = side * side
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, n, E, generator=gen), torch.randn(1, 1, n, E, generator=gen)
    v = torch.randn(1, 1, n, Ev, generator=gen)
    grad = torch.randn(1, 1, n, Ev, generator=gen)
    results = []
    for fused in (True, False):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        if fused:
            out = attn2d.attention(qq, kk, vv)
        else:
            s = qq @ kk.transpose(-1, -2) / math.sqrt(E)
            out = torch.softmax(s, dim=-1) @ vv
        out.backward(grad)
        results.append([out.detach(), qq.grad, kk.grad, vv.grad])
    return max(float((a - b).abs().max()) for a, b in zip(*results))


def run(out_dir: str = "attn2d-report", log: Callable[[str], None] = print) -> str:
    """Runs the demo, prints its table and writes it as markdown; returns the report path."""
    import attn2d

    E, Ev = 8, 64  # SAGAN-style: q/k at C/8, v at C for C = 64
    rows = []
    header = (
        "| map | tokens N | implementation | forward | backward | peak memory (measured) | "
        "unfused path needs |"
    )
    log(f"attn2d {attn2d.__version__}: CPU kernels on {attn2d.cpu_simd_target()}, "
        f"{torch.get_num_threads()} threads; one head, E={E}, Ev={Ev}, float32")
    plan = [(64, ("attn2d", "unfused")), (128, ("attn2d",)), (256, ("attn2d",))]
    for side, impls in plan:
        n = side * side
        need = unfused_attention_bytes(1, 1, n, n)
        for impl in impls:
            log(f"  running {impl} forward+backward on a {side}x{side} map (N={n}) ...")
            t0 = time.perf_counter()
            r = measure(dict(impl=impl, B=1, H=1, Lq=n, Lk=n, E=E, Ev=Ev))
            rows.append(
                f"| {side}x{side} | {n} | {impl} | {r['forward_s']:.2f} s | "
                f"{r['backward_s']:.2f} s | {format_bytes(r['peak_above_baseline_bytes'])} | "
                f">= {format_bytes(need)} |"
            )
            log(f"    done in {time.perf_counter() - t0:.1f} s: " + rows[-1])
    log("  checking attn2d against the unfused path at 64x64 (outputs and gradients) ...")
    diff = _max_difference(64, E, Ev)
    lines = [
        "# attn2d demo: self-attention on a feature map, forward and backward",
        "",
        f"CPU: {attn2d.cpu_simd_target()} kernels, {torch.get_num_threads()} threads. One image, "
        f"one head, q/k width E={E}, v width Ev={Ev}, float32.",
        "Peak memory: resident-set growth over the inputs, measured in a fresh subprocess. "
        "'Unfused path needs': the Lq x Lk scores and probabilities that matmul + softmax + "
        "matmul keeps for its backward (a lower bound).",
        "",
        header,
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Largest difference between attn2d and the unfused path at 64x64 (output and "
        f"gradients): {diff:.2e}.",
        "",
    ]
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "demo.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    log("")
    log("\n".join(lines))
    log(f"report written to {path}")
    return path
