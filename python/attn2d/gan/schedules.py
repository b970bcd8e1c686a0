"""Attention schedules for GAN training (growing windows, windows raised on a plateau, local then
global), usable in any training loop.

A schedule answers `pattern(step)`: the pattern the attention blocks should use at that step
(None = global attention). Schedules that react to sample quality also take
`observe(step, value)` with a lower-is-better metric (FID, SWD). All of them save and restore
their state with state_dict / load_state_dict, so a resumed run continues where it stopped.

    sched = ProgressiveWindow(total_steps=30_000, sizes=(8, 16, 24))
    for step in range(start, total):
        for block in attention_blocks: block.set_pattern(sched.pattern(step))
        ...
"""

from __future__ import annotations

from typing import Sequence

from .. import patterns


def _check_sizes(name: str, sizes: Sequence[int]) -> tuple[int, ...]:
    sizes = tuple(sizes)
    if not sizes or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1
                            for s in sizes):
        raise ValueError(f"attn2d.gan.schedules.{name}: sizes must be ints >= 1; got {sizes!r}")
    if any(b < a for a, b in zip(sizes, sizes[1:])):
        raise ValueError(f"attn2d.gan.schedules.{name}: sizes must not decrease; got {sizes!r}")
    return sizes


def _check_steps(name: str, arg: str, value: int, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"attn2d.gan.schedules.{name}: {arg} must be an int >= {minimum}; got "
                         f"{value!r}")
    return value


class Schedule:
    """The interface: pattern(step) -> pattern or None; observe(step, value); state."""

    def pattern(self, step: int):
        raise NotImplementedError

    def observe(self, step: int, value: float) -> None:
        """A lower-is-better quality measurement at `step`; ignored by fixed schedules."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def window_sizes(self) -> tuple[int, ...]:
        """Every window size the schedule can return, to check them against a key grid."""
        return ()


class Constant(Schedule):
    """Always the same pattern (None = global): the schedule of a plain run."""

    def __init__(self, pattern=None) -> None:
        self._pattern = pattern

    def pattern(self, step: int):
        return self._pattern

    def window_sizes(self) -> tuple[int, ...]:
        return (self._pattern.size,) if isinstance(self._pattern, patterns.Window) else ()

    def __repr__(self) -> str:
        return f"Constant({self._pattern!r})"


class ProgressiveWindow(Schedule):
    """Window size grows in equal stages over training: by default 8 -> 16 -> 24 over thirds.

    Stage i covers steps [i*total/n, (i+1)*total/n); steps past total stay at the last size."""

    def __init__(self, total_steps: int, sizes: Sequence[int] = (8, 16, 24),
                 metric: str = "manhattan") -> None:
        self.total_steps = _check_steps("ProgressiveWindow", "total_steps", total_steps)
        self.sizes = _check_sizes("ProgressiveWindow", sizes)
        patterns.Window(self.sizes[0], metric=metric)  # validates the metric
        self.metric = metric

    def size(self, step: int) -> int:
        stage = max(0, step) * len(self.sizes) // self.total_steps
        return self.sizes[min(stage, len(self.sizes) - 1)]

    def pattern(self, step: int):
        return patterns.Window(self.size(step), metric=self.metric)

    def window_sizes(self) -> tuple[int, ...]:
        return self.sizes

    def __repr__(self) -> str:
        return (f"ProgressiveWindow(total_steps={self.total_steps}, sizes={self.sizes}, "
                f"metric={self.metric!r})")


class PlateauWindow(Schedule):
    """Raise the window to the next size when the quality metric stalls: after `patience`
    observations without improving on the best by more than `min_delta` (relative), move to
    the next size and start counting again. Past the last size, `then_global` switches to
    global attention."""

    def __init__(self, sizes: Sequence[int] = (8, 16, 24), patience: int = 2,
                 min_delta: float = 0.01, metric: str = "manhattan",
                 then_global: bool = False) -> None:
        self.sizes = _check_sizes("PlateauWindow", sizes)
        self.patience = _check_steps("PlateauWindow", "patience", patience)
        if not (isinstance(min_delta, (int, float)) and 0 <= min_delta < 1):
            raise ValueError(f"attn2d.gan.schedules.PlateauWindow: min_delta must be in [0, 1); "
                             f"got {min_delta!r}")
        patterns.Window(self.sizes[0], metric=metric)
        self.metric, self.min_delta, self.then_global = metric, float(min_delta), then_global
        self.stage, self.best, self.bad = 0, float("inf"), 0
        self.history: list[tuple[int, float, int]] = []

    def pattern(self, step: int):
        if self.stage >= len(self.sizes):
            return None
        return patterns.Window(self.sizes[self.stage], metric=self.metric)

    def observe(self, step: int, value: float) -> None:
        value = float(value)
        self.history.append((int(step), value, self.stage))
        if value < self.best * (1.0 - self.min_delta):
            self.best, self.bad = value, 0
            return
        self.bad += 1
        last = len(self.sizes) if self.then_global else len(self.sizes) - 1
        if self.bad >= self.patience and self.stage < last:
            self.stage += 1
            # A larger window changes the model; its first score is the new reference.
            self.best, self.bad = float("inf"), 0

    def state_dict(self) -> dict:
        return {"stage": self.stage, "best": self.best, "bad": self.bad,
                "history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        self.stage, self.best, self.bad = int(state["stage"]), float(state["best"]), int(state["bad"])
        self.history = [tuple(h) for h in state.get("history", [])]

    def window_sizes(self) -> tuple[int, ...]:
        return self.sizes

    def __repr__(self) -> str:
        return (f"PlateauWindow(sizes={self.sizes}, patience={self.patience}, "
                f"min_delta={self.min_delta}, metric={self.metric!r}, "
                f"then_global={self.then_global})")


class Mixed(Schedule):
    """Mixed local and global attention: a local pattern (or another schedule) for the first
    `local_fraction` of training, then global attention."""

    def __init__(self, total_steps: int, local=None, local_fraction: float = 0.5) -> None:
        self.total_steps = _check_steps("Mixed", "total_steps", total_steps)
        if not (isinstance(local_fraction, (int, float)) and 0 <= local_fraction <= 1):
            raise ValueError(f"attn2d.gan.schedules.Mixed: local_fraction must be in [0, 1]; got "
                             f"{local_fraction!r}")
        if local is None:
            local = patterns.Window(8, metric="manhattan")
        if not isinstance(local, Schedule):
            local = Constant(local)
        self.local, self.local_fraction = local, float(local_fraction)
        self.switch_step = int(round(self.total_steps * self.local_fraction))

    def pattern(self, step: int):
        return self.local.pattern(step) if step < self.switch_step else None

    def observe(self, step: int, value: float) -> None:
        if step < self.switch_step:
            self.local.observe(step, value)

    def state_dict(self) -> dict:
        return {"local": self.local.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.local.load_state_dict(state.get("local", {}))

    def window_sizes(self) -> tuple[int, ...]:
        return self.local.window_sizes()

    def __repr__(self) -> str:
        return (f"Mixed(total_steps={self.total_steps}, local={self.local!r}, "
                f"local_fraction={self.local_fraction})")
