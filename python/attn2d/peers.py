"""The PyTorch implementations attn2d is compared with, each f(q, k, v, scale) -> out.

"unfused" is the plain matmul-softmax-matmul path; the sdpa-* entries force one
backend of torch's scaled_dot_product_attention (and raise where that backend refuses the input,
e.g. the CPU flash kernel when Ev != E); "sdpa" lets torch choose. CUDA_PEERS are the backends
SDPA has on CUDA, each forced (bench --device cuda)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def unfused(q, k, v, scale):
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def sdpa(q, k, v, scale):
    return F.scaled_dot_product_attention(q, k, v, scale=scale)


def forced_sdpa(backend):
    """SDPA with one backend forced: run(q, k, v, scale, attn_mask=None)."""

    def run(q, k, v, scale, attn_mask=None):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)

    return run


_math = forced_sdpa(SDPBackend.MATH)


# The probe's names of a local pattern's peers (bench --patterns, attn2d._probe): SDPA's math
# path under the pattern's dense mask, and FlexAttention's compiled forward under its block mask
# (bench_patterns.flex_forward). They need the pattern as well as q, k, v, so they are not in
# PEERS.
DENSE_MASKED = "sdpa-math-masked"
FLEX_MASKED = "flex-masked"


def dense_masked_math(q, k, v, mask, scale=None):
    """SDPA's math path under a dense bool mask (True: the key is allowed): the unfused
    reference for a local pattern, with its (B, H, Lq, Lk) score matrices."""
    return _math(q, k, v, scale, attn_mask=mask)


PEERS = {
    "unfused": unfused,
    "sdpa": sdpa,
    "sdpa-math": _math,
    "sdpa-flash": forced_sdpa(SDPBackend.FLASH_ATTENTION),
}

# Every kernel SDPA has on CUDA, each forced: a refusal raises with torch's reason in a warning.
CUDA_PEERS = {
    "sdpa-math": _math,
    "sdpa-efficient": forced_sdpa(SDPBackend.EFFICIENT_ATTENTION),
    "sdpa-flash": forced_sdpa(SDPBackend.FLASH_ATTENTION),
    "sdpa-cudnn": forced_sdpa(SDPBackend.CUDNN_ATTENTION),
}
