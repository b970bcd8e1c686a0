#!/usr/bin/env bash
# Local windows (Chebyshev, Manhattan) and YLG on 128x128 and 256x256 maps beside attn2d's
# global kernel, dense-masked SDPA math (where it fits) and FlexAttention's compiled CPU
# forward; writes docs/bench/bench_patterns.{json,md}. Extra arguments go to `attn2d bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/attn2d bench --patterns --reps 5 --out docs/bench "$@"
