"""attn2d's Triton kernels (python/attn2d/triton/) against float64 naive attention under the 2x
rule, forward and gradients. Without a GPU they run on CPU tensors through Triton's interpreter
(tests/python/conftest.py turns it on); with ATTN2D_GPU=1 on a CUDA machine the same tests run
compiled, on the GPU. The interpreter is slow, so cases are small; ATTN2D_SLOW=1 adds a sweep."""

from __future__ import annotations

import os
import random

import pytest
import torch

import attn2d
from attn2d import backends
from attn2d.patterns import YLG, Random, Window, Window1D
from reference import assert_within_rule, max_err, naive_attention
from test_attention2d import storage_view

pytest.importorskip("triton")

ON_GPU = os.environ.get("ATTN2D_GPU") == "1"
DEVICE = "cuda" if ON_GPU else "cpu"
pytestmark = pytest.mark.triton
if ON_GPU and not torch.cuda.is_available():
    pytest.skip("ATTN2D_GPU=1 but torch sees no CUDA device", allow_module_level=True)


@pytest.fixture(autouse=True)
def _triton_backend():
    with attn2d.use_backend("triton"):
        yield


def _leaves(*shapes, dtype=torch.float32, noncontiguous=False):
    out = []
    for shape in shapes:
        if noncontiguous:  # every other element of a wider last dimension
            t = torch.randn(*shape[:-1], 2 * shape[-1], dtype=dtype)[..., ::2]
        else:
            t = torch.randn(*shape, dtype=dtype)
        out.append(t.to(DEVICE).requires_grad_())
    return out


def _check_global(q, k, v, dtype, relative_floor=True, **kw):
    """attn2d.attention on the Triton backend against naive attention in `dtype` and float64."""
    grad = torch.randn(*q.shape[:-1], v.shape[-1], dtype=dtype, device=q.device)
    mask = kw.get("attn_mask")
    results = {}
    for name, ref_dtype in (("ours", None), ("naive", dtype), ("oracle", torch.float64)):
        if ref_dtype is None:
            out = attn2d.attention(q, k, v, **kw)
        else:
            cpu = [t.detach().cpu().requires_grad_() for t in (q, k, v)]
            ref_kw = dict(kw, attn_mask=None if mask is None else mask.cpu())
            out = naive_attention(*cpu, dtype=ref_dtype, **ref_kw)
        inputs = (q, k, v) if ref_dtype is None else cpu
        grads = torch.autograd.grad(out, inputs, grad.to(out.dtype).to(out.device))
        results[name] = tuple(t.detach().cpu() for t in (out, *grads))
    assert_within_rule(results, torch.float32 if dtype == torch.float32 else dtype,
                       relative_floor)
    return results


# (B, H, Lq, Lk, E, Ev): E over 1, 8, 16, 59, 64 with Ev != E, Lq != Lk, primes, tiny maps.
SHAPES = [(1, 1, 1, 1, 1, 1), (2, 2, 67, 131, 8, 64), (1, 1, 97, 61, 59, 3),
          (1, 2, 70, 70, 16, 16), (1, 1, 65, 129, 64, 96), (2, 1, 5, 3, 1, 17)]


@pytest.mark.parametrize("B,H,Lq,Lk,E,Ev", SHAPES)
def test_global_matches_float64_within_twice_naive_error(B, H, Lq, Lk, E, Ev):
    q, k, v = _leaves((B, H, Lq, E), (B, H, Lk, E), (B, H, Lk, Ev))
    _check_global(q, k, v, torch.float32)


def test_strided_views_are_read_without_a_copy():
    q, k, v = _leaves((2, 2, 37, 9), (2, 2, 41, 9), (2, 2, 41, 12), noncontiguous=True)
    assert not q.is_contiguous()
    _check_global(q, k, v, torch.float32)


@pytest.mark.parametrize("mask_kind", ["bool 2-D", "bool per batch", "additive per head",
                                       "additive full"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_masks_broadcast_and_combine_with_causal(mask_kind, is_causal):
    B, H, Lq, Lk = 2, 2, 67, 71
    q, k, v = _leaves((B, H, Lq, 8), (B, H, Lk, 8), (B, H, Lk, 24))
    shape = {"bool 2-D": (Lq, Lk), "bool per batch": (B, 1, Lq, Lk),
             "additive per head": (1, H, 1, Lk), "additive full": (B, H, Lq, Lk)}[mask_kind]
    if mask_kind.startswith("bool"):
        mask = torch.rand(shape) < 0.6
    else:
        mask = torch.randn(shape)
    _check_global(q, k, v, torch.float32, attn_mask=mask.to(DEVICE), is_causal=is_causal)


@pytest.mark.parametrize("how", ["bool", "additive -inf"])
def test_fully_masked_rows_give_zero_output_and_zero_gradient(how):
    q, k, v = _leaves((1, 2, 70, 8), (1, 2, 33, 8), (1, 2, 33, 5))
    dead = [0, 3, 64, 69]
    if how == "bool":
        mask = torch.rand(70, 33) < 0.5
        mask[dead] = False
    else:
        mask = torch.randn(70, 33)
        mask[dead] = float("-inf")
    out = attn2d.attention(q, k, v, attn_mask=mask.to(DEVICE))
    dq, = torch.autograd.grad(out.sum(), (q,))
    assert torch.equal(out[:, :, dead].cpu(), torch.zeros(1, 2, 4, 5))
    assert torch.equal(dq[:, :, dead].cpu(), torch.zeros(1, 2, 4, 8))
    assert torch.isfinite(out).all()
    _check_global(q, k, v, torch.float32, attn_mask=mask.to(DEVICE))


def test_causal_with_fewer_keys_than_queries():
    q, k, v = _leaves((1, 1, 130, 16), (1, 1, 70, 16), (1, 1, 70, 8))
    _check_global(q, k, v, torch.float32, is_causal=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_inputs_accumulate_in_float32(dtype):
    q, k, v = _leaves((2, 2, 67, 8), (2, 2, 45, 8), (2, 2, 45, 64), dtype=dtype)
    mask = (torch.rand(67, 45) < 0.7).to(DEVICE)
    results = _check_global(q, k, v, dtype, relative_floor=False, attn_mask=mask)
    assert results["ours"][0].dtype == dtype


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_backward_reads_the_float32_output(dtype):
    """A 16-bit forward that a backward follows keeps O in float32, and the backward's
    D = rowsum(dO * O) reads it: on non-negative inputs (rows of dP with a large common part
    that D cancels) dQ is about 2.5x closer to float64 than from the rounded O."""
    torch.manual_seed(12)
    Lq, Lk, E = 40, 48, 16
    q, k, v, g = (torch.rand(1, 2, n, E).to(dtype).to(DEVICE) for n in (Lq, Lk, Lk, Lq))
    mask = torch.ones(Lq, Lk, dtype=torch.bool).tril(Lk - Lq)
    mask[::5] = False
    mask = mask.to(DEVICE)

    def dq_error(forward):
        q_ = q.clone().requires_grad_()
        dq, = torch.autograd.grad(forward(q_), (q_,), g)
        q64 = q.detach().cpu().double().requires_grad_()
        want = naive_attention(q64, k.cpu().double(), v.cpu().double(), attn_mask=mask.cpu())
        want_dq, = torch.autograd.grad(want, (q64,), g.cpu().double())
        return (dq.cpu().double() - want_dq).pow(2).mean().sqrt().item()

    ours = dq_error(lambda q_: attn2d.attention(q_, k, v, attn_mask=mask))
    from_rounded_o = dq_error(lambda q_: torch.ops.attn2d.triton_attention_forward(
        q_, k, v, mask, False, E ** -0.5, [], [], False)[0])
    assert ours < 0.6 * from_rounded_o, (ours, from_rounded_o)


# Patterns: every kind, pooled keys, YLG on a non-square grid.
PATTERNS = [
    (Window(5), (11, 13), (11, 13), 2),
    (Window(7, "manhattan", dilation=2), (17, 9), (17, 9), 1),
    (Window(5, "euclidean"), (10, 10), (10, 10), 1),
    (Window(3, border="shift"), (9, 10), (9, 10), 1),
    (Window(5), (16, 14), (8, 7), 1),
    (Window(9), (9, 9), (9, 9), 1),
    (YLG(4), (8, 12), (8, 12), 4),
    (YLG(4), (16, 16), (8, 8), 4),
    (YLG(2, mapping="geometric"), (10, 6), (5, 3), 2),
    # The sequence patterns and a union on the same block-sparse kernels.
    (Window1D(7, causal=True) | Random(1, 16, 3, 2), (1, 70), (1, 70), 2),
]


def _check_pattern(pattern, q_hw, kv_hw, heads, dtype=torch.float32, storage="rows", E=7, Ev=5):
    def leaf(*shape):
        return storage_view(shape, dtype, storage).to(DEVICE).requires_grad_()

    q, k, v = leaf(2, heads, *q_hw, E), leaf(2, heads, *kv_hw, E), leaf(2, heads, *kv_hw, Ev)
    grad = torch.randn(2, heads, *q_hw, Ev, dtype=dtype, device=DEVICE)
    mask = pattern.dense_mask(q_hw, kv_hw, heads)
    results = {}
    for name, ref_dtype in (("ours", None), ("naive", dtype), ("oracle", torch.float64)):
        if ref_dtype is None:
            inputs = (q, k, v)
            out = attn2d.attention2d(q, k, v, pattern=pattern)
        else:
            inputs = [t.detach().cpu().requires_grad_() for t in (q, k, v)]
            out = naive_attention(*(t.flatten(2, 3) for t in inputs), attn_mask=mask,
                                  dtype=ref_dtype).unflatten(2, q_hw)
        grads = torch.autograd.grad(out, inputs, grad.to(out.dtype).to(out.device))
        results[name] = tuple(t.detach().cpu() for t in (out, *grads))
    assert_within_rule(results, dtype, relative_floor=True)


@pytest.mark.parametrize("pattern,q_hw,kv_hw,heads", PATTERNS, ids=lambda p: repr(p))
def test_patterns_match_their_dense_mask(pattern, q_hw, kv_hw, heads):
    _check_pattern(pattern, q_hw, kv_hw, heads)


@pytest.mark.parametrize("pattern", [Window(5), YLG(2)], ids=repr)
def test_patterns_read_channels_first_views(pattern):
    _check_pattern(pattern, (10, 12), (10, 12), 2, storage="channels_first", E=8, Ev=16)


def test_pattern_in_bfloat16():
    q_hw = (12, 12)
    q, k, v = (storage_view((1, 2, *q_hw, d), torch.bfloat16, "rows").to(DEVICE)
               for d in (8, 8, 16))
    ours = attn2d.attention2d(q, k, v, pattern=Window(5)).cpu()
    flat = [t.cpu().flatten(2, 3) for t in (q, k, v)]
    mask = Window(5).dense_mask(q_hw, q_hw, 2)
    oracle = naive_attention(*flat, attn_mask=mask).unflatten(2, q_hw)
    naive = naive_attention(*flat, attn_mask=mask, dtype=torch.bfloat16).unflatten(2, q_hw)
    assert ours.dtype == torch.bfloat16
    assert max_err(ours, oracle) <= 2 * max_err(naive, oracle) + 1e-3


def test_gradcheck_float64_global_with_mask_and_causal():
    q, k, v = _leaves((1, 2, 4, 3), (1, 2, 5, 3), (1, 2, 5, 2), dtype=torch.float64)
    mask = torch.rand(4, 5, device=DEVICE) < 0.7
    mask[1] = False
    assert torch.autograd.gradcheck(
        lambda a, b, c: attn2d.attention(a, b, c, attn_mask=mask, is_causal=True), (q, k, v),
        eps=1e-6, atol=1e-8)


@pytest.mark.parametrize("pattern", [Window(3), YLG(2)], ids=repr)
def test_gradcheck_float64_pattern(pattern):
    q, k, v = _leaves((1, 2, 3, 4, 2), (1, 2, 3, 4, 2), (1, 2, 3, 4, 3), dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda a, b, c: attn2d.attention2d(a, b, c, pattern=pattern), (q, k, v),
        eps=1e-6, atol=1e-8)


def test_modules_run_on_the_triton_kernels_and_match_the_cpu_backend():
    x = torch.randn(2, 16, 9, 10)
    for module in (attn2d.nn.SelfAttention2d(16),
                   attn2d.nn.MultiheadSelfAttention2d(16, num_heads=2, pattern=Window(3))):
        with attn2d.use_backend("cpu"):
            want = module(x)
        module = module.to(DEVICE)
        xd = x.to(DEVICE).requires_grad_()
        got = module(xd)
        assert max_err(got.cpu(), want) < 1e-5
        got.square().sum().backward()
        assert torch.isfinite(xd.grad).all()


@pytest.mark.parametrize("pattern", [None, Window(3), YLG(2)], ids=repr)
def test_gradgradcheck_float64(pattern):
    if pattern is None:
        q, k, v = _leaves((1, 2, 4, 3), (1, 2, 5, 3), (1, 2, 5, 2), dtype=torch.float64)
        mask = torch.rand(4, 5, device=DEVICE) < 0.7

        def fn(a, b, c):
            return attn2d.attention(a, b, c, attn_mask=mask, is_causal=True)
    else:
        q, k, v = _leaves((1, 2, 3, 4, 2), (1, 2, 3, 4, 2), (1, 2, 3, 4, 3),
                          dtype=torch.float64)

        def fn(a, b, c):
            return attn2d.attention2d(a, b, c, pattern=pattern)
    assert torch.autograd.gradgradcheck(fn, (q, k, v), eps=1e-6, atol=1e-7, fast_mode=True)


def test_a_layout_of_full_visits_reads_no_mask_words():
    # One kind, one 64-query tile visiting one 64-key tile with every pair allowed: the layout
    # has no mask words at all, which the kernels must not read.
    from attn2d.triton import ops

    rows = torch.arange(64, dtype=torch.int32)[None]
    layout = [torch.zeros(1, dtype=torch.int32), torch.tensor([0, 1]), torch.tensor([0, 1]),
              rows, rows, torch.tensor([0, 1]), torch.zeros(1, dtype=torch.int32),
              torch.tensor([-1]), torch.tensor([0, 1]), torch.zeros(1, dtype=torch.int32),
              torch.tensor([-1]), torch.zeros(0, 64, dtype=torch.int64)]
    layout = [t.to(DEVICE) for t in layout]
    q, k, v = _leaves((1, 1, 64, 8), (1, 1, 64, 8), (1, 1, 64, 4))
    out = torch.ops.attn2d.triton_attention_forward(q, k, v, None, False, 0.5, layout,
                                                    [1, 1], False)[0]
    dq, = torch.autograd.grad(out.sum(), (q,))
    want = naive_attention(*(t.detach().cpu() for t in (q, k, v)), scale=0.5)
    assert max_err(out.cpu(), want) < 1e-5 and torch.isfinite(dq).all()


def test_a_mask_that_requires_grad_is_refused():
    q, k, v = _leaves((1, 1, 5, 4), (1, 1, 6, 4), (1, 1, 6, 4))
    mask = torch.zeros(5, 6, device=DEVICE, requires_grad=True)
    with pytest.raises(ValueError, match="attn_mask requires grad"):
        attn2d.attention(q, k, v, attn_mask=mask)


def test_heads_wider_than_256_are_refused_with_the_widths():
    q = torch.randn(1, 1, 4, 257, device=DEVICE)
    with pytest.raises(ValueError, match="E = 257"):
        attn2d.attention(q, q, q)


needs_gpu = pytest.mark.skipif(not ON_GPU, reason="a CUDA device: ATTN2D_GPU=1")


@pytest.mark.gpu
@needs_gpu
def test_auto_chooses_sdpa_flash_for_vit_heads_and_triton_for_sagan_heads():
    with attn2d.use_backend("auto"):
        vit = [torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.float16) for _ in range(3)]
        x = attn2d.explain(*vit)
        assert x.backend.backend == "sdpa", x
        sagan = [torch.randn(2, 1, 1024, e, device="cuda") for e in (8, 8, 64)]
        sagan[0] = torch.randn(2, 1, 4096, 8, device="cuda")
        assert attn2d.explain(*sagan).backend.backend == "triton"
        out = attn2d.attention(*vit)
        want = naive_attention(*(t.cpu() for t in vit))
        assert max_err(out.cpu(), want) < 2e-3


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("module", ["sagan", "multihead ylg"])
def test_modules_on_cuda_under_autocast_and_torch_compile(module):
    torch.manual_seed(0)
    m = (attn2d.nn.SelfAttention2d(64) if module == "sagan"
         else attn2d.nn.MultiheadSelfAttention2d(64, num_heads=4, pattern=YLG(4))).cuda()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.1)
    x = torch.randn(2, 64, 32, 32, device="cuda")
    want = m(x)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        low = m(x)
    assert max_err(low.float().cpu(), want.cpu()) < 0.05 * float(want.abs().max())
    compiled = torch.compile(m, fullgraph=True)
    xc = x.clone().requires_grad_()
    got = compiled(xc)
    got.square().sum().backward()
    assert max_err(got.cpu(), want.cpu()) < 1e-4 and torch.isfinite(xc.grad).all()


# Seed 9 (E=3, causal) gives a dQ error about 8x naive float32's: the backward's
# D = rowsum(dO * O) carries the rounding of O into every dS of the row, where naive softmax
# backward never reads O. The CPU kernels, which share that backward, miss the rule on the same
# case; strict, so a fix shows.
D_TERM_LIMIT = pytest.mark.xfail(strict=True, reason="D = rowsum(dO * O) rounding, see above")


@pytest.mark.slow
@pytest.mark.parametrize("seed", [pytest.param(s, marks=D_TERM_LIMIT) if s == 9 else s
                                  for s in range(12)])
def test_random_combinations(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    B, H = rng.randint(1, 2), rng.randint(1, 3)
    Lq, Lk = rng.randint(1, 150), rng.randint(1, 150)
    E, Ev = rng.choice([1, 3, 8, 16, 33, 64, 100]), rng.choice([1, 5, 16, 64, 130])
    q, k, v = _leaves((B, H, Lq, E), (B, H, Lk, E), (B, H, Lk, Ev),
                      noncontiguous=rng.random() < 0.5)
    kw = {"is_causal": rng.random() < 0.3}
    if rng.random() < 0.5:
        kw["attn_mask"] = (torch.rand(Lq, Lk) < 0.7).to(DEVICE)
    _check_global(q, k, v, torch.float32, **kw)
