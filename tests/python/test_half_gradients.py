"""16-bit gradients against float64 attention on the same rounded inputs, beside torch.

Two rules a case, in the same test: our error is at most 2x the error of naive attention in the
same dtype, and at most 2x the error of torch.nn.functional.scaled_dot_product_attention in that
dtype, each plus a floor. And one sharper rule where the backward's D = rowsum(dO * O) matters:
with float products (float16; bfloat16 with attn2d.set_bf16_products("float")), dQ is rounded
once, its rms error within 1.1x of the rms error of the correctly rounded result. D from the
16-bit output puts dQ 10-80x past that on non-negative inputs, whose rows of dP share a large
common part that D must cancel."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

import attn2d
from attn2d.patterns import YLG, Window
from reference import max_err, naive_attention

DTYPES = [torch.bfloat16, torch.float16]
FLOOR = {torch.bfloat16: 1e-3, torch.float16: 1e-4}


def _grads(fn, q, k, v, g):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), g.to(out.dtype)))


def _oracle(fn, q, k, v, g):
    """Float64 results on the rounded inputs, not rounded back to their dtype."""
    return _grads(fn, q.double(), k.double(), v.double(), g.double())


def _inputs(dtype, B, H, Lq, Lk, E, Ev, positive, seed):
    torch.manual_seed(seed)
    draw = torch.rand if positive else torch.randn
    return (draw(B, H, Lq, E).to(dtype), draw(B, H, Lk, E).to(dtype),
            draw(B, H, Lk, Ev).to(dtype), draw(B, H, Lq, Ev).to(dtype))


def _mask(kind, Lq, Lk):
    if kind == "none":
        return None
    if kind == "masked_rows":  # random keys, and every third row sees none
        m = torch.rand(Lq, Lk, generator=torch.Generator().manual_seed(Lq)) < 0.5
        m[::3] = False
        return m
    # Lower-right causal as a bool mask: query i sees keys j <= i + Lk - Lq.
    return torch.ones(Lq, Lk, dtype=torch.bool).tril(Lk - Lq)


def _rms_units(got, want, dtype):
    """rms error of got in units of the rms error of want rounded once to dtype."""
    once = (want.to(dtype).double() - want).pow(2).mean().sqrt()
    return ((got.double() - want).pow(2).mean().sqrt() / once.clamp_min(1e-300)).item()


CASES = [  # (Lq, Lk, E, Ev, mask)
    (17, 17, 8, 8, "masked_rows"),
    (17, 23, 8, 16, "lower_right"),
    (128, 128, 16, 16, "none"),
    (128, 160, 64, 64, "lower_right"),
    (257, 257, 32, 24, "masked_rows"),
    (600, 600, 64, 64, "none"),
    (600, 640, 16, 64, "lower_right"),
]


@pytest.mark.parametrize("positive", [False, True], ids=["randn", "rand"])
@pytest.mark.parametrize("Lq,Lk,E,Ev,mask", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_16_bit_gradients_within_twice_naive_and_torch(dtype, Lq, Lk, E, Ev, mask, positive):
    q, k, v, g = _inputs(dtype, 1, 2, Lq, Lk, E, Ev, positive, Lq + Lk + E)
    kw = {"attn_mask": _mask(mask, Lq, Lk)}
    ours = _grads(lambda a, b, c: attn2d.attention(a, b, c, **kw), q, k, v, g)
    oracle = _oracle(lambda a, b, c: naive_attention(a, b, c, **kw), q, k, v, g)
    naive = _grads(lambda a, b, c: naive_attention(a, b, c, dtype=dtype, **kw), q, k, v, g)
    torch_sdpa = _grads(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, **kw), q, k, v, g)
    for name, o, w, n, t in zip(("out", "dq", "dk", "dv"), ours, oracle, naive, torch_sdpa):
        assert o.dtype == dtype and torch.isfinite(o).all(), name
        err = max_err(o, w)
        assert err <= 2 * max_err(n, w) + FLOOR[dtype], f"{name}: {err} vs naive {max_err(n, w)}"
        assert err <= 2 * max_err(t, w) + FLOOR[dtype], f"{name}: {err} vs torch {max_err(t, w)}"
    if mask == "masked_rows":  # rows that see no key: output 0, dQ 0
        assert torch.equal(ours[0][:, :, ::3], torch.zeros_like(ours[0][:, :, ::3]))
        assert torch.equal(ours[1][:, :, ::3], torch.zeros_like(ours[1][:, :, ::3]))


@contextlib.contextmanager
def _float_products():
    previous = torch.ops.attn2d.bf16_products()
    torch.ops.attn2d.set_bf16_products("float")
    try:
        yield
    finally:
        torch.ops.attn2d.set_bf16_products("auto" if previous == "pairs" else previous)


def _assert_dq_rounded_once(dtype, fn, oracle_fn, q, k, v, g):
    with _float_products():
        ours = _grads(fn, q, k, v, g)
    oracle = _oracle(oracle_fn, q, k, v, g)
    for name, o, w in zip(("out", "dq", "dk", "dv"), ours, oracle):
        assert _rms_units(o, w, dtype) <= 1.1, (name, _rms_units(o, w, dtype))


@pytest.mark.parametrize("Lq,Lk,E,Ev,mask", [CASES[0], CASES[1], CASES[3], CASES[5]])
@pytest.mark.parametrize("dtype", DTYPES)
def test_16_bit_dq_is_rounded_once(dtype, Lq, Lk, E, Ev, mask):
    q, k, v, g = _inputs(dtype, 1, 2, Lq, Lk, E, Ev, True, 11 * Lq + E)
    kw = {"attn_mask": _mask(mask, Lq, Lk)}
    _assert_dq_rounded_once(dtype, lambda a, b, c: attn2d.attention(a, b, c, **kw),
                            lambda a, b, c: naive_attention(a, b, c, **kw), q, k, v, g)


@pytest.mark.parametrize("pattern", [Window(7), Window(5, border="shift"), Window(5, "manhattan"), YLG(4)],
                         ids=["window", "window_shift", "window_manhattan", "ylg"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_16_bit_pattern_dq_is_rounded_once(dtype, pattern):
    """The window kernels and the tiled sparse ones, through attention2d."""
    torch.manual_seed(8)
    B, H, Hq, Wq, E, Ev = 1, 4, 16, 24, 16, 16

    def draw(d):
        return torch.rand(B, H, Hq, Wq, d).to(dtype)

    q, k, v, g = draw(E), draw(E), draw(Ev), draw(Ev)
    mask = pattern.dense_mask((Hq, Wq), (Hq, Wq), H)[None]

    def flat(t):
        return t.flatten(2, 3)

    _assert_dq_rounded_once(
        dtype, lambda a, b, c: flat(attn2d.attention2d(a, b, c, pattern=pattern)),
        lambda a, b, c: naive_attention(flat(a), flat(b), flat(c), attn_mask=mask),
        q, k, v, flat(g))


def test_float32_output_is_kept_only_for_16_bit_training():
    """The forward keeps its float32 output for the backward where a 16-bit call may be
    followed by one; inference and float32 calls keep none."""
    q, k, v = (torch.rand(1, 2, 9, 8) for _ in range(3))
    for dtype, wants_grad, kept in [(torch.bfloat16, True, True), (torch.float16, True, True),
                                    (torch.bfloat16, False, False),
                                    (torch.float32, True, False)]:
        a, b, c = (t.clone().to(dtype).requires_grad_(wants_grad) for t in (q, k, v))
        out, lse, out_accum = torch.ops.attn2d.attention_forward(a, b, c, None, False, 0.3)
        assert (out_accum.shape == out.shape) == kept, (dtype, wants_grad)
        if kept:
            assert out_accum.dtype == torch.float32
            assert torch.equal(out_accum.to(dtype), out.detach())
    # Asked for explicitly (as the Triton path's caller does), outside autograd.
    a, b, c = (t.bfloat16() for t in (q, k, v))
    out, _, out_accum = torch.ops.attn2d.attention_forward(a, b, c, None, False, 0.3, True)
    assert out_accum.shape == out.shape and torch.equal(out_accum.bfloat16(), out)
