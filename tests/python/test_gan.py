"""attn2d.gan: schedules, data readers, metrics, the shipped classifier, and train-gan runs
(every variant for a few steps, exact resume, the CLI report, torchrun with gloo)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from attn2d import patterns
from attn2d.gan import data, metrics, schedules
from attn2d.gan.train import VARIANTS, TrainConfig, train_variant

HAVE_FMNIST = Path(data.FASHION_MNIST_DIR, "train-images-idx3-ubyte.gz").exists()
needs_fmnist = pytest.mark.skipif(not HAVE_FMNIST, reason="dataset-fashion-mnist not installed")

# ---------------------------------------------------------------------------------------------
# Schedules


def test_progressive_window_grows_over_thirds():
    s = schedules.ProgressiveWindow(total_steps=300, sizes=(8, 16, 24))
    sizes = [s.pattern(t).size for t in (0, 99, 100, 199, 200, 299, 300, 10_000)]
    assert sizes == [8, 8, 16, 16, 24, 24, 24, 24]
    assert s.pattern(0) == patterns.Window(8, metric="manhattan")
    assert s.window_sizes() == (8, 16, 24)


def test_plateau_window_raises_size_when_metric_stalls_then_global():
    s = schedules.PlateauWindow(sizes=(4, 6), patience=2, min_delta=0.01, then_global=True)
    assert s.pattern(0).size == 4
    for v in (50.0, 40.0, 39.9, 39.95):  # two observations without a 1% gain
        s.observe(0, v)
    assert s.pattern(0).size == 6
    s.observe(0, 30.0)
    assert s.pattern(0).size == 6
    s.observe(0, 31.0)
    s.observe(0, 30.0)
    assert s.pattern(0) is None
    state = s.state_dict()
    fresh = schedules.PlateauWindow(sizes=(4, 6), patience=2, min_delta=0.01, then_global=True)
    fresh.load_state_dict(state)
    assert fresh.pattern(0) is None and fresh.history == s.history


def test_plateau_window_stays_on_last_size_without_then_global():
    s = schedules.PlateauWindow(sizes=(4,), patience=1)
    for v in (5.0, 6.0, 7.0, 8.0):
        s.observe(0, v)
    assert s.pattern(0).size == 4


def test_mixed_is_local_then_global():
    s = schedules.Mixed(total_steps=100, local=patterns.Window(5, metric="manhattan"),
                        local_fraction=0.3)
    assert s.pattern(0) == patterns.Window(5, metric="manhattan")
    assert s.pattern(29) == patterns.Window(5, metric="manhattan")
    assert s.pattern(30) is None and s.pattern(99) is None
    nested = schedules.Mixed(total_steps=100, local=schedules.ProgressiveWindow(50, (3, 5)))
    assert [nested.pattern(t) and nested.pattern(t).size for t in (0, 25, 49, 50)] == [3, 5, 5,
                                                                                         None]


@pytest.mark.parametrize("make, match", [
    (lambda: schedules.ProgressiveWindow(0), "total_steps"),
    (lambda: schedules.ProgressiveWindow(10, sizes=()), "sizes"),
    (lambda: schedules.ProgressiveWindow(10, sizes=(8, 4)), "decrease"),
    (lambda: schedules.ProgressiveWindow(10, metric="taxicab"), "metric"),
    (lambda: schedules.PlateauWindow(patience=0), "patience"),
    (lambda: schedules.PlateauWindow(min_delta=1.5), "min_delta"),
    (lambda: schedules.Mixed(10, local_fraction=2.0), "local_fraction"),
])
def test_schedule_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# ---------------------------------------------------------------------------------------------
# Data


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I",
                                                                   *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_read_idx_roundtrip_and_bad_magic(tmp_path):
    a = np.arange(2 * 3 * 5, dtype=np.uint8).reshape(2, 3, 5)
    _write_idx(tmp_path / "x.gz", a)
    np.testing.assert_array_equal(data.read_idx(tmp_path / "x.gz"), a)
    (tmp_path / "bad").write_bytes(b"\x00\x00\x0d\x01" + b"\x00" * 8)
    with pytest.raises(ValueError, match="unsigned-byte"):
        data.read_idx(tmp_path / "bad")
    (tmp_path / "short").write_bytes(struct.pack(">HBB", 0, 8, 1) + struct.pack(">I", 9) + b"x")
    with pytest.raises(ValueError, match="header"):
        data.read_idx(tmp_path / "short")


def test_folder_of_images(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(
            tmp_path / f"{i}.png")
    imgs = data.load_training_images(str(tmp_path), 8)
    assert imgs.shape == (3, 3, 8, 8) and imgs.dtype == torch.uint8
    with pytest.raises(ValueError, match="not a folder"):
        data.load_training_images(str(tmp_path / "missing"), 8)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no images"):
        data.load_folder(tmp_path / "empty")


@needs_fmnist
def test_fashion_mnist_shapes():
    x, y = data.load_fashion_mnist("test")
    assert x.shape == (10000, 1, 28, 28) and y.shape == (10000,)
    assert int(y.min()) == 0 and int(y.max()) == 9
    with pytest.raises(ValueError, match="split"):
        data.load_fashion_mnist("valid")


# ---------------------------------------------------------------------------------------------
# Metrics


def test_frechet_distance_matches_closed_form():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(20000, 4, generator=g, dtype=torch.float64)
    b = torch.randn(20000, 4, generator=g, dtype=torch.float64) * 2 + 1
    # N(0, I) vs N(1, 4I) in 4-d: |mu|^2 + tr(I + 4I - 2*2I) = 4 + 4 * (1 + 4 - 4) = 8.
    assert metrics.frechet_distance(a, b) == pytest.approx(8.0, rel=0.05)
    assert metrics.frechet_distance(a, a) == pytest.approx(0.0, abs=1e-8)


def test_kid_is_near_zero_for_one_distribution_and_positive_for_two():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(2000, 8, generator=g, dtype=torch.float64)
    b = torch.randn(2000, 8, generator=g, dtype=torch.float64)
    c = b + 0.5
    same = metrics.kernel_inception_distance(a, b, subsets=5, subset_size=1000)
    diff = metrics.kernel_inception_distance(a, c, subsets=5, subset_size=1000)
    assert abs(same) < 0.01 < diff


def test_swd_separates_noise_from_images():
    g = torch.Generator().manual_seed(2)
    # Smooth "images" (blurred noise) against white noise. Two sets of 256 images x 128 patches
    # from one distribution measure ~15 (sampling noise); the two distributions ~79 (5.3x).
    base = torch.nn.functional.avg_pool2d(torch.rand(512, 1, 36, 36, generator=g), 5, 1)
    base = (base - base.mean()) / base.std() * 0.5
    real, real2 = base[:256], base[256:]
    noise = torch.rand(256, 1, 32, 32, generator=g) * 2 - 1
    same = metrics.swd(real, real2, per_image=128)
    diff = metrics.swd(real, noise, per_image=128)
    assert set(same) == {"32x32", "16x16", "mean"}
    assert diff["mean"] > 4 * same["mean"]
    with pytest.raises(ValueError, match="same"):
        metrics.swd(real, noise[:, :, :16, :16])
    with pytest.raises(TypeError, match="floating"):
        metrics.swd(real, (noise * 100).to(torch.int32))


def test_laplacian_pyramid_reconstructs_the_image():
    x = torch.rand(2, 1, 32, 32, dtype=torch.float64)
    levels = metrics.laplacian_pyramid(x, min_res=8)
    assert [lv.shape[-1] for lv in levels] == [32, 16, 8]
    rec = levels[-1]
    for band in reversed(levels[:-1]):
        rec = metrics._pyr_up(rec) + band
    torch.testing.assert_close(rec, x)


@needs_fmnist
def test_shipped_classifier_accuracy():
    from attn2d.gan import classifier

    x, y = data.load_fashion_mnist("test")
    xf = data.to_float(data.resize_uint8(x[:2000], 32))
    acc = classifier.accuracy(classifier.load(), xf, y[:2000])
    assert acc >= 0.88, acc


# ---------------------------------------------------------------------------------------------
# Training


@pytest.mark.parametrize("attn_res", [4, 8, 16, 32, 64])
def test_attention_sits_at_the_chosen_map_in_both_networks(attn_res):
    from attn2d.gan.models import Discriminator, GANConfig, Generator, attention_blocks

    cfg = GANConfig(res=64, width=8, attn_res=attn_res)
    G, D = Generator(cfg), Discriminator(cfg)
    seen = {}

    def record(name):
        def hook(module, args, output):
            seen[name] = tuple(output.shape[-2:])
        return hook

    for name, model in (("G", G), ("D", D)):
        (block,) = attention_blocks(model)
        block.register_forward_hook(record(name))
    with torch.no_grad():
        D(G(torch.randn(2, cfg.z_dim)))
    assert seen == {"G": (attn_res, attn_res), "D": (attn_res, attn_res)}


def _tiny(tmp_path, variant: str, **kw) -> TrainConfig:
    base = dict(variant=variant, steps=3, batch=4, res=8, width=8, attn_res=8, heads=4,
                data_limit=128, out=str(tmp_path), sample_every=2, ckpt_every=2,
                eval_samples=32, swd_samples=16, log_every=1)
    base.update(kw)
    return TrainConfig(**base)


@needs_fmnist
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_trains_a_few_steps(tmp_path, variant):
    cfg = _tiny(tmp_path, variant, eval_every=2 if variant == "plateau" else 0)
    result = train_variant(cfg, log=lambda s: None, progress=False)
    assert result["steps"] == 3
    out = tmp_path / variant
    assert (out / "checkpoint.pt").exists() and (out / "samples_final.png").exists()
    assert (out / "samples_000002.png").exists()
    m = result["metrics"]
    assert all(np.isfinite([m["fid"], m["kid"], m["swd"]["mean"]]))
    assert json.loads((out / "result.json").read_text())["variant"] == variant


@needs_fmnist
def test_schedule_changes_the_blocks_pattern(tmp_path):
    cfg = _tiny(tmp_path, "mixed", steps=4)
    logs = []
    result = train_variant(cfg, log=logs.append, progress=False)
    assert result["final_pattern"] == "global"
    assert any("attention -> global" in line for line in logs)


@needs_fmnist
def test_resume_continues_exactly(tmp_path):
    straight = _tiny(tmp_path / "a", "ylg", steps=4, ckpt_every=2)
    train_variant(straight, log=lambda s: None, progress=False)
    first = _tiny(tmp_path / "b", "ylg", steps=2, ckpt_every=2)
    train_variant(first, log=lambda s: None, progress=False)
    logs = []
    train_variant(dataclasses.replace(first, steps=4, resume=True), log=logs.append,
                  progress=False)
    assert any("resumed" in line and "step 2" in line for line in logs)
    a = torch.load(tmp_path / "a" / "ylg" / "checkpoint.pt", weights_only=False)
    b = torch.load(tmp_path / "b" / "ylg" / "checkpoint.pt", weights_only=False)
    assert a["step"] == b["step"] == 4
    for part in ("G", "D"):
        for name, t in a[part].items():
            assert torch.equal(t, b[part][name]), f"{part}.{name} differs after resume"


@needs_fmnist
def test_resume_past_a_schedule_change_continues_exactly(tmp_path):
    # Progressive windows (2, 2, 3) over 6 steps: size 3 from step 4. The blocks of a run
    # resumed at step 5 are built with the first size and must be moved to the third.
    straight = _tiny(tmp_path / "a", "progressive", steps=6, ckpt_every=5)
    train_variant(straight, log=lambda s: None, progress=False)
    first = _tiny(tmp_path / "b", "progressive", steps=5, ckpt_every=5)
    train_variant(first, log=lambda s: None, progress=False)
    logs = []
    result = train_variant(dataclasses.replace(first, steps=6, resume=True), log=logs.append,
                           progress=False)
    assert any("step 5: attention -> Window(size=3" in line for line in logs)
    assert "size=3" in result["final_pattern"]
    a = torch.load(tmp_path / "a" / "progressive" / "checkpoint.pt", weights_only=False)
    b = torch.load(tmp_path / "b" / "progressive" / "checkpoint.pt", weights_only=False)
    for part in ("G", "D"):
        for name, t in a[part].items():
            assert torch.equal(t, b[part][name]), f"{part}.{name} differs after resume"


@needs_fmnist
def test_bf16_and_gradient_checkpointing(tmp_path):
    cfg = _tiny(tmp_path, "ylg", bf16=True, grad_checkpoint=True, steps=2)
    result = train_variant(cfg, log=lambda s: None, progress=False)
    assert np.isfinite(result["metrics"]["fid"])


@needs_fmnist
@pytest.mark.parametrize("variant,kw", [
    ("global", dict(r1=10.0, r1_every=2)),
    ("ylg", dict(gp=10.0)),
    ("global", dict(r1=10.0, r1_every=1, bf16=True, grad_checkpoint=True)),
], ids=["r1", "wgan-gp ylg", "r1 bf16 checkpointed"])
def test_gradient_penalties_train_and_are_recorded(tmp_path, variant, kw):
    cfg = _tiny(tmp_path, variant, steps=4, **kw)
    result = train_variant(cfg, log=lambda s: None, progress=False)
    logged = [h for h in result["history"] if "d_loss" in h]
    key = "r1" if kw.get("r1") else "gp"
    assert logged and all(np.isfinite(h[key]) and h[key] > 0 for h in logged)
    assert np.isfinite(result["metrics"]["fid"])


def test_r1_penalty_matches_its_definition():
    from attn2d.gan.train import gradient_penalty, r1_penalty

    D = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.Tanh(), torch.nn.Flatten(),
                            torch.nn.Linear(2 * 4 * 4, 1)).double()
    x = torch.randn(3, 1, 6, 6, dtype=torch.float64)
    per_image = [torch.autograd.functional.jacobian(lambda t: D(t[None])[0, 0], x[i])
                 for i in range(3)]
    want = sum(j.square().sum() for j in per_image) / 3
    assert torch.allclose(r1_penalty(D, x).double(), want, rtol=1e-6)
    fake = torch.randn_like(x)
    t = torch.rand(3, 1, 1, 1, generator=torch.Generator().manual_seed(0)).double()
    mixed = t * x + (1 - t) * fake
    norms = [torch.autograd.functional.jacobian(lambda m: D(m[None])[0, 0], mixed[i]).norm()
             for i in range(3)]
    want = sum((n - 1) ** 2 for n in norms) / 3
    got = gradient_penalty(D, x, fake, torch.Generator().manual_seed(0))
    assert torch.allclose(got.double(), want, rtol=1e-6)


@pytest.mark.parametrize("kw,match", [(dict(r1=-1.0), "r1"), (dict(gp=float("nan")), "gp"),
                                      (dict(r1_every=0), "r1_every")])
def test_bad_penalty_settings_are_refused(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        _tiny(tmp_path, "global", **kw).check()


def _cli(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "attn2d.cli", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


TINY_ARGS = ["--steps", "2", "--batch", "4", "--res", "8", "--width", "8", "--attn-res", "8",
             "--data-limit", "128", "--eval-samples", "32", "--swd-samples", "16",
             "--sample-every", "2", "--ckpt-every", "2"]


@needs_fmnist
def test_cli_report_compares_variants(tmp_path):
    r = _cli("train-gan", "--variants", "global,ylg", "--out", str(tmp_path), *TINY_ARGS)
    assert r.returncode == 0, r.stderr
    report = (tmp_path / "report.md").read_text()
    for needle in ("| global |", "| ylg |", "real train images", "FID", "SWD", "peak RSS",
                   "ylg / global"):
        assert needle in report
    data_json = json.loads((tmp_path / "report.json").read_text())
    assert [r["variant"] for r in data_json["results"]] == ["global", "ylg"]
    assert all(r["peak_rss_bytes"] > 0 for r in data_json["results"])


@pytest.mark.parametrize("args, match", [
    (["--variants", "sparse"], "variant"),
    (["--steps", "0"], "steps"),
    (["--attn-res", "6"], "attn_res"),
    (["--window-sizes", "a,b"], "window-sizes"),
    (["--lr-g", "-1"], "lr_g"),
    (["--variants", "window", "--window-sizes", "40"], "dilation"),
])
def test_cli_bad_arguments(tmp_path, capsys, args, match):
    from attn2d.cli import main

    code = main(["train-gan", "--out", str(tmp_path), "--res", "8", "--width", "8",
                 "--attn-res", "8", "--data-limit", "16", "--steps", "1", *args])
    assert code == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "report.md").exists()


@needs_fmnist
def test_torchrun_two_processes_gloo(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         "--nproc_per_node=2", "-m", "attn2d.cli", "train-gan", "--variants", "ylg",
         "--out", str(tmp_path), "--no-reference", *TINY_ARGS],
        capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((tmp_path / "ylg" / "result.json").read_text())
    assert result["world_size"] == 2 and result["steps"] == 2
    assert (tmp_path / "report.md").exists()
