"""Pattern masks against independent constructions written here from their descriptions
(plain Python loops over pixels), and attention2d's global path against flattened attention."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import attn2d
from attn2d.patterns import YLG, Window
from reference import max_err, naive_attention


def centre(i, j, q_hw, kv_hw):
    return i * kv_hw[0] // q_hw[0], j * kv_hw[1] // q_hw[1]


def window_by_loops(w: Window, q_hw, kv_hw):
    """For every query pixel and key pixel, is the key in the window? From the definition."""
    (hq, wq), (hk, wk) = q_hw, kv_hw
    k, d = w.size, w.dilation
    r = k // 2
    lo = -(k // 2)
    out = torch.zeros(hq * wq, hk * wk, dtype=torch.bool)
    for i, j in itertools.product(range(hq), range(wq)):
        ci, cj = centre(i, j, q_hw, kv_hw)
        if w.border == "shift":
            # Along each axis: the `k` positions of ci's residue class nearest to the window
            # [ci + d*lo, ...], moved inside the map.
            def axis(c, length):
                cls = [p for p in range(length) if p % d == c % d]
                t = cls.index(c) + lo
                t = min(max(t, 0), len(cls) - k)
                return cls[t:t + k]
            rows, cols = axis(ci, hk), axis(cj, wk)
            for a, b in itertools.product(rows, cols):
                out[i * wq + j, a * wk + b] = True
            continue
        for di, dj in itertools.product(range(lo, lo + k), repeat=2):
            if w.metric == "manhattan" and abs(di) + abs(dj) > r:
                continue
            if w.metric == "euclidean" and math.hypot(di, dj) > r + 1e-9:
                continue
            a, b = ci + d * di, cj + d * dj
            if 0 <= a < hk and 0 <= b < wk:
                out[i * wq + j, a * wk + b] = True
    return out


GRIDS = [((7, 5), (7, 5)), ((11, 13), (11, 13)), ((1, 17), (1, 17)), ((10, 6), (5, 3)),
         ((9, 9), (4, 4))]


@pytest.mark.parametrize("grids", GRIDS, ids=lambda g: f"{g[0]}->{g[1]}")
@pytest.mark.parametrize("metric", ["chebyshev", "manhattan", "euclidean"])
@pytest.mark.parametrize("size,dilation", [(1, 1), (3, 1), (4, 1), (5, 2), (3, 3)])
def test_window_clip_matches_loops(grids, metric, size, dilation):
    q_hw, kv_hw = grids
    w = Window(size, metric, dilation)
    if dilation * (size - 1) >= max(kv_hw):
        with pytest.raises(ValueError, match="dilation"):
            w.dense_mask(q_hw, kv_hw)
        return
    got = w.dense_mask(q_hw, kv_hw, heads=2)
    assert got.shape == (2, q_hw[0] * q_hw[1], kv_hw[0] * kv_hw[1])
    assert torch.equal(got[0], window_by_loops(w, q_hw, kv_hw)) and torch.equal(got[0], got[1])


@pytest.mark.parametrize("grids", [((7, 5), (7, 5)), ((11, 13), (11, 13)), ((10, 6), (5, 3))],
                         ids=str)
@pytest.mark.parametrize("size,dilation", [(1, 1), (3, 1), (4, 1), (2, 2), (3, 1)])
def test_window_shift_matches_loops_and_sees_size_squared_keys(grids, size, dilation):
    q_hw, kv_hw = grids
    w = Window(size, "chebyshev", dilation, "shift")
    if dilation * size > min(kv_hw):
        with pytest.raises(ValueError, match="shift"):
            w.dense_mask(q_hw, kv_hw)
        return
    got = w.dense_mask(q_hw, kv_hw)[0]
    assert torch.equal(got, window_by_loops(w, q_hw, kv_hw))
    assert (got.sum(1) == size * size).all()


def test_window_as_large_as_the_map_is_global():
    assert Window(7).dense_mask((7, 7), (7, 7)).sum() < 49 * 49  # centred: clipped at borders
    assert Window(7, border="shift").dense_mask((7, 7), (7, 7)).all()


def ylg_by_loops(kind, q_hw, kv_hw, mapping):
    """ESA as described: enumerate key cells by (i + j, i), lay the 1-D pattern on that order,
    query row by raster index mod n (official) or by its centre cell (geometric)."""
    (hq, wq), (hk, wk) = q_hw, kv_hw
    n = hk * wk
    l = int(math.isqrt(n))
    order = sorted(((i, j) for i in range(hk) for j in range(wk)), key=lambda c: (c[0] + c[1], c[0]))
    pos = {cell: p for p, cell in enumerate(order)}

    def allowed(r, c):
        if kind == "ltr-floor":
            return r - r % l <= c <= r
        if kind == "rtl-floor":
            return c - c % l <= r <= c
        if kind == "ltr-repetitive":
            return c == r or c % l == l - 1
        return c == r or (c % l == 0 and c + l - 1 < n)

    out = torch.zeros(hq * wq, n, dtype=torch.bool)
    for qi in range(hq * wq):
        if mapping == "official":
            cell = divmod(qi % n, wk)
        else:
            cell = centre(qi // wq, qi % wq, q_hw, kv_hw)
        r = pos[cell]
        for c_cell, c in pos.items():
            if allowed(r, c):
                out[qi, c_cell[0] * wk + c_cell[1]] = True
    return out


@pytest.mark.parametrize("grids", [((4, 4), (4, 4)), ((6, 6), (6, 6)), ((5, 7), (5, 7)),
                                   ((8, 8), (4, 4)), ((10, 6), (5, 3))], ids=str)
@pytest.mark.parametrize("mapping", ["official", "geometric"])
def test_ylg_matches_the_esa_description(grids, mapping):
    q_hw, kv_hw = grids
    pattern = YLG(8, mapping=mapping)
    got = pattern.dense_mask(q_hw, kv_hw)
    assert pattern.patterns == ("rtl-floor", "rtl-floor", "rtl-repetitive", "rtl-repetitive",
                                "ltr-floor", "ltr-floor", "ltr-repetitive", "ltr-repetitive")
    for h, kind in enumerate(pattern.patterns):
        assert torch.equal(got[h], ylg_by_loops(kind, q_hw, kv_hw, mapping)), (h, kind)
    assert got.any(-1).all()  # every query sees at least its own cell's row


def test_ylg_custom_head_list_and_errors():
    p = YLG(None, patterns=["ltr-floor", "rtl-repetitive"])
    assert p.heads == 2 and p.dense_mask((4, 4), (4, 4)).shape == (2, 16, 16)
    with pytest.raises(ValueError, match="heads"):
        p.dense_mask((4, 4), (4, 4), heads=8)
    with pytest.raises(ValueError, match="unknown pattern"):
        YLG(None, patterns=["diagonal"])
    with pytest.raises(ValueError, match="mapping"):
        YLG(8, mapping="nearest")


@pytest.mark.parametrize("make,word", [
    (lambda: Window(0), "size"),
    (lambda: Window(3, metric="taxicab"), "metric"),
    (lambda: Window(3, metric="manhattan", border="shift"), "shift"),
    (lambda: Window(3, dilation=0), "dilation"),
    (lambda: Window(3, border="wrap"), "border"),
])
def test_bad_window_options(make, word):
    with pytest.raises(ValueError, match=word):
        make()


def test_window_larger_than_the_map_is_refused():
    with pytest.raises(ValueError, match="dilation"):
        Window(9).dense_mask((5, 5), (5, 5))
    with pytest.raises(ValueError, match="shift"):
        Window(6, border="shift").dense_mask((5, 5), (5, 5))


@pytest.mark.parametrize("grids", [((7, 9), (7, 9)), ((8, 6), (4, 3))], ids=str)
def test_attention2d_global_matches_flattened_attention(grids):
    (hq, wq), (hk, wk) = grids
    q = torch.randn(2, 3, hq, wq, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, hk, wk, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 3, hk, wk, 5, dtype=torch.float64, requires_grad=True)
    out = attn2d.attention2d(q, k, v)
    assert out.shape == (2, 3, hq, wq, 5)
    want = naive_attention(q.flatten(2, 3), k.flatten(2, 3), v.flatten(2, 3)).unflatten(2, (hq, wq))
    assert max_err(out, want) < 1e-12
    assert torch.autograd.gradcheck(lambda a, b, c: attn2d.attention2d(a, b, c), (q, k, v))


def test_attention2d_errors():
    q, k, v = torch.randn(1, 2, 4, 4, 8), torch.randn(1, 2, 4, 4, 8), torch.randn(1, 2, 4, 4, 8)
    with pytest.raises(ValueError, match="5-D"):
        attn2d.attention2d(q[0], k, v)
    with pytest.raises(ValueError, match="grid"):
        attn2d.attention2d(q, k, v[:, :, :3])
    with pytest.raises(ValueError, match="heads"):
        attn2d.attention2d(q, k, v, pattern=YLG(8))
    with pytest.raises(TypeError, match="pattern"):
        attn2d.attention2d(q, k, v, pattern="window")
