#!/usr/bin/env bash
# Set-up on a fresh Debian 12 machine, idempotent: system packages, a virtual environment in
# .venv with torch 2.13.0 (CPU build), and attn2d built in place. Later runs only rebuild.
set -euo pipefail
cd "$(dirname "$0")/.."

# clang-16 and its runtime libraries: the libFuzzer targets of scripts/fuzz.sh.
packages="cmake g++ python3-dev libhwy-dev libgtest-dev dataset-fashion-mnist clang-16 libclang-rt-16-dev"
missing=""
for p in $packages; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
python3 -m venv --help >/dev/null 2>&1 || missing="$missing python3-venv"
if [ -n "$missing" ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "setup: installing Debian packages:$missing"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
# torch==2.13.0 exactly: it is a local CPU build here; any other spec fetches CUDA wheels.
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 numpy pytest matplotlib
.venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" \
  || { echo "setup: torch 2.13.0 is not installed in .venv" >&2; exit 1; }
.venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation -e '.[tools,test]'
# timm for tests/python/test_timm.py, without its dependencies: timm requires torchvision, and
# pip would replace the CPU torch with a CUDA build to satisfy it.
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps timm==1.0.31
.venv/bin/python -c "import attn2d; print('setup: attn2d', attn2d.__version__, 'on', attn2d.cpu_simd_target())"
