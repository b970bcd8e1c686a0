"""train-gan under a fixed compute budget: the stop on time, evaluations at fractions of the
budget, the clock and evaluations carried across --resume, the merged report and its plot, the
attention timer, and the arguments refused by name."""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attn2d.gan import budget, budget_report, data
from attn2d.gan.timing import AttentionTimer, PeakMemory
from attn2d.gan.train import TrainConfig, train_variant

HAVE_FMNIST = Path(data.FASHION_MNIST_DIR, "train-images-idx3-ubyte.gz").exists()
needs_fmnist = pytest.mark.skipif(not HAVE_FMNIST, reason="dataset-fashion-mnist not installed")

# A step of the fake clock: exact in binary, so budgets of whole steps add up exactly.
DT = 0.0625


class FakeClock:
    """Every reading is DT later than the last: a training step (two readings) takes DT."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += DT
        return self.t


def _tiny(out, variant: str = "global", steps_in_budget: int = 12, **kw) -> TrainConfig:
    base = dict(variant=variant, batch=4, res=8, width=8, attn_res=8, heads=4, data_limit=128,
                out=str(out), sample_every=1000, ckpt_every=1000, eval_samples=32,
                swd_samples=16, log_every=1, budget_minutes=steps_in_budget * DT / 60,
                eval_fractions=(0.25, 0.5, 1.0), run_subdir="seed0")
    base.update(kw)
    return TrainConfig(**base)


def _quiet(line: str) -> None:
    pass


def _budget_json(cfg: TrainConfig) -> dict:
    return json.loads((cfg.run_dir() / "budget.json").read_text())


# ---------------------------------------------------------------------------------------------
# The stop and the evaluations


@needs_fmnist
def test_budget_stops_on_time_and_evaluates_each_fraction_once_in_order(tmp_path):
    cfg = _tiny(tmp_path)
    logs: list[str] = []
    result = train_variant(cfg, log=logs.append, progress=False, clock=FakeClock())
    b = result["budget"]
    assert result["steps"] == 12 and b["train_seconds"] == 12 * DT
    assert b["complete"] and b["stopped"] == "budget" and b["overshoot_seconds"] == 0
    assert [(e["fraction"], e["steps"], e["train_seconds"]) for e in b["evals"]] == [
        (0.25, 3, 3 * DT), (0.5, 6, 6 * DT), (1.0, 12, 12 * DT)]
    assert sum("of the budget" in line for line in logs) == 3
    # The evaluations' time is measured and kept apart from the budget's.
    assert b["eval_seconds"] == pytest.approx(3 * DT)
    assert result["metrics"] == b["evals"][-1]["metrics"]  # not evaluated twice
    for f in ("0.250", "0.500", "1.000"):
        assert (cfg.run_dir() / f"samples_at_{f}.png").exists()
    assert (cfg.run_dir() / "samples_final.png").exists()
    on_disk = _budget_json(cfg)
    assert on_disk["evals"] == b["evals"] and on_disk["samples_final"] == "samples_final.png"
    assert on_disk["train_peak_bytes"] > 0 and on_disk["memory"] == "rss"
    assert 0 < on_disk["attention_seconds"]


@needs_fmnist
def test_budget_stops_on_time_with_the_real_clock(tmp_path):
    seconds = 1.0
    cfg = _tiny(tmp_path, budget_minutes=seconds / 60, eval_fractions=(1.0,))
    t0 = time.perf_counter()
    result = train_variant(cfg, log=_quiet, progress=False)
    wall = time.perf_counter() - t0
    b = result["budget"]
    longest = max(torch.load(cfg.run_dir() / "checkpoint.pt", weights_only=False)["step_times"])
    # Stopped by the first step that reached the budget: past it by less than one step.
    assert seconds <= b["train_seconds"] < seconds + longest
    assert b["overshoot_seconds"] < longest
    assert wall >= b["train_seconds"]
    share = b["attention_share"]
    assert 0 < share < 1 and b["evals"][0]["attention_share"] == pytest.approx(share)


@needs_fmnist
def test_fractions_reached_by_one_step_are_each_recorded_once(tmp_path):
    # Two steps in the budget: the first reaches 0.25 and 0.5 at once; one evaluation serves both.
    cfg = _tiny(tmp_path, steps_in_budget=2, eval_fractions=(0.25, 0.5, 0.75, 1.0))
    logs: list[str] = []
    b = train_variant(cfg, log=logs.append, progress=False, clock=FakeClock())["budget"]
    assert [(e["fraction"], e["steps"]) for e in b["evals"]] == [(0.25, 1), (0.5, 1), (0.75, 2),
                                                                (1.0, 2)]
    assert b["evals"][1]["metrics"] == b["evals"][0]["metrics"]
    assert b["evals"][1]["eval_seconds"] == 0
    assert sum("of the budget" in line for line in logs) == 2


@needs_fmnist
def test_schedules_follow_the_budget_fraction(tmp_path):
    # Progressive windows (2, 2, 3) on the 4x4 key grid: the last stage starts at 2/3 of the
    # budget, after step 8 of 12 (the log names the step about to run, counted from 0).
    cfg = _tiny(tmp_path, variant="progressive")
    logs: list[str] = []
    result = train_variant(cfg, log=logs.append, progress=False, clock=FakeClock())
    changes = [line for line in logs if "attention ->" in line]
    assert len(changes) == 1 and "step 8:" in changes[0] and "size=3" in changes[0]
    assert "size=3" in result["final_pattern"]


# ---------------------------------------------------------------------------------------------
# Resume: the clock carries, evaluations do not repeat, the report merges the pieces


@needs_fmnist
def test_resumed_budget_matches_an_uninterrupted_one_and_the_report_merges_it(tmp_path):
    straight = _tiny(tmp_path / "straight", variant="plateau")
    train_variant(straight, log=_quiet, progress=False, clock=FakeClock())
    halves = _tiny(tmp_path / "halves", variant="plateau", pause_after_minutes=6 * DT / 60)
    first = train_variant(halves, log=_quiet, progress=False, clock=FakeClock())
    assert first["paused"] and first["steps"] == 6 and not first["complete"]
    assert [e["fraction"] for e in first["evals"]] == [0.25, 0.5]
    assert not (halves.run_dir() / "result.json").exists()
    logs: list[str] = []
    second = train_variant(dataclasses.replace(halves, resume=True, pause_after_minutes=None),
                           log=logs.append, progress=False, clock=FakeClock())
    # Only the fraction left was evaluated after the resume.
    assert sum("of the budget" in line for line in logs) == 1
    a, b = _budget_json(straight), _budget_json(halves)
    assert b == json.loads(json.dumps(second["budget"]))
    assert [e["fraction"] for e in b["evals"]] == [0.25, 0.5, 1.0]
    for ea, eb in zip(a["evals"], b["evals"]):
        assert (ea["steps"], ea["train_seconds"], ea["metrics"]) == (eb["steps"],
                                                                     eb["train_seconds"],
                                                                     eb["metrics"])
    assert [(s["start_step"], s["end_step"], s["start_train_seconds"], s["end_train_seconds"],
             s["stopped"]) for s in b["sittings"]] == [(0, 6, 0.0, 6 * DT, "paused"),
                                                      (6, 12, 6 * DT, 12 * DT, "budget")]
    # A resume after the end trains and evaluates nothing, and adds no sitting.
    logs.clear()
    again = train_variant(dataclasses.replace(halves, resume=True, pause_after_minutes=None),
                          log=logs.append, progress=False, clock=FakeClock())
    assert any("already spent" in line for line in logs)
    assert again["budget"]["sittings"] == b["sittings"] and _budget_json(halves) == b
    ca = torch.load(straight.run_dir() / "checkpoint.pt", weights_only=False)
    cb = torch.load(halves.run_dir() / "checkpoint.pt", weights_only=False)
    for part in ("G", "D"):
        for name, t in ca[part].items():
            assert torch.equal(t, cb[part][name]), f"{part}.{name} differs after resume"

    path = budget_report.write(tmp_path / "halves", reference=False, log=_quiet)
    report = json.loads((tmp_path / "halves" / budget_report.REPORT_JSON).read_text())
    (setting,) = report["settings"]
    rows = setting["variants"]["plateau"]["fractions"]
    assert [r["fraction"] for r in rows] == [0.25, 0.5, 1.0]
    assert [r["train_seconds"]["mean"] for r in rows] == [3 * DT, 6 * DT, 12 * DT]
    assert setting["variants"]["plateau"]["sittings"] == [2]
    assert (tmp_path / "halves" / setting["plot"]).stat().st_size > 0
    text = path.read_text()
    assert "### plateau" in text and "plateau/seed0/samples_final.png" in text


@needs_fmnist
def test_resume_refuses_another_budget_or_fractions(tmp_path):
    cfg = _tiny(tmp_path, pause_after_minutes=3 * DT / 60)
    train_variant(cfg, log=_quiet, progress=False, clock=FakeClock())
    with pytest.raises(ValueError, match="--budget-minutes"):
        train_variant(dataclasses.replace(cfg, resume=True, budget_minutes=1.0), log=_quiet,
                      progress=False, clock=FakeClock())
    with pytest.raises(ValueError, match="--eval-fractions"):
        train_variant(dataclasses.replace(cfg, resume=True, eval_fractions=(0.5, 1.0)),
                      log=_quiet, progress=False, clock=FakeClock())
    with pytest.raises(ValueError, match="budget run"):
        train_variant(dataclasses.replace(cfg, resume=True, budget_minutes=None,
                                          pause_after_minutes=None, steps=4),
                      log=_quiet, progress=False)
    with pytest.raises(ValueError, match="--clock cpu differs from the checkpoint's wall"):
        train_variant(dataclasses.replace(cfg, resume=True, clock="cpu"), log=_quiet,
                      progress=False, clock=FakeClock())


@needs_fmnist
def test_the_cpu_clock_counts_the_process_cpu_time_not_its_waits(tmp_path, monkeypatch):
    """A budget on the CPU clock is not spent while the process waits (here: sleeps in each
    batch draw, as it would while another run holds the core); one on the wall clock is."""
    waits = []

    def slow_batch(*args, **kw):
        time.sleep(0.3)
        waits.append(0.3)
        return to_float(*args, **kw)

    to_float = data.to_float
    monkeypatch.setattr(data, "to_float", slow_batch)
    runs = {}
    for clock in ("wall", "cpu"):
        # Several steps' worth, so that a slow first step (on a loaded machine) cannot spend
        # either budget alone.
        cfg = _tiny(tmp_path / clock, clock=clock, budget_minutes=1.5 / 60,
                    eval_fractions=(1.0,))
        waits.clear()
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            b = train_variant(cfg, log=_quiet, progress=False)["budget"]
        finally:
            torch.set_num_threads(threads)
        runs[clock] = (b, sum(waits))
        assert b["complete"] and b["config"]["clock"] == clock
        assert 1.5 <= b["train_seconds"] <= 1.5 + 2 * max(b["seconds_per_step"], 0.1)
    wall, cpu = runs["wall"][0], runs["cpu"][0]
    # The wall clock counts each step's sleep (every step draws one batch); the CPU clock takes
    # more steps, and more waiting, to spend the same budget (one thread: a step's CPU time is at
    # most its wall time less the sleep).
    assert wall["train_seconds"] >= 0.3 * wall["steps"]
    assert cpu["steps"] > wall["steps"] and runs["cpu"][1] > runs["wall"][1]
    assert cpu["sittings"][0]["machine"]["cpu"] == wall["cpu"] != ""


# ---------------------------------------------------------------------------------------------
# The report over variants and seeds (runs cloned from one real run, with their metrics moved)


@pytest.fixture(scope="module")
def one_run(tmp_path_factory):
    if not HAVE_FMNIST:
        pytest.skip("dataset-fashion-mnist not installed")
    cfg = _tiny(tmp_path_factory.mktemp("one"), steps_in_budget=4,
                eval_fractions=(0.5, 1.0))
    train_variant(cfg, log=_quiet, progress=False, clock=FakeClock())
    return _budget_json(cfg)


def _clone(root: Path, run: dict, variant: str, seed: int, fid: list[float]) -> dict:
    run = copy.deepcopy(run)
    run["variant"] = run["config"]["variant"] = variant
    run["label"], run["seed"] = variant, seed
    run["config"]["seed"] = seed
    for e, v in zip(run["evals"], fid):
        e["metrics"]["fid"] = v
    where = root / variant / f"seed{seed}"
    where.mkdir(parents=True, exist_ok=True)
    (where / "budget.json").write_text(json.dumps(run))
    return run


def test_report_shows_the_spread_over_seeds_and_plots_every_variant(tmp_path, one_run):
    _clone(tmp_path, one_run, "global", 0, [30.0, 20.0])
    _clone(tmp_path, one_run, "global", 1, [34.0, 24.0])
    _clone(tmp_path, one_run, "ylg", 0, [40.0, 25.0])
    _clone(tmp_path, one_run, "ylg", 1, [44.0, 27.0])
    path = budget_report.write(tmp_path, reference=False, log=_quiet)
    (setting,) = json.loads((tmp_path / budget_report.REPORT_JSON).read_text())["settings"]
    assert list(setting["variants"]) == ["global", "ylg"]
    final = setting["variants"]["global"]["fractions"][-1]["fid"]
    assert (final["mean"], final["min"], final["max"], final["n"]) == (22.0, 20.0, 24.0, 2)
    assert final["sd"] == pytest.approx(2 * 2 ** 0.5)
    text = path.read_text()
    assert "22.00 (20.00–24.00)" in text and "| ylg |" in text
    assert "ylg/seed1/samples_final.png" in text
    png = tmp_path / setting["plot"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("description, words", [
    ("global, heads=8, pool_kv=2", "global"),
    ("Window(size=8, metric='manhattan', dilation=1, border='clip'), heads=8, pool_kv=2",
     "window 8"),
    ("Window(size=5, metric='chebyshev', dilation=2, border='clip'), heads=4, pool_kv=1",
     "window 5 (chebyshev) dilated 2"),
    ("YLG(patterns=['rtl-floor', 'ltr-floor', 'rtl-repetitive', 'ltr-repetitive'], "
     "mapping='official'), heads=4, pool_kv=2", "YLG (4 heads)"),
])
def test_report_names_each_pattern_in_a_few_words(description, words):
    assert budget_report.pattern_words(description) == words


def test_report_shows_where_a_schedule_started_and_ended(tmp_path, one_run):
    run = copy.deepcopy(one_run)
    run["attention"] = "Window(size=8, metric='manhattan', dilation=1, border='clip'), heads=8"
    run["final_pattern"] = "global"
    _clone(tmp_path, run, "mixed", 0, [30.0, 20.0])
    run["final_pattern"] = "Window(size=16, metric='manhattan', dilation=1, border='clip')"
    _clone(tmp_path, run, "mixed", 1, [34.0, 24.0])
    text = budget_report.write(tmp_path, reference=False, log=_quiet).read_text()
    assert "| mixed | window 8 → global / window 16 | 0, 1 |" in text


def test_report_keeps_budgets_of_cpu_time_apart_from_wall_clock_ones(tmp_path, one_run):
    _clone(tmp_path / "wall", one_run, "global", 0, [30.0, 20.0])
    cpu = copy.deepcopy(one_run)
    cpu["config"]["clock"] = "cpu"
    _clone(tmp_path / "cpu", cpu, "global", 0, [31.0, 21.0])
    # A run recorded before the clock was a setting counted wall-clock time.
    old = copy.deepcopy(one_run)
    del old["config"]["clock"]
    _clone(tmp_path / "old", old, "global", 1, [32.0, 22.0])
    budget_report.write(tmp_path, reference=False, log=_quiet)
    settings = json.loads((tmp_path / budget_report.REPORT_JSON).read_text())["settings"]
    assert sorted(len(s["variants"]["global"]["seeds"]) for s in settings) == [1, 2]
    assert len({s["plot"] for s in settings}) == 2
    text = (tmp_path / budget_report.REPORT_MD).read_text()
    assert "The budget's clock: the process's CPU time in the training steps" in text
    assert "The budget's clock: wall-clock time of the training steps" in text


def test_report_says_when_runs_come_from_different_machines(tmp_path, one_run):
    _clone(tmp_path, one_run, "global", 0, [30.0, 20.0])
    other = _clone(tmp_path, one_run, "global", 1, [34.0, 24.0])
    other["sittings"][0]["machine"] = dict(other["sittings"][0]["machine"], threads=64)
    (tmp_path / "global" / "seed1" / "budget.json").write_text(json.dumps(other))
    text = budget_report.write(tmp_path, reference=False, log=_quiet).read_text()
    assert "different machines" in text and "threads 64" in text


def test_report_refuses_pieces_that_do_not_join(tmp_path, one_run):
    run = _clone(tmp_path, one_run, "global", 0, [30.0, 20.0])
    broken = copy.deepcopy(run)
    broken["sittings"] = [dict(run["sittings"][0], end_step=2, end_train_seconds=2 * DT),
                          dict(run["sittings"][0], index=1, start_step=3,
                               start_train_seconds=3 * DT)]
    (tmp_path / "global" / "seed0" / "budget.json").write_text(json.dumps(broken))
    with pytest.raises(ValueError, match="sitting 1 starts at step 3"):
        budget_report.write(tmp_path, reference=False, log=_quiet)
    repeated = copy.deepcopy(run)
    repeated["evals"] = [run["evals"][0], run["evals"][0]]
    (tmp_path / "global" / "seed0" / "budget.json").write_text(json.dumps(repeated))
    with pytest.raises(ValueError, match="each once"):
        budget_report.write(tmp_path, reference=False, log=_quiet)


def test_report_refuses_one_seed_twice(tmp_path, one_run):
    _clone(tmp_path / "a", one_run, "global", 0, [30.0, 20.0])
    _clone(tmp_path / "b", one_run, "global", 0, [31.0, 21.0])
    with pytest.raises(ValueError, match="global seed 0 is in both"):
        budget_report.write(tmp_path, reference=False, log=_quiet)


def test_report_of_a_folder_without_runs(tmp_path):
    with pytest.raises(ValueError, match="--report .* no budget runs"):
        budget_report.write(tmp_path, reference=False, log=_quiet)
    with pytest.raises(ValueError, match="--report .* not a folder"):
        budget_report.write(tmp_path / "missing", reference=False, log=_quiet)


# ---------------------------------------------------------------------------------------------
# The attention timer and the peak of training


class _Slow(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        time.sleep(0.02)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        time.sleep(0.03)
        return grad * 2


class _SlowBlock(torch.nn.Module):
    def forward(self, x):
        return _Slow.apply(x)


def test_attention_timer_counts_forward_and_backward_while_active():
    block = _SlowBlock()
    timer = AttentionTimer([block])
    x = torch.ones(3, requires_grad=True)
    block(x * 1).sum().backward()  # inactive: not counted
    assert timer.take() == 0.0
    timer.active = True
    block(x * 1).sum().backward()
    timer.active = False
    took = timer.take()
    assert 0.05 <= took < 0.5, took
    with torch.no_grad():
        timer.active = True
        block(x)
    assert 0.02 <= timer.take() < 0.3
    timer.close()
    timer.active = True
    block(x * 1).sum().backward()
    assert timer.take() == 0.0
    with pytest.raises(TypeError, match="nn.Module"):
        AttentionTimer([lambda t: t])


def test_peak_memory_keeps_the_process_peak_across_resets():
    """In a fresh process: inside the test suite's the peak so far may already lie above what
    one 64 MiB tensor adds."""
    code = """
import torch
from attn2d.gan.timing import PeakMemory
peak = PeakMemory("cpu")
peak.reset()
before = peak.read()
big = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
big += 1
del big
during = peak.read()
assert during >= before + 60 * 2**20, (before, during)
peak.reset()
if peak.resettable:
    assert peak.read() < during
assert peak.process_peak() >= during
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


# ---------------------------------------------------------------------------------------------
# Arguments


@pytest.mark.parametrize("kw, error, match", [
    (dict(budget_minutes=-1.0), ValueError, "budget_minutes"),
    (dict(budget_minutes=0.0), ValueError, "budget_minutes"),
    (dict(budget_minutes=float("inf")), ValueError, "budget_minutes"),
    (dict(budget_minutes="5"), TypeError, "budget_minutes"),
    (dict(eval_fractions=(0.5, 0.2)), ValueError, "eval_fractions .*increasing"),
    (dict(eval_fractions=(0.5, 0.5)), ValueError, "eval_fractions .*increasing"),
    (dict(eval_fractions=(0.0, 1.0)), ValueError, r"eval_fractions .*\(0, 1\]"),
    (dict(eval_fractions=(0.5, 1.5)), ValueError, r"eval_fractions .*\(0, 1\]"),
    (dict(eval_fractions=()), ValueError, "eval_fractions .*empty"),
    (dict(eval_fractions="0.5"), TypeError, "eval_fractions"),
    (dict(pause_after_minutes=0.0), ValueError, "pause_after_minutes"),
    (dict(budget_minutes=None, pause_after_minutes=1.0), ValueError, "pause_after_minutes"),
    (dict(eval_every=5), ValueError, "eval_every"),
    (dict(seed=-1), ValueError, "seed"),
    (dict(run_subdir="a/b"), ValueError, "run_subdir"),
    (dict(clock="process"), ValueError, "clock"),
])
def test_bad_budget_settings_are_refused_by_name(tmp_path, kw, error, match):
    with pytest.raises(error, match=match):
        _tiny(tmp_path, **kw).check()


def test_parsers_name_their_option():
    assert budget.parse_fractions("0.1, 0.5,1") == (0.1, 0.5, 1.0)
    assert budget.parse_seeds("0,1") == (0, 1)
    for text in ("a,b", "0.5,0.2", "0,1", "1.5"):
        with pytest.raises(ValueError, match="--eval-fractions"):
            budget.parse_fractions(text)
    for text in ("0,0", "x", "-1", ""):
        with pytest.raises(ValueError, match="--seeds"):
            budget.parse_seeds(text)
    with pytest.raises(ValueError, match="budget_seconds"):
        budget.BudgetState(-1.0, (1.0,))


@pytest.mark.parametrize("args, match", [
    (["--budget-minutes", "-1"], "--budget-minutes"),
    (["--budget-minutes", "1", "--eval-fractions", "0.5,0.2"], "--eval-fractions"),
    (["--budget-minutes", "1", "--eval-fractions", "0,1"], "--eval-fractions"),
    (["--budget-minutes", "1", "--eval-fractions", "x"], "--eval-fractions"),
    (["--eval-fractions", "0.5,1"], "--budget-minutes"),
    (["--budget-minutes", "1", "--steps", "5"], "--steps"),
    (["--budget-minutes", "1", "--pause-after-minutes", "-2"], "--pause-after-minutes"),
    (["--budget-minutes", "1", "--eval-every", "3"], "--eval-every"),
    (["--seeds", "0,0"], "--seeds"),
    (["--seeds", "a"], "--seeds"),
    (["--report", "/nonexistent/attn2d-budget"], "--report"),
])
def test_cli_bad_budget_arguments(tmp_path, capsys, args, match):
    from attn2d.cli import main

    code = main(["train-gan", "--out", str(tmp_path), "--res", "8", "--width", "8",
                 "--attn-res", "8", "--data-limit", "16", *args])
    assert code == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "budget_report.md").exists()


@needs_fmnist
def test_cli_budget_runs_two_seeds_and_writes_the_report(tmp_path):
    from attn2d.cli import main

    code = main(["train-gan", "--variants", "ylg", "--seeds", "0,1", "--budget-minutes",
                 str(0.4 / 60), "--eval-fractions", "0.5,1", "--image-size", "8", "--width", "8",
                 "--attn-res", "8", "--batch", "4", "--data-limit", "128", "--eval-samples",
                 "32", "--swd-samples", "16", "--in-process", "--no-reference",
                 "--out", str(tmp_path)])
    assert code == 0
    for seed in (0, 1):
        run = json.loads((tmp_path / "ylg" / f"seed{seed}" / "budget.json").read_text())
        assert run["complete"] and run["seed"] == seed and run["config"]["res"] == 8
        assert [e["fraction"] for e in run["evals"]] == [0.5, 1.0]
    (setting,) = json.loads((tmp_path / "budget_report.json").read_text())["settings"]
    assert setting["variants"]["ylg"]["seeds"] == [0, 1]
    assert (tmp_path / setting["plot"]).exists()
    # The report alone, again, from the runs on disk.
    (tmp_path / "budget_report.md").unlink()
    assert main(["train-gan", "--report", str(tmp_path), "--no-reference"]) == 0
    assert "| ylg |" in (tmp_path / "budget_report.md").read_text()
