"""attn2d: exact, memory-efficient attention for images (fused tiled kernels in C++)."""

import torch

from . import nn, patterns
from .backends import backend_setting, use_backend
from .explain import explain
from .functional import attention, attention2d

__version__ = "0.1.0"


def cpu_simd_target() -> str:
    """The SIMD target the CPU kernels dispatch to on this machine (e.g. "AVX2")."""
    return torch.ops.attn2d.cpu_simd_target()


BF16_PRODUCTS = ("auto", "pairs", "float")


def set_bf16_products(choice: str) -> None:
    """How the kernels multiply bfloat16 inputs, for the whole process: "pairs" (VDPBF16PS on
    bf16 pairs, where the CPU has AVX512-BF16; P and dS rounded to bf16 as naive bf16 attention
    rounds them), "float" (inputs widened to float32 FMAs) or "auto" (the default: pairs where
    this CPU's VDPBF16PS measured at least 1.5x the multiply-adds a second of its FMAs, e.g. AMD
    Zen 5; float where not, e.g. an Intel Xeon whose VDPBF16PS ran at half its FMAs' rate)."""
    if not isinstance(choice, str):
        raise TypeError(f"attn2d.set_bf16_products: choice must be a str; got {type(choice).__name__}")
    if choice not in BF16_PRODUCTS:
        raise ValueError(f"attn2d.set_bf16_products: choice must be one of {BF16_PRODUCTS}; got {choice!r}")
    torch.ops.attn2d.set_bf16_products(choice)


def bf16_products() -> str:
    """The products bfloat16 inputs run on now: "pairs" or "float"."""
    return torch.ops.attn2d.bf16_products()


def set_workspace_limit(limit_bytes) -> None:
    """The most scratch memory one CPU kernel call may allocate, in bytes, for the whole process;
    None: no limit but the allocator's. A call whose workspace would pass it raises MemoryError
    with the size it asked for, as it does where the allocator itself refuses."""
    if limit_bytes is None:
        torch.ops.attn2d.set_workspace_limit(-1)
        return
    if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int):
        raise TypeError("attn2d.set_workspace_limit: limit_bytes must be an int or None; got "
                        f"{type(limit_bytes).__name__}")
    if limit_bytes < 0:
        raise ValueError(f"attn2d.set_workspace_limit: limit_bytes must be >= 0; got {limit_bytes}")
    torch.ops.attn2d.set_workspace_limit(limit_bytes)


def workspace_limit():
    """The limit set_workspace_limit set, in bytes, or None."""
    limit = torch.ops.attn2d.workspace_limit()
    return None if limit < 0 else limit


__all__ = ["attention", "attention2d", "backend_setting", "bf16_products", "cpu_simd_target",
           "explain", "nn", "patterns", "set_bf16_products", "set_workspace_limit", "use_backend",
           "workspace_limit", "__version__"]
