#!/usr/bin/env bash
# Dense attention beside PyTorch (unfused, SDPA default/math/flash), the bf16 kernels and one
# thread, on SAGAN, ProGAN MHA, ViT-B and cross-attention shapes; writes
# docs/bench/bench.{json,md,png}. Extra arguments go to `attn2d bench` (e.g. --cases "ViT-B").
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/attn2d bench --thread-scaling --reps 7 --out docs/bench "$@"
