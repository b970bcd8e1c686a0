"""attn2d.explain: which backend and kernel serve a call, forward and backward, and why.

The answers come from the functions that choose when the call runs: the backend from
attn2d.backends.choose_backend, the CPU kernel from the core's kernel chooser
(src/core/kernel_choice.cc); nothing is computed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from . import _checks, _ops, backends  # noqa: F401  (_ops loads the binding)
from .functional import _autocast_inputs, _resolve_pattern


@dataclass(frozen=True)
class KernelReport:
    """One direction's choice. kernel: "dense_tiles", "sparse_tiles", "query_lanes", "window"
    or "reference"; products: "float32", "float64", "float" (16-bit inputs widened to float32)
    or "bf16 pairs"; schedule: how the kernel splits its work: the tiled backward's "whole
    heads", "key-tile groups" or "two passes", the window kernels' "blocked rows" or "one
    vector at a time"; "" where none; reason: why this kernel;
    refused: (kernel, reason) for each other kernel."""

    kernel: str
    products: str
    schedule: str
    reason: str
    refused: tuple[tuple[str, str], ...]

    def __str__(self) -> str:
        head = self.kernel + (f" ({self.schedule})" if self.schedule else "")
        lines = [f"{head}, products {self.products}", f"  why: {self.reason}"]
        lines += [f"  not {name}: {why}" for name, why in self.refused]
        return "\n".join(lines)


@dataclass(frozen=True)
class Explanation:
    forward: KernelReport
    backward: KernelReport
    backend: backends.BackendChoice

    def __str__(self) -> str:
        b = self.backend
        lines = [f"backend: {b.backend}", f"  why: {b.reason}"]
        lines += [f"  not {name}: {why}" for name, why in b.refused]
        return "\n".join(lines) + f"\nforward: {self.forward}\nbackward: {self.backward}"


def _products(dtype: torch.dtype) -> str:
    if dtype in _checks.LOW_PRECISION:
        return f"{str(dtype).replace('torch.', '')} with float32 accumulation"
    return "float32 (exact, not TF32)" if dtype == torch.float32 else "float64"


def _gpu_reports(choice: backends.BackendChoice, q: torch.Tensor, k: torch.Tensor,
                 layout) -> tuple:
    """Forward and backward reports of the Triton or SDPA backend."""
    if choice.backend == "sdpa":
        kernel = "sdpa"
        for name in ("flash", "cudnn"):
            if f"{name} kernel" in choice.reason:
                kernel = f"sdpa_{name}"
        report = KernelReport(kernel, str(q.dtype).replace("torch.", ""), "", choice.reason, ())
        return report, report
    if layout:
        kernel = "triton_sparse_tiles"
        head_layout, q_begin, fwd_begin = layout[0], layout[1], layout[5]
        visits = sum(int(fwd_begin[q_begin[i + 1]] - fwd_begin[q_begin[i]]) for i in head_layout)
        why = (f"a 2-D pattern: 64x64 tiles over its compiled layout; {visits * 64 * 64:,} "
               "(query, key) pairs computed per image over all heads, against "
               f"{q.shape[1] * q.shape[2] * k.shape[2]:,} for global attention")
    else:
        kernel = "triton_dense_tiles"
        why = "global attention: 64-query tiles over every key tile"
    products = _products(q.dtype)
    forward = KernelReport(kernel, products, "query tiles", why, ())
    backward = KernelReport(kernel, products, "key tiles (dK, dV), then query tiles (dQ)",
                            why + "; P recomputed from the saved lse, no atomics", ())
    return forward, backward


def _report(fields: list[str], direction: str) -> KernelReport:
    values = {}
    refused = []
    for line in fields:
        d, key, value = line.split("\t", 2)
        if d != direction:
            continue
        if key == "refused":
            name, why = value.split("\t", 1)
            refused.append((name, why))
        else:
            values[key] = value
    return KernelReport(values["kernel"], values["products"], values["schedule"],
                        values["reason"], tuple(refused))


def explain(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_mask: Optional[torch.Tensor] = None,
    is_causal: bool = False,
    pattern=None,
    scale: Optional[float] = None,
) -> Explanation:
    """Which kernel attn2d.attention (4-D q, k, v, with or without a pattern) or
    attn2d.attention2d (5-D, with or without a pattern) runs for these arguments, forward and
    backward, and why each other kernel refused. ``print(attn2d.explain(...))`` reads as text;
    ``.forward.kernel`` and the other fields serve programs. The inputs are checked as the call
    itself checks them."""
    fn = "attn2d.explain"
    q, k, v = _autocast_inputs(q, k, v)
    if not isinstance(is_causal, bool):
        raise TypeError(f"{fn}: is_causal must be a bool; got {type(is_causal).__name__}")
    if (pattern is not None and isinstance(q, torch.Tensor) and q.dim() == 4
            and attn_mask is None and not is_causal):
        # attn2d.attention with a pattern: the sequences as 1 x L grids, as that call runs them.
        q, k, v = (t.unsqueeze(2) if isinstance(t, torch.Tensor) else t for t in (q, k, v))
    from . import _compiled_layout

    layout = offsets = None
    height = width = 0
    grid_pattern = None
    if isinstance(q, torch.Tensor) and q.dim() == 5:
        if attn_mask is not None or is_causal:
            raise ValueError(f"{fn}: attn_mask and is_causal apply to 4-D (B, H, L, E) inputs "
                             "(attn2d.attention), not to 5-D grids (attn2d.attention2d)")
        r = _resolve_pattern(fn, q, k, v, pattern, scale)
        q, k, v, scale, layout, offsets = r.q, r.k, r.v, r.scale, r.layout, r.offsets
        height, width = r.q_hw
        grid_pattern = (pattern, r.q_hw, r.kv_hw) if pattern is not None else None
        if layout is not None:
            # A clip window on one grid that the window kernels refused: the chooser says why.
            offsets = _compiled_layout.window_offsets_on_grid(pattern, r.q_hw, r.kv_hw)
    elif pattern is not None:
        raise ValueError(f"{fn}: a pattern takes 4-D sequences (B, H, L, E) without attn_mask "
                         "and is_causal, or 5-D grids (B, heads, H, W, E); got q of shape "
                         f"{tuple(getattr(q, 'shape', ()))}")
    _checks.check_attention(fn, q, k, v, attn_mask)
    scale = _checks.resolve_scale(fn, scale, q.shape[-1])
    choice = backends.choose_backend(fn, q, k, v, attn_mask, is_causal,
                                     pattern=grid_pattern is not None)
    if choice.backend != "cpu":
        sparse = None
        if grid_pattern is not None:
            sparse = _compiled_layout.build(grid_pattern[0], grid_pattern[1], grid_pattern[2], q.shape[1])
        return Explanation(*_gpu_reports(choice, q, k, sparse), choice)
    fields = torch.ops.attn2d.explain(q, k, v, attn_mask, is_causal, layout or [],
                                      _compiled_layout.BLOCK_Q, offsets, height, width, scale)
    return Explanation(_report(fields, "forward"), _report(fields, "backward"), choice)
