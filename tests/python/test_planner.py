"""The planner's memory model against memory measured on this CPU (peak RSS growth in a fresh
subprocess), and its command line.

Bounds: the unfused (original) blocks within 15% of the measurement; attn2d within 25%. The model
is of activations; the measurement is of a warm (second) training step, as the model's."""

from __future__ import annotations

import json

import pytest
import torch

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


# SAGAN's attention as the reference tables take it: q/k C/8, v C, so E=8 and Ev=64 at C=64.
SAGAN_E8_EV64 = planner.Block("SAGAN block (q/k C/8, v C)", "conv", 64, v_channels=64)
VIT_BLOCK = planner.Block("ViT-B/16 block", "tokens", 768, heads=12)  # E = Ev = 64


@pytest.mark.parametrize("res", [64, 128])
def test_gpu_plan_lists_sdpa_rows_and_recommends_triton_for_sagan_widths(res):
    p = planner.plan(SAGAN_E8_EV64, planner.Setting(res, res, batch=8), device="rtx3090")
    by = {e.implementation: e for e in p.estimates}
    assert list(by) == list(planner.IMPLEMENTATIONS)
    for runs in ("sdpa-mem-efficient", "sdpa-math", "attn2d-global", "pytorch-unfused"):
        assert by[runs].available and by[runs].note == "", runs
    flash = by["sdpa-flash"]
    assert not flash.available and "equal head widths" in flash.note
    assert "E=8, Ev=64" in flash.note
    assert not by["sdpa-cudnn"].available
    # mem-efficient is O(N) like attn2d; the math path stores the N x M scores.
    assert by["sdpa-mem-efficient"].memory_bytes < 1.1 * by["attn2d-global"].memory_bytes
    assert by["sdpa-math"].memory_bytes > 10 * by["sdpa-mem-efficient"].memory_bytes
    assert p.recommendation.startswith("attn2d-global: attn2d's Triton kernels, the fastest")
    assert "sdpa-flash and sdpa-cudnn refuse" in p.recommendation
    assert "sdpa-mem-efficient also runs" in p.recommendation


def test_mem_efficient_row_is_linear_in_the_pixels():
    small, big = (planner.estimate(SAGAN_E8_EV64, planner.Setting(r, r), "sdpa-mem-efficient")
                  for r in (64, 128))
    assert big.memory_bytes / small.memory_bytes == pytest.approx(4.0)


def test_gpu_plan_command_for_sagan_widths(capsys):
    assert cli_main(["plan", "--res", "128", "--block", "custom", "--channels", "64",
                     "--gpu", "rtx3090"]) == 0
    out = capsys.readouterr().out
    rows = {line.split(" | ")[0].lstrip("| "): line for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| implementation")}
    assert rows["sdpa-mem-efficient"].startswith("| sdpa-mem-efficient | yes |")
    assert rows["sdpa-math"].startswith("| sdpa-math | yes |")
    assert rows["attn2d-global"].startswith("| attn2d-global | yes |")
    assert rows["sdpa-flash"].startswith("| sdpa-flash | no |")
    assert "got E=8, Ev=64" in rows["sdpa-flash"]
    assert "sm86" in out
    assert "Recommendation: attn2d-global: attn2d's Triton kernels" in out


def test_vit_block_in_fp16_is_recommended_sdpa_flash():
    p = planner.plan(VIT_BLOCK, planner.Setting(14, 14, batch=64, dtype="fp16"),
                     device="rtx3090")
    by = {e.implementation: e for e in p.estimates}
    assert by["sdpa-flash"].available and by["sdpa-cudnn"].available
    assert p.recommendation.startswith("sdpa-flash: torch SDPA's flash kernel, the fastest")
    # In fp32 flash and cuDNN refuse, and attn2d's Triton kernels lead.
    p32 = planner.plan(VIT_BLOCK, planner.Setting(14, 14, batch=64), device="rtx3090")
    assert p32.recommendation.startswith("attn2d-global")
    assert "needs fp16 or bf16, got fp32" in p32.recommendation


def test_plan_command_recommends_flash_for_the_equal_width_block(capsys):
    # ProGAN at 256 channels: the token block has E = Ev = 64, the conv block E=32, Ev=256.
    assert cli_main(["plan", "--res", "32", "--channels", "256", "--dtype", "fp16",
                     "--gpu", "a100-80"]) == 0
    out = capsys.readouterr().out
    assert out.count("Recommendation: sdpa-flash") == 1
    assert out.count("Recommendation: attn2d-global") == 1


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("device", list(planner.DEVICES))
def test_recommendation_names_only_a_path_that_runs_and_fits(device, dtype):
    for block in (SAGAN_E8_EV64, VIT_BLOCK, *planner.progan_blocks(64)):
        for setting in (planner.Setting(64, 64, 8, dtype), planner.Setting(256, 256, 8, dtype)):
            p = planner.plan(block, setting, device=device)
            by = {e.implementation: e for e in p.estimates}
            chosen = p.recommendation.split(":")[0]
            if chosen in by:
                assert by[chosen].available and by[chosen].fits, (block.name, p.recommendation)
            if planner.COMPUTE_CAPABILITY[device] < (8, 0):
                assert not by["sdpa-flash"].available and not by["sdpa-cudnn"].available


def test_below_sm80_mem_efficient_leads_and_bf16_leaves_triton():
    t4 = planner.plan(SAGAN_E8_EV64, planner.Setting(128, 128, 8), device="t4")
    assert t4.recommendation.startswith("sdpa-mem-efficient")
    assert "sm75" in t4.recommendation
    v100 = planner.plan(SAGAN_E8_EV64, planner.Setting(128, 128, 8, "bf16"), device="v100")
    by = {e.implementation: e for e in v100.estimates}
    assert not by["attn2d-global"].available and "sm80" in by["attn2d-global"].note
    assert not by["sdpa-mem-efficient"].available
    assert v100.recommendation.startswith("sdpa-math")


@pytest.mark.parametrize("dtype,capability,width,refused", [
    ("fp16", (8, 0), 4, "multiples of 8"),
    ("fp32", (8, 0), 4, ""),
    ("fp32", (8, 0), 2, "multiples of 4"),
    ("fp32", (7, 5), 2, ""),
    ("fp16", (7, 0), 4, "multiples of 8"),
])
def test_mem_efficient_head_width_rule(dtype, capability, width, refused):
    block = planner.Block("narrow", "conv", 64, heads=2, qk_channels=2 * width, v_channels=64)
    why = planner.refusal(block, planner.Setting(32, 32, dtype=dtype), "sdpa-mem-efficient",
                          capability)
    assert (refused in why) if refused else why == ""


def test_memory_alone_assumes_sm80_and_says_so():
    p = planner.plan(SAGAN_E8_EV64, planner.Setting(64, 64), memory_gib=10)
    assert p.capability == planner.ASSUMED_CAPABILITY and "sm80 assumed" in p.device
    preset = planner.plan(SAGAN_E8_EV64, planner.Setting(64, 64), device="t4", memory_gib=10)
    assert preset.capability == (7, 5) and preset.device.startswith("T4")
    with pytest.raises(ValueError, match="capability"):
        planner.plan(SAGAN_E8_EV64, planner.Setting(64, 64), capability=(8,))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a CUDA device")
def test_validate_on_cuda_without_a_gpu_is_a_clear_error(capsys):
    with pytest.raises(ValueError, match="torch sees no CUDA device"):
        planner.validate(SAGAN_E8_EV64, planner.Setting(64, 64), device="cuda")
    assert cli_main(["plan", "--res", "64", "--validate", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "--device cuda" in err and "torch sees no CUDA device" in err


@pytest.mark.parametrize("argv,words", [
    (["plan", "--res", "64", "--device", "cpu"], "add --validate"),
    (["plan", "--res", "64", "--validate", "--gpu", "t4"], "leave out --gpu"),
    (["plan", "--res", "64", "--validate", "--block", "sagan"], "ProGAN blocks"),
    (["plan", "--res", "64", "--validate", "--dtype", "fp16"], "fp32 training"),
    (["plan", "--res", "64", "--validate", "--pattern", "ylg"], "drop a pattern"),
])
def test_validate_arguments_are_clear_errors(argv, words, capsys):
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "error" in err and words in err


def test_validate_on_the_cpu_compares_both_progan_rows(monkeypatch, capsys):
    def fake_measure(case, timeout=None):
        predicted = planner.estimate(
            PROGAN_BLOCKS["tokens" if case["block"] == "SelfAttention" else "conv"],
            planner.Setting(case["res"], case["res"]),
            "pytorch-unfused" if case["impl"] == "original" else "attn2d-global").memory_bytes
        return {"peak_above_baseline_bytes": predicted * 1.1, "forward_s": 0.1,
                "backward_s": 0.2}

    monkeypatch.setattr("attn2d.memory.measure", fake_measure)
    assert cli_main(["plan", "--res", "32", "--validate"]) == 0
    out = capsys.readouterr().out
    assert out.count("| pytorch-unfused |") == 2 and out.count("| attn2d-global |") == 2
    assert out.count("Every check within its bound.") == 2
    monkeypatch.setattr("attn2d.memory.measure",
                        lambda case, timeout=None: {"peak_above_baseline_bytes": 1 << 20,
                                                    "forward_s": 0.1, "backward_s": 0.2})
    assert cli_main(["plan", "--res", "32", "--validate", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data[0]["device"] == "cpu" and data[0]["problems"]


def test_cuda_validation_rows_run_through_a_measure_function():
    """The rows `--validate --device cuda` runs, here on CPU tensors with a stand-in for
    torch.cuda's peak: each exact row in speed order, refused rows not run with the reason."""
    block = PROGAN_BLOCKS["conv"]
    setting = planner.Setting(8, 8, batch=2)
    steps = []

    def measure_step(step):
        step()
        steps.append(step)
        return 1 << 20, 1e-3

    gpu_plan = planner.plan(block, setting, device="rtx3090")
    v = planner._measure_rows(block, setting, gpu_plan, "cpu", measure_step)
    by = {c.implementation: c for c in v.checks}
    assert [c.implementation for c in v.checks] == list(planner.SPEED_ORDER)
    assert by["sdpa-flash"].measured_bytes is None and "E=8, Ev=64" in by["sdpa-flash"].ran
    for ran in ("sdpa-math", "pytorch-unfused"):
        assert by[ran].measured_bytes == 1 << 20 and by[ran].seconds == 1e-3
    assert by["pytorch-unfused"].ran == "attn2d.unfused_blocks.SelfAttention2"
    # torch's own verdict: its CUDA mem-efficient kernel refuses CPU tensors.
    assert by["sdpa-mem-efficient"].ran == "not run: torch refuses it"
    assert any("sdpa-mem-efficient" in p for p in v.problems)
    assert "Plan's recommendation: attn2d-global" in planner.format_validation(v)
