#!/usr/bin/env bash
# The whole test suite: the torch-free C++ core (GoogleTest through ctest, every compiled SIMD
# target), then the Python package (pytest). Run scripts/setup.sh first.
# ATTN2D_SLOW=1 adds the slow sweeps.
set -euo pipefail
cd "$(dirname "$0")/.."

cmake -S . -B build/core -DCMAKE_BUILD_TYPE=Release -DATTN2D_BUILD_TESTS=ON >/dev/null
cmake --build build/core -j "$(nproc)"
(cd build/core && ctest --output-on-failure -j "$(nproc)")

.venv/bin/python -m pytest -q tests/python
