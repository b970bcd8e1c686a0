"""Measured and modelled memory of attention.

measure() runs a case in a subprocess (attn2d._probe) so that its peak resident memory is its
own; unfused_attention_bytes() is the lower bound an unfused implementation cannot go under;
available_memory_bytes() is what the system can still hand out (bench --patterns runs the
dense-masked peer only where it fits). On CUDA, in this process (torch.cuda.max_memory_allocated),
cuda_peak_bytes() measures a step's peak and cuda_step_peak() a warm step's peak and time;
block_peer() builds a planner block around any attention function (`attn2d plan --validate --device cuda` runs SDPA's kernels on it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Callable, Optional


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


def cuda_peak_bytes(step: Callable[[], Any], device) -> int:
    """torch.cuda.max_memory_allocated growth on `device` over what is allocated before
    step() runs."""
    import torch

    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


def cuda_step_peak(step: Callable[[], Any], reps: int = 3) -> tuple[int, float]:
    """(peak bytes, mean seconds) of step() on the current CUDA device: the peak is
    torch.cuda.max_memory_allocated above what was allocated before the call, after one
    warm-up call (Triton compilation, cuBLAS workspaces and parameter gradients are allocated
    there and stay); the time is the mean of `reps` further calls."""
    import torch

    step()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    peak = cuda_peak_bytes(step, torch.device("cuda", torch.cuda.current_device()))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        step()
    end.record()
    torch.cuda.synchronize()
    return peak, start.elapsed_time(end) / 1e3 / reps


def block_peer(block, attend):
    """An attn2d.planner Block in plain PyTorch around attend(q, k, v, scale): the conv kind is
    SAGAN's (1x1 convs; keys and values max-pooled by pool_kv; the optional out conv, gamma and
    residual), the tokens kind ProGAN's (LayerNorm, in and out projections, feed-forward). q, k
    and v reach attend as contiguous (B, heads, N, width) tensors, because SDPA's fused kernels
    refuse a last dimension whose stride is not 1, which attn2d.nn's channels-first views have."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class BlockPeer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            C = block.channels
            if block.kind == "tokens":
                self.ln = nn.LayerNorm(C)
                self.in_proj = nn.Linear(C, 3 * C)
                self.out_proj = nn.Linear(C, C)
                self.ff = nn.Sequential(nn.LayerNorm(C), nn.Linear(C, C), nn.GELU(),
                                        nn.Linear(C, C))
                return
            self.query = nn.Conv2d(C, block.qk_channels, 1)
            self.key = nn.Conv2d(C, block.qk_channels, 1)
            self.value = nn.Conv2d(C, block.v_channels, 1)
            self.out = nn.Conv2d(block.v_channels, C, 1) if block.out_conv else None
            self.gamma = nn.Parameter(torch.ones(1)) if block.gamma else None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            B, C, H, W = x.shape
            if block.kind == "tokens":
                tokens = x.flatten(2).transpose(1, 2)
                q, k, v = (t.unflatten(-1, (block.heads, -1)).transpose(1, 2).contiguous()
                           for t in self.in_proj(self.ln(tokens)).chunk(3, dim=-1))
                o = attend(q, k, v, q.shape[-1] ** -0.5).transpose(1, 2).flatten(2)
                t = self.out_proj(o) + tokens
                t = self.ff(t) + t
                return t.transpose(1, 2).reshape(B, C, H, W)
            k, v = self.key(x), self.value(x)
            if block.pool_kv > 1:
                k, v = F.max_pool2d(k, block.pool_kv), F.max_pool2d(v, block.pool_kv)
            q, k, v = (t.flatten(2).unflatten(1, (block.heads, -1)).transpose(-1, -2).contiguous()
                       for t in (self.query(x), k, v))
            o = attend(q, k, v, q.shape[-1] ** -0.5).transpose(-1, -2).reshape(B, -1, H, W)
            if self.out is not None:
                o = self.out(o)
            if self.gamma is not None:
                o = self.gamma * o
            return x + o if block.residual else o

    return BlockPeer()
