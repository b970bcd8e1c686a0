"""attn2d.explain: which kernel serves a call, forward and backward, and why.

The answer comes from the core's kernel chooser (src/core/kernel_choice.cc), the same function
that picks the kernel when the call runs; nothing is computed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from . import _checks, _ops  # noqa: F401  (_ops loads the binding)
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

    def __str__(self) -> str:
        return f"forward: {self.forward}\nbackward: {self.backward}"


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
    """Which kernel attn2d.attention (4-D q, k, v) or attn2d.attention2d (5-D, with or without
    a pattern) runs for these arguments, forward and backward, and why each other kernel
    refused. ``print(attn2d.explain(...))`` reads as text; ``.forward.kernel`` and the other
    fields serve programs. The inputs are checked as the call itself checks them."""
    fn = "attn2d.explain"
    q, k, v = _autocast_inputs(q, k, v)
    if not isinstance(is_causal, bool):
        raise TypeError(f"{fn}: is_causal must be a bool; got {type(is_causal).__name__}")
    from . import _layout

    layout = offsets = None
    height = width = 0
    if isinstance(q, torch.Tensor) and q.dim() == 5:
        if attn_mask is not None or is_causal:
            raise ValueError(f"{fn}: attn_mask and is_causal apply to 4-D (B, H, L, E) inputs "
                             "(attn2d.attention), not to 5-D grids (attn2d.attention2d)")
        r = _resolve_pattern(fn, q, k, v, pattern, scale)
        q, k, v, scale, layout, offsets = r.q, r.k, r.v, r.scale, r.layout, r.offsets
        height, width = r.q_hw
        if layout is not None:
            # A clip window on one grid that the window kernels refused: the chooser says why.
            offsets = _layout.window_offsets_on_grid(pattern, r.q_hw, r.kv_hw)
    elif pattern is not None:
        raise ValueError(f"{fn}: a pattern needs 5-D grids q (B, heads, Hq, Wq, E), k and v; "
                         f"got q of shape {tuple(getattr(q, 'shape', ()))}")
    _checks.check_attention(fn, q, k, v, attn_mask)
    scale = _checks.resolve_scale(fn, scale, q.shape[-1])
    fields = torch.ops.attn2d.explain(q, k, v, attn_mask, is_causal, layout or [],
                                      _layout.BLOCK_Q, offsets, height, width, scale)
    return Explanation(_report(fields, "forward"), _report(fields, "backward"))
