#!/usr/bin/env bash
# The whole test suite: the torch-free C++ core (GoogleTest through ctest, every compiled SIMD
# target), the C++ examples built against the installed core, the same tests under
# AddressSanitizer and UBSan, a short run of every fuzzer, then the Python package (pytest). Run
# scripts/setup.sh first. ATTN2D_SLOW=1 adds the slow sweeps.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"

# The tests build in the folder where setup.sh built the binding, so the core compiles once.
[ -f build/torch/CMakeCache.txt ] || { echo "test: run scripts/setup.sh first" >&2; exit 1; }
cmake -S . -B build/torch -DATTN2D_BUILD_TESTS=ON >/dev/null
cmake --build build/torch -j "$jobs" --target attn2d_core_tests
(cd build/torch && ctest --output-on-failure -j "$jobs")
bash scripts/cpp_examples.sh

bash scripts/sanitize.sh
bash scripts/fuzz.sh --quick

ATTN2D_REQUIRE_LIBTORCH=1 .venv/bin/python -m pytest -q tests/python
