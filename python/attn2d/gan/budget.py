"""Fixed compute budgets for `attn2d train-gan --budget-minutes`.

A budget is minutes of training time: the sum of the training steps' durations, so evaluation,
sample grids and checkpoints do not eat into it (their time is measured and reported on its
own). Evaluations run at fixed fractions of the budget, each once, in order. BudgetState holds
that bookkeeping and travels in the checkpoint, so a budget spread over several invocations
(`--pause-after-minutes`, then `--resume`) keeps its clock, never repeats an evaluation, and
records each invocation as a sitting."""

from __future__ import annotations

import math
from typing import Optional, Sequence

# Every 10% of the budget.
DEFAULT_FRACTIONS = tuple(i / 10 for i in range(1, 11))
# Step-based schedules (progressive, mixed) advance with the budget's fraction, in millionths:
# the stages split the training time, not a step count that a time budget cannot know ahead.
SCHEDULE_UNITS = 1_000_000
# Float sums of step times may land a hair short of f * budget on the step that reaches it.
_SLACK = 1e-9


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_minutes(name: str, value: object) -> float:
    """A positive, finite number of minutes; the ValueError names the argument."""
    if not _is_number(value):
        raise TypeError(f"attn2d train-gan: {name} must be a number of minutes; got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"attn2d train-gan: {name} must be a positive number of minutes; got "
                         f"{value!r}")
    return float(value)


def check_fractions(value: object, name: str = "eval_fractions") -> tuple[float, ...]:
    """Fractions of the budget: a non-empty, strictly increasing sequence in (0, 1]."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"attn2d train-gan: {name} must be a sequence of numbers; got {value!r}")
    fractions = tuple(value)
    if not fractions:
        raise ValueError(f"attn2d train-gan: {name} is empty; give at least one fraction in "
                         "(0, 1]")
    for f in fractions:
        if not _is_number(f):
            raise TypeError(f"attn2d train-gan: {name} must hold numbers; got {f!r}")
        if not (math.isfinite(f) and 0 < f <= 1):
            raise ValueError(f"attn2d train-gan: {name} must lie in (0, 1]; got {f!r} in "
                             f"{fractions}")
    if any(b <= a for a, b in zip(fractions, fractions[1:])):
        raise ValueError(f"attn2d train-gan: {name} must be strictly increasing (sorted, no "
                         f"repeats); got {fractions}")
    return tuple(float(f) for f in fractions)


def _parse_list(text: str, name: str, convert, what: str) -> tuple:
    """'a,b,...' -> (convert(a), convert(b), ...), blanks skipped."""
    if not isinstance(text, str):
        raise TypeError(f"attn2d train-gan: {name} must be a string; got {text!r}")
    try:
        return tuple(convert(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise ValueError(f"attn2d train-gan: {name} must be comma-separated {what}; got "
                         f"{text!r}") from None


def parse_fractions(text: str, name: str = "--eval-fractions") -> tuple[float, ...]:
    """'0.1,0.2,...' -> checked fractions."""
    return check_fractions(_parse_list(text, name, float, "numbers"), name)


def parse_seeds(text: str, name: str = "--seeds") -> tuple[int, ...]:
    """'0,1' -> (0, 1): distinct ints >= 0."""
    seeds = _parse_list(text, name, int, "ints")
    if not seeds:
        raise ValueError(f"attn2d train-gan: {name} is empty")
    if any(s < 0 for s in seeds):
        raise ValueError(f"attn2d train-gan: {name} must be ints >= 0; got {text!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"attn2d train-gan: {name} repeats a seed; got {text!r}")
    return seeds


class BudgetState:
    """A budget's clock and its evaluations: which fractions are done, each with its metrics,
    training seconds and steps; the attention time and step time of each interval between
    evaluations; the invocations (sittings) that made up the run; the peak memory of training
    and of evaluation, apart."""

    def __init__(self, budget_seconds: float, fractions: Sequence[float]) -> None:
        if not (_is_number(budget_seconds) and math.isfinite(budget_seconds)
                and budget_seconds > 0):
            raise ValueError(f"attn2d train-gan: budget_seconds must be a positive number; got "
                             f"{budget_seconds!r}")
        self.budget_seconds = float(budget_seconds)
        self.fractions = check_fractions(fractions)
        self.evals: list[dict] = []
        self.sittings: list[dict] = []
        self.attention_seconds = 0.0
        self.eval_seconds = 0.0
        self.train_peak_bytes = 0
        self.eval_peak_bytes = 0
        # Since the last evaluation: for each evaluation's own share and step time.
        self.interval_train_seconds = 0.0
        self.interval_attention_seconds = 0.0
        self.interval_step_times: list[float] = []

    # -- the clock ------------------------------------------------------------------------
    def done(self, elapsed: float) -> bool:
        return elapsed >= self.budget_seconds * (1 - _SLACK)

    def due(self, elapsed: float) -> list[float]:
        """The fractions not yet evaluated whose time has come, in order."""
        todo = self.fractions[len(self.evals):]
        return [f for f in todo if elapsed >= f * self.budget_seconds * (1 - _SLACK)]

    def position(self, elapsed: float) -> int:
        """The budget's fraction in SCHEDULE_UNITS, for step-based schedules."""
        # Rounded, so a step that ends exactly on a stage boundary (2/3 is no binary
        # fraction) starts the next stage, as a step count would.
        return min(SCHEDULE_UNITS, round(elapsed / self.budget_seconds * SCHEDULE_UNITS))

    def add_step(self, seconds: float, attention_seconds: float) -> None:
        self.attention_seconds += attention_seconds
        self.interval_train_seconds += seconds
        self.interval_attention_seconds += attention_seconds
        self.interval_step_times.append(seconds)

    # -- evaluations ----------------------------------------------------------------------
    def record_eval(self, fraction: float, elapsed: float, step: int, metrics: dict,
                    eval_seconds: float, pattern: str) -> dict:
        from .timing import median

        expected = self.fractions[len(self.evals)]
        if fraction != expected:
            raise RuntimeError(f"attn2d train-gan: evaluation at fraction {fraction} out of "
                               f"order (next is {expected})")
        share = (self.interval_attention_seconds / self.interval_train_seconds
                 if self.interval_train_seconds > 0 else None)
        record = {"fraction": fraction, "train_seconds": elapsed, "steps": step,
                  "metrics": metrics, "eval_seconds": eval_seconds, "pattern": pattern,
                  "attention_share": share,
                  "seconds_per_step": median(self.interval_step_times),
                  "sitting": len(self.sittings) - 1}
        self.evals.append(record)
        self.eval_seconds += eval_seconds
        if self.sittings:
            self.sittings[-1]["eval_seconds"] += eval_seconds
        self.interval_train_seconds = 0.0
        self.interval_attention_seconds = 0.0
        self.interval_step_times = []
        return record

    def share_evaluation(self, fraction: float, elapsed: float, step: int) -> dict:
        """A second fraction reached by the same step: the same model, so the same metrics,
        recorded without evaluating again."""
        last = self.evals[-1]
        return self.record_eval(fraction, elapsed, step, last["metrics"], 0.0, last["pattern"])

    # -- sittings -------------------------------------------------------------------------
    def start_sitting(self, step: int, elapsed: float, resumed: bool, started: str,
                      machine: Optional[dict] = None) -> None:
        """machine: what the step times depend on (threads, CPUs, device), so a report can
        tell a budget spent on two different machines."""
        self.sittings.append({"index": len(self.sittings), "resumed": resumed,
                              "started": started, "machine": machine or {},
                              "start_step": step, "end_step": step,
                              "start_train_seconds": elapsed, "end_train_seconds": elapsed,
                              "wall_seconds": 0.0, "eval_seconds": 0.0, "stopped": "running"})

    def update_sitting(self, step: int, elapsed: float, wall_seconds: float,
                       stopped: Optional[str] = None) -> None:
        s = self.sittings[-1]
        s["end_step"], s["end_train_seconds"], s["wall_seconds"] = step, elapsed, wall_seconds
        if stopped is not None:
            s["stopped"] = stopped

    # -- persistence ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"budget_seconds": self.budget_seconds, "fractions": list(self.fractions),
                "evals": self.evals, "sittings": self.sittings,
                "attention_seconds": self.attention_seconds, "eval_seconds": self.eval_seconds,
                "train_peak_bytes": self.train_peak_bytes,
                "eval_peak_bytes": self.eval_peak_bytes,
                "interval_train_seconds": self.interval_train_seconds,
                "interval_attention_seconds": self.interval_attention_seconds,
                "interval_step_times": self.interval_step_times}

    def load_state_dict(self, state: dict) -> None:
        """Continue a checkpointed budget; the budget and fractions must be the same ones."""
        if state.get("budget_seconds") != self.budget_seconds:
            raise ValueError(
                f"attn2d train-gan: --budget-minutes {self.budget_seconds / 60:g} differs from "
                f"the checkpoint's {state.get('budget_seconds', 0) / 60:g}; resume with the "
                "same budget")
        if tuple(state.get("fractions", ())) != self.fractions:
            raise ValueError(
                f"attn2d train-gan: --eval-fractions {list(self.fractions)} differ from the "
                f"checkpoint's {state.get('fractions')}; resume with the same fractions")
        self.evals = list(state["evals"])
        self.sittings = list(state["sittings"])
        for name in ("attention_seconds", "eval_seconds", "interval_train_seconds",
                     "interval_attention_seconds"):
            setattr(self, name, float(state[name]))
        self.train_peak_bytes = int(state["train_peak_bytes"])
        self.eval_peak_bytes = int(state["eval_peak_bytes"])
        self.interval_step_times = list(state["interval_step_times"])
