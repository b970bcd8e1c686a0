"""Property tests (hypothesis): attention and attention2d over drawn shapes, strides, masks,
causal, scale and patterns, in float64, against naive float64 attention. 200 examples each in
every run; ATTN2D_SLOW=1 draws 2,000."""

from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attn2d
from attn2d.patterns import YLG, YLG_PATTERNS, Window
from reference import naive_attention

EXAMPLES = 2000 if os.environ.get("ATTN2D_SLOW") == "1" else 200
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
TOL = 1e-10


def _tensor(draw, shape, name):
    """A float64 tensor of `shape`, contiguous or a view: the last two dims transposed from
    storage, or every other element of a wider last dim."""
    layout = draw(st.sampled_from(["rows", "transposed", "strided"]), label=f"{name} layout")
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1), label=f"{name} seed"))
    if layout == "transposed" and len(shape) >= 2:
        return torch.randn(*shape[:-2], shape[-1], shape[-2], generator=gen,
                           dtype=torch.float64).transpose(-1, -2)
    if layout == "strided":
        return torch.randn(*shape[:-1], 2 * shape[-1], generator=gen, dtype=torch.float64)[..., ::2]
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


@st.composite
def attention_cases(draw):
    B, H = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    Lq, Lk = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    E, Ev = draw(st.integers(1, 20)), draw(st.integers(1, 20))
    q = _tensor(draw, (B, H, Lq, E), "q")
    k = _tensor(draw, (B, H, Lk, E), "k")
    v = _tensor(draw, (B, H, Lk, Ev), "v")
    kw = {"is_causal": draw(st.booleans())}
    if draw(st.booleans()):
        kw["scale"] = draw(st.floats(0.05, 2.0))
    mask_kind = draw(st.sampled_from([None, "bool", "additive"]))
    if mask_kind is not None:
        shape = draw(st.sampled_from([(Lq, Lk), (1, Lk), (B, 1, Lq, Lk), (1, H, 1, Lk), (Lk,)]))
        gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
        if mask_kind == "bool":
            kw["attn_mask"] = torch.rand(shape, generator=gen) < draw(st.floats(0.0, 1.0))
        else:
            kw["attn_mask"] = torch.randn(shape, generator=gen, dtype=torch.float64)
    return q, k, v, kw


@SETTINGS
@given(attention_cases())
def test_attention_matches_float64_naive(case):
    q, k, v, kw = case
    leaves = [t.requires_grad_() for t in (q, k, v)]
    out = attn2d.attention(*leaves, **kw)
    want = naive_attention(*leaves, **kw)
    assert (out - want).abs().max() <= TOL
    grad = torch.randn_like(want)
    ours = torch.autograd.grad(out, leaves, grad)
    theirs = torch.autograd.grad(want, leaves, grad)
    for a, b in zip(ours, theirs):
        assert (a - b).abs().max() <= TOL


@st.composite
def pattern_cases(draw):
    heads = draw(st.sampled_from([1, 2, 4]))
    hq, wq = draw(st.integers(2, 12)), draw(st.integers(2, 12))
    pool = draw(st.sampled_from([1, 1, 2]))
    kv_hw = (max(1, hq // pool), max(1, wq // pool))
    if draw(st.booleans()):
        border = draw(st.sampled_from(["clip", "shift"]))
        metric = "chebyshev" if border == "shift" else draw(
            st.sampled_from(["chebyshev", "manhattan", "euclidean"]))
        pattern = Window(draw(st.integers(1, 7)), metric, draw(st.integers(1, 3)), border)
    else:
        pattern = YLG(heads, [draw(st.sampled_from(YLG_PATTERNS)) for _ in range(heads)],
                      draw(st.sampled_from(["official", "geometric"])))
    try:
        pattern.check((hq, wq), kv_hw, heads)
    except ValueError:  # too large for the drawn grids: the one-key window stands in
        pattern = Window(1)
    E, Ev = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    q = _tensor(draw, (1, heads, hq, wq, E), "q")
    k = _tensor(draw, (1, heads, *kv_hw, E), "k")
    v = _tensor(draw, (1, heads, *kv_hw, Ev), "v")
    return pattern, q, k, v


@SETTINGS
@given(pattern_cases())
def test_attention2d_matches_its_dense_mask(case):
    pattern, q, k, v = case
    q_hw, kv_hw, heads = tuple(q.shape[2:4]), tuple(k.shape[2:4]), q.shape[1]
    mask = pattern.dense_mask(q_hw, kv_hw, heads)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    out = attn2d.attention2d(*leaves, pattern=pattern)
    want = naive_attention(*(t.flatten(2, 3) for t in leaves), attn_mask=mask).unflatten(2, q_hw)
    assert (out - want).abs().max() <= TOL
    grad = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(out, leaves, grad), torch.autograd.grad(want, leaves, grad)):
        assert (a - b).abs().max() <= TOL
