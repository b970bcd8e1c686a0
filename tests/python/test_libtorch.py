"""attn2d::nn's LibTorch modules against the Python modules: the same weights (the Python
module's state_dict, loaded in C++) give the same outputs and gradients in float64, within
1e-12. tests/libtorch/module_parity (built against the installed attn2d::torch by
scripts/cpp_examples.sh) runs the C++ side."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

import attn2d
from attn2d import patterns

ROOT = Path(__file__).resolve().parents[2]
PARITY = ROOT / "build" / "libtorch-tests" / "module_parity"

if not PARITY.exists():
    if os.environ.get("ATTN2D_REQUIRE_LIBTORCH"):
        raise RuntimeError(f"{PARITY} is missing: scripts/cpp_examples.sh builds it")
    pytest.skip(f"{PARITY} not built (scripts/cpp_examples.sh)", allow_module_level=True)

TOL = 1e-12

SELF_ATTENTION = dict(qk_ratio=8, v_channels=None, heads=1, pool_kv=2, out_conv=True, gamma=True,
                      residual=True, scale=1.0, groups=1)

CASES = [
    # (module, channels, options, pattern, window, map)
    ("SelfAttention2d", 16, {}, "", None, (9, 7)),
    ("SelfAttention2d", 16, dict(qk_ratio=4, v_channels=8, heads=2, groups=2, scale=None), "window",
     (5, "manhattan"), (11, 13)),
    ("SelfAttention2d", 16, dict(qk_ratio=2, heads=8, pool_kv=1, out_conv=False, gamma=False,
                                 residual=False, v_channels=16), "window", (3, "chebyshev"),
     (7, 10)),
    ("SelfAttention2d", 64, dict(heads=8), "ylg", None, (16, 16)),
    ("MultiheadSelfAttention2d", 12, dict(heads=3), "", None, (5, 7)),
    ("MultiheadSelfAttention2d", 16, dict(heads=4), "window", (5, "manhattan"), (8, 9)),
    ("MultiheadSelfAttention2d", 16, dict(heads=8), "ylg", None, (8, 8)),
]


def _python_module(kind: str, channels: int, options: dict, pattern_kind: str, window):
    heads = options.get("heads", 1)
    pattern = None
    if pattern_kind == "window":
        pattern = patterns.Window(window[0], metric=window[1])
    elif pattern_kind == "ylg":
        pattern = patterns.YLG(heads)
    if kind == "SelfAttention2d":
        return attn2d.nn.SelfAttention2d(channels, pattern=pattern, **options)
    return attn2d.nn.MultiheadSelfAttention2d(channels, num_heads=heads, pattern=pattern)


def _run_cpp(tmp_path: Path, case: dict, state: dict) -> dict:
    torch.save(case, tmp_path / "case.pt")
    torch.save(dict(state), tmp_path / "state.pt")
    run = subprocess.run([str(PARITY), str(tmp_path / "case.pt"), str(tmp_path / "state.pt"),
                          str(tmp_path / "result.pt")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    # Our own file: its typed dict (torch::pickle_save) needs the full unpickler.
    return dict(torch.load(tmp_path / "result.pt", weights_only=False))


@pytest.mark.parametrize("kind, channels, options, pattern_kind, window, hw", CASES,
                         ids=[f"{c[0]}-{c[3] or 'global'}-{c[5][0]}x{c[5][1]}" for c in CASES])
def test_libtorch_module_matches_the_python_module(tmp_path, kind, channels, options,
                                                    pattern_kind, window, hw):
    torch.manual_seed(0)
    m = _python_module(kind, channels, options, pattern_kind, window).double()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name == "gamma":
                p.fill_(0.7)  # 0 at initialisation would hide the attention from the output
    x = torch.randn(2, channels, *hw, dtype=torch.float64, requires_grad=True)
    y = m(x)
    grad_y = torch.randn_like(y)
    y.backward(grad_y)
    case = dict(module=kind, channels=channels, **{**SELF_ATTENTION, **options},
                pattern=pattern_kind, window_size=window[0] if window else 0,
                window_metric=window[1] if window else "", x=x.detach(), grad_y=grad_y)
    got = _run_cpp(tmp_path, case, m.state_dict())
    assert (got["y"] - y).abs().max().item() <= TOL
    assert (got["grad_x"] - x.grad).abs().max().item() <= TOL
    params = dict(m.named_parameters())
    assert {k[len("grad."):] for k in got if k.startswith("grad.")} == set(params)
    for name, p in params.items():
        assert (got["grad." + name] - p.grad).abs().max().item() <= TOL, name
    # The outputs depend on the attention: a wrong attention would move them.
    assert (y - x).abs().max().item() > 1e-3 if kind == "SelfAttention2d" else True


def test_libtorch_load_state_dict_names_a_missing_or_misshapen_entry(tmp_path):
    m = attn2d.nn.SelfAttention2d(16).double()
    case = dict(module="SelfAttention2d", channels=16, **SELF_ATTENTION, pattern="",
                window_size=0, window_metric="", x=torch.randn(1, 16, 4, 4, dtype=torch.float64),
                grad_y=torch.randn(1, 16, 4, 4, dtype=torch.float64))
    torch.save(case, tmp_path / "case.pt")
    for state, words in (
            ({k: v for k, v in m.state_dict().items() if k != "key.weight"},
             "has no entry for key.weight"),
            ({**m.state_dict(), "value.weight": torch.zeros(3, 16, 1, 1, dtype=torch.float64)},
             "value.weight has shape [3, 16, 1, 1]"),
            ({**m.state_dict(), "extra": torch.zeros(1)}, "does not: extra"),
            (m.state_dict(), "save the state_dict as a plain dict")):
        torch.save(state, tmp_path / "state.pt")
        run = subprocess.run([str(PARITY), str(tmp_path / "case.pt"), str(tmp_path / "state.pt"),
                              str(tmp_path / "result.pt")], capture_output=True, text=True)
        assert run.returncode != 0 and words in run.stderr, run.stderr


def test_libtorch_refuses_a_second_backward_by_name(tmp_path):
    m = attn2d.nn.SelfAttention2d(16).double()
    case = dict(module="SelfAttention2d", channels=16, **SELF_ATTENTION, pattern="",
                window_size=0, window_metric="", x=torch.randn(1, 16, 4, 4, dtype=torch.float64),
                grad_y=torch.randn(1, 16, 4, 4, dtype=torch.float64))
    torch.save(case, tmp_path / "case.pt")
    torch.save(dict(m.state_dict()), tmp_path / "state.pt")
    run = subprocess.run([str(PARITY), str(tmp_path / "case.pt"), str(tmp_path / "state.pt"),
                          str(tmp_path / "result.pt"), "--double-backward"],
                         capture_output=True, text=True)
    assert run.returncode == 3, run.stderr
    assert "attn2d::attention_backward" in run.stderr and "not implemented" in run.stderr
