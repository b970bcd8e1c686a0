"""Measured and modelled memory of attention.

measure() runs a case in a subprocess (attn2d._probe) so that its peak resident memory is its
own; unfused_attention_bytes() is the lower bound an unfused implementation cannot go under;
available_memory_bytes() is what the system can still hand out (bench --patterns runs the
dense-masked peer only where it fits).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Optional


def measure(case: dict[str, Any], timeout: Optional[float] = None) -> dict[str, Any]:
    """Time and peak memory (bytes above the inputs) of one case, in a fresh process."""
    # glibc's mmap threshold grows to 32 MiB after a large free, after which freed buffers stay
    # resident and a second run can reuse them without raising the high-water mark; a fixed
    # threshold keeps every buffer of 64 KiB or more in its own mapping, returned on free.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    proc = subprocess.run(
        [sys.executable, "-m", "attn2d._probe", json.dumps(case)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-5:]
        raise RuntimeError(
            f"attn2d probe failed (exit {proc.returncode}) for {case}:\n" + "\n".join(tail)
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def available_memory_bytes() -> Optional[int]:
    """Memory the system can give a new allocation without swapping: MemAvailable from
    /proc/meminfo, else the free physical pages sysconf reports, else None (unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def unfused_attention_bytes(
    batch: int, heads: int, len_q: int, len_k: int, elem_bytes: int = 4, training: bool = True
) -> int:
    """Lower bound for matmul + softmax + matmul: the score matrix and the probabilities (kept for
    the backward) both exist at once, B*H*Lq*Lk elements each. Inference can free the scores."""
    matrices = 2 if training else 1
    return matrices * batch * heads * len_q * len_k * elem_bytes


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"
