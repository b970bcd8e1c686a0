"""attn2d: exact, memory-efficient attention for images (fused tiled kernels in C++)."""

import torch

from . import nn, patterns
from .functional import attention, attention2d

__version__ = "0.1.0"


def cpu_simd_target() -> str:
    """The SIMD target the CPU kernels dispatch to on this machine (e.g. "AVX2")."""
    return torch.ops.attn2d.cpu_simd_target()


__all__ = ["attention", "attention2d", "cpu_simd_target", "nn", "patterns", "__version__"]
