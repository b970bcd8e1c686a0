"""Naive attention written with plain torch ops: the oracle (in float64) and the same-dtype
baseline that sets the tolerance of the fused kernels."""

from __future__ import annotations

import math
import random

import pytest
import torch


def naive_attention(q, k, v, attn_mask=None, is_causal=False, scale=None, dtype=torch.float64):
    """matmul + softmax + matmul in `dtype`; a row with no allowed key gives 0, as attn2d does."""
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1]) if q.shape[-1] else 1.0
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    Lq, Lk = q.shape[-2], k.shape[-2]
    allowed = torch.ones(Lq, Lk, dtype=torch.bool)
    if is_causal:
        allowed = allowed.tril()
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            allowed = allowed & attn_mask
        else:
            s = s + attn_mask.to(dtype)
    s = s.masked_fill(~allowed, float("-inf"))
    if Lk == 0:  # no keys at all: every row is fully masked
        return torch.matmul(s, v)
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m).detach()
    p = torch.exp(s - m)
    l = p.sum(dim=-1, keepdim=True)
    return torch.matmul(p, v) / torch.where(l == 0, torch.ones_like(l), l)


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    d = (a.detach().double() - b.detach().double()).abs()
    if torch.isnan(d).any():
        return float("inf")
    return float(d.max()) if d.numel() else 0.0


def tolerance(naive_error: float, dtype: torch.dtype, magnitude: float = 1.0) -> float:
    """Our error may be at most 2x that of naive attention in the same dtype, plus a floor of
    1e-6 (float32; 1e-12 for float64) times the largest reference value `magnitude` when above 1,
    4-8 float32 units in the last place of that value.
    The naive error is one element's, the largest of thousands, and sometimes far below an ulp,
    so without the scaled floor an error of 2 ulp on values near 10 (1.9e-6) would fail."""
    floor = (1e-6 if dtype == torch.float32 else 1e-12) * max(1.0, magnitude)
    return 2.0 * naive_error + floor


def assert_within_rule(results: dict, dtype: torch.dtype, relative_floor: bool = False) -> None:
    """results["ours" | "naive" | "oracle"] = (out, dq, dk, dv): each of ours within tolerance()
    of the float64 oracle, naive being the same-dtype naive attention; with relative_floor the
    floor scales with the oracle tensor's largest value."""
    for i, what in enumerate(("out", "dq", "dk", "dv")):
        ours, naive, oracle = (results[n][i] for n in ("ours", "naive", "oracle"))
        err, naive_err = max_err(ours, oracle), max_err(naive, oracle)
        magnitude = float(oracle.abs().max()) if relative_floor and oracle.numel() else 1.0
        assert err <= tolerance(naive_err, dtype, magnitude), (what, err, naive_err, magnitude)


def random_sweep_tests(draw, check, quick: int, slow: int):
    """Two tests over seeded draws: seeds [0, quick) in every run and [quick, quick + slow) with
    ATTN2D_SLOW=1. Seed s draws a case with draw(random.Random(s)) (its tensors from torch's
    generator seeded with s) and runs check(**case, relative_floor=True)."""
    def run(seed: int):
        rng = random.Random(seed)
        torch.manual_seed(seed)
        check(**draw(rng), relative_floor=True)

    @pytest.mark.parametrize("seed", range(quick))
    def test_random_combinations(seed):
        run(seed)

    @pytest.mark.slow
    @pytest.mark.parametrize("seed", range(quick, quick + slow))
    def test_random_combinations_sweep(seed):
        run(seed)

    return test_random_combinations, test_random_combinations_sweep
