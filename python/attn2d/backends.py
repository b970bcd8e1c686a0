"""Which backend runs a call: attn2d's C++ CPU kernels, its Triton kernels, or torch's own
fused scaled_dot_product_attention (SDPA), and the setting that steers the choice.

The kernel inside a backend is chosen by that backend: the CPU kernels by the core's chooser
(src/core/kernel_choice.cc), the Triton kernels by whether the call has a pattern (block-sparse
tiles over its compiled layout) or not (dense tiles), SDPA by torch."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Optional

import torch

BACKENDS = ("auto", "cpu", "triton", "sdpa")
_setting = "auto"


class use_backend:
    """Sets the backend for the whole process: "auto" (the default: the CPU kernels for CPU
    tensors; on CUDA, torch's SDPA for a global call that its flash or cuDNN kernel accepts
    and attn2d's Triton kernels for everything else), "cpu", "triton" or "sdpa".

    ``attn2d.use_backend("triton")`` keeps the setting; ``with attn2d.use_backend("triton"):``
    restores the previous one on leaving the block. With TRITON_INTERPRET=1 set before triton
    is imported, "triton" also runs on CPU tensors, through Triton's interpreter."""

    def __init__(self, backend: str) -> None:
        global _setting
        if not isinstance(backend, str):
            raise TypeError(f"attn2d.use_backend: backend must be a str; got {type(backend).__name__}")
        if backend not in BACKENDS:
            raise ValueError(f"attn2d.use_backend: backend must be one of {BACKENDS}; got {backend!r}")
        self._previous, _setting = _setting, backend

    def __enter__(self) -> "use_backend":
        return self

    def __exit__(self, *exc) -> None:
        global _setting
        _setting = self._previous


def backend_setting() -> str:
    """The backend set by use_backend ("auto" unless set)."""
    return _setting


@dataclass(frozen=True)
class BackendChoice:
    """backend: "cpu", "triton" or "sdpa"; reason: why; refused: (backend, reason) for each
    other backend that could not or should not serve the call."""

    backend: str
    reason: str
    refused: tuple[tuple[str, str], ...] = ()


@functools.lru_cache(maxsize=1)
def triton_status() -> tuple[bool, bool, str]:
    """(importable, interpreted, why not importable). Interpreted: TRITON_INTERPRET=1 was set
    when attn2d's kernels were defined, so they run on CPU tensors through numpy."""
    try:
        from .triton import kernels, ops  # noqa: F401  (ops registers the Triton operators)
    except ImportError as e:
        return False, False, f"triton is not installed ({e}); pip install triton"
    from triton.runtime.interpreter import InterpretedFunction

    return True, isinstance(kernels.attention_forward_kernel, InterpretedFunction), ""


MAX_TRITON_WIDTH = 256


def _triton_refusal(device: torch.device, q_width: int, v_width: int) -> str:
    """Why the Triton kernels cannot run heads of these widths on `device`, or ""."""
    importable, interpreted, why = triton_status()
    if not importable:
        return why
    if max(q_width, v_width) > MAX_TRITON_WIDTH:
        return (f"head widths up to {MAX_TRITON_WIDTH} (E = {q_width}, Ev = {v_width}): a "
                "64-row tile of wider heads does not fit a GPU's registers")
    if device.type == "cuda":
        if interpreted:
            return ("triton's interpreter is on (TRITON_INTERPRET=1), and it runs CPU tensors "
                    "only; unset it to compile the kernels for the GPU")
        return ""
    if device.type == "cpu":
        if not interpreted:
            return ("CPU tensors run on the Triton kernels only through triton's interpreter: "
                    "set TRITON_INTERPRET=1 before triton is imported")
        return ""
    return f"the Triton kernels run on CUDA tensors, not on {device.type}"


def _sdpa_fast_kernel(q, k, v, attn_mask, is_causal) -> str:
    """The name of SDPA's flash or cuDNN kernel if one accepts these CUDA inputs, else "".
    The rule assumes, as attn2d.planner.SPEED_ORDER does, that those beat attn2d's Triton kernels
    on the shapes they take (equal head widths, multiples of 8, 16-bit) and that SDPA's
    mem-efficient kernel does not (scripts/gpu_check.sh times both). Under torch.compile only
    the flash probe runs: it is the one whose answer dynamo can fold into the graph."""
    if q.device.type != "cuda" or attn_mask is not None:
        return ""
    params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, is_causal, False)
    if torch.backends.cuda.can_use_flash_attention(params, False):
        return "flash"
    if not torch.compiler.is_compiling() and torch.backends.cuda.can_use_cudnn_attention(
            params, False):
        return "cudnn"
    return ""


def _sdpa_refusal(pattern: bool) -> str:
    if pattern:
        return "SDPA has no 2-D patterns (a pattern is a sparse mask it would store densely)"
    return ""


def choose_backend(fn: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   attn_mask: Optional[torch.Tensor], is_causal: bool, *, pattern: bool,
                   setting: Optional[str] = None) -> BackendChoice:
    """The backend that runs this call under `setting` (default: use_backend's). Raises
    ValueError, naming the setting and the reason, when the set backend cannot run it. The
    tensors have passed _checks.check_attention: one device, CPU or CUDA."""
    setting = _setting if setting is None else setting
    device = q.device
    cpu_refusal = "" if device.type == "cpu" else f"the C++ kernels run on CPU tensors, not {device.type}"
    triton_refusal = _triton_refusal(device, q.shape[-1], v.shape[-1])
    sdpa_refusal = _sdpa_refusal(pattern)

    def refuse_or_pick(backend: str, refusal: str) -> BackendChoice:
        if refusal:
            raise ValueError(f"{fn}: use_backend({backend!r}): {refusal}")
        others = {"cpu": cpu_refusal, "triton": triton_refusal, "sdpa": sdpa_refusal}
        refused = tuple((b, why or "not chosen: use_backend sets " + repr(backend))
                        for b, why in others.items() if b != backend)
        return BackendChoice(backend, f"use_backend({backend!r})", refused)

    if setting == "cpu":
        return refuse_or_pick("cpu", cpu_refusal)
    if setting == "triton":
        return refuse_or_pick("triton", triton_refusal)
    if setting == "sdpa":
        return refuse_or_pick("sdpa", sdpa_refusal)
    if device.type == "cpu":
        others = (("triton", triton_refusal or "auto runs CPU tensors on the C++ kernels"),
                  ("sdpa", sdpa_refusal or "auto runs CPU tensors on the C++ kernels"))
        return BackendChoice("cpu", "CPU tensors: attn2d's C++ kernels", others)
    fast = "" if sdpa_refusal else _sdpa_fast_kernel(q, k, v, attn_mask, is_causal)
    if fast:
        return BackendChoice(
            "sdpa", f"global attention that SDPA's {fast} kernel accepts (it has no double "
            "backward: for gradient penalties through it, use_backend('triton'))",
            (("cpu", cpu_refusal), ("triton", triton_refusal or f"SDPA's {fast} kernel is faster")))
    if triton_refusal:
        if sdpa_refusal:
            raise ValueError(f"{fn}: no backend runs this call on {device}: Triton: "
                             f"{triton_refusal}; SDPA: {sdpa_refusal}")
        return BackendChoice("sdpa", "attn2d's Triton kernels cannot run here",
                             (("cpu", cpu_refusal), ("triton", triton_refusal)))
    if sdpa_refusal:
        why_sdpa = sdpa_refusal
    elif attn_mask is not None:
        why_sdpa = ("a mask: SDPA's flash kernel takes none, and attn2d's kernels give a row "
                    "with no allowed key 0 output and 0 gradient on every device")
    else:
        why_sdpa = ("neither SDPA's flash nor its cuDNN kernel accepts these inputs (head "
                    "widths, dtype)")
    return BackendChoice("triton", "attn2d's Triton kernels" + (" (a 2-D pattern)" if pattern else ""),
                         (("cpu", cpu_refusal), ("sdpa", why_sdpa)))
