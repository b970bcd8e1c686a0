#!/usr/bin/env bash
# Installs the torch-free core from the build folder setup.sh made (build/torch) into
# build/install, then configures examples/cpp against that tree with find_package(attn2d CONFIG
# REQUIRED), builds the examples and runs them. Run scripts/setup.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f build/torch/CMakeCache.txt ] || { echo "cpp_examples: run scripts/setup.sh first" >&2; exit 1; }
cmake --build build/torch -j "$(nproc)" --target attn2d_core
rm -rf build/install build/examples
cmake --install build/torch --prefix build/install >/dev/null
cmake -S examples/cpp -B build/examples -DCMAKE_PREFIX_PATH="$PWD/build/install" >/dev/null
cmake --build build/examples -j "$(nproc)"
build/examples/ylg_on_own_buffers 2
