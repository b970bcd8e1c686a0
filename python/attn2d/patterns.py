"""Which keys each query pixel may attend to: 2-D local windows and YLG's sparse ESA patterns.

A pattern maps a query grid (Hq, Wq) and a key grid (Hk, Wk) to a boolean (heads, Hq*Wq, Hk*Wk)
relation; dense_mask() materialises it, for inspection and tests. Query pixel (i, j) is centred
at key pixel (floor(i*Hk/Hq), floor(j*Wk/Wq)): with 2x2-pooled keys (SAGAN, BigGAN, YLG) four
query pixels share a centre.

The classes here hold a pattern's options and check their types; the torch-free core
(include/attn2d/patterns.h) checks them against the grids, builds dense masks and compiles the
layouts the kernels read, for Python and C++ callers alike."""

from __future__ import annotations

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


def _check_int_heads(heads: object) -> int:
    """heads as an int for the core, which checks its value against the pattern's."""
    if isinstance(heads, bool) or not isinstance(heads, int):
        raise ValueError(f"attn2d.patterns: heads must be an int; got {heads!r}")
    return heads


def _core():
    """The core's pattern operators (binding/torch_patterns.cc)."""
    from . import _ops  # noqa: F401  (loads the binding)

    return torch.ops.attn2d


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

    def _options(self) -> tuple:
        return self.size, self.metric, self.dilation, self.border

    def check(self, q_hw: tuple[int, int], kv_hw: tuple[int, int], heads: int) -> None:
        """The window must fit the key map. "clip": its span dilation*(size-1) must be smaller
        than the longer side (a 1xN map clips the window's rows). "shift": every residue class
        of both sides must hold `size` positions, dilation*size <= the shorter side (NATTEN's
        rule)."""
        heads = _check_heads(heads)
        q_hw, kv_hw = _check_grid("q_hw", q_hw), _check_grid("kv_hw", kv_hw)
        _core().check_window(*self._options(), q_hw, kv_hw, heads)

    def dense_mask(self, q_hw, kv_hw, heads: int = 1) -> torch.Tensor:
        heads = _check_heads(heads)
        q_hw, kv_hw = _check_grid("q_hw", q_hw), _check_grid("kv_hw", kv_hw)
        return _core().window_dense_mask(*self._options(), q_hw, kv_hw, heads)

    def _compile(self, q_hw, kv_hw, heads: int) -> list[torch.Tensor]:
        return _core().compile_window(*self._options(), q_hw, kv_hw, heads)

    def _window_offsets(self, q_hw, kv_hw, on_grid_only: bool) -> Optional[torch.Tensor]:
        return _core().window_offsets(*self._options(), q_hw, kv_hw, on_grid_only)


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
        q_hw, kv_hw = _check_grid("q_hw", q_hw), _check_grid("kv_hw", kv_hw)
        _core().check_ylg(list(self.patterns), self.mapping, q_hw, kv_hw, _check_int_heads(heads))

    def dense_mask(self, q_hw, kv_hw, heads: Optional[int] = None) -> torch.Tensor:
        heads = self.heads if heads is None else _check_int_heads(heads)
        q_hw, kv_hw = _check_grid("q_hw", q_hw), _check_grid("kv_hw", kv_hw)
        return _core().ylg_dense_mask(list(self.patterns), self.mapping, q_hw, kv_hw, heads)

    def _compile(self, q_hw, kv_hw, heads: int) -> list[torch.Tensor]:
        return _core().compile_ylg(list(self.patterns), self.mapping, q_hw, kv_hw, heads)

    def _window_offsets(self, q_hw, kv_hw, on_grid_only: bool) -> Optional[torch.Tensor]:
        return None


def from_spec(spec: dict):
    """The pattern a to_spec() dict describes."""
    spec = dict(spec)
    kind = spec.pop("kind", None)
    if kind == "window":
        return Window(**spec)
    if kind == "ylg":
        return YLG(None, **spec)
    raise ValueError(f"attn2d.patterns: unknown pattern spec kind {kind!r}")
