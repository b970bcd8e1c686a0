"""attn2d.nn modules against PyTorch-only references given the same weights: outputs and
parameter gradients in float64 and float32, state_dict round trips, compile, checkpoint,
autocast, errors."""

from __future__ import annotations

import copy

import pytest
import torch

import attn2d
import attn2d.nn as ann
from attn2d.patterns import YLG, Window
from module_references import (
    ProganSelfAttention,
    ProganSelfAttention2,
    RefAttention,
    RefCrossAttention,
    RefMultiheadSelfAttention2d,
    RefSelfAttention2d,
)
from reference import max_err, naive_attention


def _randomize(module: torch.nn.Module) -> None:
    """Non-trivial weights everywhere (gamma starts at 0 and biases at 0 otherwise)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def compare(ours, ref, inputs, dtype):
    """ours and ref hold the same weights; compares outputs and every parameter's gradient.
    float64: within 1e-10 of the largest value compared. float32: within 2x the float32
    reference's error, both measured against the float64 reference, plus a floor of 1e-5 of the
    largest value compared. The floor is global, not per tensor, because some gradients are
    sums that cancel to ~0 (a key bias shifts every score of a row equally: its gradient is 0
    up to the rounding of terms as large as the other gradients)."""
    ref64 = copy.deepcopy(ref).double()
    runs = {}
    for name, mod, dt in (("ours", ours.to(dtype), dtype), ("ref", ref.to(dtype), dtype),
                          ("ref64", ref64, torch.float64)):
        mod.zero_grad()
        xs = [x.to(dt).detach().requires_grad_() for x in inputs]
        out = mod(*xs)
        g = torch.Generator().manual_seed(2)
        out.backward(torch.randn(out.shape, generator=g, dtype=torch.float64).to(dt))
        grads = {n: p.grad for n, p in mod.named_parameters()}
        runs[name] = (out.detach(), [x.grad for x in xs], grads)
    ours_r, ref_r, ref64_r = runs["ours"], runs["ref"], runs["ref64"]
    compared = [ref64_r[0], *ref64_r[1], *ref64_r[2].values()]
    size = max([1.0] + [float(t.abs().max()) for t in compared if t is not None and t.numel()])

    def check(a, b, c, what):
        if dtype == torch.float64:
            assert max_err(a, c) <= 1e-10 * size, (what, max_err(a, c))
        else:
            bound = 2 * max_err(b, c) + 1e-5 * size
            assert max_err(a, c) <= bound, (what, max_err(a, c), max_err(b, c))

    check(ours_r[0], ref_r[0], ref64_r[0], "output")
    for i, (a, b, c) in enumerate(zip(ours_r[1], ref_r[1], ref64_r[1])):
        check(a, b, c, f"input grad {i}")
    assert ours_r[2].keys() == ref64_r[2].keys()
    for n in ours_r[2]:
        check(ours_r[2][n], ref_r[2][n], ref64_r[2][n], f"grad of {n}")


def _pair(ours_cls, ref_cls, *args, **kwargs):
    ref = ref_cls(*args, **kwargs)
    _randomize(ref)
    ours = ours_cls(*args, **kwargs)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ours, ref


SAGAN_CONFIGS = [
    dict(channels=16),
    dict(channels=32, heads=2, scale=None),
    dict(channels=32, qk_ratio=16, v_channels=32, pool_kv=1),
    dict(channels=16, groups=2, heads=2),
    dict(channels=16, downsample=2),
    dict(channels=16, out_conv=False, v_channels=16, gamma=False),
    dict(channels=16, spectral_norm=True),
]


@pytest.mark.parametrize("config", SAGAN_CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("hw", [(8, 8), (7, 11)])
def test_self_attention2d_matches_reference(config, dtype, hw):
    torch.manual_seed(0)
    ours, ref = _pair(ann.SelfAttention2d, RefSelfAttention2d, **config)
    x = torch.randn(2, config["channels"], *hw)
    if config.get("spectral_norm"):
        ours.eval(), ref.eval()  # fixed power-iteration vectors: both use the loaded u, v
    compare(ours, ref, [x], dtype)


def test_progan_self_attention2_loads_strictly_and_matches():
    torch.manual_seed(0)
    original = ProganSelfAttention2(32)
    _randomize(original)
    ours = ann.SelfAttention2d(32, qk_ratio=8, v_channels=32, pool_kv=1, out_conv=False,
                               gamma=False, residual=False, scale=1.0)
    ours.load_state_dict(original.state_dict(), strict=True)
    assert set(ours.state_dict()) == set(original.state_dict())
    x = torch.randn(2, 32, 9, 9)
    compare(ours, original, [x], torch.float64)
    compare(ours, original, [x], torch.float32)


def test_sagan_defaults_are_the_published_block():
    m = ann.SelfAttention2d(64)
    assert m.query.out_channels == 8 and m.key.out_channels == 8 and m.value.out_channels == 32
    assert m.out.in_channels == 32 and m.out.out_channels == 64
    assert m.pool_kv == 2 and m.scale == 1.0 and float(m.gamma.detach()) == 0.0
    x = torch.randn(1, 64, 8, 8)
    assert torch.equal(m(x), x)  # gamma = 0 at initialisation: the block starts as identity


@pytest.mark.parametrize("heads,hw", [(4, (8, 8)), (2, (5, 9)), (8, (6, 4))])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_multihead_self_attention2d_matches_reference(heads, hw, dtype):
    torch.manual_seed(0)
    ours, ref = _pair(ann.MultiheadSelfAttention2d, RefMultiheadSelfAttention2d, 32, heads)
    compare(ours, ref, [torch.randn(2, 32, *hw)], dtype)


def test_multihead_self_attention2d_downsample_matches_reference():
    torch.manual_seed(0)
    ours, ref = _pair(ann.MultiheadSelfAttention2d, RefMultiheadSelfAttention2d, 16, 4,
                      downsample=2)
    compare(ours, ref, [torch.randn(2, 16, 9, 8)], torch.float64)


def test_progan_self_attention_loads_strictly_and_matches():
    torch.manual_seed(0)
    original = ProganSelfAttention(64)
    _randomize(original)
    ours = ann.MultiheadSelfAttention2d(64)
    ours.load_state_dict(original.state_dict(), strict=True)
    assert set(ours.state_dict()) == set(original.state_dict())
    x = torch.randn(1, 64, 8, 8)
    compare(ours, original, [x], torch.float64)
    compare(ours, original, [x], torch.float32)
    # And back: attn2d's weights load into the original.
    original.load_state_dict(ours.state_dict(), strict=True)


@pytest.mark.parametrize("kwargs", [dict(num_heads=4), dict(num_heads=2, qkv_bias=True),
                                    dict(num_heads=4, qk_norm=True)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_vit_attention_matches_reference(kwargs, dtype):
    torch.manual_seed(0)
    ours, ref = _pair(ann.Attention, RefAttention, 48, **kwargs)
    compare(ours, ref, [torch.randn(3, 50, 48)], dtype)


def test_vit_attention_takes_timm_blocks_mask_and_causal_arguments():
    torch.manual_seed(0)
    ours = ann.Attention(24, num_heads=3).double()
    x = torch.randn(2, 11, 24, dtype=torch.float64)
    mask = torch.rand(11, 11) > 0.3
    q, k, v = (t.unflatten(-1, (3, 8)).transpose(1, 2) for t in ours.qkv(x).chunk(3, dim=-1))
    for kwargs in (dict(is_causal=True), dict(attn_mask=mask),
                   dict(attn_mask=mask, is_causal=True)):
        expect = naive_attention(q, k, v, **kwargs).transpose(1, 2).flatten(2)
        assert max_err(ours(x, **kwargs), ours.proj(expect)) < 1e-12
    with pytest.raises(TypeError, match="is_causal"):
        ours(x, is_causal=1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cross_attention_matches_reference(dtype):
    torch.manual_seed(0)
    ours, ref = _pair(ann.CrossAttention, RefCrossAttention, 32, 20, num_heads=4, qkv_bias=True)
    compare(ours, ref, [torch.randn(2, 33, 32), torch.randn(2, 7, 20)], dtype)


def _all_modules():
    return [
        (ann.SelfAttention2d(16, heads=2), (torch.randn(2, 16, 6, 7),)),
        (ann.MultiheadSelfAttention2d(16, 4), (torch.randn(2, 16, 5, 6),)),
        (ann.Attention(16, num_heads=4), (torch.randn(2, 9, 16),)),
        (ann.CrossAttention(16, 8, num_heads=2), (torch.randn(2, 9, 16), torch.randn(2, 4, 8))),
    ]


@pytest.mark.parametrize("index", range(4))
def test_state_dict_round_trip(index):
    module, inputs = _all_modules()[index]
    _randomize(module)
    fresh = _all_modules()[index][0]
    assert not torch.equal(fresh(*inputs), module(*inputs))
    fresh.load_state_dict(module.state_dict(), strict=True)
    assert torch.equal(fresh(*inputs), module(*inputs))


@pytest.mark.parametrize("index", range(4))
def test_checkpoint_gives_the_same_gradients(index):
    torch.manual_seed(0)
    module, inputs = _all_modules()[index]
    _randomize(module)
    if not hasattr(module, "checkpoint"):
        from torch.utils.checkpoint import checkpoint

        run = lambda m, *xs: checkpoint(m, *xs, use_reentrant=False)  # noqa: E731
    else:
        run = None
    outs = []
    for use_ckpt in (False, True):
        module.zero_grad()
        if run is None:
            module.checkpoint = use_ckpt
            out = module(*inputs)
        else:
            out = run(module, *inputs) if use_ckpt else module(*inputs)
        out.square().sum().backward()
        outs.append((out.detach(), [p.grad.clone() for p in module.parameters()]))
    assert torch.equal(outs[0][0], outs[1][0])
    for a, b in zip(outs[0][1], outs[1][1]):
        assert torch.allclose(a, b, atol=1e-6)


def _check_compiled_matches_eager(module, inputs):
    """The module compiled whole-graph (fullgraph=True) gives eager mode's output and parameter
    gradients."""
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    out = compiled(*inputs)
    out.sum().backward()
    grads = [p.grad.clone() for p in module.parameters()]
    module.zero_grad()
    want = module(*inputs)
    want.sum().backward()
    assert torch.allclose(out, want, atol=1e-6)
    for g, p in zip(grads, module.parameters()):
        assert torch.allclose(g, p.grad, atol=1e-5)


@pytest.mark.parametrize("index", range(4))
def test_torch_compile(index):
    torch._dynamo.reset()
    torch.manual_seed(0)
    module, inputs = _all_modules()[index]
    _randomize(module)
    _check_compiled_matches_eager(module, inputs)


@pytest.mark.parametrize("pattern", [YLG(8), Window(5, "manhattan")], ids=["ylg", "window"])
def test_torch_compile_pattern_blocks(pattern):
    # The YLG-SAGAN block (2x2-pooled keys) and a window block, whole-graph: a sparse layout's
    # construction must stay out of the traced graph, or fullgraph=True fails.
    torch._dynamo.reset()
    torch.manual_seed(0)
    module = ann.SelfAttention2d(64, heads=8, pattern=pattern, pool_kv=2 if isinstance(pattern, YLG) else 1)
    _randomize(module)
    _check_compiled_matches_eager(module, [torch.randn(2, 64, 8, 10)])


@pytest.mark.parametrize("index", range(4))
def test_autocast_bf16_modules_match_float32(index):
    torch.manual_seed(0)
    module, inputs = _all_modules()[index]
    _randomize(module)
    want = module(*inputs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = module(*inputs)
    got.float().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all()
               for p in module.parameters() if p.requires_grad)
    # The projections and the attention round to bf16 (2^-8 relative each; measured up to
    # 0.6% of the largest output); a silently wrong attention would be off by O(1).
    err = (got.float() - want).abs().max().item()
    assert err <= 4 * 2**-8 * want.detach().abs().max().item(), err


def test_functional_under_autocast_runs_the_16_bit_kernels():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 17, 8) for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = attn2d.attention(q, k, v)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, attn2d.attention(q.bfloat16(), k.bfloat16(), v.bfloat16()))


BAD_MODULES = [
    (lambda: ann.SelfAttention2d(30), "qk_ratio"),
    (lambda: ann.SelfAttention2d(64, heads=3), "heads"),
    (lambda: ann.SelfAttention2d(64, v_channels=30, heads=4), "v_channels"),
    (lambda: ann.SelfAttention2d(0), "channels"),
    (lambda: ann.SelfAttention2d(64, groups=3), "groups"),
    (lambda: ann.MultiheadSelfAttention2d(30, 4), "num_heads"),
    (lambda: ann.Attention(30, num_heads=4), "num_heads"),
    (lambda: ann.Attention(32, attn_drop=0.1), "attn_drop"),
    (lambda: ann.CrossAttention(30, num_heads=4), "num_heads"),
]


@pytest.mark.parametrize("case", BAD_MODULES, ids=lambda c: c[1])
def test_bad_construction_names_module_and_argument(case):
    make, word = case
    with pytest.raises(ValueError) as info:
        make()
    assert "attn2d.nn." in str(info.value) and word in str(info.value)


@pytest.mark.parametrize("config", [
    dict(channels=64, heads=8, pattern=YLG(8)),  # YLG-SAGAN: 8 heads, 2x2-pooled keys
    dict(channels=16, heads=2, pattern=Window(3, "manhattan")),
    dict(channels=16, pool_kv=1, pattern=Window(5, border="shift")),
], ids=lambda c: repr(c["pattern"]))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_self_attention2d_with_patterns_matches_masked_reference(config, dtype):
    torch.manual_seed(0)
    ours, ref = _pair(ann.SelfAttention2d, RefSelfAttention2d, **config)
    compare(ours, ref, [torch.randn(2, config["channels"], 12, 10)], dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_multihead_self_attention2d_with_window_matches_masked_reference(dtype):
    torch.manual_seed(0)
    ours, ref = _pair(ann.MultiheadSelfAttention2d, RefMultiheadSelfAttention2d, 16, 4,
                      pattern=Window(3))
    compare(ours, ref, [torch.randn(2, 16, 7, 9)], dtype)


def test_bad_patterns_are_refused():
    with pytest.raises(TypeError, match="pattern"):
        ann.SelfAttention2d(64, pattern="window")
    with pytest.raises(ValueError, match="heads"):
        ann.SelfAttention2d(64, heads=4, pattern=YLG(8))
    with pytest.raises(ValueError, match="8 heads but the module has 4"):
        ann.Attention(32, num_heads=4, pattern=YLG(8))
    with pytest.raises(TypeError, match="pattern"):
        ann.CrossAttention(32, num_heads=4, pattern=torch.ones(4, 4, dtype=torch.bool))


@pytest.mark.parametrize("module,bad,word", [
    (ann.SelfAttention2d(16), torch.randn(2, 16, 8), "4-D"),
    (ann.SelfAttention2d(16), torch.randn(2, 8, 8, 8), "channels"),
    (ann.MultiheadSelfAttention2d(16), torch.randn(16, 8, 8), "4-D"),
    (ann.MultiheadSelfAttention2d(16), torch.randn(1, 12, 8, 8), "channels"),
    (ann.Attention(16, num_heads=2), torch.randn(2, 5, 12), "channels"),
    (ann.Attention(16, num_heads=2), torch.randn(5, 16), "3-D"),
])
def test_bad_input_names_module_and_argument(module, bad, word):
    with pytest.raises(ValueError) as info:
        module(bad)
    assert "attn2d.nn." in str(info.value) and word in str(info.value)


def test_pool_larger_than_map_is_refused():
    with pytest.raises(ValueError, match="pool_kv"):
        ann.SelfAttention2d(16)(torch.randn(1, 16, 1, 5))
