"""Input checks shared by the public functions and the fake (meta) kernels.

Errors name the function, the argument and what was expected: ValueError for shapes, sizes and
options, TypeError for types and dtypes.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
# 16-bit inputs are computed in float32: their lse is float32 and additive masks may be float32.
LOW_PRECISION = (torch.bfloat16, torch.float16)


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_tensor(fn: str, name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor; got {type(t).__name__}")
    return t


def check_rank(fn: str, name: str, t: torch.Tensor, layout: str) -> None:
    rank = len(layout.split(","))
    if t.dim() != rank:
        raise ValueError(f"{fn}: {name} must be {rank}-D {layout}; got shape {tuple(t.shape)}")


def check_float_dtype(fn: str, name: str, t: torch.Tensor) -> None:
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"{fn}: {name} must be float32, float64, bfloat16 or float16; got {t.dtype}"
        )


def check_same_dtype(fn: str, tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
    first_name, first = tensors[0]
    for name, t in tensors[1:]:
        if t.dtype != first.dtype:
            raise TypeError(
                f"{fn}: {name} has dtype {t.dtype} but {first_name} has {first.dtype}; "
                "all must match"
            )


def check_on_device(fn: str, name: str, t: torch.Tensor, device: torch.device) -> None:
    """One device for every tensor of a call, and one attn2d runs on."""
    if t.device != device:
        raise ValueError(f"{fn}: {name} is on {t.device} but q is on {device}; all tensors "
                         "must be on one device")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"{fn}: {name} is on {device}; attn2d runs on CPU and CUDA tensors")


def check_run_device(fn: str, device: object) -> None:
    """A --device value of the command line and the tools: "cpu", or "cuda" where torch sees a
    CUDA device (the error says why not)."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"{fn}: device must be 'cpu' or 'cuda'; got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        why = (f"torch {torch.__version__} is built without CUDA" if torch.version.cuda is None
               else f"torch {torch.__version__} is built for CUDA {torch.version.cuda} and "
               "finds no GPU")
        raise ValueError(f"{fn}: --device cuda: torch sees no CUDA device ({why})")


def check_size(fn: str, name: str, t: torch.Tensor, dim: int, want: int, what: str) -> None:
    if t.shape[dim] != want:
        raise ValueError(
            f"{fn}: {name}.shape[{dim}] ({what}) is {t.shape[dim]} but must be {want}; "
            f"got {name} of shape {tuple(t.shape)}"
        )


def check_mask(fn: str, mask: Optional[torch.Tensor], q: torch.Tensor, full: tuple) -> None:
    if mask is None:
        return
    check_tensor(fn, "attn_mask", mask)
    allowed = {torch.bool, q.dtype}
    if q.dtype in LOW_PRECISION:
        allowed.add(torch.float32)
    if mask.dtype not in allowed:
        extra = " or float32" if q.dtype in LOW_PRECISION else ""
        raise TypeError(
            f"{fn}: attn_mask must be bool (True = may attend) or have q's dtype {q.dtype}"
            f"{extra} (added to the scores); got {mask.dtype}"
        )
    shape = tuple(mask.shape)
    ok = len(shape) <= 4 and all(
        s == 1 or s == f for s, f in zip(reversed(shape), reversed(full))
    )
    if not ok:
        raise ValueError(
            f"{fn}: attn_mask of shape {shape} does not broadcast to (B, H, Lq, Lk) = {full}"
        )


def check_attention(
    fn: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: Optional[torch.Tensor],
    *,
    check_device: bool = True,
) -> None:
    """Shapes, dtypes and devices of attention(q, k, v, attn_mask)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(fn, name, t)
    check_rank(fn, "q", q, "(B, H, Lq, E)")
    check_rank(fn, "k", k, "(B, H, Lk, E)")
    check_rank(fn, "v", v, "(B, H, Lk, Ev)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float_dtype(fn, name, t)
    check_same_dtype(fn, [("q", q), ("k", k), ("v", v)])
    if check_device:
        for name, t in (("q", q), ("k", k), ("v", v)):
            check_on_device(fn, name, t, q.device)
        if attn_mask is not None and isinstance(attn_mask, torch.Tensor):
            check_on_device(fn, "attn_mask", attn_mask, q.device)
    check_size(fn, "k", k, 0, q.shape[0], "batch")
    check_size(fn, "k", k, 1, q.shape[1], "heads")
    check_size(fn, "k", k, 3, q.shape[3], "E, the query/key width")
    check_size(fn, "v", v, 0, q.shape[0], "batch")
    check_size(fn, "v", v, 1, q.shape[1], "heads")
    check_size(fn, "v", v, 2, k.shape[2], "Lk, the number of keys")
    check_mask(fn, attn_mask, q, (q.shape[0], q.shape[1], q.shape[2], k.shape[2]))


def resolve_scale(fn: str, scale: Optional[float], head_dim: int) -> float:
    """SDPA's default 1/sqrt(E); E = 0 has all-zero scores, so any finite scale will do."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim) if head_dim > 0 else 1.0
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"{fn}: scale must be a real number or None; got {type(scale).__name__}")
    if not math.isfinite(scale):
        raise ValueError(f"{fn}: scale must be finite; got {scale}")
    return float(scale)
