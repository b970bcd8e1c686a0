"""The operations users call."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from . import _checks, _ops, backends  # noqa: F401  (_ops loads the binding)


def _autocast_inputs(*ts):
    """Under autocast to bfloat16/float16 on the inputs' device (CPU or CUDA), q, k and v are
    cast to that dtype (as autocast does for matmul) and attention runs in the 16-bit kernels:
    float32 accumulation, output in the autocast dtype. Float masks are left as they are
    (float32 masks are accepted)."""
    first = ts[0]
    if not isinstance(first, torch.Tensor) or first.device.type not in ("cpu", "cuda"):
        return ts
    device = first.device.type
    if not torch.is_autocast_enabled(device):
        return ts
    dtype = torch.get_autocast_dtype(device)
    if dtype not in (torch.bfloat16, torch.float16):
        return ts
    return tuple(
        t.to(dtype) if isinstance(t, torch.Tensor) and t.device.type == device
        and t.dtype in (torch.float32, torch.bfloat16, torch.float16) else t
        for t in ts)


def _keeps_out_accum(q, k, v) -> bool:
    """Whether a Triton forward keeps its float32 output for the backward's D: a 16-bit call
    that a backward may follow (the CPU operators ask the same in C++, torch_autograd.cc)."""
    return (q.dtype in (torch.bfloat16, torch.float16) and torch.is_grad_enabled()
            and any(t.requires_grad for t in (q, k, v)))


def _global_attention(backend: str, q, k, v, attn_mask, is_causal: bool, scale: float):
    if backend == "cpu":
        return torch.ops.attn2d.attention_forward(q, k, v, attn_mask, is_causal, scale)[0]
    if backend == "triton":
        from .triton import ops  # noqa: F401  (registers the Triton operators)

        return torch.ops.attn2d.triton_attention_forward(q, k, v, attn_mask, is_causal, scale,
                                                         [], [], _keeps_out_accum(q, k, v))[0]
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                                            is_causal=is_causal, scale=scale)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_mask: Optional[torch.Tensor] = None,
    is_causal: bool = False,
    scale: Optional[float] = None,
    pattern=None,
) -> torch.Tensor:
    """Exact softmax attention that never stores the Lq x Lk score matrix.

    q (B, H, Lq, E), k (B, H, Lk, E), v (B, H, Lk, Ev) -> (B, H, Lq, Ev). The meaning is that of
    ``torch.nn.functional.scaled_dot_product_attention`` without dropout: ``scale`` defaults to
    1/sqrt(E); a bool ``attn_mask`` is True where attention is allowed, a float one is added to
    the scores; it broadcasts to (B, H, Lq, Lk). ``is_causal`` lets query i see keys j <= i
    (top-left aligned) and may be combined with ``attn_mask``. E may differ from Ev and any
    strides are accepted without a copy. A query row with no allowed key gives 0 (and gradient 0).

    ``pattern`` (attn2d.patterns: Window1D, Random, BlockMask, their unions and intersections,
    or any pattern, reading the sequences as 1 x L grids) restricts each query to its keys and
    computes only those pairs; it excludes ``attn_mask`` and ``is_causal`` (Window1D's causal
    option is the causal window).

    Runs on CPU tensors (attn2d's C++ kernels) and CUDA tensors (attn2d's Triton kernels, or
    torch's SDPA where its flash or cuDNN kernel takes the call); attn2d.use_backend steers
    the choice and attn2d.explain reports it.
    """
    fn = "attn2d.attention"
    if pattern is not None:
        if attn_mask is not None or is_causal is not False:
            raise ValueError(f"{fn}: pattern excludes attn_mask and is_causal (a causal window "
                             "is Window1D(size, causal=True))")
        for name, t in (("q", q), ("k", k), ("v", v)):
            _checks.check_tensor(fn, name, t)
            if t.dim() != 4:
                raise ValueError(f"{fn}: {name} must be 4-D (B, H, L, E) with a pattern; got "
                                 f"shape {tuple(t.shape)}")
        return _attention2d(fn, q.unsqueeze(2), k.unsqueeze(2), v.unsqueeze(2), pattern,
                            scale).squeeze(2)
    q, k, v = _autocast_inputs(q, k, v)
    _checks.check_attention(fn, q, k, v, attn_mask)
    if not isinstance(is_causal, bool):
        raise TypeError(f"{fn}: is_causal must be a bool; got {type(is_causal).__name__}")
    scale = _checks.resolve_scale(fn, scale, q.shape[-1])
    if attn_mask is not None and attn_mask.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{fn}: attn_mask requires grad, but gradients with respect to the "
                         "mask are not supported; pass attn_mask.detach()")
    choice = backends.choose_backend(fn, q, k, v, attn_mask, is_causal, pattern=False)
    return _global_attention(choice.backend, q, k, v, attn_mask, is_causal, scale)


def _check_grid_tensor(fn: str, name: str, t: object, what: str) -> torch.Tensor:
    _checks.check_tensor(fn, name, t)
    if t.dim() != 5:
        raise ValueError(f"{fn}: {name} must be 5-D {what}; got shape {tuple(t.shape)}")
    return t


# torch.compile would trace the layouts' construction (a sparse layout's data-dependent tensor
# slicing fails under fullgraph=True). They depend only on the pattern and the grid sizes, which
# the compiled graph is specialized on, so they run once at trace time and their tensors are
# constants of the graph.
@torch.compiler.assume_constant_result
def _sparse_layout(pattern, q_hw, kv_hw, heads):
    from . import _compiled_layout

    return list(_compiled_layout.build(pattern, q_hw, kv_hw, heads))


@torch.compiler.assume_constant_result
def _device_layout(pattern, q_hw, kv_hw, heads, device):
    from .triton import ops

    return list(ops.device_layout(pattern, q_hw, kv_hw, heads, device).tensors)


@torch.compiler.assume_constant_result
def _device_layout_programs(pattern, q_hw, kv_hw, heads, device):
    from .triton import ops

    return list(ops.device_layout(pattern, q_hw, kv_hw, heads, device).programs)


@torch.compiler.assume_constant_result
def _window_offsets(pattern, q_hw, kv_hw):
    from . import _compiled_layout

    return _compiled_layout.window_offsets(pattern, q_hw, kv_hw)


class _Resolved(NamedTuple):
    """attention2d's inputs as the kernels take them: q, k, v as (B, heads, N, width) views,
    the scale (None: the default, for a global call), the pattern's layout and window offsets
    (each None where absent; offsets only where the window kernels serve the pattern, by the
    core's rule), and the query and key grids."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    scale: Optional[float]
    layout: Optional[list]
    offsets: Optional[torch.Tensor]
    q_hw: tuple[int, int]
    kv_hw: tuple[int, int]


def _resolve_pattern(fn, q, k, v, pattern, scale) -> _Resolved:
    """Checks attention2d's inputs (errors name `fn`) and resolves them (_Resolved)."""
    _check_grid_tensor(fn, "q", q, "(B, heads, Hq, Wq, E)")
    _check_grid_tensor(fn, "k", k, "(B, heads, Hk, Wk, E)")
    _check_grid_tensor(fn, "v", v, "(B, heads, Hk, Wk, Ev)")
    if v.shape[2:4] != k.shape[2:4]:
        raise ValueError(
            f"{fn}: v's grid {tuple(v.shape[2:4])} must equal k's grid {tuple(k.shape[2:4])}"
        )
    H, q_hw, kv_hw = q.shape[1], tuple(q.shape[2:4]), tuple(k.shape[2:4])
    q4, k4, v4 = q.flatten(2, 3), k.flatten(2, 3), v.flatten(2, 3)
    if pattern is None:
        return _Resolved(q4, k4, v4, scale, None, None, q_hw, kv_hw)
    from . import patterns as _patterns

    if not isinstance(pattern, _patterns.Pattern):
        raise TypeError(
            f"{fn}: pattern must be None or an attn2d.patterns pattern (Window, YLG, Window1D, "
            f"Random, BlockMask, Union, Intersection); got {type(pattern).__name__}"
        )
    pattern.check(q_hw, kv_hw, H)
    _checks.check_attention(fn, q4, k4, v4, None)
    scale = _checks.resolve_scale(fn, scale, q.shape[-1])
    offsets = _window_offsets(pattern, q_hw, kv_hw)
    layout = None if offsets is not None else _sparse_layout(pattern, q_hw, kv_hw, H)
    return _Resolved(q4, k4, v4, scale, layout, offsets, q_hw, kv_hw)


def attention2d(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    pattern=None,
    scale: Optional[float] = None,
) -> torch.Tensor:
    """Attention between pixels: q (B, heads, Hq, Wq, E), k (B, heads, Hk, Wk, E),
    v (B, heads, Hk, Wk, Ev) -> (B, heads, Hq, Wq, Ev).

    The key grid may be smaller than the query grid (pooled keys and values, as in SAGAN,
    BigGAN and YLG): query pixel (i, j) is centred at key pixel (i*Hk//Hq, j*Wk//Wq).
    pattern=None is global attention; a pattern of attn2d.patterns (Window, YLG, the sequence
    patterns read in raster order, and unions and intersections) restricts each query to its
    keys (pattern.dense_mask shows which).
    """
    return _attention2d("attn2d.attention2d", q, k, v, pattern, scale)


def _attention2d(fn: str, q, k, v, pattern, scale) -> torch.Tensor:
    """attention2d, its errors naming `fn`."""
    q, k, v = _autocast_inputs(q, k, v)
    r = _resolve_pattern(fn, q, k, v, pattern, scale)
    if pattern is None:
        return attention(r.q, r.k, r.v, scale=r.scale).unflatten(2, r.q_hw)
    choice = backends.choose_backend(fn, r.q, r.k, r.v, None, False, pattern=True)
    if choice.backend == "triton":
        where = (pattern, r.q_hw, r.kv_hw, r.q.shape[1], r.q.device)
        out = torch.ops.attn2d.triton_attention_forward(
            r.q, r.k, r.v, None, False, r.scale, _device_layout(*where),
            _device_layout_programs(*where), _keeps_out_accum(r.q, r.k, r.v))[0]
    elif r.offsets is not None:
        out = torch.ops.attn2d.attention2d_window_forward(r.q, r.k, r.v, r.offsets, *r.q_hw,
                                                          r.scale)[0]
    else:
        from . import _compiled_layout

        out = torch.ops.attn2d.attention2d_forward(r.q, r.k, r.v, r.layout, _compiled_layout.BLOCK_Q,
                                                   r.scale)[0]
    return out.unflatten(2, r.q_hw)
