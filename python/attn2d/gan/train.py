"""`attn2d train-gan`: SAGAN (global attention) against YLG-SAGAN (local sparse attention) and
the other schedules, trained on real images on the CPU or a CUDA GPU (device="cuda").

One variant trains in one process (`train_variant`), so its peak memory is its own (on CUDA,
torch.cuda.max_memory_allocated); the driver (`run`) starts one subprocess per variant and writes
the comparison report. Under torchrun every rank runs the variants in-process with
DistributedDataParallel over gloo (NCCL on CUDA, one GPU a rank). With budget_minutes a run
trains for a fixed training time instead of a step count (attn2d.gan.budget), and the driver
writes the budget report (attn2d.gan.budget_report)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import multiprocessing
import os
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from .. import _checks, patterns
from .._machine import cpu_name
from . import budget as budget_mod
from . import data, metrics, schedules
from .budget import DEFAULT_FRACTIONS, SCHEDULE_UNITS, BudgetState
from .models import (AttentionConfig, Discriminator, GANConfig, Generator, attention_blocks,
                     count_parameters, hinge_d_loss, hinge_g_loss)
from .timing import AttentionTimer, PeakMemory, median

VARIANTS = ("global", "ylg", "window", "downsample", "progressive", "plateau", "mixed")
# Manhattan neighbourhoods of 8, 16 and 24 suit 64-256 px maps with keys on a 32-128 px grid;
# they are scaled by (key grid / 32) for smaller maps.
WINDOW_SIZES = (8, 16, 24)
# The budget's clocks: process_time sums the CPU time of every thread of the process.
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


@dataclass
class TrainConfig:
    variant: str = "global"
    steps: int = 2000
    batch: int = 32
    res: int = 32
    width: int = 32
    attn_res: int = 16
    heads: int = 4
    pool_kv: int = 2
    window_sizes: Optional[tuple[int, ...]] = None
    lr_g: float = 1e-4
    lr_d: float = 4e-4
    bf16: bool = False
    grad_checkpoint: bool = False
    data: Optional[str] = None
    data_limit: Optional[int] = None
    out: str = "gan-report"
    seed: int = 0
    sample_every: int = 500
    ckpt_every: int = 500
    eval_every: int = 0
    eval_samples: int = 5000
    swd_samples: int = 2048
    log_every: int = 50
    resume: bool = False
    device: str = "cpu"
    r1: float = 0.0
    r1_every: int = 16
    gp: float = 0.0
    # A fixed compute budget (minutes of training steps) instead of a step count: `steps` is
    # then unused, and FID/KID/SWD are evaluated at these fractions of the budget.
    budget_minutes: Optional[float] = None
    eval_fractions: tuple[float, ...] = DEFAULT_FRACTIONS
    # Stop this invocation after this many minutes of training (checkpointed); --resume goes on.
    pause_after_minutes: Optional[float] = None
    # Runs of several seeds sit side by side in out/<variant>/<run_subdir>.
    run_subdir: Optional[str] = None
    # What the budget counts: "wall" (wall-clock seconds of the training steps) or "cpu" (the
    # process's CPU seconds in them), which runs sharing a machine cannot take from each other.
    clock: str = "wall"

    def check(self) -> None:
        _checks.check_run_device("attn2d train-gan", self.device)
        if self.variant not in VARIANTS:
            raise ValueError(f"attn2d train-gan: variant must be one of {VARIANTS}; got "
                             f"{self.variant!r}")
        for name in ("steps", "batch", "width", "heads", "pool_kv", "sample_every",
                     "ckpt_every", "eval_samples", "swd_samples", "log_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"attn2d train-gan: {name} must be an int >= 1; got {v!r}")
        if self.eval_every < 0:
            raise ValueError(f"attn2d train-gan: eval_every must be >= 0; got {self.eval_every}")
        if self.eval_samples < 2 or self.swd_samples < 2:
            raise ValueError("attn2d train-gan: eval_samples and swd_samples must be >= 2")
        for name in ("lr_g", "lr_d"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"attn2d train-gan: {name} must be a positive number; got {v!r}")
        for name in ("r1", "gp"):
            v = getattr(self, name)
            if isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v)
                                           and v >= 0):
                raise ValueError(f"attn2d train-gan: {name} must be a number >= 0; got {v!r}")
        if isinstance(self.r1_every, bool) or not isinstance(self.r1_every, int) or \
                self.r1_every < 1:
            raise ValueError(f"attn2d train-gan: r1_every must be an int >= 1; got "
                             f"{self.r1_every!r}")
        if self.clock not in CLOCKS:
            raise ValueError(f"attn2d train-gan: clock (--clock) must be one of "
                             f"{tuple(CLOCKS)}; got {self.clock!r}")
        if self.clock == "cpu" and self.device != "cpu":
            raise ValueError("attn2d train-gan: clock (--clock) 'cpu' counts the host's CPU "
                             "time, which misses the GPU's work; use --clock wall with --device "
                             "cuda")
        if self.budget_minutes is not None:
            budget_mod.check_minutes("budget_minutes (--budget-minutes)", self.budget_minutes)
            if self.eval_every:
                raise ValueError("attn2d train-gan: eval_every (--eval-every) counts steps; with "
                                 "--budget-minutes the evaluations are at --eval-fractions")
        budget_mod.check_fractions(self.eval_fractions, "eval_fractions (--eval-fractions)")
        if self.pause_after_minutes is not None:
            budget_mod.check_minutes("pause_after_minutes (--pause-after-minutes)",
                                     self.pause_after_minutes)
            if self.budget_minutes is None:
                raise ValueError("attn2d train-gan: pause_after_minutes (--pause-after-minutes) "
                                 "pauses a budget; add --budget-minutes")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"attn2d train-gan: seed must be an int >= 0; got {self.seed!r}")
        if self.run_subdir is not None and (not isinstance(self.run_subdir, str)
                                            or not self.run_subdir
                                            or Path(self.run_subdir).name != self.run_subdir):
            raise ValueError(f"attn2d train-gan: run_subdir must be one folder name; got "
                             f"{self.run_subdir!r}")
        if self.attn_res % self.pool_kv:
            raise ValueError(f"attn2d train-gan: pool_kv={self.pool_kv} must divide "
                             f"attn_res={self.attn_res}")
        gan_config(self, 1, None).check()
        g = self.key_grid
        for size in make_schedule(self).window_sizes():
            patterns.Window(size, metric="manhattan").check((self.attn_res, self.attn_res),
                                                            (g, g), self.heads)

    @property
    def budget_seconds(self) -> Optional[float]:
        return None if self.budget_minutes is None else float(self.budget_minutes) * 60

    @property
    def schedule_steps(self) -> int:
        """The length step-based schedules are built for: the steps, or under a budget its
        fraction in SCHEDULE_UNITS."""
        return self.steps if self.budget_minutes is None else SCHEDULE_UNITS

    def run_dir(self) -> Path:
        out = Path(self.out) / self.variant
        return out / self.run_subdir if self.run_subdir else out

    @property
    def key_grid(self) -> int:
        downsample = 2 if self.variant == "downsample" else 1
        return max(1, self.attn_res // downsample // self.pool_kv)

    def sizes(self) -> tuple[int, ...]:
        if self.window_sizes is not None:
            return tuple(self.window_sizes)
        g = self.key_grid
        return tuple(max(2, min(g, round(s * g / 32))) for s in WINDOW_SIZES)


def make_schedule(cfg: TrainConfig) -> schedules.Schedule:
    sizes = cfg.sizes()
    if cfg.variant == "global" or cfg.variant == "downsample":
        return schedules.Constant(None)
    if cfg.variant == "ylg":
        return schedules.Constant(patterns.YLG(cfg.heads))
    if cfg.variant == "window":
        return schedules.Constant(patterns.Window(sizes[len(sizes) // 2], metric="manhattan"))
    total = cfg.schedule_steps
    if cfg.variant == "progressive":
        return schedules.ProgressiveWindow(total, sizes)
    if cfg.variant == "plateau":
        return schedules.PlateauWindow(sizes, patience=2, then_global=True)
    return schedules.Mixed(total, local=schedules.ProgressiveWindow(
        max(1, total // 2), sizes[:2]), local_fraction=0.5)


def gan_config(cfg: TrainConfig, channels: int, pattern) -> GANConfig:
    return GANConfig(res=cfg.res, channels=channels, width=cfg.width, attn_res=cfg.attn_res,
                     attention=AttentionConfig(pattern=pattern, heads=cfg.heads,
                                               downsample=2 if cfg.variant == "downsample" else 1,
                                               pool_kv=cfg.pool_kv,
                                               checkpoint=cfg.grad_checkpoint))


# ---------------------------------------------------------------------------------------------
# Output helpers

def save_grid(images: torch.Tensor, path: Path, nrow: int = 8) -> None:
    """Float images in [-1, 1] (N, C, H, W) as one PNG grid with 2-px gaps."""
    from .. import _tools

    _tools.require("attn2d.gan's sample grids", "PIL")
    from PIL import Image

    u8 = data.to_uint8(images)
    n, c, h, w = u8.shape
    rows = math.ceil(n / nrow)
    pad = 2
    grid = torch.full((c, rows * (h + pad) + pad, nrow * (w + pad) + pad), 255, dtype=torch.uint8)
    for i in range(n):
        r, col = divmod(i, nrow)
        y, x = pad + r * (h + pad), pad + col * (w + pad)
        grid[:, y:y + h, x:x + w] = u8[i]
    arr = grid[0].numpy() if c == 1 else grid.permute(1, 2, 0).numpy()
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path)


def peak_rss_bytes() -> int:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Progress:
    """A one-line progress bar on a terminal, a line every `every` steps otherwise."""

    def __init__(self, name: str, total: int, every: int, enabled: bool = True) -> None:
        self.name, self.total, self.every, self.enabled = name, total, every, enabled
        self.tty = sys.stderr.isatty()
        self.t0 = time.perf_counter()
        self.start_step: Optional[int] = None

    def update(self, step: int, d_loss: float, g_loss: float, extra: str = "",
               budget: Optional[tuple[float, float]] = None) -> None:
        """budget: (training seconds so far, budget seconds) for a budget run, whose bar
        counts minutes instead of steps."""
        if not self.enabled:
            return
        if self.start_step is None:
            self.start_step = step - 1
        done = step - self.start_step
        last = step == self.total if budget is None else budget[0] >= budget[1]
        if not self.tty and step % self.every and not last:
            return
        rate = (time.perf_counter() - self.t0) / max(1, done)
        width = 24
        if budget is None:
            eta = rate * (self.total - step)
            filled = int(width * step / self.total)
            where = f"{step}/{self.total}"
        else:
            eta = max(0.0, budget[1] - budget[0])
            filled = int(width * min(1.0, budget[0] / budget[1]))
            where = f"{budget[0] / 60:.1f}/{budget[1] / 60:.1f} min, step {step}"
        bar = "#" * filled + "-" * (width - filled)
        line = (f"[{self.name}] [{bar}] {where} d_loss {d_loss:.3f} "
                f"g_loss {g_loss:.3f} {rate:.2f} s/step eta {eta / 60:.1f} min {extra}")
        if self.tty:
            sys.stderr.write("\r" + line[:150].ljust(150))
            if last:
                sys.stderr.write("\n")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


# ---------------------------------------------------------------------------------------------
# Training one variant

def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _unwrap(m: nn.Module) -> nn.Module:
    return m.module if isinstance(m, nn.parallel.DistributedDataParallel) else m


def torch_device(cfg: TrainConfig) -> torch.device:
    """cfg.device as a torch.device: on CUDA the current GPU (a rank's own under torchrun)."""
    if cfg.device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@torch.no_grad()
def generate(G: nn.Module, n: int, z_dim: int, seed: int, batch: int = 500) -> torch.Tensor:
    """n images from G on the CPU, the noise drawn on the CPU whatever G's device, so a seed
    gives the same noise everywhere."""
    device = next(G.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    was_training = G.training
    G.eval()
    out = [G(torch.randn(min(batch, n - i), z_dim, generator=gen).to(device)).float().cpu()
           for i in range(0, n, batch)]
    G.train(was_training)
    return torch.cat(out)


def evaluate(G: nn.Module, cfg: TrainConfig, real: torch.Tensor, z_dim: int) -> dict:
    fake = generate(G, cfg.eval_samples, z_dim, seed=cfg.seed + 12345)
    out = metrics.fid_kid(real[:cfg.eval_samples], fake)
    out["swd"] = metrics.swd(real[:cfg.swd_samples], fake[:cfg.swd_samples], seed=cfg.seed)
    return out


def real_eval_images(cfg: TrainConfig, train_u8: torch.Tensor) -> torch.Tensor:
    """The reference set for FID/KID/SWD: Fashion-MNIST's test split (images never trained on),
    or, for a folder, the training images themselves."""
    if cfg.data is None or cfg.data == "fashion-mnist":
        test, _ = data.load_fashion_mnist("test")
        return data.to_float(data.resize_uint8(test[:cfg.eval_samples], cfg.res))
    return data.to_float(train_u8[:cfg.eval_samples])


def _checkpoint_path(out: Path) -> Path:
    return out / "checkpoint.pt"


def _pattern_name(pattern) -> str:
    return "global" if pattern is None else repr(pattern)


def variant_label(cfg: dict) -> str:
    """A run's name in budget reports: the variant, and its gradient penalty if any, so a run
    with --r1 sits beside the same variant without one."""
    label = cfg["variant"]
    if cfg.get("r1"):
        label += f"+r1({cfg['r1']:g})"
    if cfg.get("gp"):
        label += f"+gp({cfg['gp']:g})"
    return label


def train_variant(cfg: TrainConfig, log: Callable[[str], None] = print,
                  progress: bool = True, clock: Optional[Callable[[], float]] = None) -> dict:
    """Train one variant for cfg.steps, or for cfg.budget_minutes of training time (continuing
    from its checkpoint with cfg.resume), evaluate it, write samples / checkpoint /
    result.json (and budget.json for a budget) under cfg.run_dir(), return the result.

    `clock` times the training steps (the budget's clock) and the evaluations: by default the
    one cfg.clock names; tests pass a fake one. A run stopped by cfg.pause_after_minutes
    returns with "paused": True and no final evaluation; --resume continues it."""
    cfg.check()
    if clock is None:
        clock = CLOCKS[cfg.clock]
    if not callable(clock):
        raise TypeError(f"attn2d train-gan: clock must be callable; got {clock!r}")
    rank, world = _world()
    if world > 1 and (cfg.budget_minutes is not None or cfg.pause_after_minutes is not None):
        raise ValueError("attn2d train-gan: --budget-minutes and --pause-after-minutes train in "
                         "one process: under torchrun each rank's clock would stop it at a "
                         "different step")
    device = torch_device(cfg)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    out = cfg.run_dir()
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    rss_start = current_rss_bytes()
    train_u8 = data.load_training_images(cfg.data, cfg.res, cfg.data_limit)
    channels = train_u8.shape[1]
    schedule = make_schedule(cfg)
    gcfg = gan_config(cfg, channels, schedule.pattern(0))
    G, D = Generator(gcfg).to(device), Discriminator(gcfg).to(device)
    opt_g = torch.optim.Adam(G.parameters(), lr=cfg.lr_g, betas=(0.0, 0.9))
    opt_d = torch.optim.Adam(D.parameters(), lr=cfg.lr_d, betas=(0.0, 0.9))
    # One generator for batches and noise: saving its state makes a resumed run continue
    # exactly as an uninterrupted one. Ranks draw different batches.
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + rank)
    step, elapsed, history, step_times = 0, 0.0, [], []
    attention_seconds = 0.0
    budget = (BudgetState(cfg.budget_seconds, cfg.eval_fractions)
              if cfg.budget_minutes is not None else None)
    ckpt = _checkpoint_path(out)
    resumed = cfg.resume and ckpt.exists()
    if resumed:
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
        if budget is not None and state.get("budget") is None:
            raise ValueError(f"attn2d train-gan: {ckpt} was trained by steps; --budget-minutes "
                             "cannot resume it (start in a new --out)")
        if budget is None and state.get("budget") is not None:
            raise ValueError(f"attn2d train-gan: {ckpt} is a budget run; resume it with its "
                             "--budget-minutes")
        if budget is not None:
            saved_clock = state.get("config", {}).get("clock", "wall")
            if saved_clock != cfg.clock:
                raise ValueError(f"attn2d train-gan: --clock {cfg.clock} differs from the "
                                 f"checkpoint's {saved_clock}; resume with the same clock")
            budget.load_state_dict(state["budget"])
            if budget.done(state["elapsed"]) and (out / "result.json").exists():
                # Nothing left to train or evaluate: a new sitting would only blur the
                # record of the ones that did the work.
                log(f"[{cfg.variant}] {ckpt}: the budget is already spent")
                return json.loads((out / "result.json").read_text())
        G.load_state_dict(state["G"])
        D.load_state_dict(state["D"])
        opt_g.load_state_dict(state["opt_g"])
        opt_d.load_state_dict(state["opt_d"])
        schedule.load_state_dict(state["schedule"])
        step, elapsed, history = state["step"], state["elapsed"], state["history"]
        step_times = state.get("step_times", [])
        attention_seconds = state.get("attention_seconds", 0.0)
        gen.set_state(state["rng"][rank] if rank < len(state["rng"]) else state["rng"][0])
        log(f"[{cfg.variant}] resumed from {ckpt} at step {step}"
            + (f", {elapsed / 60:.2f} of {cfg.budget_minutes:g} budget minutes"
               if budget is not None else ""))
    blocks = attention_blocks(G, D)
    Gw, Dw = G, D
    if world > 1 and (cfg.r1 or cfg.gp):
        raise ValueError("attn2d train-gan: --r1 and --gp train in one process: a penalty's "
                         "step leaves D's parameters off the input gradient without gradients, "
                         "which DistributedDataParallel refuses")
    if world > 1:
        ids = [device.index] if device.type == "cuda" else None
        Gw = nn.parallel.DistributedDataParallel(G, device_ids=ids)
        Dw = nn.parallel.DistributedDataParallel(D, device_ids=ids)
    real_eval = real_eval_images(cfg, train_u8) if rank == 0 else None
    n_data = train_u8.shape[0]
    steps_per_epoch = math.ceil(n_data / (cfg.batch * world))
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16)
    prog = Progress(cfg.variant, cfg.steps, cfg.log_every, enabled=progress and rank == 0)
    if rank == 0:
        length = (f"budget {cfg.budget_minutes:g} min of training, evaluated at "
                  f"{', '.join(f'{f:g}' for f in cfg.eval_fractions)}"
                  if budget is not None else f"{cfg.steps} steps")
        log(f"[{cfg.variant}] attention {gcfg.attention.describe()}; schedule {schedule!r}; "
            f"G {count_parameters(G) / 1e6:.2f} M, D {count_parameters(D) / 1e6:.2f} M "
            f"parameters; {n_data} images {channels}x{cfg.res}x{cfg.res}; batch {cfg.batch} x "
            f"{world} process(es); {steps_per_epoch} steps per epoch; {length}")
    # The pattern the blocks were built with: a resumed schedule may be past it, and the first
    # step then sets its own.
    current = gcfg.attention.pattern
    penalties: dict[str, float] = {}  # the latest value of each gradient penalty
    # The configured kind of clock, never a test's fake one: reading that would move its time.
    timer = AttentionTimer(blocks, device, clock=CLOCKS[cfg.clock])
    peak = PeakMemory(device)
    train_peak = budget.train_peak_bytes if budget is not None else 0
    eval_peak = budget.eval_peak_bytes if budget is not None else 0
    sitting_start, start_elapsed = clock(), elapsed
    pause_seconds = (None if cfg.pause_after_minutes is None
                     else float(cfg.pause_after_minutes) * 60)
    if budget is not None:
        budget.start_sitting(step, elapsed, resumed, time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                             {"threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                              "cpu": cpu_name(),
                              "device": (torch.cuda.get_device_name(device)
                                         if device.type == "cuda" else "cpu")})

    def budget_summary(stopped: str, final_metrics: Optional[dict] = None) -> dict:
        budget.train_peak_bytes, budget.eval_peak_bytes = train_peak, eval_peak
        budget.update_sitting(step, elapsed, clock() - sitting_start, stopped)
        summary = {
            "kind": "attn2d train-gan budget run", "variant": cfg.variant,
            "label": variant_label(dataclasses.asdict(cfg)), "seed": cfg.seed,
            "complete": budget.done(elapsed), "stopped": stopped,
            "budget_seconds": budget.budget_seconds, "fractions": list(budget.fractions),
            "train_seconds": elapsed, "steps": step,
            "overshoot_seconds": max(0.0, elapsed - budget.budget_seconds),
            "seconds_per_step": median(step_times),
            "mean_seconds_per_step": elapsed / max(1, step),
            "attention_seconds": attention_seconds,
            "attention_share": attention_seconds / elapsed if elapsed > 0 else None,
            "eval_seconds": budget.eval_seconds,
            "train_peak_bytes": train_peak, "eval_peak_bytes": eval_peak,
            "memory": peak.kind, "train_peak_excludes_eval": peak.resettable,
            "evals": budget.evals, "sittings": budget.sittings,
            "attention": gcfg.attention.describe(), "schedule": repr(schedule),
            "final_pattern": _pattern_name(current),
            "g_parameters": count_parameters(G), "d_parameters": count_parameters(D),
            "device": cfg.device, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
            "cpu": cpu_name(), "torch": torch.__version__, "config": dataclasses.asdict(cfg),
            "final_metrics": final_metrics,
            "samples_final": "samples_final.png" if final_metrics is not None else None,
        }
        if device.type == "cuda":
            summary["device_name"] = torch.cuda.get_device_name(device)
        return summary

    def write_budget_json(summary: dict) -> None:
        tmp = out / "budget.json.tmp"
        tmp.write_text(json.dumps(summary, indent=1))
        os.replace(tmp, out / "budget.json")

    def save_checkpoint(stopped: str = "running") -> None:
        rngs = [None] * world
        if world > 1:
            dist.all_gather_object(rngs, gen.get_state())
        else:
            rngs = [gen.get_state()]
        if rank != 0:
            return
        summary = budget_summary(stopped) if budget is not None else None
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"G": G.state_dict(), "D": D.state_dict(), "opt_g": opt_g.state_dict(),
                    "opt_d": opt_d.state_dict(), "schedule": schedule.state_dict(),
                    "step": step, "elapsed": elapsed, "history": history, "rng": rngs,
                    "step_times": step_times, "attention_seconds": attention_seconds,
                    "budget": budget.state_dict() if budget is not None else None,
                    "config": dataclasses.asdict(cfg)}, tmp)
        os.replace(tmp, ckpt)  # a crash while saving keeps the previous checkpoint
        if summary is not None:
            # Written after the checkpoint, so it never lists an evaluation the checkpoint
            # would lose.
            write_budget_json(summary)

    def finished() -> bool:
        return step >= cfg.steps if budget is None else budget.done(elapsed)

    peak.reset()
    stopped = "budget" if budget is not None else "steps"
    while not finished():
        if pause_seconds is not None and elapsed - start_elapsed >= pause_seconds * (1 - 1e-9):
            stopped = "paused"
            break
        pattern = schedule.pattern(budget.position(elapsed) if budget is not None else step)
        if pattern != current:
            for b in blocks:
                b.set_pattern(pattern)
            if rank == 0:
                log(f"[{cfg.variant}] step {step}: attention -> {_pattern_name(pattern)}")
            current = pattern
        timer.active = True
        t0 = clock()
        # Batches and noise drawn on the CPU from `gen`, whatever the device: a resumed run on
        # either continues exactly.
        idx = torch.randint(0, n_data, (cfg.batch,), generator=gen)
        real = data.to_float(train_u8[idx]).to(device)
        z = torch.randn(cfg.batch, gcfg.z_dim, generator=gen).to(device)
        # D step: real and fake in one forward, so DDP sees one forward per backward.
        with autocast:
            with torch.no_grad():
                fake = Gw(z)
            logits = Dw(torch.cat([real, fake.to(real.dtype)])).float()
            d_loss = hinge_d_loss(logits[:cfg.batch], logits[cfg.batch:])
            if cfg.gp:
                gp = gradient_penalty(Dw, real, fake.to(real.dtype), gen)
                penalties["gp"] = gp.item()
                d_loss = d_loss + cfg.gp * gp
        opt_d.zero_grad(set_to_none=True)
        d_loss.backward()
        opt_d.step()
        if cfg.r1 and step % cfg.r1_every == 0:
            # StyleGAN2's lazy R1: its own D step every r1_every steps, scaled by the interval.
            with autocast:
                r1 = r1_penalty(Dw, real)
            penalties["r1"] = r1.item()
            opt_d.zero_grad(set_to_none=True)
            (r1 * (cfg.r1 / 2 * cfg.r1_every)).backward()
            opt_d.step()
        # G step.
        z = torch.randn(cfg.batch, gcfg.z_dim, generator=gen).to(device)
        with autocast:
            g_loss = hinge_g_loss(Dw(Gw(z)).float())
        opt_g.zero_grad(set_to_none=True)
        opt_d.zero_grad(set_to_none=True)
        g_loss.backward()
        opt_g.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the step's kernels, not only their launches
        step_times.append(clock() - t0)
        timer.active = False
        in_attention = timer.take()
        attention_seconds += in_attention
        elapsed += step_times[-1]
        step += 1
        if budget is not None:
            budget.add_step(step_times[-1], in_attention)
        if not (math.isfinite(d_loss.item()) and math.isfinite(g_loss.item())):
            raise FloatingPointError(f"attn2d train-gan: [{cfg.variant}] loss is not finite at "
                                     f"step {step} (d {d_loss.item()}, g {g_loss.item()})")
        prog.update(step, d_loss.item(), g_loss.item(),
                    budget=(elapsed, budget.budget_seconds) if budget is not None else None)
        last = finished()
        if step % cfg.log_every == 0 or last:
            history.append({"step": step, "d_loss": d_loss.item(), "g_loss": g_loss.item(),
                            **penalties})
        if rank == 0 and (step % cfg.sample_every == 0 or last):
            save_grid(generate(G, 64, gcfg.z_dim, seed=cfg.seed + 7),
                      out / f"samples_{step:06d}.png")
        if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps:
            value = None
            train_peak = max(train_peak, peak.read())
            if rank == 0:
                m = evaluate(G, cfg, real_eval, gcfg.z_dim)
                value = m["fid"]
                history.append({"step": step, "eval": m})
                log(f"[{cfg.variant}] step {step}: FID {m['fid']:.2f} SWD {m['swd']['mean']:.2f}")
            eval_peak = max(eval_peak, peak.read())
            peak.reset()
            if world > 1:
                box = [value]
                dist.broadcast_object_list(box, src=0)
                value = box[0]
            schedule.observe(step, value)
        due = budget.due(elapsed) if budget is not None else []
        for i, fraction in enumerate(due):
            if i:
                budget.share_evaluation(fraction, elapsed, step)
                continue
            train_peak = max(train_peak, peak.read())
            t_eval = clock()
            m = evaluate(G, cfg, real_eval, gcfg.z_dim)
            record = budget.record_eval(fraction, elapsed, step, m, clock() - t_eval,
                                        _pattern_name(current))
            save_grid(generate(G, 64, gcfg.z_dim, seed=cfg.seed + 7),
                      out / f"samples_at_{fraction:.3f}.png")
            eval_peak = max(eval_peak, peak.read())
            peak.reset()
            schedule.observe(step, m["fid"])
            share = record["attention_share"]
            log(f"[{cfg.variant}] {fraction:g} of the budget ({elapsed / 60:.2f} min, step "
                f"{step}): FID {m['fid']:.2f} KID {m['kid']:.3f} SWD {m['swd']['mean']:.2f}; "
                f"{'' if share is None else f'{100 * share:.0f}% of the steps in attention; '}"
                f"{record['eval_seconds']:.1f} s to evaluate")
        if step % cfg.ckpt_every == 0 or (due and not last):
            save_checkpoint()
    timer.close()
    train_peak = max(train_peak, peak.read())
    if rank == 0 and stopped == "paused":
        save_checkpoint("paused")
        log(f"[{cfg.variant}] paused at step {step}, {elapsed / 60:.2f} of "
            f"{cfg.budget_minutes or 0:g} budget minutes; --resume continues")
        result = budget_summary("paused") if budget is not None else {"steps": step}
        result["paused"] = True
        return result
    save_checkpoint(stopped)
    median_step = median(step_times) or 0.0
    result = {"variant": cfg.variant, "steps": step, "world_size": world,
              "attention": gcfg.attention.describe(), "schedule": repr(schedule),
              "final_pattern": _pattern_name(current),
              # The median step: robust to other work on the machine now and then.
              "seconds_per_step": median_step,
              "mean_seconds_per_step": elapsed / max(1, step),
              "seconds_per_epoch": median_step * steps_per_epoch,
              "steps_per_epoch": steps_per_epoch, "train_seconds": elapsed,
              "attention_share": attention_seconds / elapsed if elapsed > 0 else None,
              "peak_rss_bytes": max(peak_rss_bytes(), peak.process_peak() if peak.kind == "rss"
                                    else 0),
              "rss_start_bytes": rss_start,
              "train_peak_bytes": train_peak,
              "g_parameters": count_parameters(G), "d_parameters": count_parameters(D),
              "config": dataclasses.asdict(cfg), "history": history}
    if device.type == "cuda":
        result["device_name"] = torch.cuda.get_device_name(device)
        result["peak_cuda_bytes"] = peak.process_peak()
    if rank == 0:
        t0 = clock()
        last_eval = budget.evals[-1] if budget is not None and budget.evals else None
        if last_eval is not None and last_eval["fraction"] == 1.0:
            # The budget's last evaluation is of this very model.
            result["metrics"] = last_eval["metrics"]
        else:
            result["metrics"] = evaluate(G, cfg, real_eval, gcfg.z_dim)
        result["eval_seconds"] = clock() - t0
        save_grid(generate(G, 64, gcfg.z_dim, seed=cfg.seed + 7), out / "samples_final.png")
        if budget is not None:
            result["budget"] = budget_summary(stopped, result["metrics"])
            write_budget_json(result["budget"])
        (out / "result.json").write_text(json.dumps(result, indent=1))
        m = result["metrics"]
        share = result["attention_share"]
        log(f"[{cfg.variant}] done: {result['seconds_per_step']:.3f} s/step"
            f"{'' if share is None else f' ({100 * share:.0f}% in attention)'}, peak "
            f"{_memory_label(result)} {peak_memory_bytes(result) / 2**20:.0f} MiB, FID "
            f"{m['fid']:.2f}, KID {m['kid']:.3f}, "
            f"SWD {m['swd']['mean']:.2f}")
    return result


# ---------------------------------------------------------------------------------------------
# The driver: one subprocess per variant, then the report

def _variant_process(cfg: TrainConfig, threads: int) -> None:
    torch.set_num_threads(threads)
    train_variant(cfg)


def real_reference(cfg: TrainConfig) -> Optional[dict]:
    """FID/KID/SWD of real training images against the evaluation set: the floor a perfect
    generator would reach with this many samples."""
    if cfg.data is not None and cfg.data != "fashion-mnist":
        return None
    train_u8 = data.load_training_images(cfg.data, cfg.res, cfg.data_limit)
    gen = torch.Generator().manual_seed(cfg.seed + 99)
    pick = torch.randperm(train_u8.shape[0], generator=gen)[:cfg.eval_samples]
    real_train = data.to_float(train_u8[pick])
    real_eval = real_eval_images(cfg, train_u8)
    out = metrics.fid_kid(real_eval, real_train)
    out["swd"] = metrics.swd(real_eval[:cfg.swd_samples], real_train[:cfg.swd_samples],
                             seed=cfg.seed)
    return out


def _mib(b: float) -> str:
    return f"{b / 2**20:.0f} MiB"


def _penalty_backend(x: torch.Tensor):
    """On CUDA, attn2d's Triton kernels for a penalty's forward: auto could give equal-width
    16-bit heads to SDPA's flash kernel, which has no double backward."""
    from ..backends import use_backend

    return use_backend("triton") if x.device.type == "cuda" else contextlib.nullcontext()


def r1_penalty(D, real: torch.Tensor) -> torch.Tensor:
    """R1 (Mescheder et al. 2018): the mean over real images of |dD(x)/dx|^2. Differentiating
    it runs the double backward of every op in D, attention included."""
    real = real.detach().requires_grad_()
    with _penalty_backend(real):
        score = D(real).float().sum()
    grad, = torch.autograd.grad(score, (real,), create_graph=True)
    return grad.float().square().sum(dim=(1, 2, 3)).mean()


def gradient_penalty(D, real: torch.Tensor, fake: torch.Tensor,
                     gen: torch.Generator) -> torch.Tensor:
    """WGAN-GP (Gulrajani et al. 2017): (|dD(x)/dx| - 1)^2 at random points x between real
    and fake images."""
    t = torch.rand(real.shape[0], 1, 1, 1, generator=gen).to(real.device, real.dtype)
    mixed = (t * real.detach() + (1 - t) * fake.detach()).requires_grad_()
    with _penalty_backend(mixed):
        score = D(mixed).float().sum()
    grad, = torch.autograd.grad(score, (mixed,), create_graph=True)
    return (grad.float().flatten(1).norm(dim=1) - 1).square().mean()


def peak_memory_bytes(result: dict) -> int:
    """A variant's peak memory: on CUDA, torch.cuda.max_memory_allocated; else peak RSS."""
    return result.get("peak_cuda_bytes", result["peak_rss_bytes"])


def _memory_label(result: dict) -> str:
    return "CUDA memory" if "peak_cuda_bytes" in result else "RSS"


def _penalty_text(cfg: dict) -> str:
    text = ""
    if cfg.get("r1"):
        text += f"; R1 gamma {cfg['r1']} every {cfg['r1_every']} steps (lazy, as StyleGAN2)"
    if cfg.get("gp"):
        text += f"; WGAN-GP lambda {cfg['gp']}"
    return text


def _row_name(result: dict) -> str:
    """The variant, with its seed where runs of several seeds sit in seed folders."""
    if result["config"].get("run_subdir"):
        return f"{result['variant']} (seed {result['config']['seed']})"
    return result["variant"]


def write_report(out: Path, results: list[dict], reference: Optional[dict]) -> Path:
    cfg = results[0]["config"]
    memory = _memory_label(results[0])
    gpu = f", {results[0]['device_name']}" if "device_name" in results[0] else ""
    how = ("peak CUDA memory (torch.cuda.max_memory_allocated)" if "peak_cuda_bytes" in results[0]
           else "peak RSS")
    lines = [
        "# attn2d train-gan report", "",
        f"Data: {cfg['data'] or 'Fashion-MNIST (Debian dataset-fashion-mnist)'}, "
        f"{cfg['res']}x{cfg['res']}; batch {cfg['batch']} per process; {cfg['steps']} steps; "
        f"attention at {cfg['attn_res']}x{cfg['attn_res']} in G and D (keys pooled "
        f"{cfg['pool_kv']}x); hinge loss, spectral norm, Adam(0, 0.9), "
        f"lr G {cfg['lr_g']} / D {cfg['lr_d']}{', bf16 autocast' if cfg['bf16'] else ''}"
        f"{_penalty_text(cfg)}.",
        f"Machine: {os.cpu_count()} CPUs{gpu}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads.", "",
        "FID and KID are over the 128-d features of attn2d's shipped Fashion-MNIST classifier "
        f"({cfg['eval_samples']} generated vs {cfg['eval_samples']} test images); SWD is "
        f"ProGAN's sliced Wasserstein distance (x1e3) on Laplacian-pyramid 7x7 patches "
        f"({cfg['swd_samples']} images). Lower is better for all three. Time per epoch = "
        "median time per training step x steps per epoch (sampling, checkpoints and "
        f"evaluation excluded). Peak memory is the training process's {how}.", "",
        f"| variant | attention | s/step | time per epoch | peak {memory} | FID | KID | "
        "SWD (mean) | SWD per level |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        m = r["metrics"]
        levels = ", ".join(f"{k}: {v:.2f}" for k, v in m["swd"].items() if k != "mean")
        lines.append(
            f"| {_row_name(r)} | {r['attention']} | {r['seconds_per_step']:.3f} | "
            f"{r['seconds_per_epoch'] / 60:.1f} min | {_mib(peak_memory_bytes(r))} | "
            f"{m['fid']:.2f} | {m['kid']:.3f} | {m['swd']['mean']:.2f} | {levels} |")
    if reference is not None:
        levels = ", ".join(f"{k}: {v:.2f}" for k, v in reference["swd"].items() if k != "mean")
        lines.append(f"| real train images (floor) | - | - | - | - | {reference['fid']:.2f} | "
                     f"{reference['kid']:.3f} | {reference['swd']['mean']:.2f} | {levels} |")
    # The first run of each of the first two variants (seeds of one variant are not variants).
    firsts: list[dict] = []
    for r in results:
        if all(f["variant"] != r["variant"] for f in firsts):
            firsts.append(r)
    if len(firsts) >= 2:
        a, b = firsts[0], firsts[1]
        lines += ["", f"{b['variant']} / {a['variant']}: time per step "
                  f"{b['seconds_per_step'] / a['seconds_per_step']:.2f}x, peak {memory} "
                  f"{peak_memory_bytes(b) / peak_memory_bytes(a):.2f}x."]
    lines += ["", "## Samples (fixed noise, final step)", ""]
    for r in results:
        where = "/".join(filter(None, (r["variant"], r["config"].get("run_subdir"))))
        lines += [f"### {_row_name(r)}", "", f"![{_row_name(r)}]({where}/samples_final.png)", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    (out / "report.json").write_text(json.dumps({"results": results, "reference": reference},
                                                indent=1))
    return path


def run(cfg: TrainConfig, variants: list[str], log: Callable[[str], None] = print,
        subprocesses: bool = True, reference: bool = True,
        seeds: Optional[Sequence[int]] = None) -> Optional[Path]:
    """Train each variant for each seed (each in its own subprocess unless running under
    torchrun or subprocesses=False), then write out/report.md, or with cfg.budget_minutes
    out/budget_report.md. seeds (several, or one) puts each run in out/<variant>/seed<k>;
    None trains cfg.seed in out/<variant>. Returns the report's path."""
    if isinstance(variants, str) or not variants:
        raise ValueError(f"attn2d train-gan: variants must be a non-empty list of names; got "
                         f"{variants!r}")
    if seeds is not None:
        seeds = tuple(seeds)
        if not seeds or len(set(seeds)) != len(seeds) or not all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in seeds):
            raise ValueError(f"attn2d train-gan: seeds must be distinct ints >= 0; got {seeds!r}")
    cfgs = [dataclasses.replace(cfg, variant=v, seed=seed,
                                run_subdir=f"seed{seed}" if seeds is not None else cfg.run_subdir)
            for v in variants for seed in (seeds if seeds is not None else (cfg.seed,))]
    for c in cfgs:
        c.check()
    out = Path(cfg.out)
    rank, world = _world()
    results = []
    for vcfg in cfgs:
        if subprocesses and world == 1:
            # A fresh process per run, so each peak memory is that run's own.
            proc = multiprocessing.get_context("spawn").Process(
                target=_variant_process, args=(vcfg, torch.get_num_threads()))
            proc.start()
            proc.join()
            if proc.exitcode != 0:
                raise RuntimeError(f"attn2d train-gan: variant {vcfg.variant!r} seed "
                                   f"{vcfg.seed} failed (exit {proc.exitcode})")
            name = "budget.json" if cfg.budget_minutes is not None else "result.json"
            results.append(json.loads((vcfg.run_dir() / name).read_text()))
        else:
            result = train_variant(vcfg, log=log)
            results.append(result.get("budget", result))
    if rank != 0:
        return out / "report.md"
    if cfg.budget_minutes is not None:
        from . import budget_report

        if not all(r.get("complete", False) for r in results):
            log("some runs paused before the end of their budget; --resume continues them")
        return budget_report.write(out, reference=reference, log=log)
    ref = real_reference(cfg) if reference else None
    path = write_report(out, results, ref)
    log(f"report: {path}")
    return path
