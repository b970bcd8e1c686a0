"""What a training step spends in attention, and the training stretches' peak memory.

AttentionTimer times every attention block's forward and backward inside the training steps,
so a run can say which share of its step time the attention takes (a variant whose attention
is a few percent of the step cannot gain much time from a sparse pattern). PeakMemory measures
the peak of the training stretches alone, leaving out the evaluations between them (which
generate thousands of images at once and would otherwise set the peak)."""

from __future__ import annotations

import re
import resource
import time
from typing import Callable, Iterable, Optional

import torch
from torch import nn


class AttentionTimer:
    """Seconds spent inside the given modules during a step, forward and backward.

    Forward: a pre-hook and a hook around the module's call. Backward: from the moment the
    gradient of the module's output is ready (a hook on the output) to the moment the gradient
    of its input is (a hook on the input); the autograd engine runs a module's backward nodes
    together, between those two moments. On CUDA the marks are CUDA events, read after the
    step's synchronize, so timing adds no synchronization; on the CPU they are readings of
    `clock` (the budget's clock: wall-clock perf_counter, or the process's CPU time).

    Only calls made while `active` count: evaluation and sample grids, which also run the
    generator, are not training. With create_graph (an R1 step), the penalty's second-order
    backward is not bracketed by these hooks, so the share is a lower bound on such steps."""

    def __init__(self, modules: Iterable[nn.Module], device: torch.device | str = "cpu",
                 clock: Callable[[], float] = time.perf_counter) -> None:
        modules = list(modules)
        if not callable(clock):
            raise TypeError(f"attn2d.gan.timing.AttentionTimer: clock must be callable; got "
                            f"{clock!r}")
        self.clock = clock
        if not all(isinstance(m, nn.Module) for m in modules):
            raise TypeError("attn2d.gan.timing.AttentionTimer: modules must be torch.nn.Module "
                            "instances")
        self.cuda = torch.device(device).type == "cuda"
        self.active = False
        self._forward_start: dict[int, object] = {}
        self._backward_start: dict[int, object] = {}
        self._intervals: list[tuple[object, object]] = []
        self._handles = []
        for m in modules:
            self._handles.append(m.register_forward_pre_hook(self._before_forward))
            self._handles.append(m.register_forward_hook(self._after_forward))

    def _mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return self.clock()

    def _before_forward(self, module: nn.Module, args) -> None:
        if not self.active:
            return
        self._forward_start[id(module)] = self._mark()
        x = args[0] if args else None
        if torch.is_grad_enabled() and isinstance(x, torch.Tensor) and x.requires_grad:
            key = id(module)
            x.register_hook(lambda grad: self._end_backward(key))

    def _after_forward(self, module: nn.Module, args, output) -> None:
        start = self._forward_start.pop(id(module), None)
        if not self.active or start is None:
            return
        self._intervals.append((start, self._mark()))
        if torch.is_grad_enabled() and isinstance(output, torch.Tensor) and output.requires_grad:
            key = id(module)
            output.register_hook(lambda grad: self._start_backward(key))

    def _start_backward(self, key: int) -> None:
        if self.active:
            self._backward_start[key] = self._mark()

    def _end_backward(self, key: int) -> None:
        start = self._backward_start.pop(key, None)
        if self.active and start is not None:
            self._intervals.append((start, self._mark()))

    def take(self) -> float:
        """The seconds recorded since the last take() (on CUDA, after the step's synchronize),
        and a fresh start; marks of a backward that never came are dropped."""
        if self.cuda:
            total = sum(a.elapsed_time(b) for a, b in self._intervals) / 1e3
        else:
            total = sum(b - a for a, b in self._intervals)
        self._intervals.clear()
        self._forward_start.clear()
        self._backward_start.clear()
        return float(total)

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


_HWM = re.compile(r"VmHWM:\s+(\d+)\s+kB")


class PeakMemory:
    """The peak of a stretch of work: on CUDA torch.cuda.max_memory_allocated, reset with
    reset_peak_memory_stats; on the CPU the resident set's high-water mark (VmHWM), reset by
    writing 5 to /proc/self/clear_refs. Where that reset is refused, the CPU peak is the
    process's peak so far (`resettable` says which)."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.kind = "cuda" if self.device.type == "cuda" else "rss"
        self.resettable = True
        self._before_resets = 0
        self.reset()

    def reset(self) -> None:
        # The process's own peak must survive the reset: it is what a whole run reports.
        self._before_resets = max(self._before_resets, self.read())
        if self.kind == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            self.resettable = False

    def read(self) -> int:
        if self.kind == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        try:
            with open("/proc/self/status") as f:
                found = _HWM.search(f.read())
        except OSError:
            found = None
        if found is not None:
            return int(found.group(1)) * 1024
        self.resettable = False
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


    def process_peak(self) -> int:
        """The peak since the process (on CUDA, the last reset_peak_memory_stats before this
        object) started, whatever the resets in between."""
        return max(self._before_resets, self.read())


def median(values: Iterable[float]) -> Optional[float]:
    """The median (the mean of the middle two for an even count), or None for no values."""
    v = sorted(float(x) for x in values)
    if not v:
        return None
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2
