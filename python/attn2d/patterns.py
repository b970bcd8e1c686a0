"""Which keys each query may attend to: 2-D local windows and YLG's sparse ESA patterns on pixel
grids; 1-D windows, BigBird's random blocks and a user's block mask on token sequences; and
unions and intersections of any of them (``a | b``, ``a & b``).

A pattern maps a query grid (Hq, Wq) and a key grid (Hk, Wk) to a boolean (heads, Hq*Wq, Hk*Wk)
relation; dense_mask() materialises it, for inspection and tests. Query pixel (i, j) is centred
at key pixel (floor(i*Hk/Hq), floor(j*Wk/Wq)): with 2x2-pooled keys (SAGAN, BigGAN, YLG) four
query pixels share a centre. The sequence patterns read the grids in raster order (a sequence of
L tokens is a 1 x L grid; attn2d.attention takes them on (B, H, L, E) tensors), query i centred
at key floor(i*Lk/Lq).

The classes here hold a pattern's options and check their types; the torch-free core
(include/attn2d/patterns.h) checks them against the grids, builds dense masks and compiles the
layouts the kernels read, for Python and C++ callers alike."""

from __future__ import annotations

import abc
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


def _check_int(cls: str, name: str, value: object, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"attn2d.patterns.{cls}: {name} must be an int; got {value!r}")
    if value < least:
        raise ValueError(f"attn2d.patterns.{cls}: {name} must be >= {least}; got {value}")
    return value


class Pattern(abc.ABC):
    """What every pattern has: check, dense_mask and the compiled layout, all from the core
    (include/attn2d/pattern.h), and ``|`` (union) and ``&`` (intersection)."""

    @abc.abstractmethod
    def _spec(self, masks: list) -> str:
        """The pattern as binding/torch_patterns.cc parses it; block masks go into `masks`."""

    def _core_args(self) -> tuple[str, list]:
        masks: list = []
        return self._spec(masks), masks

    def check(self, q_hw, kv_hw, heads: int) -> None:
        """Raises ValueError unless the pattern applies to these grids and heads."""
        heads = _check_heads(heads)
        q_hw, kv_hw = _check_grid("q_hw", q_hw), _check_grid("kv_hw", kv_hw)
        _core().check_pattern(*self._core_args(), q_hw, kv_hw, heads)

    def dense_mask(self, q_hw, kv_hw, heads: int = 1) -> torch.Tensor:
        """(heads, Hq*Wq, Hk*Wk) bool: may each query see each key. As large as the attention
        matrix: for inspection and tests."""
        heads = _check_heads(heads)
        q_hw, kv_hw = _check_grid("q_hw", q_hw), _check_grid("kv_hw", kv_hw)
        return _core().pattern_dense_mask(*self._core_args(), q_hw, kv_hw, heads)

    def allowed_pairs(self, q_hw, kv_hw, heads: int = 1) -> int:
        """(query, key) pairs the pattern allows, summed over the heads, counted on its compiled
        layout (cached, as attention builds it) rather than a dense mask."""
        from . import _compiled_layout

        self.check(q_hw, kv_hw, heads)
        layout = _compiled_layout.build(self, tuple(q_hw), tuple(kv_hw), heads)
        return _compiled_layout.allowed_pairs(layout)

    def _compile(self, q_hw, kv_hw, heads: int) -> list[torch.Tensor]:
        return _core().compile_pattern(*self._core_args(), q_hw, kv_hw, heads)

    def _window_offsets(self, q_hw, kv_hw, on_grid_only: bool) -> Optional[torch.Tensor]:
        return None

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._key()))

    def _key(self):
        return repr(self)

    def __or__(self, other: "Pattern") -> "Union":
        return Union(self, other)

    def __and__(self, other: "Pattern") -> "Intersection":
        return Intersection(self, other)


class Window(Pattern):
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

    def to_spec(self) -> dict:
        """A JSON-able description; from_spec() rebuilds the pattern."""
        return {"kind": "window", "size": self.size, "metric": self.metric,
                "dilation": self.dilation, "border": self.border}

    def _spec(self, masks: list) -> str:
        return f"window({self.size},{self.metric},{self.dilation},{self.border})"

    def check(self, q_hw: tuple[int, int], kv_hw: tuple[int, int], heads: int) -> None:
        """The window must fit the key map. "clip": its span dilation*(size-1) must be smaller
        than the longer side (a 1xN map clips the window's rows). "shift": every residue class
        of both sides must hold `size` positions, dilation*size <= the shorter side (NATTEN's
        rule)."""
        super().check(q_hw, kv_hw, heads)

    def _window_offsets(self, q_hw, kv_hw, on_grid_only: bool) -> Optional[torch.Tensor]:
        return _core().window_offsets(self.size, self.metric, self.dilation, self.border, q_hw,
                                      kv_hw, on_grid_only)


class YLG(Pattern):
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

    def to_spec(self) -> dict:
        return {"kind": "ylg", "patterns": list(self.patterns), "mapping": self.mapping}

    def _spec(self, masks: list) -> str:
        return f"ylg({self.mapping},{','.join(self.patterns)})"

    def check(self, q_hw, kv_hw, heads: int) -> None:
        q_hw, kv_hw = _check_grid("q_hw", q_hw), _check_grid("kv_hw", kv_hw)
        _core().check_pattern(*self._core_args(), q_hw, kv_hw, _check_int_heads(heads))

    def dense_mask(self, q_hw, kv_hw, heads: Optional[int] = None) -> torch.Tensor:
        heads = self.heads if heads is None else _check_int_heads(heads)
        q_hw, kv_hw = _check_grid("q_hw", q_hw), _check_grid("kv_hw", kv_hw)
        return _core().pattern_dense_mask(*self._core_args(), q_hw, kv_hw, heads)


class Window1D(Pattern):
    """A window over a sequence: query i sees keys c + dilation*o around its centre c, o from
    -(size//2) to size-1-size//2, or with causal=True from -(size-1) to 0 (the centre and the
    keys before it). Keys outside the sequence are dropped; dilation*(size-1) must be smaller
    than the number of keys."""

    def __init__(self, size: int, dilation: int = 1, causal: bool = False) -> None:
        self.size = _check_int("Window1D", "size", size, 1)
        self.dilation = _check_int("Window1D", "dilation", dilation, 1)
        if not isinstance(causal, bool):
            raise TypeError(f"attn2d.patterns.Window1D: causal must be a bool; got {causal!r}")
        self.causal = causal

    def __repr__(self) -> str:
        return f"Window1D(size={self.size}, dilation={self.dilation}, causal={self.causal})"

    def to_spec(self) -> dict:
        return {"kind": "window1d", "size": self.size, "dilation": self.dilation,
                "causal": self.causal}

    def _spec(self, masks: list) -> str:
        return f"window1d({self.size},{self.dilation},{int(self.causal)})"


class Random(Pattern):
    """BigBird's random attention on blocks of `block` tokens: each query block sees its own
    key block and `blocks_per_row` other key blocks drawn from a seeded generator (the same
    blocks for the same seed on every run and platform; include/attn2d/sequence_patterns.h);
    every query sees the first `global_tokens` keys and the first `global_tokens` queries see
    every key. Every head sees the same blocks."""

    def __init__(self, blocks_per_row: int = 1, block: int = 64, seed: int = 0,
                 global_tokens: int = 0) -> None:
        self.blocks_per_row = _check_int("Random", "blocks_per_row", blocks_per_row, 0)
        self.block = _check_int("Random", "block", block, 1)
        self.seed = _check_int("Random", "seed", seed, 0)
        if self.seed >= 2**63:
            raise ValueError(f"attn2d.patterns.Random: seed must be below 2**63; got {seed}")
        self.global_tokens = _check_int("Random", "global_tokens", global_tokens, 0)

    def __repr__(self) -> str:
        return (f"Random(blocks_per_row={self.blocks_per_row}, block={self.block}, "
                f"seed={self.seed}, global_tokens={self.global_tokens})")

    def to_spec(self) -> dict:
        return {"kind": "random", "blocks_per_row": self.blocks_per_row, "block": self.block,
                "seed": self.seed, "global_tokens": self.global_tokens}

    def _spec(self, masks: list) -> str:
        return f"random({self.blocks_per_row},{self.block},{self.seed},{self.global_tokens})"


class BlockMask(Pattern):
    """A user's block layout: query i sees key j when mask[i // block_q, j // block_k] is True.
    mask: a bool tensor (ceil(Lq/block_q), ceil(Lk/block_k)), or with a leading heads dimension
    for one layout per head. block: an int, or (block_q, block_k)."""

    def __init__(self, mask: torch.Tensor, block=64) -> None:
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"attn2d.patterns.BlockMask: mask must be a bool tensor; got "
                            f"{type(mask).__name__}")
        if mask.dtype != torch.bool:
            raise TypeError(f"attn2d.patterns.BlockMask: mask must be a bool tensor; got "
                            f"{mask.dtype}")
        if mask.dim() not in (2, 3) or mask.numel() == 0:
            raise ValueError("attn2d.patterns.BlockMask: mask must be a non-empty (query blocks, "
                             "key blocks) or (heads, query blocks, key blocks) tensor; got shape "
                             f"{tuple(mask.shape)}")
        pair = block if isinstance(block, (tuple, list)) else (block, block)
        if len(pair) != 2:
            raise ValueError(
                f"attn2d.patterns.BlockMask: block must be an int or a pair; got {block!r}")
        self.block_q = _check_int("BlockMask", "block", pair[0], 1)
        self.block_k = _check_int("BlockMask", "block", pair[1], 1)
        self.mask = mask.detach().to("cpu", copy=True).contiguous()

    def __repr__(self) -> str:
        return (f"BlockMask(mask of shape {tuple(self.mask.shape)}, "
                f"block=({self.block_q}, {self.block_k}))")

    def _key(self):
        return (tuple(self.mask.shape), self.block_q, self.block_k,
                self.mask.flatten().numpy().tobytes())

    def to_spec(self) -> dict:
        return {"kind": "blockmask", "mask": self.mask.tolist(),
                "block": [self.block_q, self.block_k]}

    def _spec(self, masks: list) -> str:
        masks.append(self.mask)
        return f"blockmask({len(masks) - 1},{self.block_q},{self.block_k})"


class _Combination(Pattern):
    _name = ""

    def __init__(self, *parts: Pattern) -> None:
        if not parts:
            raise ValueError(f"attn2d.patterns.{self._name}: needs at least one pattern")
        for p in parts:
            if not isinstance(p, Pattern):
                raise TypeError(f"attn2d.patterns.{self._name}: parts must be patterns; got "
                                f"{type(p).__name__}")
        self.parts = tuple(parts)

    @property
    def heads(self) -> Optional[int]:
        """The heads a part fixes (YLG), else None."""
        return next((p.heads for p in self.parts if getattr(p, "heads", None)), None)

    def __repr__(self) -> str:
        return f"{self._name}({', '.join(repr(p) for p in self.parts)})"

    def _key(self):
        return tuple((type(p).__name__, p._key()) for p in self.parts)

    def to_spec(self) -> dict:
        return {"kind": self._name.lower(), "parts": [p.to_spec() for p in self.parts]}

    def _spec(self, masks: list) -> str:
        return f"{self._name.lower()}({','.join(p._spec(masks) for p in self.parts)})"


class Union(_Combination):
    """Query i may see key j when any part allows it."""

    _name = "Union"


class Intersection(_Combination):
    """Query i may see key j when every part allows it."""

    _name = "Intersection"


def from_spec(spec: dict):
    """The pattern a to_spec() dict describes."""
    spec = dict(spec)
    kind = spec.pop("kind", None)
    if kind == "window":
        return Window(**spec)
    if kind == "ylg":
        return YLG(None, **spec)
    if kind == "window1d":
        return Window1D(**spec)
    if kind == "random":
        return Random(**spec)
    if kind == "blockmask":
        return BlockMask(torch.tensor(spec["mask"], dtype=torch.bool), tuple(spec["block"]))
    if kind in ("union", "intersection"):
        parts = [from_spec(p) for p in spec["parts"]]
        return Union(*parts) if kind == "union" else Intersection(*parts)
    raise ValueError(f"attn2d.patterns: unknown pattern spec kind {kind!r}")
