"""The double backward (attn2d/double_backward.py): gradgradcheck in float64 over awkward shapes,
masks and every pattern kind; second derivatives in float32 against float64 naive attention
under the 2x rule; an R1 penalty through the modules against the same modules built from torch
operations."""

from __future__ import annotations

import pytest
import torch

import attn2d
import attn2d.nn as ann
from attn2d.patterns import YLG, BlockMask, Random, Window, Window1D
from module_references import RefMultiheadSelfAttention2d, RefSelfAttention2d
from reference import max_err, naive_attention
from test_nn import _pair
from test_sequence_patterns import EIGHT_BLOCKS_ONE_EMPTY


def _leaves(*shapes, dtype=torch.float64):
    return [torch.randn(s, dtype=dtype).requires_grad_() for s in shapes]


def _gradgradcheck(fn, inputs, fast_mode=True):
    """fast_mode checks random projections of the second-derivative Jacobian (torch's fast
    gradcheck), which any wrong entry changes; the global shapes also run the full check."""
    assert torch.autograd.gradgradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-5,
                                        fast_mode=fast_mode)


# (B, H, Lq, Lk, E, Ev): E in {1, 3, 8}, E != Ev, Lq != Lk, primes.
SHAPES = [(1, 1, 5, 7, 1, 2), (2, 2, 7, 5, 3, 4), (1, 2, 11, 3, 8, 3), (1, 1, 1, 1, 3, 3)]


@pytest.mark.parametrize("B,H,Lq,Lk,E,Ev", SHAPES)
def test_gradgradcheck_global(B, H, Lq, Lk, E, Ev):
    _gradgradcheck(attn2d.attention, _leaves((B, H, Lq, E), (B, H, Lk, E), (B, H, Lk, Ev)),
                   fast_mode=False)


@pytest.mark.parametrize("variant", ["bool mask with a dead row", "additive mask", "causal",
                                     "causal and mask", "strided", "scale"])
def test_gradgradcheck_masks_causal_strides(variant):
    q, k, v = _leaves((2, 2, 6, 3), (2, 2, 5, 3), (2, 2, 5, 4))
    kw = {}
    mask = torch.rand(6, 5) < 0.6
    mask[4] = False
    if variant == "bool mask with a dead row":
        kw["attn_mask"] = mask
    elif variant == "additive mask":
        kw["attn_mask"] = torch.randn(2, 1, 6, 5, dtype=torch.float64)
    elif variant == "causal":
        kw["is_causal"] = True
    elif variant == "causal and mask":
        kw.update(is_causal=True, attn_mask=mask)
    elif variant == "strided":
        q = torch.randn(2, 6, 2, 3, dtype=torch.float64).transpose(1, 2).requires_grad_()
        v = torch.randn(2, 2, 5, 8, dtype=torch.float64)[..., ::2].requires_grad_()
    elif variant == "scale":
        kw["scale"] = 0.7
    _gradgradcheck(lambda a, b, c: attn2d.attention(a, b, c, **kw), (q, k, v))


@pytest.mark.parametrize("pattern", [None, Window(3), YLG(2), Window(3, border="shift")],
                         ids=repr)
def test_gradgradcheck_over_many_row_groups(monkeypatch, pattern):
    # The smallest groups the module makes (16 rows, one 64-row tile of a layout): several
    # groups, gathered and scattered rows.
    from attn2d import double_backward

    monkeypatch.setattr(double_backward, "GROUP_BYTES", 1)
    if pattern is None:
        q, k, v = _leaves((1, 2, 37, 3), (1, 2, 20, 3), (1, 2, 20, 2))
        mask = torch.rand(37, 20) < 0.7
        _gradgradcheck(lambda a, b, c: attn2d.attention(a, b, c, attn_mask=mask,
                                                        is_causal=True), (q, k, v))
        return
    q, k, v = _leaves((1, 2, 9, 9, 2), (1, 2, 9, 9, 2), (1, 2, 9, 9, 3))
    _gradgradcheck(lambda a, b, c: attn2d.attention2d(a, b, c, pattern=pattern), (q, k, v))


def test_no_keys_give_zero_second_derivatives():
    q, k, v = _leaves((1, 1, 3, 2), (1, 1, 0, 2), (1, 1, 0, 2))
    out = attn2d.attention(q, k, v)
    dq, = torch.autograd.grad(out.sum(), (q,), create_graph=True)
    assert "attention_backward" in type(dq.grad_fn).__name__  # the double backward runs
    gq, gk, gv = torch.autograd.grad(dq.sum(), (q, k, v))
    assert torch.equal(gq, torch.zeros_like(q)) and gk.shape == k.shape and gv.shape == v.shape


def test_fully_masked_rows_have_zero_second_derivatives():
    q, k, v = _leaves((1, 1, 4, 3), (1, 1, 5, 3), (1, 1, 5, 2))
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[1] = False
    out = attn2d.attention(q, k, v, attn_mask=mask)
    dq, = torch.autograd.grad(out.square().sum(), (q,), create_graph=True)
    gq, = torch.autograd.grad(dq.square().sum(), (q,))
    assert torch.equal(gq[:, :, 1], torch.zeros(1, 1, 3, dtype=torch.float64))
    assert torch.isfinite(gq).all()


PATTERNS = [
    (Window(3), (4, 5), (4, 5), 1),                        # window kernels (offsets)
    (Window(3, "manhattan", dilation=2), (5, 5), (5, 5), 2),
    (Window(5, "euclidean"), (5, 4), (5, 4), 1),
    (Window(3, border="shift"), (4, 4), (4, 4), 1),
    (Window(3), (6, 4), (3, 2), 1),                        # pooled keys
    (YLG(2), (4, 5), (4, 5), 2),                           # non-square grid
    (YLG(4), (4, 4), (2, 2), 4),
]


@pytest.mark.parametrize("pattern,q_hw,kv_hw,heads", PATTERNS, ids=lambda p: repr(p))
def test_gradgradcheck_patterns(pattern, q_hw, kv_hw, heads):
    q, k, v = _leaves((1, heads, *q_hw, 3), (1, heads, *kv_hw, 3), (1, heads, *kv_hw, 2))
    _gradgradcheck(lambda a, b, c: attn2d.attention2d(a, b, c, pattern=pattern), (q, k, v))


def test_gradgradcheck_channels_first_views():
    q, k, v = (torch.randn(1, 2, d, 4, 5, dtype=torch.float64).permute(0, 1, 3, 4, 2)
               .requires_grad_() for d in (3, 3, 2))
    _gradgradcheck(lambda a, b, c: attn2d.attention2d(a, b, c, pattern=Window(3)), (q, k, v))


def _penalty_grads(fn, inputs, weights):
    """Gradients of a penalty on the first derivatives: |d<weights, fn>/d inputs|^2."""
    out = fn(*inputs)
    first = torch.autograd.grad((out * weights.to(out.dtype)).sum(), inputs, create_graph=True)
    penalty = sum(g.square().sum() for g in first)
    return torch.autograd.grad(penalty, inputs)


@pytest.mark.parametrize("kind", ["global", "mask", "window", "ylg"])
def test_float32_second_derivatives_within_twice_naive_error(kind):
    B, H = 2, 2
    grid = (7, 6)
    shapes = [(B, H, *grid, 8), (B, H, *grid, 8), (B, H, *grid, 16)]
    inputs64 = [torch.randn(s, dtype=torch.float64) for s in shapes]
    weights = torch.randn(B, H, *grid, 16, dtype=torch.float64)
    pattern = {"window": Window(3), "ylg": YLG(2)}.get(kind)
    allowed = None
    if pattern is not None:
        allowed = pattern.dense_mask(grid, grid, H)
    elif kind == "mask":
        allowed = torch.rand(42, 42) < 0.5

    def ours(q, k, v):
        if pattern is not None:
            return attn2d.attention2d(q, k, v, pattern=pattern)
        return attn2d.attention(q.flatten(2, 3), k.flatten(2, 3), v.flatten(2, 3),
                                attn_mask=allowed).unflatten(2, grid)

    def naive(dtype):
        def fn(q, k, v):
            return naive_attention(q.flatten(2, 3), k.flatten(2, 3), v.flatten(2, 3),
                                   attn_mask=allowed, dtype=dtype).unflatten(2, grid)
        return fn

    def leaves(dtype):
        return [t.to(dtype).requires_grad_() for t in inputs64]

    got = _penalty_grads(ours, leaves(torch.float32), weights)
    oracle = _penalty_grads(naive(torch.float64), leaves(torch.float64), weights)
    base = _penalty_grads(naive(torch.float32), leaves(torch.float32), weights)
    for name, a, b, c in zip("qkv", got, base, oracle):
        floor = 1e-6 * max(1.0, float(c.abs().max()))
        assert max_err(a, c) <= 2 * max_err(b, c) + floor, (name, max_err(a, c), max_err(b, c))


# Grids of several 64-row tiles, so layouts visit 1, 2 or more key tiles per query tile (and
# the last tile has rows past the map's end); windows in several map-row bands.
SPARSE_CASES = [
    ("attention2d", YLG(4), (16, 16), (8, 8), 4),
    ("attention2d", YLG(2), (13, 11), (13, 11), 2),
    ("attention2d", Window(3, border="shift"), (12, 11), (12, 11), 1),
    ("attention2d", Window(3), (14, 10), (7, 5), 2),                  # pooled keys: a layout
    ("attention2d", Window(5, dilation=2), (11, 13), (11, 13), 1),    # the window kernels
    ("attention2d", Window(7, "euclidean"), (9, 8), (9, 8), 2),
    ("attention", Random(1, 16, 3, 2), (1, 150), (1, 150), 2),
    ("attention", Window1D(5) & BlockMask(EIGHT_BLOCKS_ONE_EMPTY, 16), (1, 120), (1, 120), 2),
    ("attention", BlockMask(torch.tensor([[1, 0, 1], [0, 0, 0], [1, 1, 0]], dtype=torch.bool),
                            64), (1, 170), (1, 150), 1),               # a tile with no keys
]


@pytest.mark.parametrize("small_groups", [False, True], ids=["groups", "small groups"])
@pytest.mark.parametrize("op,pattern,q_hw,kv_hw,heads", SPARSE_CASES, ids=lambda p: repr(p)[:40])
def test_penalty_gradients_of_a_pattern_match_its_dense_mask(monkeypatch, small_groups, op,
                                                             pattern, q_hw, kv_hw, heads):
    """The double backward computes only the pairs a pattern's groups reach (a window's band
    of map rows, a layout's visited key tiles): the penalty's gradients must equal those of
    naive attention under the pattern's dense mask, in float64."""
    from attn2d import double_backward

    if small_groups:
        monkeypatch.setattr(double_backward, "GROUP_BYTES", 1)
    torch.manual_seed(0)
    B, E, Ev = 2, 3, 4
    mask = pattern.dense_mask(q_hw, kv_hw, heads)
    inputs = [torch.randn(B, heads, *q_hw, E, dtype=torch.float64),
              torch.randn(B, heads, *kv_hw, E, dtype=torch.float64),
              torch.randn(B, heads, *kv_hw, Ev, dtype=torch.float64)]
    weights = torch.randn(B, heads, *q_hw, Ev, dtype=torch.float64)

    def ours(q, k, v):
        if op == "attention2d":
            return attn2d.attention2d(q, k, v, pattern=pattern)
        return attn2d.attention(q[:, :, 0], k[:, :, 0], v[:, :, 0], pattern=pattern)[:, :, None]

    def naive(q, k, v):
        return naive_attention(q.flatten(2, 3), k.flatten(2, 3), v.flatten(2, 3),
                               attn_mask=mask).unflatten(2, q_hw)

    got = _penalty_grads(ours, [t.clone().requires_grad_() for t in inputs], weights)
    want = _penalty_grads(naive, [t.clone().requires_grad_() for t in inputs], weights)
    for name, a, b in zip("qkv", got, want):
        assert max_err(a, b) <= 1e-10 * max(1.0, float(b.abs().max())), (name, max_err(a, b))
    dead = ~mask.any(-1).view(heads, *q_hw)  # queries without keys: zero gradient
    if dead.any():
        assert (got[0][:, dead] == 0).all()


@pytest.mark.parametrize("offsets", [[[0, 1, -2], [0, -1, 1]], [[1], [0]], [[3, 4], [0, 2]],
                                     [[], []]], ids=["both sides", "one below", "beyond the map",
                                                     "none"])
def test_window_bands_match_the_windows_dense_mask(monkeypatch, offsets):
    """window_groups' bands of key rows against dense_groups under the same pairs as a mask,
    one map row a group, including offsets that reach past the map from every row."""
    from attn2d import double_backward as db

    monkeypatch.setattr(db, "GROUP_BYTES", 1)
    height, width = 4, 5
    off = torch.tensor(offsets, dtype=torch.int32).view(2, -1)
    qi, qj = torch.arange(20).div(width, rounding_mode="floor"), torch.arange(20) % width
    ki, kj = qi, qj
    mask = torch.zeros(20, 20, dtype=torch.bool)
    for di, dj in off.t().tolist():
        mask |= (ki[None, :] == qi[:, None] + di) & (kj[None, :] == qj[:, None] + dj)
    q, k, v, do, u, w, z = (torch.randn(2, 2, 20, d, dtype=torch.float64)
                            for d in (3, 3, 4, 4, 3, 3, 4))
    args = (q, k, v, do, u, w, z, 0.5)
    got = db.attention_double_backward(db.window_groups(q, k, off, height, width), *args)
    want = db.attention_double_backward(db.dense_groups(q, k, mask, False), *args)
    for a, b in zip(got, want):
        assert max_err(a, b) <= 1e-12


def _r1_grads(module, x):
    """An R1 step: the penalty |d D(x) / dx|^2 on a module's output, backpropagated to the
    weights and the input."""
    x = x.clone().requires_grad_()
    score = (module(x) * torch.linspace(-1, 1, x[0].numel(), dtype=x.dtype).view(x[0].shape)).sum()
    grad_x, = torch.autograd.grad(score, (x,), create_graph=True)
    penalty = grad_x.square().sum()
    params = [p for p in module.parameters()]
    grads = torch.autograd.grad(penalty, params + [x], allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for g, t in zip(grads, params + [x])]


@pytest.mark.parametrize("make", [
    lambda: _pair(ann.SelfAttention2d, RefSelfAttention2d, 16),
    lambda: _pair(ann.SelfAttention2d, RefSelfAttention2d, 16, heads=2, pattern=Window(3),
                  pool_kv=1),
    lambda: _pair(ann.MultiheadSelfAttention2d, RefMultiheadSelfAttention2d, 16, 4),
    lambda: _pair(ann.MultiheadSelfAttention2d, RefMultiheadSelfAttention2d, 16, 2,
                  pattern=Window(3, "manhattan")),
], ids=["sagan", "sagan window", "multihead", "multihead window"])
def test_r1_penalty_through_modules_matches_torch_ops(make):
    torch.manual_seed(0)
    ours, ref = make()
    ours, ref = ours.double(), ref.double()
    x = torch.randn(2, 16, 6, 8, dtype=torch.float64)
    # torch's fused SDPA kernels (nn.MultiheadAttention's) have no double backward: the
    # reference runs on SDPA's math path.
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        want = _r1_grads(ref, x)
    for a, b in zip(_r1_grads(ours, x), want):
        assert max_err(a, b) <= 1e-10 * max(1.0, float(b.abs().max()))


def test_r1_penalty_under_bfloat16_autocast_within_twice_the_torch_modules_error():
    torch.manual_seed(0)
    ours, ref = _pair(ann.SelfAttention2d, RefSelfAttention2d, 16)
    x = torch.randn(2, 16, 8, 8)
    oracle = _r1_grads(ref.double(), x.double())
    ref.float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _r1_grads(ours, x)
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            base = _r1_grads(ref, x)
    for a, b, c in zip(got, base, oracle):
        assert torch.isfinite(a).all()
        floor = 2.0**-8 * max(1.0, float(c.abs().max()))  # one bf16 unit at the largest value
        assert max_err(a, c) <= 2 * max_err(b, c) + floor, (max_err(a, c), max_err(b, c))


def test_bench_double_backward_writes_its_table(tmp_path):
    from attn2d.cli import main

    assert main(["bench", "--double-backward", "--quick", "--reps", "1", "--no-memory",
                 "--out", str(tmp_path)]) == 0
    text = (tmp_path / "bench_double_backward.md").read_text()
    assert "| global | 32x32 (C=64) | 1,024 x 256 |" in text
    assert "| YLG(8), 8 heads | 32x32 (C=64) | 1,024 x 256 |" in text
    import json

    rows = json.loads((tmp_path / "bench_double_backward.json").read_text())["rows"]
    assert [r["pattern"] for r in rows] == ["global", "ylg"]
    for row in rows:
        assert row["speedup_median_of_ratios"] > 0 and set(row["median_s"]) == {"attn2d", "math"}
        assert row["penalty_relative_difference"] <= 1e-3


def test_bench_double_backward_peer_attends_through_the_patterns_dense_mask():
    """The math peer of a YLG block computes the same penalty as attn2d, and not global
    attention's: the dense mask is what it differs by."""
    from attn2d import bench_double_backward as bdb

    module = bdb.make_block(64, pattern="ylg").double()
    x = torch.randn(1, 64, 8, 8, dtype=torch.float64)
    readout = torch.randn(64, 8, 8, dtype=torch.float64)
    ours, peer = (bdb.r1_penalty_fn(impl, module, readout) for impl in bdb.IMPLS)
    assert bdb.check_agreement([ours, peer], x) <= 1e-12
    pattern = module.pattern
    module.set_pattern(None)
    global_value = ours(x.clone().requires_grad_()).item()
    module.set_pattern(pattern)
    assert abs(global_value - peer(x.clone().requires_grad_()).item()) > 1e-6 * abs(global_value)
    with pytest.raises(RuntimeError, match="disagree"):
        bdb.check_agreement([ours, lambda t: 2 * peer(t)], x)
    with pytest.raises(ValueError, match="pattern must be one of"):
        bdb.make_block(64, pattern="window")


def test_bench_double_backward_refuses_cuda_and_patterns(capsys):
    from attn2d.cli import main

    assert main(["bench", "--double-backward", "--patterns"]) == 2
    assert "--double-backward" in capsys.readouterr().err


def test_bench_double_backward_records_a_peer_that_runs_out_of_memory(monkeypatch):
    from attn2d import bench_double_backward as bdb

    def measure(case, timeout=None):
        if case["impl"] == "math":
            raise RuntimeError(f"attn2d probe failed (exit -9) for {case}:\n")
        return {"peak_above_baseline_bytes": 3 << 20}

    monkeypatch.setattr(bdb, "measure", measure)
    row = bdb.run_case(64, 8, reps=1, pattern="ylg")
    assert row["peak_bytes"] == {"attn2d": 3 << 20, "math": None}
    assert "exit -9" in row["peak_failed"]["math"]
    assert "| 3.0 MiB | killed (out of memory) |" in bdb.markdown([row], "m")
