"""`--device` on `attn2d demo`, `bench` and `train-gan`: cpu by default; cuda where torch sees no
CUDA device is refused at once, naming the option, before any work starts."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attn2d.cli import main as cli_main

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")


@no_cuda
@pytest.mark.parametrize("command", [
    ["demo"], ["bench"], ["bench", "--patterns"], ["bench", "--quick", "--no-memory"],
    ["train-gan", "--steps", "1"]])
def test_cuda_without_a_cuda_device_is_a_clear_error(command, tmp_path, capsys):
    out = tmp_path / "report"
    assert cli_main([*command, "--device", "cuda", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"attn2d {command[0]}: error: --device cuda: torch sees no CUDA device" in err
    assert not out.exists()  # refused before any work


@pytest.mark.parametrize("command", ["demo", "bench", "train-gan"])
def test_device_must_be_cpu_or_cuda(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main([command, "--device", "tpu"])
    assert exit_info.value.code == 2
    assert "--device" in capsys.readouterr().err


@no_cuda
def test_library_entry_points_refuse_cuda_without_a_device(tmp_path):
    from attn2d import bench_cuda, demo
    from attn2d.gan.train import TrainConfig

    with pytest.raises(ValueError, match="--device cuda: torch sees no CUDA device"):
        bench_cuda.run(str(tmp_path), cases=[], device="cuda", log=lambda line: None)
    with pytest.raises(ValueError, match="--device cuda: torch sees no CUDA device"):
        demo.run(str(tmp_path), log=lambda line: None, device="cuda")
    with pytest.raises(ValueError, match="--device cuda: torch sees no CUDA device"):
        TrainConfig(device="cuda").check()


def test_library_entry_points_name_a_bad_device(tmp_path):
    from attn2d import bench_cuda, demo
    from attn2d.gan.train import TrainConfig

    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda'; got 'tpu'"):
        bench_cuda.run(str(tmp_path), cases=[], device="tpu", log=lambda line: None)
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda'; got 'tpu'"):
        demo.run(str(tmp_path), log=lambda line: None, device="tpu")
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda'; got 'tpu'"):
        dataclasses.replace(TrainConfig(), device="tpu").check()


def test_train_gan_defaults_to_the_cpu():
    from attn2d.gan.train import TrainConfig, torch_device

    assert TrainConfig().device == "cpu"
    assert torch_device(TrainConfig()) == torch.device("cpu")
