"""Each script in examples/ runs (small sizes) and reaches its last line; those that run
attention check attn2d against an unfused or dense-masked reference themselves and exit non-zero
when the two disagree. Bad arguments exit 2 with a message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

CASES = {
    "swap_progan_block.py": (["--res", "48", "--channels", "16"],
                             "48x48: one attn2d training step took"),
    "local_patterns.py": (["--res", "16"], "16x16, 64 channels, forward + backward"),
    "vit_attention.py": (["--tokens", "65", "--dim", "96", "--heads", "3"],
                         "the block, batch 2, forward + backward"),
    "plan_gpu.py": (["--gpu", "t4"], "Recommendation: "),
    "vit_sparse_patterns.py": (["--sides", "16", "--dim", "32", "--heads", "2", "--reps", "1"],
                               "| 256 | window ∪ random |"),
}


def run(script: str, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True,
                          text=True, timeout=300, check=False)


def test_every_example_is_run_here():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(CASES)


@pytest.mark.parametrize("script", sorted(CASES))
def test_example_runs(script):
    args, last = CASES[script]
    proc = run(script, args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert last in proc.stdout, proc.stdout[-2000:]


@pytest.mark.parametrize("script,args", [
    ("swap_progan_block.py", ["--channels", "12"]),
    ("local_patterns.py", ["--res", "15"]),
    ("vit_attention.py", ["--dim", "100", "--heads", "3"]),
    ("plan_gpu.py", ["--channels", "4"]),
    ("vit_sparse_patterns.py", ["--sides", "12"]),
])
def test_example_refuses_bad_arguments(script, args):
    proc = run(script, args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "must" in proc.stderr
