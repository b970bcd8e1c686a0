"""Which keys each query pixel may attend to: 2-D local windows and YLG's sparse ESA patterns.

A pattern maps a query grid (Hq, Wq) and a key grid (Hk, Wk) to a boolean (heads, Hq*Wq, Hk*Wk)
relation; dense_mask() materialises it, for inspection and tests. Query pixel (i, j) is centred
at key pixel (floor(i*Hk/Hq), floor(j*Wk/Wq)): with 2x2-pooled keys (SAGAN, BigGAN, YLG) four
query pixels share a centre."""

from __future__ import annotations

import functools
import math
from typing import Optional, Sequence

import torch

METRICS = ("chebyshev", "manhattan", "euclidean")
BORDERS = ("clip", "shift")
YLG_PATTERNS = ("rtl-floor", "rtl-repetitive", "ltr-floor", "ltr-repetitive")


def _check_grid(name: str, hw: object) -> tuple[int, int]:
    if (not isinstance(hw, (tuple, list)) or len(hw) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in hw)):
        raise TypeError(f"attn2d.patterns: {name} must be a pair of ints (H, W); got {hw!r}")
    if hw[0] < 1 or hw[1] < 1:
        raise ValueError(f"attn2d.patterns: {name} must be at least 1x1; got {tuple(hw)}")
    return int(hw[0]), int(hw[1])


def _check_heads(heads: object) -> int:
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
        raise ValueError(f"attn2d.patterns: heads must be an int >= 1; got {heads!r}")
    return heads


def key_centres(q_hw: tuple[int, int], kv_hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column of the key pixel each query pixel is centred at, (Hq*Wq,) each."""
    (hq, wq), (hk, wk) = q_hw, kv_hw
    rows = (torch.arange(hq) * hk) // hq
    cols = (torch.arange(wq) * wk) // wq
    return rows.repeat_interleave(wq), cols.repeat(hq)


class Window:
    """A local window around each query's centre on the key grid.

    chebyshev: a size x size square (offsets -(size//2) .. size-1-size//2 per axis, so an even
    size has one more cell before the centre than after); manhattan: |di| + |dj| <= size//2 (a
    diamond); euclidean: di^2 + dj^2 <= (size//2)^2 (a disk). Offsets are in steps of
    `dilation` key pixels. border "clip" drops keys outside the map; "shift" (chebyshev only)
    moves the window inside the map, as NATTEN does, so every query sees size*size keys (with
    dilation, within the query's residue class).
    """

    def __init__(self, size: int, metric: str = "chebyshev", dilation: int = 1,
                 border: str = "clip") -> None:
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(f"attn2d.patterns.Window: size must be an int; got {size!r}")
        if size < 1:
            raise ValueError(f"attn2d.patterns.Window: size must be >= 1; got {size}")
        if isinstance(dilation, bool) or not isinstance(dilation, int) or dilation < 1:
            raise ValueError(f"attn2d.patterns.Window: dilation must be an int >= 1; got {dilation!r}")
        if metric not in METRICS:
            raise ValueError(f"attn2d.patterns.Window: metric must be one of {METRICS}; got {metric!r}")
        if border not in BORDERS:
            raise ValueError(f"attn2d.patterns.Window: border must be one of {BORDERS}; got {border!r}")
        if border == "shift" and metric != "chebyshev":
            raise ValueError(
                f"attn2d.patterns.Window: border='shift' needs metric='chebyshev' (a shifted "
                f"{metric} window is not defined); got metric={metric!r}"
            )
        self.size, self.metric, self.dilation, self.border = size, metric, dilation, border

    def __repr__(self) -> str:
        return (f"Window(size={self.size}, metric={self.metric!r}, dilation={self.dilation}, "
                f"border={self.border!r})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Window) and repr(self) == repr(other)

    def to_spec(self) -> dict:
        """A JSON-able description; from_spec() rebuilds the pattern."""
        return {"kind": "window", "size": self.size, "metric": self.metric,
                "dilation": self.dilation, "border": self.border}

    def __hash__(self) -> int:
        return hash(repr(self))

    def check(self, q_hw: tuple[int, int], kv_hw: tuple[int, int], heads: int) -> None:
        """The window must fit the key map. "clip": its span dilation*(size-1) must be smaller
        than the longer side (a 1xN map clips the window's rows). "shift": every residue class
        of both sides must hold `size` positions, dilation*size <= the shorter side (NATTEN's
        rule)."""
        _check_heads(heads)
        _check_grid("q_hw", q_hw)
        hk, wk = _check_grid("kv_hw", kv_hw)
        d, k = self.dilation, self.size
        if self.border == "shift" and d * k > min(hk, wk):
            raise ValueError(
                f"attn2d.patterns.Window: border='shift' needs dilation*size = {d * k} <= both "
                f"sides of the key map ({hk}x{wk}); got size={k}, dilation={d}"
            )
        if self.border == "clip" and d * (k - 1) >= max(hk, wk):
            raise ValueError(
                f"attn2d.patterns.Window: dilation*(size-1) = {d * (k - 1)} must be smaller than "
                f"the key map's longer side ({hk}x{wk}); got size={k}, dilation={d}"
            )

    def offsets(self) -> list[tuple[int, int]]:
        """(di, dj) in dilation steps, for clip."""
        lo = -(self.size // 2)
        r = self.size // 2
        out = []
        for di in range(lo, lo + self.size):
            for dj in range(lo, lo + self.size):
                if self.metric == "manhattan" and abs(di) + abs(dj) > r:
                    continue
                if self.metric == "euclidean" and di * di + dj * dj > r * r:
                    continue
                out.append((di, dj))
        return out

    def _shifted_starts(self, centre: torch.Tensor, length: int) -> torch.Tensor:
        """First window position (in key pixels) along one axis for border="shift"."""
        d = self.dilation
        group = centre % d
        count = (length - group + d - 1) // d  # positions in the centre's residue class
        t = (centre - group) // d + (-(self.size // 2))
        t = torch.minimum(torch.clamp(t, min=0), count - self.size)
        return group + d * t

    def allowed_rows(self, q_hw, kv_hw, query_rows: torch.Tensor,
                     key_rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """(len(query_rows), len(key_rows)) bool: may each listed query (raster index) see each
        listed key (raster index, default: every key)."""
        (hk, wk) = kv_hw
        ci_all, cj_all = key_centres(q_hw, kv_hw)
        ci, cj = ci_all[query_rows], cj_all[query_rows]
        keys = torch.arange(hk * wk) if key_rows is None else key_rows
        kr, kc = keys // wk, keys % wk
        d, k = self.dilation, self.size
        if self.border == "shift":
            r0 = self._shifted_starts(ci, hk)[:, None]
            c0 = self._shifted_starts(cj, wk)[:, None]
            dr, dc = kr[None, :] - r0, kc[None, :] - c0
            return ((dr >= 0) & (dr <= d * (k - 1)) & (dr % d == 0)
                    & (dc >= 0) & (dc <= d * (k - 1)) & (dc % d == 0))
        dr, dc = kr[None, :] - ci[:, None], kc[None, :] - cj[:, None]
        di, dj = torch.div(dr, d, rounding_mode="floor"), torch.div(dc, d, rounding_mode="floor")
        lo, r = -(k // 2), k // 2
        ok = (dr % d == 0) & (dc % d == 0) & (di >= lo) & (di < lo + k) & (dj >= lo) & (dj < lo + k)
        if self.metric == "manhattan":
            ok &= di.abs() + dj.abs() <= r
        elif self.metric == "euclidean":
            ok &= di * di + dj * dj <= r * r
        return ok

    def dense_mask(self, q_hw, kv_hw, heads: int = 1) -> torch.Tensor:
        self.check(q_hw, kv_hw, heads)
        rows = self.allowed_rows(q_hw, kv_hw, torch.arange(q_hw[0] * q_hw[1]))
        return rows.unsqueeze(0).expand(heads, -1, -1).clone()


@functools.lru_cache(maxsize=16)
def manhattan_order(hw: tuple[int, int]) -> torch.Tensor:
    """YLG's Enumerate step: raster indices of the grid's cells ordered by Manhattan distance
    i + j from (0, 0), ties by smaller i. Returns rank[raster index] -> position (cached: do not
    modify it)."""
    h, w = hw
    cells = sorted(((i + j, i, i * w + j) for i in range(h) for j in range(w)))
    rank = torch.empty(h * w, dtype=torch.long)
    for pos, (_, _, raster) in enumerate(cells):
        rank[raster] = pos
    return rank


def ylg_allowed(kind: str, n: int, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """One of YLG's 1-D patterns over positions 0..n-1, stride l = floor(sqrt(n)):
    (len(rows), len(cols)) bool, [i, j] = may position rows[i] attend to position cols[j]."""
    l = max(int(math.isqrt(n)), 1)
    r, c = rows[:, None], cols[None, :]
    if kind == "ltr-floor":  # c in [r - r mod l, r]
        return (c <= r) & (c >= r - r % l)
    if kind == "rtl-floor":  # the transpose: c in r's block at or after r
        return (c >= r) & (r >= c - c % l)
    if kind == "ltr-repetitive":  # the last cell of every full block, and itself
        return ((c % l == l - 1) & (c < n)) | (c == r)
    if kind == "rtl-repetitive":  # the first cell of every full block, and itself
        return ((c % l == 0) & (c + l - 1 < n)) | (c == r)
    raise ValueError(f"attn2d.patterns.YLG: unknown pattern {kind!r}; choose from {YLG_PATTERNS}")


def ylg_1d(kind: str, n: int) -> torch.Tensor:
    """The (n, n) matrix of one 1-D pattern."""
    positions = torch.arange(n)
    return ylg_allowed(kind, n, positions, positions)


class YLG:
    """YLG's ESA patterns (Daras et al., CVPR 2020): Manhattan enumeration of the key grid,
    one 1-D sparse pattern per head shifted onto the grid through that order.

    patterns: one name per head from YLG_PATTERNS; default: the official code's order for
    `heads` heads (each pattern on heads/4 consecutive heads: rtl-floor, rtl-repetitive,
    ltr-floor, ltr-repetitive). mapping, for queries on a finer grid than the keys: "official"
    (query raster index r uses pattern row r mod n, as the published code tiles its mask) or
    "geometric" (the key cell the query is centred at)."""

    def __init__(self, heads: Optional[int] = 8, patterns: Optional[Sequence[str]] = None,
                 mapping: str = "official") -> None:
        if patterns is None:
            heads = _check_heads(heads)
            patterns = [YLG_PATTERNS[(h * 4) // heads] for h in range(heads)]
        else:
            patterns = list(patterns)
            for p in patterns:
                if p not in YLG_PATTERNS:
                    raise ValueError(f"attn2d.patterns.YLG: unknown pattern {p!r}; choose from {YLG_PATTERNS}")
            if heads is not None and heads != len(patterns):
                raise ValueError(f"attn2d.patterns.YLG: heads={heads} but {len(patterns)} patterns given")
        if not patterns:
            raise ValueError("attn2d.patterns.YLG: needs at least one head")
        if mapping not in ("official", "geometric"):
            raise ValueError(f"attn2d.patterns.YLG: mapping must be 'official' or 'geometric'; got {mapping!r}")
        self.patterns, self.mapping = tuple(patterns), mapping

    @property
    def heads(self) -> int:
        return len(self.patterns)

    def __repr__(self) -> str:
        return f"YLG(patterns={list(self.patterns)}, mapping={self.mapping!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, YLG) and repr(self) == repr(other)

    def to_spec(self) -> dict:
        return {"kind": "ylg", "patterns": list(self.patterns), "mapping": self.mapping}

    def __hash__(self) -> int:
        return hash(repr(self))

    def check(self, q_hw, kv_hw, heads: int) -> None:
        _check_grid("q_hw", q_hw)
        _check_grid("kv_hw", kv_hw)
        if heads != self.heads:
            raise ValueError(
                f"attn2d.patterns.YLG: the pattern has {self.heads} heads but the tensors have "
                f"{heads}"
            )

    @functools.lru_cache(maxsize=16)
    def query_positions(self, q_hw, kv_hw) -> torch.Tensor:
        """The pattern row (an enumeration position) each query pixel uses, (Hq*Wq,) (cached:
        do not modify it)."""
        (hq, wq), (hk, wk) = q_hw, kv_hw
        rank = manhattan_order((hk, wk))  # key raster -> enumeration position
        if self.mapping == "official":
            return rank[torch.arange(hq * wq) % (hk * wk)]
        ci, cj = key_centres((hq, wq), (hk, wk))
        return rank[ci * wk + cj]

    def allowed_rows(self, kind: str, q_hw, kv_hw, query_rows: torch.Tensor,
                     key_rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """(len(query_rows), len(key_rows)) bool for one head pattern `kind` (default keys:
        all)."""
        n = kv_hw[0] * kv_hw[1]
        rows = self.query_positions(q_hw, kv_hw)[query_rows]
        rank = manhattan_order(kv_hw)
        return ylg_allowed(kind, n, rows, rank if key_rows is None else rank[key_rows])

    def dense_mask(self, q_hw, kv_hw, heads: Optional[int] = None) -> torch.Tensor:
        heads = self.heads if heads is None else heads
        self.check(q_hw, kv_hw, heads)
        everyone = torch.arange(q_hw[0] * q_hw[1])
        return torch.stack([self.allowed_rows(k, q_hw, kv_hw, everyone) for k in self.patterns])


def from_spec(spec: dict):
    """The pattern a to_spec() dict describes."""
    spec = dict(spec)
    kind = spec.pop("kind", None)
    if kind == "window":
        return Window(**spec)
    if kind == "ylg":
        return YLG(None, **spec)
    raise ValueError(f"attn2d.patterns: unknown pattern spec kind {kind!r}")
