"""The fused local/sparse kernels against dense-masked float64 attention (the same pattern's
dense_mask): outputs and gradients over metrics, borders, dilations, pooled key grids and
awkward sizes; YLG on square and non-square grids; gradcheck; float32 under the 2x rule."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

import attn2d
from attn2d import _compiled_layout
from attn2d.patterns import YLG, YLG_PATTERNS, Window
from reference import (assert_within_rule, max_err, naive_attention, random_sweep_tests,
                       tolerance)


def storage_view(shape, dtype, storage):
    """A random (B, heads, H, W, d) tensor stored as `storage` says: "rows" (contiguous),
    "strided" (every other element of a wider last dimension: a non-unit stride along d) or
    "channels_first" (a 1x1 conv's (B, heads*d, H, W) output viewed without a copy: stride 1
    along W, H*W along d, as attn2d.nn passes it)."""
    if storage == "rows":
        return torch.randn(*shape, dtype=dtype)
    if storage == "strided":
        return torch.randn(*shape[:-1], 2 * shape[-1], dtype=dtype)[..., ::2]
    if storage == "channels_first":
        B, heads, H, W, d = shape
        return torch.randn(B, heads, d, H, W, dtype=dtype).permute(0, 1, 3, 4, 2)
    raise ValueError(f"storage: unknown {storage!r}")


def run_both(pattern, q_hw, kv_hw, heads, dtype=torch.float64, E=7, Ev=5, B=2, storage="rows",
             relative_floor=False):
    def leaf(*shape):
        return storage_view(shape, dtype, storage).requires_grad_()
    q, k, v = leaf(B, heads, *q_hw, E), leaf(B, heads, *kv_hw, E), leaf(B, heads, *kv_hw, Ev)
    grad = storage_view((B, heads, *q_hw, Ev), dtype, storage)
    mask = pattern.dense_mask(q_hw, kv_hw, heads)
    results = {}
    for name, ref_dtype in (("ours", None), ("naive", dtype), ("oracle", torch.float64)):
        if ref_dtype is None:
            out = attn2d.attention2d(q, k, v, pattern=pattern)
        else:
            out = naive_attention(q.flatten(2, 3), k.flatten(2, 3), v.flatten(2, 3),
                                  attn_mask=mask, dtype=ref_dtype).unflatten(2, q_hw)
        grads = torch.autograd.grad(out, (q, k, v), grad.to(out.dtype))
        results[name] = (out.detach(), *grads)
    assert_within_rule(results, dtype, relative_floor)
    return results


# Prime sides, 1xN maps, pooled keys (2x and uneven), windows as large as the map.
GRIDS = [((7, 11), (7, 11)), ((13, 13), (13, 13)), ((1, 29), (1, 29)), ((14, 10), (7, 5)),
         ((17, 9), (5, 3))]
WINDOWS = [
    Window(size, metric, dilation, border)
    for size, metric, dilation, border in itertools.product(
        (1, 3, 4, 5), ("chebyshev", "manhattan", "euclidean"), (1, 2), ("clip", "shift"))
    if not (border == "shift" and metric != "chebyshev")
]


@pytest.mark.parametrize("grids", GRIDS, ids=lambda g: f"{g[0]}->{g[1]}")
@pytest.mark.parametrize("window", WINDOWS, ids=repr)
def test_windows_match_dense_masked_attention(window, grids):
    q_hw, kv_hw = grids
    try:
        window.check(q_hw, kv_hw, 1)
    except ValueError:
        pytest.skip("window does not fit this map (its error is tested separately)")
    run_both(window, q_hw, kv_hw, heads=2)


@pytest.mark.parametrize("side", [5, 7])
def test_window_as_large_as_the_map(side):
    for border in ("clip", "shift"):
        run_both(Window(side, border=border), (side, side), (side, side), heads=1)
        run_both(Window(side, border=border), (2 * side, 2 * side), (side, side), heads=1)


@pytest.mark.parametrize("grids", [((8, 8), (8, 8)), ((12, 12), (6, 6)), ((9, 7), (9, 7)),
                                   ((10, 6), (5, 3)), ((16, 16), (8, 8))], ids=str)
@pytest.mark.parametrize("mapping", ["official", "geometric"])
def test_ylg_matches_dense_masked_attention(grids, mapping):
    q_hw, kv_hw = grids
    run_both(YLG(8, mapping=mapping), q_hw, kv_hw, heads=8)


def test_ylg_custom_heads():
    run_both(YLG(None, patterns=["ltr-repetitive", "rtl-floor", "ltr-repetitive"]),
             (6, 6), (6, 6), heads=3)


@pytest.mark.parametrize("q_hw", [(40, 48), (21, 47), (12, 80)], ids=str)
def test_window_backward_bands_longer_than_one_delta_chunk(q_hw):
    # The blocked window backward forms D = rowsum(dO * O) 256 positions at a time
    # (src/cpu/window/window_backward_plan-inl.h, kDeltaChunk), and its bands hold 2 block rows
    # of 4 pixel rows: 384 positions at width 48 (a chunk and a short one), 384 on width 47's
    # 48-wide pitched raster (pad columns inside the chunks), 640 at width 80 (two chunks and a
    # short one).
    for dtype in (torch.float64, torch.float32):
        run_both(Window(5, "manhattan"), q_hw, q_hw, heads=2, dtype=dtype, E=6, Ev=21, B=1)


def random_case(rng: random.Random):
    """A pattern, grids and shapes drawn from everything attention2d takes, drawn again until
    the pattern fits the map: small maps of any side, and a quarter of maps 16-48 pixels wide
    (widths a multiple of 16 take the blocked window kernels, in float32 and float64); keys
    pooled by 1-3 per axis; windows of every metric, border and dilation; YLG heads of random
    kinds and either mapping; odd E and Ev; strided and channels-first views."""
    while True:
        big = rng.random() < 0.25
        if big:
            q_hw = (rng.choice([16, 17, 31, 32, 48]), rng.choice([16, 32, 47, 48]))
        else:
            q_hw = (rng.randint(1, 19), rng.randint(1, 19))
        f = rng.choice([1, 1, 2, 3])
        kv_hw = (max(1, q_hw[0] // f), max(1, q_hw[1] // rng.choice([1, f])))
        heads = rng.randint(1, 4)
        if rng.random() < 0.65:
            metric = rng.choice(["chebyshev", "manhattan", "euclidean"])
            border = "shift" if metric == "chebyshev" and rng.random() < 0.3 else "clip"
            pattern = Window(rng.randint(1, 16 if big else 9), metric, rng.choice([1, 1, 2, 3]),
                             border)
        else:
            pattern = YLG(None, patterns=[rng.choice(YLG_PATTERNS) for _ in range(heads)],
                          mapping=rng.choice(["official", "geometric"]))
        try:
            pattern.check(q_hw, kv_hw, heads)
        except ValueError:
            continue
        return dict(pattern=pattern, q_hw=q_hw, kv_hw=kv_hw, heads=heads,
                    dtype=rng.choice([torch.float32, torch.float64]), E=rng.randint(1, 20),
                    Ev=rng.randint(1, 20), B=rng.randint(1, 2),
                    storage=rng.choice(["rows", "rows", "rows", "strided", "channels_first"]))


test_random_combinations, test_random_combinations_sweep = random_sweep_tests(
    random_case, run_both, quick=150, slow=2000)


FLOAT32_CASES = [
    (Window(5, "manhattan", 2), (30, 27), (15, 14), 2),
    (YLG(8), (24, 24), (12, 12), 8),
    (Window(8, dilation=3, border="shift"), (31, 29), (31, 29), 1),
]


@pytest.mark.parametrize("pattern,q_hw,kv_hw,heads", FLOAT32_CASES)
# channels_first: YLG and the shifted window run on gathered tiles, which copy such views to rows
# first (16 x 16 transposes at E = 16 and Ev = 24, the output gradient too); the clipped window
# on the window kernels.
@pytest.mark.parametrize("storage", ["rows", "channels_first"])
def test_float32_within_twice_naive_error(pattern, q_hw, kv_hw, heads, storage):
    run_both(pattern, q_hw, kv_hw, heads, dtype=torch.float32, E=16, Ev=24, storage=storage)


@pytest.mark.parametrize("pattern,q_hw,kv_hw,heads", FLOAT32_CASES)
@pytest.mark.parametrize("storage", ["rows", "channels_first"])
@pytest.mark.parametrize("E,Ev", [(16, 16), (32, 48)])
def test_float32_direct_lanes_within_twice_naive_error(pattern, q_hw, kv_hw, heads, storage, E,
                                                       Ev):
    # Widths of whole 16 x 16 transposes take the sparse forward's direct lanes on AVX-512 (q
    # read and out written straight from the lanes; a repetitive YLG head's own keys, a run of
    # 16 rows but where a wrap of the key grid or a special key breaks it, transposed straight
    # from k and v). The output, which that forward writes, is held to the fixed 1e-6 floor.
    # The gradients take the floor scaled by the largest reference value (reference.tolerance):
    # they reach 4-12 here, where the fixed 1e-6 floor is two or three ulp and a correct
    # backward's error can exceed twice naive float32's.
    results = run_both(pattern, q_hw, kv_hw, heads, dtype=torch.float32, E=E, Ev=Ev,
                       storage=storage, relative_floor=True)
    ours, naive, oracle = (results[name][0] for name in ("ours", "naive", "oracle"))
    assert max_err(ours, oracle) <= tolerance(max_err(naive, oracle), torch.float32)


@pytest.mark.parametrize("pattern,heads", [(Window(3, "euclidean"), 2), (YLG(4), 4)], ids=repr)
def test_gradcheck(pattern, heads):
    q = torch.randn(1, heads, 6, 5, 3, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, heads, 3, 5, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, heads, 3, 5, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: attn2d.attention2d(a, b, c, pattern=pattern),
                                    (q, k, v))


@pytest.mark.parametrize("pattern", [Window(3), YLG(None, patterns=["ltr-repetitive",
                                                                   "rtl-repetitive"])], ids=repr)
def test_strided_nchw_views(pattern):
    # 1x1 conv outputs (B, heads*d, H, W) -> (B, heads, H, W, d) without a copy. YLG's
    # repetitive heads: each query's own-position key comes from visits that allow one key a
    # row, computed row by row from the tensors (VisitSingleKeys), here with strided channels.
    B, heads, H, W = 2, 2, 9, 11
    x = torch.randn(B, heads * 9, H, W, dtype=torch.float64)
    q, k, v = (x[:, i * heads * 3:(i + 1) * heads * 3].view(B, heads, 3, H, W).permute(0, 1, 3, 4, 2)
               for i in range(3))
    assert q.stride(-1) == H * W
    out = attn2d.attention2d(q, k, v, pattern=pattern)
    want = naive_attention(q.flatten(2, 3), k.flatten(2, 3), v.flatten(2, 3),
                           attn_mask=pattern.dense_mask((H, W), (H, W), heads)).unflatten(2, (H, W))
    assert max_err(out, want) < 1e-12


@pytest.mark.parametrize("mapping", ["official", "geometric"])
def test_channels_first_views_give_the_bits_of_row_major_inputs(mapping):
    # The gathered-tile kernels copy channels-first views to rows first: the forward a run of
    # heads at a time within 8 MiB (here 1.5 MiB a head: several runs), the backward one slice a
    # thread (the geometric mapping's floor tiles, rows in pairs, are copied too). The copies are
    # exact and the kernels then run as on row-major inputs, so every result must be bitwise
    # equal to theirs.
    B, heads, E, Ev = 2, 8, 16, 24
    pattern = YLG(8, mapping=mapping)
    views = [storage_view((B, heads, *hw, d), torch.float32, "channels_first")
             for hw, d in (((128, 128), E), ((64, 64), E), ((64, 64), Ev))]
    grad = storage_view((B, heads, 128, 128, Ev), torch.float32, "channels_first")
    results = []
    for make in (lambda t: t, lambda t: t.contiguous()):
        q, k, v = (make(t).detach().requires_grad_() for t in views)
        out = attn2d.attention2d(q, k, v, pattern=pattern)
        results.append((out, *torch.autograd.grad(out, (q, k, v), make(grad))))
    assert views[0].stride(-1) == 128 * 128
    for name, cf, rows in zip(("out", "dq", "dk", "dv"), *results):
        assert torch.equal(cf, rows), name


def test_deterministic_and_visits_few_tiles():
    pattern = Window(7)
    q, k, v = (torch.randn(1, 1, 48, 48, 16) for _ in range(3))
    a = attn2d.attention2d(q, k, v, pattern=pattern)
    b = attn2d.attention2d(q, k, v, pattern=pattern)
    assert torch.equal(a, b)
    layout = _compiled_layout.build(pattern, (48, 48), (48, 48), 1)
    visited = _compiled_layout.visited_pairs(layout)
    allowed = int(pattern.dense_mask((48, 48), (48, 48), 1).sum())
    # An 8x8 query tile's 7x7 windows span 14x14 keys: at most 3x3 key tiles of 8x8.
    assert allowed <= visited <= 48 * 48 * 9 * 64
    assert visited < (48 * 48) ** 2 / 4  # a fifth of global attention's pairs here


@pytest.mark.parametrize("kind", ["ltr-floor", "rtl-floor"])
def test_ylg_floor_visits_reach_only_the_keys_they_need(kind):
    # 64x64 queries over 32x32 keys: l = 32 positions a block, query tiles of 16 positions (4
    # queries each), key tiles of 2 blocks. A query tile sees its positions' part of one block:
    # laid out so that part leads the key tile, its visit reaches 16, 32, 48 or 64 columns, 40
    # a query on average (rtl-floor's keys in ascending order would reach 32 or 64: 48).
    pattern = YLG(1, patterns=[kind])
    layout = _compiled_layout.build(pattern, (64, 64), (32, 32), 1)
    assert _compiled_layout.visited_pairs(layout) == 40 * 64 * 64
    allowed = int(pattern.dense_mask((64, 64), (32, 32)).sum())
    assert _compiled_layout.allowed_pairs(layout) == allowed
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, *hw, 5, dtype=torch.float64, generator=g)
               for hw in ((64, 64), (32, 32), (32, 32)))
    out = attn2d.attention2d(q, k, v, pattern=pattern)
    want = naive_attention(q.flatten(2, 3), k.flatten(2, 3), v.flatten(2, 3),
                           attn_mask=pattern.dense_mask((64, 64), (32, 32), 1)).unflatten(2, (64, 64))
    assert max_err(out, want) < 1e-12


@pytest.mark.parametrize("mapping", ["official", "geometric"])
@pytest.mark.parametrize("kind", ["ltr-repetitive", "rtl-repetitive"])
def test_ylg_repetitive_tiles_are_raster_runs_with_one_own_key_a_query(kind, mapping):
    # 40x24 queries over 20x12 keys (n = 240, l = 15): query tiles are runs of 64 raster rows
    # (contiguous rows, outputs and log-sum-exps); a query computes its special columns and
    # its own key only, so the kernel computes exactly the allowed pairs.
    pattern = YLG(1, patterns=[kind], mapping=mapping)
    q_hw, kv_hw = (40, 24), (20, 12)
    layout = _compiled_layout.build(pattern, q_hw, kv_hw, 1)
    q_rows = layout[3]
    rows = q_rows[q_rows >= 0]
    assert torch.equal(rows, torch.arange(40 * 24, dtype=rows.dtype))
    assert bool((q_rows >= 0).all())  # 960 queries: 15 full tiles
    allowed = int(pattern.dense_mask(q_hw, kv_hw).sum())
    assert _compiled_layout.allowed_pairs(layout) == allowed
    assert _compiled_layout.visited_pairs(layout) == allowed
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 1, *hw, 5, dtype=torch.float64, generator=g)
               for hw in (q_hw, kv_hw, kv_hw))
    out = attn2d.attention2d(q, k, v, pattern=pattern)
    want = naive_attention(q.flatten(2, 3), k.flatten(2, 3), v.flatten(2, 3),
                           attn_mask=pattern.dense_mask(q_hw, kv_hw, 1)).unflatten(2, q_hw)
    assert max_err(out, want) < 1e-12


def test_raw_op_refuses_a_malformed_layout():
    pattern = Window(3)
    layout = list(_compiled_layout.build(pattern, (6, 6), (6, 6), 1))
    q, k, v = (torch.randn(1, 1, 36, 4) for _ in range(3))
    bad = [t.clone() for t in layout]
    bad[4][0, 0] = 999  # a key row out of range
    with pytest.raises(ValueError, match="layout"):
        torch.ops.attn2d.attention2d_forward(q, k, v, bad, _compiled_layout.BLOCK_Q, 0.5)
    bad = [t.clone() for t in layout]
    bad[10][0] = 5 if bad[10].numel() and bad[10][0] < 0 else -1  # backward lists disagree
    with pytest.raises(ValueError, match="layout"):
        torch.ops.attn2d.attention2d_forward(q, k, v, bad, _compiled_layout.BLOCK_Q, 0.5)
    with pytest.raises(ValueError, match="heads"):
        torch.ops.attn2d.attention2d_forward(torch.randn(1, 2, 36, 4), torch.randn(1, 2, 36, 4),
                                             torch.randn(1, 2, 36, 4), layout, 64, 0.5)


def test_window_kernel_takes_clip_windows_on_one_grid():
    offsets = _compiled_layout.window_offsets(Window(3, "manhattan", 2), (9, 9), (9, 9))
    assert sorted(map(tuple, offsets.t().tolist())) == [(-2, 0), (0, -2), (0, 0), (0, 2), (2, 0)]
    assert _compiled_layout.window_offsets(Window(5), (1, 29), (1, 29)).shape == (2, 5)  # rows clipped
    # The tiled kernel serves the rest: pooled keys, shifted windows, YLG, and windows whose
    # offsets mostly fall outside the map (7x11 under an 11x11 window: 2.2x the allowed pairs).
    assert _compiled_layout.window_offsets(Window(5), (14, 10), (7, 5)) is None
    assert _compiled_layout.window_offsets(Window(5, border="shift"), (13, 13), (13, 13)) is None
    assert _compiled_layout.window_offsets(YLG(8), (8, 8), (8, 8)) is None
    assert _compiled_layout.window_offsets(Window(11), (7, 11), (7, 11)) is None


@pytest.mark.parametrize("pattern,hw", [(Window(9, "euclidean"), (37, 41)),
                                        (Window(6, dilation=3), (23, 16)),
                                        (Window(15, "manhattan"), (3, 64))], ids=str)
def test_window_kernel_float32_and_agrees_with_the_tiled_kernel(pattern, hw):
    assert _compiled_layout.window_offsets(pattern, hw, hw) is not None
    run_both(pattern, hw, hw, 3, dtype=torch.float32, E=20, Ev=24)
    # NCHW-like views (last-dim stride H*W) straight into both kernels, forward and backward.
    q, k, v, g = (torch.randn(2, 3, 20, hw[0] * hw[1]).transpose(2, 3) for _ in range(4))
    layout = list(_compiled_layout.build(pattern, hw, hw, 3))
    offsets = _compiled_layout.window_offsets(pattern, hw, hw)
    out_w, lse_w, _ = torch.ops.attn2d.attention2d_window_forward(q, k, v, offsets, *hw, 0.3)
    out_t, lse_t, _ = torch.ops.attn2d.attention2d_forward(q, k, v, layout, _compiled_layout.BLOCK_Q, 0.3)
    assert max_err(out_w, out_t) < 1e-5 and max_err(lse_w, lse_t) < 1e-5
    grads_w = torch.ops.attn2d.attention2d_window_backward(g, q, k, v, out_w, lse_w, offsets, *hw,
                                                           0.3)
    grads_t = torch.ops.attn2d.attention2d_backward(g, q, k, v, out_t, lse_t, layout,
                                                    _compiled_layout.BLOCK_Q, 0.3)
    for a, b in zip(grads_w, grads_t):
        assert max_err(a, b) < 1e-4


def test_window_kernel_gradcheck_and_opcheck():
    pattern = Window(3, "manhattan")
    q, k, v = (torch.randn(1, 2, 5, 6, 3, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    assert _compiled_layout.window_offsets(pattern, (5, 6), (5, 6)) is not None
    assert torch.autograd.gradcheck(lambda a, b, c: attn2d.attention2d(a, b, c, pattern=pattern),
                                    (q, k, v))
    offsets = _compiled_layout.window_offsets(pattern, (5, 6), (5, 6))
    q4, k4, v4 = (t.detach().flatten(2, 3) for t in (q, k, v))
    args = (q4, k4, v4, offsets, 5, 6, 0.5)
    torch.library.opcheck(torch.ops.attn2d.attention2d_window_forward.default, args)
    out, lse, _ = torch.ops.attn2d.attention2d_window_forward(*args)
    bwd_args = (torch.randn_like(out), q4, k4, v4, out, lse, offsets, 5, 6, 0.5)
    torch.library.opcheck(torch.ops.attn2d.attention2d_window_backward.default, bwd_args)


def test_raw_window_op_refuses_bad_offsets():
    pattern = Window(3)
    q, k, v = (torch.randn(1, 1, 36, 4) for _ in range(3))
    good = _compiled_layout.window_offsets(pattern, (6, 6), (6, 6))
    out, lse, _ = torch.ops.attn2d.attention2d_window_forward(q, k, v, good, 6, 6, 0.5)
    for bad, match in [(good.long(), "int32"), (good.t().contiguous(), r"\(2, count\)"),
                       (torch.tensor([[0, 0], [1, 1]], dtype=torch.int32), "distinct"),
                       (torch.tensor([[6], [0]], dtype=torch.int32), "smaller than the map")]:
        with pytest.raises(ValueError, match=match):
            torch.ops.attn2d.attention2d_window_forward(q, k, v, bad, 6, 6, 0.5)
        with pytest.raises(ValueError, match=match):
            torch.ops.attn2d.attention2d_window_backward(out, q, k, v, out, lse, bad, 6, 6, 0.5)
    with pytest.raises(ValueError, match="height"):
        torch.ops.attn2d.attention2d_window_forward(q, k, v, good, 6, 5, 0.5)
    with pytest.raises(ValueError, match="height"):
        torch.ops.attn2d.attention2d_window_backward(out, q, k, v, out, lse, good, 6, 5, 0.5)
    with pytest.raises(ValueError, match="lse"):
        torch.ops.attn2d.attention2d_window_backward(out, q, k, v, out, lse[..., :5], good, 6, 6,
                                                     0.5)


@pytest.mark.parametrize("pattern", [None, Window(5), Window(3, border="shift"), YLG(4)],
                         ids=["global", "window", "shift", "ylg"])
def test_scale_argument_scales_the_scores(pattern):
    torch.manual_seed(0)
    ylg = isinstance(pattern, YLG)
    heads, q_hw, kv_hw = (4, (8, 8), (4, 4)) if ylg else (2, (7, 9), (7, 9))
    q = torch.randn(1, heads, *q_hw, 6, dtype=torch.float64)
    k = torch.randn(1, heads, *kv_hw, 6, dtype=torch.float64)
    v = torch.randn(1, heads, *kv_hw, 5, dtype=torch.float64)
    mask = None if pattern is None else pattern.dense_mask(q_hw, kv_hw)
    for scale in (0.37, 2.5):
        out = attn2d.attention2d(q, k, v, pattern=pattern, scale=scale)
        expect = naive_attention(q.flatten(2, 3), k.flatten(2, 3), v.flatten(2, 3),
                                 attn_mask=mask, scale=scale).unflatten(2, q_hw)
        assert max_err(out, expect) < 1e-12
    default = attn2d.attention2d(q, k, v, pattern=pattern)
    assert max_err(default, attn2d.attention2d(q, k, v, pattern=pattern, scale=1.0 / math.sqrt(6))) == 0
    assert max_err(default, attn2d.attention2d(q, k, v, pattern=pattern, scale=0.37)) > 1e-3
