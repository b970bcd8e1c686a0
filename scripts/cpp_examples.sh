#!/usr/bin/env bash
# Installs attn2d from the build folder setup.sh made (build/torch: the core and, with torch,
# attn2d::torch) into build/install, then configures the C++ programs against that tree with
# find_package(attn2d CONFIG REQUIRED [COMPONENTS torch]), builds them and runs the examples:
#   examples/cpp  ylg_on_own_buffers (attn2d::core), sagan_block_libtorch (attn2d::torch)
#   tests/libtorch  module_parity, which tests/python/test_libtorch.py runs
# Run scripts/setup.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f build/torch/CMakeCache.txt ] || { echo "cpp_examples: run scripts/setup.sh first" >&2; exit 1; }
jobs="$(nproc)"
cmake --build build/torch -j "$jobs" --target attn2d_core attn2d_torch
rm -rf build/install build/examples build/libtorch-tests
cmake --install build/torch --prefix build/install >/dev/null
prefix="$PWD/build/install;$(.venv/bin/python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
cmake -S examples/cpp -B build/examples -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build build/examples -j "$jobs"
cmake -S tests/libtorch -B build/libtorch-tests -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build build/libtorch-tests -j "$jobs"
build/examples/ylg_on_own_buffers 2
build/examples/sagan_block_libtorch 5 global
build/examples/sagan_block_libtorch 3 ylg
