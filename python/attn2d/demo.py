"""`attn2d demo`: a ProGAN generator with a self-attention block before toRGB trains at 32x32 and
is killed for memory at 256x256; here both of its attention blocks (attn2d.unfused_blocks) run
forward and backward on (1, 64, 256, 256) with attn2d, beside the originals where they fit.

Every timed row runs in its own subprocess so that its peak memory is measured (resident-set
growth over the inputs), not computed; the "unfused needs" column is the lower bound the
original path cannot go under (scores + probabilities, float32). With device="cuda" the rows run
on the GPU, in this process, their memory the growth of torch.cuda.max_memory_allocated over the
inputs; the originals run wherever the planner's prediction fits the GPU's free memory."""

from __future__ import annotations

import json
import os
import time
from typing import Callable, Optional

import torch

from . import _checks
from .memory import cuda_peak_bytes, format_bytes, measure, unfused_attention_bytes

CHANNELS = 64
BLOCKS = {
    # name: (heads of its attention, description)
    "SelfAttention": (4, "LayerNorm + nn.MultiheadAttention(64, 4 heads, E=Ev=16) + feed-forward"),
    "SelfAttention2": (1, "1x1 convs: q, k at C/8 = 8, v at C = 64; unscaled; one head"),
}
RESOLUTIONS = (32, 64, 128, 256)
# The originals run only where their N x N scores and probabilities stay within 2 GiB, so that the
# demo runs on any machine.
ORIGINAL_RESOLUTIONS = {"SelfAttention": (32, 64), "SelfAttention2": (32, 64, 128)}
# On a GPU an original runs where the planner's prediction for it stays within this share of the
# free device memory (the rest for the CUDA context, cuBLAS workspaces and fragmentation).
CUDA_FREE_SHARE = 0.8


def max_difference(block: str, res: int = 64, device: str = "cpu") -> dict[str, float]:
    """Largest |original - attn2d| over the output and over every parameter gradient."""
    from .unfused_blocks import make_pair

    original, ours = (m.to(device) for m in make_pair(block, CHANNELS))
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, CHANNELS, res, res, generator=gen).to(device)
    grad = torch.randn(1, CHANNELS, res, res, generator=gen).to(device)
    outs = []
    for module in (original, ours):
        y = module(x)
        y.backward(grad)
        outs.append((y.detach(), {n: p.grad for n, p in module.named_parameters()}))
    (y0, g0), (y1, g1) = outs
    return {
        "output": float((y0 - y1).abs().max()),
        "output_scale": float(y0.abs().max()),
        "gradients": max(float((g0[n] - g1[n]).abs().max()) for n in g0),
        "gradient_scale": max(float(g0[n].abs().max()) for n in g0),
    }


def _plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, block in zip(axes, BLOCKS):
        heads = BLOCKS[block][0]
        res = list(RESOLUTIONS)
        bound = [unfused_attention_bytes(1, heads, r * r, r * r) / 2**20 for r in res]
        ax.plot(res, bound, "k--", label="unfused: scores + probabilities (computed)")
        for impl, style in (("original", "o-"), ("attn2d", "s-")):
            pts = [(r["res"], r["peak_above_baseline_bytes"] / 2**20) for r in results
                   if r["block"] == block and r["impl"] == impl and "skipped" not in r]
            if pts:
                ax.plot(*zip(*pts), style, label=f"{impl} (measured)")
        ax.axhline(24 * 1024, color="r", lw=0.8)
        ax.text(res[-1], 24 * 1024 * 1.15, "24 GiB (RTX 3090)", color="r", fontsize=8,
                ha="right")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(res, [f"{r}x{r}" for r in res])
        ax.set_xlabel("feature map")
        ax.set_title(f"ProGAN {block}, forward + backward")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("peak memory above inputs (MiB)")
    axes[0].legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cuda_original_skip_reason(block: str, res: int, device: torch.device) -> Optional[str]:
    """Why the original `block` is not run at res x res on this GPU, or None where the
    planner's prediction for it fits CUDA_FREE_SHARE of the device's free memory."""
    from . import planner

    kind = {"SelfAttention": "tokens", "SelfAttention2": "conv"}[block]
    model = {b.kind: b for b in planner.progan_blocks(CHANNELS)}[kind]
    need = planner.estimate(model, planner.Setting(res, res), "pytorch-unfused").memory_bytes
    free, _ = torch.cuda.mem_get_info(device)
    if need <= CUDA_FREE_SHARE * free:
        return None
    return (f"the planner predicts {format_bytes(need)}, over {CUDA_FREE_SHARE:.0%} of the "
            f"{format_bytes(free)} free")


def measure_cuda(block: str, impl: str, res: int, device: torch.device) -> dict:
    """Time and peak memory of a warm (second) forward + backward of a block on the GPU: the
    growth of torch.cuda.max_memory_allocated over the input, its gradient and the weights."""
    from .unfused_blocks import make_pair

    original, ours = make_pair(block, CHANNELS)
    module = (original if impl == "original" else ours).to(device)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, CHANNELS, res, res, generator=gen).to(device)
    grad = torch.randn(1, CHANNELS, res, res, generator=gen).to(device)
    module(x).backward(grad)  # warm-up: kernels compiled, cuDNN's algorithms chosen
    module.zero_grad(set_to_none=True)
    seconds = {}

    def step():
        t0 = time.perf_counter()
        out = module(x)
        torch.cuda.synchronize(device)
        t1 = time.perf_counter()
        out.backward(grad)
        torch.cuda.synchronize(device)
        seconds.update(forward_s=t1 - t0, backward_s=time.perf_counter() - t1)

    peak = cuda_peak_bytes(step, device)
    return {"impl": impl, **seconds, "peak_above_baseline_bytes": peak}


def _seconds(s: float) -> str:
    return f"{s:.2f} s" if s >= 1 else f"{1e3 * s:.1f} ms"


def run(out_dir: str = "attn2d-report", log: Callable[[str], None] = print,
        device: str = "cpu") -> str:
    """Runs the demo on `device` ("cpu" or "cuda"), prints its table and writes the report;
    returns the report's path."""
    import attn2d

    from . import _tools

    _checks.check_run_device("attn2d demo", device)
    _tools.require("attn2d demo", "matplotlib")  # for its plot, before minutes of work
    os.makedirs(out_dir, exist_ok=True)
    started = time.perf_counter()
    on_cuda = device == "cuda"
    if on_cuda:
        dev = torch.device("cuda", torch.cuda.current_device())
        where = f"GPU: {torch.cuda.get_device_name(dev)}, torch {torch.__version__}"
        running = f"on {where}"
        fmt = _seconds
    else:
        where = f"CPU: {attn2d.cpu_simd_target()} kernels, {torch.get_num_threads()} threads"
        running = (f"CPU kernels on {attn2d.cpu_simd_target()}, {torch.get_num_threads()} "
                   "threads")
        fmt = lambda s: f"{s:.2f} s"  # noqa: E731
    log(f"attn2d {attn2d.__version__}: {running}; input (1, {CHANNELS}, H, W), float32, "
        "forward + backward")
    plan = [(block, res, impl) for block in BLOCKS for res in RESOLUTIONS
            for impl in ("original", "attn2d")
            if impl == "attn2d" or on_cuda or res in ORIGINAL_RESOLUTIONS[block]]
    results = []
    for step, (block, res, impl) in enumerate(plan, 1):
        log(f"[{step}/{len(plan)}] {block} {impl} at {res}x{res} ...")
        t0 = time.perf_counter()
        if on_cuda:
            skip = cuda_original_skip_reason(block, res, dev) if impl == "original" else None
            try:
                r = {"impl": impl, "skipped": skip} if skip else measure_cuda(block, impl, res, dev)
            except torch.cuda.OutOfMemoryError:
                r = {"impl": impl, "skipped": "out of memory"}
            torch.cuda.empty_cache()
        else:
            r = measure(dict(block=block, impl=impl, res=res, channels=CHANNELS, batch=1))
        r.update(block=block, res=res)
        results.append(r)
        if "skipped" in r:
            log(f"      skipped: {r['skipped']}")
            continue
        log(f"      forward {fmt(r['forward_s'])}, backward {fmt(r['backward_s'])}, peak "
            f"{format_bytes(r['peak_above_baseline_bytes'])} ({time.perf_counter() - t0:.0f} s)")
    log("checking attn2d against the originals at 64x64 (outputs and parameter gradients) ...")
    diffs = {block: max_difference(block, device=device) for block in BLOCKS}

    rows = []
    for r in results:
        heads = BLOCKS[r["block"]][0]
        n = r["res"] ** 2
        need = unfused_attention_bytes(1, heads, n, n)
        head = f"| {r['block']} | {r['res']}x{r['res']} | {r['impl']} |"
        if "skipped" in r:
            rows.append(f"{head} - | - | skipped: {r['skipped']} | >= {format_bytes(need)} |")
            continue
        rows.append(
            f"{head} {fmt(r['forward_s'])} | {fmt(r['backward_s'])} | "
            f"{format_bytes(r['peak_above_baseline_bytes'])} | >= {format_bytes(need)} |"
        )
    measured_how = (
        "growth of torch.cuda.max_memory_allocated over the input, its gradient and the "
        "weights during a warm (second) forward + backward. The originals run where the "
        "planner's prediction fits the GPU's free memory." if on_cuda else
        "resident-set growth over the inputs during a warm (second) forward + backward in a "
        "fresh subprocess. The originals run only where they fit.")
    lines = [
        "# attn2d demo: the ProGAN generator's self-attention blocks, forward + backward",
        "",
        f"{where}. Input (1, {CHANNELS}, H, W), float32.",
        "",
        *[f"- **{b}**: {desc}" for b, (_, desc) in BLOCKS.items()],
        "",
        f"Peak memory is measured: {measured_how} "
        "'Unfused needs' is computed: the N x N scores and probabilities (per head) that the "
        "original keeps for its backward, a lower bound.",
        "",
        "| block | map | implementation | forward | backward | peak memory (measured) | "
        "unfused needs (computed) |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Largest difference between the original and attn2d at 64x64 (same weights, float32):",
        "",
        *[f"- {b}: output {d['output']:.1e} (largest |output| {d['output_scale']:.1f}), "
          f"parameter gradients {d['gradients']:.1e} (largest {d['gradient_scale']:.1f})"
          for b, d in diffs.items()],
        "",
        "![peak memory against resolution](demo_memory.png)",
        "",
    ]
    report = os.path.join(out_dir, "demo.md")
    with open(report, "w") as f:
        f.write("\n".join(lines))
    with open(os.path.join(out_dir, "demo.json"), "w") as f:
        json.dump({"results": results, "max_difference_64x64": diffs}, f, indent=2)
    _plot(results, os.path.join(out_dir, "demo_memory.png"))
    log("")
    log("\n".join(lines[:-2]))
    log(f"report: {report} and demo_memory.png, demo.json beside it "
        f"({time.perf_counter() - started:.0f} s in all)")
    return report
