"""bfloat16 and float16 inputs: float32 accumulation in the fused kernels, one rounding of each
result. Rule (as for float32): our error against float64 attention on the same rounded inputs
is at most 2x the error of naive attention computed in the same 16-bit dtype, plus a floor."""

from __future__ import annotations

import pytest
import torch

import attn2d
from attn2d.patterns import YLG, Window
from reference import max_err, naive_attention

DTYPES = [torch.bfloat16, torch.float16]
FLOOR = {torch.bfloat16: 1e-3, torch.float16: 1e-4}


def _grads(fn, q, k, v, g):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), g.to(out.dtype))
    return out.detach(), dq, dk, dv


def _check_against_naive(dtype, q, k, v, g, **kw):
    """q, k, v, g in `dtype`; kw for attn2d.attention and naive_attention."""
    ours = _grads(lambda a, b, c: attn2d.attention(a, b, c, **kw), q, k, v, g)
    oracle = _grads(lambda a, b, c: naive_attention(a, b, c, **kw), q, k, v, g.double())
    naive = _grads(lambda a, b, c: naive_attention(a, b, c, dtype=dtype, **kw), q, k, v, g)
    for name, o, w, n in zip(("out", "dq", "dk", "dv"), ours, oracle, naive):
        assert o.dtype == dtype, name
        err, naive_err = max_err(o, w), max_err(n, w)
        assert err <= 2 * naive_err + FLOOR[dtype], f"{name}: {err} vs naive {naive_err}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,H,Lq,Lk,E,Ev", [
    (1, 1, 1, 1, 1, 1), (2, 3, 97, 33, 8, 64), (1, 2, 65, 129, 59, 17), (1, 1, 300, 257, 64, 64),
])
def test_matches_float64_within_twice_naive_16_bit_error(dtype, B, H, Lq, Lk, E, Ev):
    torch.manual_seed(Lq * 7 + Lk)
    q = (torch.randn(B, H, Lq, E) * 1.5).to(dtype)
    k = (torch.randn(B, H, Lk, E) * 1.5).to(dtype)
    v = torch.randn(B, H, Lk, Ev).to(dtype)
    g = torch.randn(B, H, Lq, Ev).to(dtype)
    _check_against_naive(dtype, q, k, v, g)


@pytest.mark.parametrize("dtype", DTYPES)
def test_nchw_views_masks_and_causal(dtype):
    torch.manual_seed(3)
    B, C, Hh, W = 2, 16, 7, 9
    x = torch.randn(B, 3 * C, Hh, W).to(dtype)
    # Conv outputs viewed as (B, heads=2, N, C/2): last-dim stride H*W, no copy.
    q, k, v = (t.reshape(B, 2, C // 2, Hh * W).transpose(-1, -2) for t in x.split(C, 1))
    g = torch.randn(B, 2, Hh * W, C // 2).to(dtype)
    bool_mask = torch.rand(Hh * W, Hh * W) < 0.6
    bias32 = torch.randn(1, 2, Hh * W, Hh * W)
    _check_against_naive(dtype, q, k, v, g, attn_mask=bool_mask)
    _check_against_naive(dtype, q, k, v, g, attn_mask=bias32)
    _check_against_naive(dtype, q, k, v, g, attn_mask=bias32.to(dtype))
    _check_against_naive(dtype, q, k, v, g, is_causal=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fully_masked_rows_give_zero_and_zero_gradient(dtype):
    torch.manual_seed(4)
    q, k, v = (torch.randn(1, 2, 6, 8).to(dtype).requires_grad_() for _ in range(3))
    mask = torch.ones(6, 6, dtype=torch.bool)
    mask[2] = False
    out = attn2d.attention(q, k, v, attn_mask=mask)
    out.float().sum().backward()
    assert torch.equal(out[:, :, 2], torch.zeros_like(out[:, :, 2]))
    assert torch.equal(q.grad[:, :, 2], torch.zeros_like(q.grad[:, :, 2]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pattern", [Window(5, "manhattan"), Window(4, border="shift"), YLG(2),
                                     YLG(None, patterns=["rtl-repetitive", "ltr-repetitive"])])
# 20 x 32: whole-vector rows, where a window runs on the blocked kernels and the forward's
# streamed planes (several bands a head); 11 x 13 on the one-vector-at-a-time ones.
@pytest.mark.parametrize("hw", [(11, 13), (20, 32)])
# channels_first: views of (B, H, d, Hq, Wq) tensors, as attn2d.nn passes conv outputs (the
# output gradient too); the gathered-tile kernels copy them to rows first.
@pytest.mark.parametrize("storage", ["rows", "channels_first"])
def test_patterns_in_16_bit(dtype, pattern, hw, storage):
    torch.manual_seed(5)
    B, H, E = 2, 2, 8
    Hq, Wq = hw

    def make(d):
        if storage == "rows":
            return torch.randn(B, H, Hq, Wq, d).to(dtype)
        return torch.randn(B, H, d, Hq, Wq).to(dtype).permute(0, 1, 3, 4, 2)

    q, k, v, g = make(E), make(E), make(16), make(16)
    assert storage == "rows" or q.stride(-1) == Hq * Wq
    mask = pattern.dense_mask((Hq, Wq), (Hq, Wq), H)[None]

    def flat(t):
        return t.flatten(2, 3)

    ours = _grads(lambda a, b, c: attn2d.attention2d(a, b, c, pattern=pattern), q, k, v, g)
    oracle = _grads(lambda a, b, c: naive_attention(flat(a), flat(b), flat(c), attn_mask=mask),
                    q, k, v, flat(g).double())
    naive = _grads(lambda a, b, c: naive_attention(flat(a), flat(b), flat(c), attn_mask=mask,
                                                   dtype=dtype), q, k, v, flat(g))
    for name, o, w, n in zip(("out", "dq", "dk", "dv"), ours, oracle, naive):
        o = o.flatten(2, 3)
        w, n = w.reshape(o.shape), n.reshape(o.shape)
        assert o.dtype == dtype
        assert max_err(o, w) <= 2 * max_err(n, w) + FLOOR[dtype], name


def test_lse_is_float32_and_opcheck_passes():
    q, k, v = (torch.randn(1, 2, 9, 8).bfloat16() for _ in range(3))
    out, lse, _ = torch.ops.attn2d.attention_forward(q, k, v, None, False, 0.3)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    torch.library.opcheck(torch.ops.attn2d.attention_forward, (q, k, v, None, False, 0.3))
    g = torch.randn_like(out)
    torch.library.opcheck(torch.ops.attn2d.attention_backward,
                          (g, q, k, v, out, lse, None, False, 0.3))
    with pytest.raises(TypeError, match="lse"):
        torch.ops.attn2d.attention_backward(g, q, k, v, out, lse.bfloat16(), None, False, 0.3)


def test_autocast_module_output_is_close_to_float32():
    torch.manual_seed(6)
    block = attn2d.nn.SelfAttention2d(64, heads=8, pattern=YLG(8))
    torch.nn.init.normal_(block.gamma)
    x = torch.randn(2, 64, 16, 16)
    want = block(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = block(x)
    got.float().sum().backward()
    assert block.query.weight.grad is not None
    # A few bf16 roundings (2^-8 relative each) through the projections and the attention.
    assert max_err(got, want) <= 4 * 2**-8 * float(want.detach().abs().max())


def _cpu_has_avx512_bf16() -> bool:
    """From the kernel's CPU flags, independently of attn2d's own detection."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx512_bf16" in line for line in f)
    except OSError:
        pytest.skip("no /proc/cpuinfo to tell whether the CPU has AVX512-BF16")


@pytest.fixture
def restore_bf16_products():
    yield
    attn2d.set_bf16_products("auto")


@pytest.mark.parametrize("choice", ["pairs", "float"])
def test_bf16_products_choice_switches_the_kernels_and_both_hold_the_rule(choice,
                                                                         restore_bf16_products):
    attn2d.set_bf16_products(choice)
    # "pairs" runs where the CPU has AVX512-BF16 (this project's compilers all build the pair
    # kernels); "float" runs everywhere.
    expected = "pairs" if choice == "pairs" and _cpu_has_avx512_bf16() else "float"
    assert attn2d.bf16_products() == expected
    gen = torch.Generator().manual_seed(31)
    q, k, v = (torch.randn(1, 2, n, e, generator=gen).bfloat16()
               for n, e in ((150, 64), (211, 64), (211, 48)))
    g = torch.randn(1, 2, 150, 48, generator=gen).bfloat16()
    _check_against_naive(torch.bfloat16, q, k, v, g)
    _check_against_naive(torch.bfloat16, q, k, v, g, is_causal=True)


def test_bf16_products_pairs_and_float_differ_only_by_rounding(restore_bf16_products):
    attn2d.set_bf16_products("pairs")
    if attn2d.bf16_products() != "pairs":
        pytest.skip("no AVX512-BF16 pair kernels on this CPU or build")
    gen = torch.Generator().manual_seed(32)
    q, k, v = (torch.randn(1, 2, 128, 64, generator=gen).bfloat16() for _ in range(3))
    pairs = attn2d.attention(q, k, v)
    attn2d.set_bf16_products("float")
    widened = attn2d.attention(q, k, v)
    # P is rounded to bf16 on the pair products: the outputs differ, by a few bf16 ulps at most.
    assert not torch.equal(pairs, widened)
    assert (pairs.float() - widened.float()).abs().max() < 0.05


def test_set_bf16_products_rejects_bad_choices():
    with pytest.raises(ValueError, match="set_bf16_products: choice must be one of"):
        attn2d.set_bf16_products("fast")
    with pytest.raises(TypeError, match="must be a str"):
        attn2d.set_bf16_products(1)
    with pytest.raises(ValueError, match="choice must be 'auto', 'pairs' or 'float'"):
        torch.ops.attn2d.set_bf16_products("fast")
    assert attn2d.bf16_products() in ("pairs", "float")
