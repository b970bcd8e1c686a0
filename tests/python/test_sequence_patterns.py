"""The sequence patterns (Window1D, Random, BlockMask) and unions and intersections of any
patterns: dense masks against loops written here from the definitions; attn2d.attention with a
pattern and attn2d.attention2d against float64 naive attention under the dense mask, forward and
backward, with gradcheck; the modules; and bad arguments."""

from __future__ import annotations

import json

import pytest
import torch

import attn2d
import attn2d.nn as ann
from attn2d import _compiled_layout
from attn2d.patterns import (YLG, BlockMask, Intersection, Random, Union, Window, Window1D,
                             from_spec)
from reference import assert_within_rule, naive_attention


def window1d_by_loops(w: Window1D, lq: int, lk: int) -> torch.Tensor:
    out = torch.zeros(lq, lk, dtype=torch.bool)
    offsets = range(-(w.size - 1), 1) if w.causal else range(-(w.size // 2), w.size - w.size // 2)
    for i in range(lq):
        c = i * lk // lq
        for o in offsets:
            if 0 <= c + w.dilation * o < lk:
                out[i, c + w.dilation * o] = True
    return out


def block_mask_by_loops(m: BlockMask, heads: int, lq: int, lk: int) -> torch.Tensor:
    out = torch.zeros(heads, lq, lk, dtype=torch.bool)
    for h in range(heads):
        blocks = m.mask if m.mask.dim() == 2 else m.mask[h]
        for i in range(lq):
            for j in range(lk):
                out[h, i, j] = bool(blocks[i // m.block_q, j // m.block_k])
    return out


@pytest.mark.parametrize("lq,lk", [(1, 1), (17, 17), (65, 65), (40, 131), (131, 77)])
@pytest.mark.parametrize("size,dilation,causal", [(1, 1, False), (4, 1, False), (5, 3, False),
                                                  (7, 1, True), (3, 5, True)])
def test_window1d_mask_matches_loops(lq, lk, size, dilation, causal):
    w = Window1D(size, dilation, causal)
    if dilation * (size - 1) >= lk:
        with pytest.raises(ValueError, match="Window1D: dilation"):
            w.dense_mask((1, lq), (1, lk))
        return
    assert torch.equal(w.dense_mask((1, lq), (1, lk))[0], window1d_by_loops(w, lq, lk))


@pytest.mark.parametrize("lq,lk,block_q,block_k,mask_heads",
                         [(50, 50, 8, 8, 1), (37, 91, 5, 16, 3), (64, 64, 64, 64, 1)])
def test_block_mask_matches_loops(lq, lk, block_q, block_k, mask_heads):
    g = torch.Generator().manual_seed(lq)
    shape = (-(-lq // block_q), -(-lk // block_k))
    mask = torch.rand((mask_heads, *shape) if mask_heads > 1 else shape, generator=g) < 0.4
    m = BlockMask(mask, (block_q, block_k))
    assert torch.equal(m.dense_mask((1, lq), (1, lk), 3), block_mask_by_loops(m, 3, lq, lk))


def test_random_sees_its_own_block_its_draws_and_the_global_tokens():
    r = Random(blocks_per_row=2, block=16, seed=11, global_tokens=3)
    mask = r.dense_mask((1, 160), (1, 160))[0]
    assert mask[:3].all() and mask[:, :3].all()  # global tokens, both ways
    for b in range(10):
        rows = mask[16 * b + 3 if b == 0 else 16 * b:16 * (b + 1), 3:]
        seen = {j // 16 for j in torch.nonzero(rows.any(0)).flatten().add(3).tolist()}
        assert b in seen and len(seen) == 3, (b, seen)
        # Every query of a block sees the same keys.
        assert (rows == rows[0]).all()


def test_random_is_the_same_for_the_same_seed_and_differs_across_seeds():
    masks = [Random(2, 8, seed, 1).dense_mask((1, 200), (1, 200)) for seed in (5, 5, 6)]
    assert torch.equal(masks[0], masks[1])
    assert not torch.equal(masks[0], masks[2])


def test_unions_and_intersections_are_the_parts_masks_ored_and_anded():
    hw = (9, 14)
    parts = [Window(3), Window1D(9, 2), Random(1, 16, 3, 0), YLG(4),
             BlockMask(torch.rand(4, 2, 8, generator=torch.Generator().manual_seed(0)) < 0.5,
                       (64, 16))]
    masks = [p.dense_mask(hw, hw, 4) for p in parts]
    for i, j in [(0, 1), (1, 2), (0, 3), (2, 4), (3, 4)]:
        assert torch.equal((parts[i] | parts[j]).dense_mask(hw, hw, 4), masks[i] | masks[j])
        assert torch.equal((parts[i] & parts[j]).dense_mask(hw, hw, 4), masks[i] & masks[j])
    three = Union(parts[1], parts[2], parts[4])
    assert torch.equal(three.dense_mask(hw, hw, 4), masks[1] | masks[2] | masks[4])


def run_both(pattern, lq, lk, heads, dtype=torch.float64, E=7, Ev=5, B=2):
    """attn2d.attention with the pattern against naive attention under its dense mask, forward
    and backward, held to the 2x rule."""
    q = torch.randn(B, heads, lq, E, dtype=dtype, requires_grad=True)
    k = torch.randn(B, heads, lk, E, dtype=dtype, requires_grad=True)
    v = torch.randn(B, heads, lk, Ev, dtype=dtype, requires_grad=True)
    grad = torch.randn(B, heads, lq, Ev, dtype=dtype)
    mask = pattern.dense_mask((1, lq), (1, lk), heads)
    results = {}
    for name, ref_dtype in (("ours", None), ("naive", dtype), ("oracle", torch.float64)):
        if ref_dtype is None:
            out = attn2d.attention(q, k, v, pattern=pattern)
        else:
            out = naive_attention(q, k, v, attn_mask=mask, dtype=ref_dtype)
        results[name] = (out.detach(), *torch.autograd.grad(out, (q, k, v), grad.to(out.dtype)))
    assert_within_rule(results, dtype)
    return results, mask


# 8 x 8 blocks: each query block sees its own and the next; block 3 sees none.
EIGHT_BLOCKS_ONE_EMPTY = torch.eye(8, dtype=torch.bool)
EIGHT_BLOCKS_ONE_EMPTY |= EIGHT_BLOCKS_ONE_EMPTY.roll(1, 1)
EIGHT_BLOCKS_ONE_EMPTY[3] = False

SEQUENCE_CASES = [
    (Window1D(9), 100, 100),
    (Window1D(8, 3, causal=True), 131, 131),
    (Window1D(5, 2), 70, 33),  # fewer keys than queries
    (Random(2, 16, 7, 2), 97, 97),
    (Random(1, 7, 1, 0), 45, 120),
    (BlockMask(torch.tensor([[1, 0, 1], [0, 0, 0], [1, 1, 0]], dtype=torch.bool), 23), 60, 60),
    (Window1D(7, causal=True) | Random(1, 32, 4, 2), 150, 150),
    (Window1D(15) & Random(2, 16, 9, 0), 120, 120),
    (Window1D(5) & BlockMask(EIGHT_BLOCKS_ONE_EMPTY, 16), 120, 120),  # rows with no key
]


@pytest.mark.parametrize("pattern,lq,lk", SEQUENCE_CASES, ids=lambda x: repr(x)[:60])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_attention_with_a_pattern_matches_dense_masked_attention(pattern, lq, lk, dtype):
    results, mask = run_both(pattern, lq, lk, 3, dtype=dtype, E=7 if dtype == torch.float64 else 16,
                             Ev=5 if dtype == torch.float64 else 24)
    empty = ~mask.any(-1)  # (heads, lq): rows with no allowed key give 0, gradient 0
    if empty.any():
        out, dq = results["ours"][0], results["ours"][1]
        assert (out[:, empty] == 0).all() and (dq[:, empty] == 0).all()


def test_an_intersection_can_leave_rows_without_keys():
    mask = (Window1D(5) & BlockMask(EIGHT_BLOCKS_ONE_EMPTY, 16)).dense_mask((1, 120), (1, 120))
    assert (~mask.any(-1))[0, 48:64].all() and mask.any(-1)[0, :48].all()


@pytest.mark.parametrize("pattern", [Window1D(4, 2, causal=True), Random(1, 4, 3, 1),
                                     Window1D(3) | Random(1, 8, 2, 0),
                                     BlockMask(torch.eye(3, dtype=torch.bool), 5)], ids=repr)
def test_gradcheck(pattern):
    q = torch.randn(1, 2, 13, 3, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 13, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 13, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: attn2d.attention(a, b, c, pattern=pattern),
                                    (q, k, v))


def test_attention2d_takes_a_union_of_a_window_and_random_blocks():
    """Seed 002's ViT case on a patch grid: a 2-D window or BigBird's random blocks."""
    pattern = Window(5) | Random(1, 16, 0, 4)
    hw = (11, 12)
    q, k = (torch.randn(2, 4, *hw, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v = torch.randn(2, 4, *hw, 6, dtype=torch.float64, requires_grad=True)
    out = attn2d.attention2d(q, k, v, pattern=pattern)
    mask = pattern.dense_mask(hw, hw, 4)
    ref = naive_attention(q.flatten(2, 3), k.flatten(2, 3), v.flatten(2, 3),
                          attn_mask=mask).unflatten(2, hw)
    assert (out - ref).abs().max() < 1e-12
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        assert (a - b).abs().max() < 1e-12


def test_vit_attention_module_with_a_pattern_matches_the_masked_reference():
    torch.manual_seed(0)
    pattern = Window1D(9) | Random(1, 16, 5, 1)
    m = ann.Attention(48, num_heads=4, qkv_bias=True, pattern=pattern).double()
    x = torch.randn(2, 70, 48, dtype=torch.float64, requires_grad=True)
    out = m(x)
    q, k, v = (t.unflatten(-1, (4, 12)).transpose(1, 2) for t in m.qkv(x).chunk(3, dim=-1))
    ref = naive_attention(q, k, v, attn_mask=pattern.dense_mask((1, 70), (1, 70), 4))
    ref = m.proj(ref.transpose(1, 2).flatten(2))
    assert (out - ref).abs().max() < 1e-12
    with pytest.raises(ValueError, match="is_causal"):
        m(x, is_causal=True)


def test_cross_attention_module_with_a_pattern():
    m = ann.CrossAttention(32, context_dim=16, num_heads=2, pattern=Window1D(5)).double()
    x = torch.randn(2, 40, 32, dtype=torch.float64)
    ctx = torch.randn(2, 77, 16, dtype=torch.float64)
    out = m(x, ctx)
    q = m.q(x).unflatten(-1, (2, 16)).transpose(1, 2)
    k, v = (t.unflatten(-1, (2, 16)).transpose(1, 2) for t in m.kv(ctx).chunk(2, dim=-1))
    ref = naive_attention(q, k, v, attn_mask=Window1D(5).dense_mask((1, 40), (1, 77), 2))
    assert (out - m.proj(ref.transpose(1, 2).flatten(2))).abs().max() < 1e-12


def test_specs_round_trip_and_patterns_compare_by_value():
    mask = torch.rand(2, 3, 4, generator=torch.Generator().manual_seed(1)) < 0.5
    for p in [Window1D(5, 2, True), Random(3, 32, 2**40, 2), BlockMask(mask, (8, 16)),
              Union(Window(3), Intersection(Window1D(3), Random(1, 4, 0, 0))),
              YLG(4) | BlockMask(mask[0], 4)]:
        q = from_spec(json.loads(json.dumps(p.to_spec())))
        assert q == p and hash(q) == hash(p)
    assert BlockMask(mask, 8) != BlockMask(~mask, 8)
    assert Random(1, 8, 1) != Random(1, 8, 2)
    # Compiled layouts are cached by value: an equal pattern reuses them.
    a = _compiled_layout.build(Window1D(5) | Random(1, 8, 3), (1, 50), (1, 50), 2)
    assert _compiled_layout.build(Window1D(5) | Random(1, 8, 3), (1, 50), (1, 50), 2) is a


@pytest.mark.parametrize("pattern,hw", [
    (Random(1, 64, 0, 0), (1, 256)),          # whole-tile visits only: no mask words
    (Window1D(9) | Random(1, 16, 2, 3), (1, 100)),
    (Window(5) & Random(2, 8, 1, 0), (9, 11)),
], ids=repr)
def test_allowed_pairs_counts_the_dense_masks_pairs(pattern, hw):
    assert pattern.allowed_pairs(hw, hw, 3) == int(pattern.dense_mask(hw, hw, 3).sum())


def test_bad_arguments_name_themselves():
    with pytest.raises(TypeError, match="mask must be a bool tensor; got torch.float32"):
        BlockMask(torch.ones(2, 2), 4)
    with pytest.raises(TypeError, match="mask must be a bool tensor; got list"):
        BlockMask([[True]], 4)
    with pytest.raises(ValueError, match="mask must be a non-empty"):
        BlockMask(torch.ones(4, dtype=torch.bool), 4)
    with pytest.raises(ValueError, match="the mask must have 3 x 3 blocks"):
        BlockMask(torch.ones(2, 3, dtype=torch.bool), 4).check((1, 12), (1, 12), 1)
    with pytest.raises(ValueError, match="holds 2 heads; it must hold 1 or 3"):
        BlockMask(torch.ones(2, 3, 3, dtype=torch.bool), 4).check((1, 12), (1, 12), 3)
    with pytest.raises(ValueError, match="block must be >= 1"):
        BlockMask(torch.ones(2, 2, dtype=torch.bool), 0)
    with pytest.raises(ValueError, match="size must be >= 1"):
        Window1D(0)
    with pytest.raises(TypeError, match="causal must be a bool"):
        Window1D(3, causal=1)
    with pytest.raises(ValueError, match="blocks_per_row must be smaller than the 4 key blocks"):
        Random(4, 16).check((1, 64), (1, 64), 1)
    with pytest.raises(ValueError, match="global_tokens must be at most"):
        Random(1, 16, 0, 65).check((1, 64), (1, 64), 1)
    with pytest.raises(ValueError, match="seed must be below 2\\*\\*63"):
        Random(1, 16, 2**63)
    with pytest.raises(ValueError, match="needs at least one pattern"):
        Union()
    with pytest.raises(TypeError, match="parts must be patterns"):
        Union(Window(3), "window")
    q = torch.randn(1, 2, 20, 4)
    with pytest.raises(ValueError, match="attn2d.attention: pattern excludes attn_mask"):
        attn2d.attention(q, q, q, is_causal=True, pattern=Window1D(3))
    with pytest.raises(ValueError, match="attn2d.attention: q must be 4-D"):
        attn2d.attention(q[0], q, q, pattern=Window1D(3))
    with pytest.raises(ValueError, match="Window1D: dilation"):
        attn2d.attention(q, q, q, pattern=Window1D(21))


def test_mask_words_bit_counts_match_pythons():
    from attn2d._compiled_layout import _popcount

    g = torch.Generator().manual_seed(3)
    words = torch.randint(-2**63, 2**63 - 1, (2000,), dtype=torch.int64, generator=g)
    words[:3] = torch.tensor([0, -1, -2**63])
    assert _popcount(words).tolist() == [bin(int(w) & (2**64 - 1)).count("1") for w in words]
