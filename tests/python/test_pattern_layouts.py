"""Compiled layouts stay what the kernels, the Triton kernels and the double backward were
validated on: every pattern case the test suite compiles, with the SHA-256 of its 12 layout
tensors and of its window offsets (the first 64 bits of each) (on the grid, and where the window kernels serve it), or the
message it is rejected with.

data/pattern_layouts.jsonl was written from the layouts of attn2d's earlier pure-Python
compiler; the core's compiler (include/attn2d/patterns.h) reproduces them bit for bit. A
deliberate change to the layouts rewrites the file: ATTN2D_RECORD_LAYOUTS=1 pytest on this
file."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from attn2d import _compiled_layout
from attn2d.patterns import from_spec

CASES_FILE = Path(__file__).parent / "data" / "pattern_layouts.jsonl"
RECORD = os.environ.get("ATTN2D_RECORD_LAYOUTS") == "1"


def digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        if t is None:
            h.update(b"none")
            continue
        h.update(str(tuple(t.shape)).encode())
        h.update(str(t.dtype).encode())
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def compiled(case: dict) -> dict:
    """The case as this build compiles it: digests, or the rejection's message."""
    pattern = from_spec(case["pattern"])
    q_hw, kv_hw, heads = tuple(case["q_hw"]), tuple(case["kv_hw"]), case["heads"]
    try:
        layout = _compiled_layout.build(pattern, q_hw, kv_hw, heads)
    except (ValueError, TypeError) as e:
        return {"error": str(e)}
    offsets = [_compiled_layout.window_offsets_on_grid(pattern, q_hw, kv_hw),
               _compiled_layout.window_offsets(pattern, q_hw, kv_hw)]
    return {"layout": digest(layout), "offsets": digest(offsets)}


def load_cases() -> list[dict]:
    return [json.loads(line) for line in CASES_FILE.read_text().splitlines() if line]


def test_every_case_compiles_to_the_recorded_layout():
    cases = load_cases()
    assert len(cases) > 600
    if RECORD:
        rows = []
        for case in cases:
            entry = {k: case[k] for k in ("pattern", "q_hw", "kv_hw", "heads")}
            entry.update(compiled(case))
            rows.append(json.dumps(entry, sort_keys=True))
        CASES_FILE.write_text("\n".join(rows) + "\n")
        pytest.skip(f"recorded {len(rows)} layouts into {CASES_FILE}")
    mismatches = []
    for case in cases:
        got = compiled(case)
        want = {k: case[k] for k in ("layout", "offsets", "error") if k in case}
        if got != want:
            mismatches.append((case["pattern"], case["q_hw"], case["kv_hw"], case["heads"]))
    assert not mismatches, f"{len(mismatches)} of {len(cases)} cases differ: {mismatches[:5]}"


def test_the_cases_cover_every_kind_of_pattern_and_rejection():
    cases = load_cases()
    windows = [c for c in cases if c["pattern"]["kind"] == "window"]
    ylg = [c for c in cases if c["pattern"]["kind"] == "ylg"]
    assert {c["pattern"]["metric"] for c in windows} == {"chebyshev", "manhattan", "euclidean"}
    assert {c["pattern"]["border"] for c in windows} == {"clip", "shift"}
    assert any(c["pattern"]["dilation"] > 1 for c in windows)
    assert {c["pattern"]["mapping"] for c in ylg} == {"official", "geometric"}
    assert any(c["q_hw"] != c["kv_hw"] for c in windows) and any(c["q_hw"] != c["kv_hw"] for c in ylg)
    assert any("error" in c for c in cases) and any("layout" in c for c in cases)
    assert any(c.get("offsets") != digest([None, None]) for c in windows if "offsets" in c)


def test_a_changed_layout_is_caught():
    """The digest sees one flipped mask bit."""
    case = next(c for c in load_cases() if c["pattern"]["kind"] == "ylg" and "layout" in c)
    layout = [t.clone() for t in _compiled_layout.build(
        from_spec(case["pattern"]), tuple(case["q_hw"]), tuple(case["kv_hw"]), case["heads"])]
    assert digest(layout) == case["layout"]
    target = next(i for i in (11, 3) if layout[i].numel())
    layout[target].view(-1)[0] ^= 1
    assert digest(layout) != case["layout"]
