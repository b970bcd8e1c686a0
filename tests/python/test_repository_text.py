"""The product speaks of the project alone: no tracked text file narrates how it was built
(numbered work runs, the build machine, attempts set aside)."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORK_HISTORY = re.compile(
    r"sessions? \d|development vm|\bthe vm\b|not kept|until run \d|this session|pattern-sessions",
    re.IGNORECASE)
BINARY = {".png", ".pt", ".so", ".pyc"}


def tracked_text_files():
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / p for p in out.splitlines() if Path(p).suffix not in BINARY]


def test_no_tracked_file_narrates_work_history():
    hits = []
    for path in tracked_text_files():
        if not path.is_file() or path == Path(__file__).resolve():
            continue
        text = path.read_text(errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            if WORK_HISTORY.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not hits, "work history in tracked files:\n" + "\n".join(hits)


def test_the_pattern_finds_what_it_is_for():
    for line in ("measured in session 42", "on the development VM", "tried and not kept"):
        assert WORK_HISTORY.search(line)
    assert not WORK_HISTORY.search("a training step of the YLG-SAGAN block")
