"""The report of fixed-budget `attn2d train-gan` runs (`attn2d train-gan --report DIR`).

Every budget.json under DIR is one run (a variant and a seed, however many sittings it took).
Runs are grouped by setting (image size, attention map, budget, fractions, model and batch); in
each, the seeds of a variant are merged: FID, KID and SWD at every fraction of the budget as the
mean over seeds with the min-max range and the standard deviation, the time per step, the peak
training memory and the share of the step spent in attention. Writes budget_report.md (docs
ready, images linked relative to DIR), budget_report.json, and one PNG per setting of FID
against training time (mean over seeds, min-max band)."""

from __future__ import annotations

import json
import os
import re
import statistics
import textwrap
from pathlib import Path
from typing import Callable, Optional

KIND = "attn2d train-gan budget run"
REPORT_MD = "budget_report.md"
REPORT_JSON = "budget_report.json"
REFERENCE_JSON = "reference.json"
METRICS = ("fid", "kid", "swd")
# What makes runs comparable: they share a table and a plot only where all of these agree.
SETTING_KEYS = ("res", "attn_res", "budget_minutes", "eval_fractions", "heads", "width", "batch",
                "pool_kv", "bf16", "grad_checkpoint", "device", "data", "data_limit",
                "eval_samples", "swd_samples", "lr_g", "lr_d", "clock")
# Settings recorded before a key existed had its default.
SETTING_DEFAULTS = {"clock": "wall"}


def _metric(metrics: dict, name: str) -> float:
    return float(metrics["swd"]["mean"] if name == "swd" else metrics[name])


def check_pieces(run: dict, where: str) -> None:
    """A run's pieces must join up: each sitting starts at the clock and step where the one
    before it stopped, and the evaluations are the budget's fractions, in order, each once, at
    non-decreasing training times."""
    done = [e["fraction"] for e in run["evals"]]
    if done != run["fractions"][:len(done)]:
        raise ValueError(f"attn2d train-gan: {where}: evaluations at {done} are not the "
                         f"budget's fractions {run['fractions']} in order, each once")
    times = [e["train_seconds"] for e in run["evals"]]
    if any(b < a for a, b in zip(times, times[1:])):
        raise ValueError(f"attn2d train-gan: {where}: evaluation times go backwards: {times}")
    for a, b in zip(run["sittings"], run["sittings"][1:]):
        if (b["start_step"], b["start_train_seconds"]) != (a["end_step"], a["end_train_seconds"]):
            raise ValueError(
                f"attn2d train-gan: {where}: sitting {b['index']} starts at step "
                f"{b['start_step']} ({b['start_train_seconds']:.3f} s) but sitting {a['index']} "
                f"stopped at step {a['end_step']} ({a['end_train_seconds']:.3f} s)")


def load_runs(root: str | os.PathLike) -> list[dict]:
    """Every budget run under root, each with "dir" (relative to root) added; checked."""
    if not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"attn2d train-gan: --report must be a folder path; got {root!r}")
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"attn2d train-gan: --report {str(root)!r} is not a folder")
    runs = []
    for path in sorted(root.rglob("budget.json")):
        try:
            run = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"attn2d train-gan: {path} is not JSON ({err})") from None
        if not isinstance(run, dict) or run.get("kind") != KIND:
            continue
        run["dir"] = path.parent.relative_to(root).as_posix()
        check_pieces(run, str(path))
        runs.append(run)
    if not runs:
        raise ValueError(f"attn2d train-gan: --report {str(root)!r} holds no budget runs "
                         "(budget.json, written by train-gan --budget-minutes)")
    return runs


def stats(values: list[float]) -> Optional[dict]:
    """mean, sd (over seeds, n - 1; None for one seed), min, max and n; None for no values."""
    if not values:
        return None
    return {"mean": statistics.fmean(values),
            "sd": statistics.stdev(values) if len(values) > 1 else None,
            "min": min(values), "max": max(values), "n": len(values)}


def _setting_key(cfg: dict) -> tuple:
    return tuple(json.dumps(cfg.get(k, SETTING_DEFAULTS.get(k)), sort_keys=True)
                 for k in SETTING_KEYS)


def _cpu_clock(cfg: dict) -> bool:
    return cfg.get("clock", SETTING_DEFAULTS["clock"]) == "cpu"


def _slug(cfg: dict) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-",
                  f"res{cfg['res']}_attn{cfg['attn_res']}_{cfg['budget_minutes']:g}"
                  f"{'cpu' if _cpu_clock(cfg) else ''}min")


def _title(cfg: dict) -> str:
    q = cfg["attn_res"] ** 2
    g = max(1, cfg["attn_res"] // cfg["pool_kv"])
    return (f"{cfg['res']}x{cfg['res']} images, attention at {cfg['attn_res']}x{cfg['attn_res']} "
            f"({q:,} queries over {g}x{g} = {g * g:,} pooled keys), budget "
            f"{cfg['budget_minutes']:g} min of training{' (CPU time)' if _cpu_clock(cfg) else ''}")


def summarize(runs: list[dict]) -> list[dict]:
    """Runs grouped by setting, then by variant label; per fraction, each metric's stats over
    seeds, with the per-seed values kept."""
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        groups.setdefault(_setting_key(run["config"]), []).append(run)
    settings = []
    for members in groups.values():
        cfg = members[0]["config"]
        by_label: dict[str, list[dict]] = {}
        for run in members:
            seen = {r["seed"]: r["dir"] for r in by_label.get(run["label"], [])}
            if run["seed"] in seen:
                raise ValueError(f"attn2d train-gan: {run['label']} seed {run['seed']} is in "
                                 f"both {seen[run['seed']]} and {run['dir']}; keep one")
            by_label.setdefault(run["label"], []).append(run)
        variants = {}
        for label, seeds in by_label.items():
            seeds.sort(key=lambda r: r["seed"])
            rows = []
            for i, fraction in enumerate(cfg["eval_fractions"]):
                evals = [r["evals"][i] for r in seeds if len(r["evals"]) > i]
                row = {"fraction": fraction,
                       "train_seconds": stats([e["train_seconds"] for e in evals]),
                       "steps": stats([float(e["steps"]) for e in evals]),
                       "attention_share": stats([e["attention_share"] for e in evals
                                                 if e["attention_share"] is not None]),
                       "seconds_per_step": stats([e["seconds_per_step"] for e in evals
                                                  if e["seconds_per_step"] is not None]),
                       "per_seed": {str(r["seed"]): r["evals"][i] for r in seeds
                                    if len(r["evals"]) > i}}
                for m in METRICS:
                    row[m] = stats([_metric(e["metrics"], m) for e in evals])
                rows.append(row)
            shares = [r["attention_share"] for r in seeds if r["attention_share"] is not None]
            variants[label] = {
                "variant": seeds[0]["variant"], "seeds": [r["seed"] for r in seeds],
                "dirs": [r["dir"] for r in seeds],
                "complete": [bool(r["complete"]) for r in seeds],
                "steps": stats([float(r["steps"]) for r in seeds]),
                "train_seconds": stats([r["train_seconds"] for r in seeds]),
                "seconds_per_step": stats([r["seconds_per_step"] for r in seeds
                                           if r["seconds_per_step"] is not None]),
                "attention_share": stats(shares),
                "train_peak_bytes": stats([float(r["train_peak_bytes"]) for r in seeds]),
                "eval_seconds": stats([r["eval_seconds"] for r in seeds]),
                "overshoot_seconds": stats([r["overshoot_seconds"] for r in seeds]),
                "sittings": [len(r["sittings"]) for r in seeds],
                "memory": seeds[0]["memory"],
                "train_peak_excludes_eval": all(r["train_peak_excludes_eval"] for r in seeds),
                "attention": seeds[0]["attention"], "schedule": seeds[0]["schedule"],
                "final_patterns": [r.get("final_pattern") for r in seeds],
                "samples_final": {str(r["seed"]): f"{r['dir']}/{r['samples_final']}"
                                  for r in seeds if r.get("samples_final")},
                "fractions": rows}
        machines = sorted({json.dumps(s.get("machine", {}), sort_keys=True)
                           for run in members for s in run["sittings"]})
        settings.append({"title": _title(cfg), "slug": _slug(cfg), "config": cfg,
                         "machine": {k: members[0].get(k) for k in
                                     ("device", "device_name", "cpu", "threads", "cpus",
                                      "torch")},
                         "machines": [json.loads(m) for m in machines],
                         "variants": variants})
    settings.sort(key=lambda s: (s["config"]["res"], s["config"]["attn_res"],
                                 s["config"]["budget_minutes"]))
    return settings


_WINDOW = re.compile(r"Window\(size=(\d+), metric='(\w+)', dilation=(\d+)")


def pattern_words(description: str) -> str:
    """A recorded attention description in a few words: 'global', 'window 8', 'YLG (8 heads)'.
    The setting's heads and pooling are dropped (the section names them)."""
    text = re.sub(r", heads=\d+, pool_kv=\d+$", "", description or "")
    window = _WINDOW.match(text)
    if window:
        size, metric, dilation = window.groups()
        return (f"window {size}" + (f" ({metric})" if metric != "manhattan" else "")
                + (f" dilated {dilation}" if dilation != "1" else ""))
    if text.startswith("YLG("):
        heads = re.search(r"patterns=\[([^\]]*)\]", text)
        return f"YLG ({heads.group(1).count(',') + 1} heads)" if heads else "YLG"
    return text


def _attention_words(v: dict) -> str:
    """The attention a variant starts with, and where its seeds ended if that differs."""
    start = pattern_words(v["attention"])
    ends = sorted({pattern_words(p) for p in v["final_patterns"] if p})
    if not ends or ends == [start]:
        return start
    return f"{start} → {' / '.join(ends)}"


def _cell(s: Optional[dict], fmt: str = "{:.2f}", scale: float = 1.0) -> str:
    """mean (min-max) over seeds, with the seed count where not all seeds reached it."""
    if s is None:
        return "-"

    def f(v: float) -> str:
        return fmt.format(v * scale)

    return f(s["mean"]) if s["n"] == 1 else f"{f(s['mean'])} ({f(s['min'])}–{f(s['max'])})"


def _mib(s: Optional[dict]) -> str:
    return "-" if s is None else _cell(s, "{:.0f}", 1 / 2**20) + " MiB"


def plot(setting: dict, path: Path, reference: Optional[dict] = None) -> Path:
    """FID against training minutes, one line per variant (mean over seeds) with its min-max
    band; the real-vs-real floor dashed where known."""
    from .. import _tools

    _tools.require("attn2d train-gan --report's plot", "matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, v in setting["variants"].items():
        rows = [r for r in v["fractions"] if r["fid"] is not None]
        if not rows:
            continue
        x = [r["train_seconds"]["mean"] / 60 for r in rows]
        n = len(v["seeds"])
        line, = ax.plot(x, [r["fid"]["mean"] for r in rows], marker="o", ms=3,
                        label=f"{label} ({n} seed{'s' if n > 1 else ''})")
        ax.fill_between(x, [r["fid"]["min"] for r in rows], [r["fid"]["max"] for r in rows],
                        color=line.get_color(), alpha=0.2, linewidth=0)
    if reference is not None:
        ax.axhline(reference["fid"], color="0.4", linestyle="--", linewidth=1,
                   label="real vs real (floor)")
    ax.set_xlabel("training time (min; evaluation excluded)")
    ax.set_ylabel("FID (lower is better)")
    ax.set_title(textwrap.fill(setting["title"], 100), fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _reference_for(root: Path, cfg: dict, log: Callable[[str], None]) -> Optional[dict]:
    """The real-vs-real floor for a setting's data and sample counts, computed once and kept in
    root/reference.json."""
    from .train import TrainConfig, real_reference

    key = json.dumps({k: cfg.get(k) for k in ("data", "res", "data_limit", "eval_samples",
                                              "swd_samples", "seed")}, sort_keys=True)
    cache_path = root / REFERENCE_JSON
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    if key not in cache:
        log(f"real-vs-real reference for {cfg['res']}x{cfg['res']} ...")
        fields = {k: cfg[k] for k in ("data", "res", "data_limit", "eval_samples", "swd_samples",
                                      "seed")}
        cache[key] = real_reference(TrainConfig(**fields))
        _atomic_write(cache_path, json.dumps(cache, indent=1))
    return cache[key]


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _markdown(settings: list[dict], references: dict) -> str:
    lines = ["# attn2d train-gan: attention under a fixed compute budget", "",
             "Each run trains for a fixed number of minutes of training steps (evaluation, "
             "sample grids and checkpoints are timed apart and not counted) and is evaluated at "
             "fixed fractions of that budget. Cells are the mean over seeds with the min–max "
             "range in parentheses (the standard deviation is in "
             f"{REPORT_JSON}). FID and KID are over the 128-d features of attn2d's Fashion-MNIST "
             "classifier, which sees images at 32x32 (larger ones are resized with "
             "antialiasing); SWD (x1e3) is ProGAN's sliced Wasserstein distance on Laplacian-"
             "pyramid 7x7 patches at the images' own size. Lower is better for all three. "
             "Attention share: the time inside the attention blocks of G and D (forward and "
             "backward, timed by hooks around each block) over the training time. Peak memory "
             "is that of the training stretches, evaluations excluded.", ""]
    for s in settings:
        cfg, machine = s["config"], s["machine"]
        ref = references.get(s["slug"])
        where = (machine.get("device_name") or machine.get("cpu")
                 or f"{machine.get('cpus')} CPUs")
        clock = ("the process's CPU time in the training steps" if _cpu_clock(cfg)
                 else "wall-clock time of the training steps")
        lines += [f"## {s['title']}", "",
                  f"Data: {cfg['data'] or 'Fashion-MNIST'}; batch {cfg['batch']}; width "
                  f"{cfg['width']}; {cfg['heads']} heads; keys pooled {cfg['pool_kv']}x; "
                  f"evaluated at {', '.join(f'{f:g}' for f in cfg['eval_fractions'])} of the "
                  f"budget on {cfg['eval_samples']} samples (SWD {cfg['swd_samples']}). "
                  f"The budget's clock: {clock}. "
                  f"Machine: {where}, torch threads {machine.get('threads')}, torch "
                  f"{machine.get('torch')}.", ""]
        if len(s["machines"]) > 1:
            lines += ["**The runs (or their sittings) ran on different machines or thread "
                      "counts; their times per step do not compare:** "
                      + "; ".join(", ".join(f"{k} {v}" for k, v in m.items())
                                  for m in s["machines"]) + ".", ""]
        memory = "RSS" if all(v["memory"] == "rss" for v in s["variants"].values()) else "CUDA"
        lines += [f"| variant | attention | seeds | steps | s/step | attention share | peak "
                  f"train {memory} | eval time | final FID | final KID | final SWD |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for label, v in s["variants"].items():
            last = v["fractions"][-1]
            incomplete = sum(1 for c in v["complete"] if not c)
            seeds = ", ".join(str(x) for x in v["seeds"]) + (
                f" ({incomplete} run{'s' if incomplete > 1 else ''} not finished)" if incomplete
                else "")
            lines.append(
                f"| {label} | {_attention_words(v)} | {seeds} | {_cell(v['steps'], '{:.0f}')} | "
                f"{_cell(v['seconds_per_step'], '{:.3f}')} | "
                f"{_cell(v['attention_share'], '{:.0f}%', 100)} | {_mib(v['train_peak_bytes'])} | "
                f"{_cell(v['eval_seconds'], '{:.0f}')} s | {_cell(last['fid'])} | "
                f"{_cell(last['kid'], '{:.3f}')} | {_cell(last['swd'])} |")
        if ref is not None:
            lines.append(f"| real vs real (floor) | - | - | - | - | - | - | - | {ref['fid']:.2f} | "
                         f"{ref['kid']:.3f} | {ref['swd']['mean']:.2f} |")
        lines += ["", f"![FID against training time](fid_vs_time_{s['slug']}.png)", ""]
        for label, v in s["variants"].items():
            lines += [f"### {label}", "", f"Schedule: {v['schedule']}.", "",
                      "| fraction | training min | steps | FID | KID | SWD | s/step since the "
                      "last | attention share since the last |",
                      "|---|---|---|---|---|---|---|---|"]
            for r in v["fractions"]:
                lines.append(
                    f"| {r['fraction']:g} | {_cell(r['train_seconds'], '{:.2f}', 1 / 60)} | "
                    f"{_cell(r['steps'], '{:.0f}')} | {_cell(r['fid'])} | "
                    f"{_cell(r['kid'], '{:.3f}')} | {_cell(r['swd'])} | "
                    f"{_cell(r['seconds_per_step'], '{:.3f}')} | "
                    f"{_cell(r['attention_share'], '{:.0f}%', 100)} |")
            lines.append("")
        lines += ["### Samples (fixed noise, end of the budget)", "",
                  "| variant | " + " | ".join(f"seed {x}" for x in _all_seeds(s)) + " |",
                  "|---|" + "---|" * len(_all_seeds(s))]
        for label, v in s["variants"].items():
            cells = [f"![{label} seed {x}]({v['samples_final'][str(x)]})"
                     if str(x) in v["samples_final"] else "-" for x in _all_seeds(s)]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def _all_seeds(setting: dict) -> list[int]:
    return sorted({x for v in setting["variants"].values() for x in v["seeds"]})


def write(root: str | os.PathLike, reference: bool = True,
          log: Callable[[str], None] = print) -> Path:
    """Merge every budget run under root into root/budget_report.md, root/budget_report.json
    and root/fid_vs_time_<setting>.png; returns the markdown's path. reference=False leaves out
    the real-vs-real floor (which loads the training set and computes FID once per setting)."""
    if not isinstance(reference, bool):
        raise TypeError(f"attn2d train-gan: reference must be True or False; got {reference!r}")
    runs = load_runs(root)
    root = Path(root)
    settings = summarize(runs)
    references = {}
    for s in settings:
        if reference:
            ref = _reference_for(root, s["config"], log)
            if ref is not None:
                references[s["slug"]] = ref
        s["plot"] = plot(s, root / f"fid_vs_time_{s['slug']}.png",
                         references.get(s["slug"])).name
        s["reference"] = references.get(s["slug"])
    _atomic_write(root / REPORT_JSON, json.dumps({"settings": settings}, indent=1))
    path = root / REPORT_MD
    _atomic_write(path, _markdown(settings, references))
    log(f"budget report: {path}")
    return path

