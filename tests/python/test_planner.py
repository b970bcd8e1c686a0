"""The planner's memory model against memory measured on this CPU (peak RSS growth in a fresh
subprocess), and its command line.

Bounds: the unfused (original) blocks within 15% of the measurement; attn2d within 25%. The model
is of activations; the measurement is of a warm (second) training step, as the model's."""

from __future__ import annotations

import json

import pytest

from attn2d import planner
from attn2d.cli import main as cli_main
from attn2d.memory import measure

PROGAN_BLOCKS = {b.kind: b for b in planner.progan_blocks(64)}
BLOCK_NAMES = {"tokens": "SelfAttention", "conv": "SelfAttention2"}
CASES = [  # (block kind, implementation, resolution)
    ("conv", "original", 48), ("conv", "original", 64), ("conv", "original", 96),
    ("tokens", "original", 48), ("tokens", "original", 64),
    ("conv", "attn2d", 64), ("conv", "attn2d", 128),
    ("tokens", "attn2d", 64), ("tokens", "attn2d", 128),
]


def predicted_on_cpu(kind: str, impl: str, res: int) -> float:
    implementation = "pytorch-unfused" if impl == "original" else "attn2d-global"
    est = planner.estimate(PROGAN_BLOCKS[kind], planner.Setting(res, res), implementation)
    return est.memory_bytes


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{BLOCK_NAMES[c[0]]}-{c[1]}-{c[2]}")
def test_model_matches_measured_memory(case):
    kind, impl, res = case
    measured = measure(dict(block=BLOCK_NAMES[kind], impl=impl, res=res, channels=64, batch=1))
    got = measured["peak_above_baseline_bytes"]
    want = predicted_on_cpu(kind, impl, res)
    bound = 0.15 if impl == "original" else 0.25
    print(f"\n{BLOCK_NAMES[kind]} {impl} {res}x{res}: predicted {want / 2**20:.1f} MiB, "
          f"measured {got / 2**20:.1f} MiB")
    assert abs(got - want) <= bound * got, (want / 2**20, got / 2**20)


def test_acceptance_command_says_progan_blocks_fit_only_with_attn2d(capsys):
    assert cli_main(["plan", "--res", "256", "--channels", "64", "--gpu", "rtx3090"]) == 0
    out = capsys.readouterr().out
    assert out.count("| pytorch-unfused | ") == 2
    for line in out.splitlines():
        if line.startswith("| pytorch-unfused |"):
            assert "| NO |" in line and "GiB" in line
        if line.startswith("| attn2d-global |"):
            assert "| yes |" in line
    assert out.count("Recommendation: attn2d-global") == 2
    assert "does not fit" in out


def test_json_output_has_every_implementation(capsys):
    assert cli_main(["plan", "--res", "128", "--block", "sagan", "--batch", "4", "--json",
                     "--gpu", "t4"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data) == 1
    names = [e["implementation"] for e in data[0]["estimates"]]
    assert names == list(planner.IMPLEMENTATIONS)
    for e in data[0]["estimates"]:
        assert e["memory_bytes"] > 0 and e["flops"] > 0 and isinstance(e["fits"], bool)


def test_quadratic_and_linear_scaling():
    block = PROGAN_BLOCKS["conv"]
    small, big = (planner.estimate(block, planner.Setting(r, r), "pytorch-unfused").memory_bytes
                  for r in (64, 128))
    assert 14 < big / small <= 16  # N^2: 16x, less the linear part
    small, big = (planner.estimate(block, planner.Setting(r, r), "attn2d-global").memory_bytes
                  for r in (64, 128))
    assert big / small == pytest.approx(4.0)
    two = planner.estimate(block, planner.Setting(64, 64, batch=2), "pytorch-unfused")
    one = planner.estimate(block, planner.Setting(64, 64, batch=1), "pytorch-unfused")
    assert two.memory_bytes == pytest.approx(2 * one.memory_bytes)
    fp16 = planner.estimate(block, planner.Setting(64, 64, dtype="fp16"), "pytorch-unfused")
    assert fp16.memory_bytes == pytest.approx(one.memory_bytes / 2)


def test_recommends_the_cheapest_fitting_option_when_global_does_not_fit():
    block = PROGAN_BLOCKS["tokens"]
    p = planner.plan(block, planner.Setting(256, 256, batch=64), memory_gib=10)
    by = {e.implementation: e for e in p.estimates}
    assert not by["attn2d-global"].fits and by["attn2d-downsampled"].fits
    assert p.recommendation.startswith("attn2d-downsampled")
    assert by["attn2d-global"].max_batch == int(p.usable_bytes // by["attn2d-global"].per_sample_bytes)


def test_reference_tables_are_computed(capsys):
    assert cli_main(["plan", "--tables", "resolution,hardware"]) == 0
    out = capsys.readouterr().out
    for name, _ in planner.DEVICES.values():
        assert name in out
    assert "| 256x256 | 2 |" in out
    assert out.index("| resolution |") < out.index("| device |")


@pytest.mark.parametrize("tables,present,absent", [
    ("resolution", "| resolution |", "| device |"),
    ("hardware", "| device |", "| resolution |"),
])
def test_reference_tables_are_selected(tables, present, absent, capsys):
    assert cli_main(["plan", "--tables", tables]) == 0
    out = capsys.readouterr().out
    assert present in out and absent not in out
    assert planner.reference_tables(64, (tables,)) == out.rstrip("\n")


def test_reference_tables_default_to_both():
    assert planner.reference_tables(64) == planner.reference_tables(64, ("resolution", "hardware"))
    with pytest.raises(ValueError, match="tables"):
        planner.reference_tables(64, ("memory",))


@pytest.mark.parametrize("tables", ["memory", "resolution,gpu", ""])
def test_unknown_tables_are_an_argparse_error_naming_the_option(tables, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["plan", "--tables", tables])
    assert exit_info.value.code == 2
    assert "--tables" in capsys.readouterr().err


def test_plan_without_res_or_tables_says_which_is_needed(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["plan"])
    assert exit_info.value.code == 2
    assert "--res is required (or --tables)" in capsys.readouterr().err


def test_progan_block_is_the_default_and_named(capsys):
    assert cli_main(["plan", "--res", "64", "--block", "progan"]) == 0
    named = capsys.readouterr().out
    assert cli_main(["plan", "--res", "64"]) == 0
    assert capsys.readouterr().out == named
    assert named.count("ProGAN SelfAttention") == 2


@pytest.mark.parametrize("argv,word", [
    (["plan", "--res", "0"], "height"),
    (["plan", "--res", "-4"], "height"),
    (["plan", "--res", "64", "--batch", "0"], "batch"),
    (["plan", "--res", "64", "--gpu", "gtx480"], "unknown device"),
    (["plan", "--res", "64", "--memory", "-1"], "memory"),
    (["plan", "--res", "64", "--block", "custom", "--heads", "3"], "heads"),
    (["plan", "--res", "64", "--channels", "30", "--block", "custom", "--heads", "4",
      "--qk-channels", "8", "--v-channels", "8"], "heads"),
    (["plan", "--res", "64", "--dtype", "int8"], "dtype"),
    (["plan", "--res", "64", "--pattern", "window:0"], "window"),
    (["plan", "--res", "64", "--pattern", "window:5:taxicab"], "metric"),
])
def test_bad_input_is_a_clear_error(argv, word, capsys):
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "error" in err and word in err
