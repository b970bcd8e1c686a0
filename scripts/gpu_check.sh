#!/usr/bin/env bash
# Everything that needs an NVIDIA GPU, in one call, within ATTN2D_GPU_CHECK_SECONDS (540 s):
#   1. set-up and build (scripts/setup.sh), with a CUDA build of torch;
#   2. the GPU tests, attn2d's Triton kernels compiled for the device (pytest -m "triton or gpu");
#   3. NATTEN, if `pip install` finds a build with CUDA kernels (else the bench says why not);
#   4. attn2d bench --device cuda: attn2d against SDPA's kernels, FlexAttention and NATTEN, and
#      memory against the planner;
#   5. attn2d plan --validate --device cuda;
#   6. the figures written into docs/benchmarks.md between its gpu-check markers.
# Outputs go to attn2d-report/gpu-check, and are copied under $OUT when it is set. Every step has
# a time limit, and all of them end within ATTN2D_GPU_CHECK_SECONDS (default 540) of the start; a
# failed step is reported in the summary at the end and the later steps still run. The exit
# status is 0 only if every step passed.
#
#   bash scripts/gpu_check.sh
#   ATTN2D_PYTHON=python3 bash scripts/gpu_check.sh
#       uses an interpreter whose torch is a CUDA build and where attn2d is already built
#       (pip install --no-build-isolation -e .), with no set-up: for a machine without network.
#   ATTN2D_NATTEN_PIP_ARGS="natten==VERSION -f URL" bash scripts/gpu_check.sh
#       installs NATTEN from the wheel index its documentation names for this torch and CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."

report=attn2d-report/gpu-check
mkdir -p "$report"
rm -f "$report"/*.md "$report"/*.json "$report"/*.log "$report"/*.txt
exec > >(tee "$report/gpu_check.log") 2>&1
started=$SECONDS
deadline=$((started + ${ATTN2D_GPU_CHECK_SECONDS:-540}))
summary=()
failed=0

# step NAME LIMIT_S OUTPUT_FILE COMMAND...: runs COMMAND for at most LIMIT_S seconds (less if the
# deadline is nearer), its output shown and kept in OUTPUT_FILE, and records how it ended for the
# summary.
step() {
  local name=$1 limit=$2 out=$3
  shift 3
  local left=$((deadline - SECONDS))
  if [ "$left" -lt 10 ]; then
    summary+=("SKIPPED  $name (no time left)")
    failed=1
    return
  fi
  [ "$limit" -le "$left" ] || limit=$left
  echo
  echo "== $name (at most ${limit} s)"
  local start=$SECONDS rc=0
  timeout -k 10 "$limit" "$@" 2>&1 | tee "$out" || rc=${PIPESTATUS[0]}
  local took=$((SECONDS - start))
  if [ "$rc" -eq 0 ]; then
    summary+=("ok       $name (${took} s)")
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    summary+=("TIMEOUT  $name (stopped after ${limit} s)")
    failed=1
  else
    summary+=("FAILED   $name (exit $rc, ${took} s; see $out)")
    failed=1
  fi
}

cuda_torch() {
  "$1" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null
}

echo "== set-up"
if [ -n "${ATTN2D_PYTHON:-}" ]; then
  py=$ATTN2D_PYTHON
  echo "gpu_check: using $py as it is (ATTN2D_PYTHON set): no set-up, no build"
else
  bash scripts/setup.sh
  py=.venv/bin/python
  # setup.sh pins torch==2.13.0, which from PyPI is a CUDA build, but a machine whose pip finds
  # a CPU-only wheel first (a local build, a CPU index) ends up with torch that sees no GPU. Only
  # where nvidia-smi shows a working GPU and driver is it replaced, by the CUDA 12.8 build of the
  # same version, and the binding rebuilt against it.
  if ! cuda_torch "$py" && nvidia-smi >/dev/null 2>&1; then
    echo "gpu_check: .venv's torch $("$py" -c 'import torch; print(torch.__version__)') sees" \
      "no CUDA device, yet nvidia-smi works: installing torch 2.13.0 built for CUDA 12.8"
    "$py" -m pip install -q --disable-pip-version-check --force-reinstall torch==2.13.0 \
      --index-url https://download.pytorch.org/whl/cu128
    "$py" -m pip install -q --disable-pip-version-check --no-build-isolation -e '.[tools,test]'
  fi
fi
if ! cuda_torch "$py"; then
  cat >&2 <<EOF
gpu_check: torch in $py sees no CUDA device, so there is nothing to check here.
  torch: $("$py" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>&1)
  nvidia-smi: $( (nvidia-smi -L 2>&1 || echo "not found or not working") | head -1)
On a machine with an NVIDIA GPU and its driver, install the CUDA build of torch and rerun:
  .venv/bin/python -m pip install --force-reinstall torch==2.13.0 \\
      --index-url https://download.pytorch.org/whl/cu128
  bash scripts/gpu_check.sh
EOF
  exit 1
fi
nvidia-smi -L || true
"$py" -c "import torch, triton, attn2d
print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'triton', triton.__version__,
      'attn2d', attn2d.__version__, 'on', torch.cuda.get_device_name())"
summary+=("ok       set-up ($((SECONDS - started)) s)")

step "GPU tests (ATTN2D_GPU=1 pytest -m \"triton or gpu\")" 150 "$report/gpu_tests.log" \
  env ATTN2D_GPU=1 "$py" -m pytest -q -m "triton or gpu" tests/python

# NATTEN is optional: without it the bench lists NATTEN as unavailable, with the reason. Binary
# wheels only by default, since building NATTEN's kernels from source takes far longer than
# this step may.
read -r -a natten_args <<<"${ATTN2D_NATTEN_PIP_ARGS:---only-binary=:all: natten}"
failed_before=$failed
step "pip install natten (optional)" 60 "$report/natten_install.log" \
  "$py" -m pip install --disable-pip-version-check "${natten_args[@]}"
if [ "${summary[-1]:0:2}" != "ok" ]; then
  summary[-1]="no NATTEN: $(sed 's/^[A-Z]* *//' <<<"${summary[-1]}"); the bench lists it as"
  summary[-1]+=" unavailable"
  failed=$failed_before
fi

step "attn2d bench --device cuda" 240 "$report/bench.log" \
  env PYTHONUNBUFFERED=1 "$py" -m attn2d.cli bench --device cuda --out "$report"

# The planner against this GPU: both ProGAN blocks at 64x64 and 128x128, and the SAGAN block at
# 128x128, batch 8 (the bench's memory cases are the SAGAN block too).
step "attn2d plan --validate --device cuda" 90 "$report/plan_validate.txt" \
  bash -c 'set -e
    py=$1
    shift
    for setting in "$@"; do
      echo "\$ attn2d plan --validate --device cuda $setting"
      # Unquoted: each setting is a list of options.
      "$py" -m attn2d.cli plan --validate --device cuda $setting
      echo
    done' gpu_check "$py" "--res 64" "--res 128" "--block sagan --res 128 --batch 8"

# docs/benchmarks.md: the bench's tables (their headings moved under the GPU section), the
# planner's validation and the GPU tests' outcome, between the gpu-check markers.
if [ -s "$report/bench_cuda.md" ]; then
  section="$report/gpu_section.md"
  {
    commit=$(git rev-parse --short HEAD 2>/dev/null || true)
    echo "Recorded $(date -u +%Y-%m-%d)${commit:+, commit $commit} by scripts/gpu_check.sh."
    echo
    sed -e '1{/^# /{N;d}}' -e 's/^## /### /' "$report/bench_cuda.md"
    echo
    echo "### Planner validation (\`attn2d plan --validate --device cuda\`)"
    echo
    echo '```text'
    cat "$report/plan_validate.txt" 2>/dev/null || echo "(no output)"
    echo '```'
    echo
    echo "GPU tests: $(tail -n 1 "$report/gpu_tests.log" 2>/dev/null || echo 'no output')"
  } >"$section"
  "$py" -c "import sys; from attn2d.bench_cuda import splice_file; splice_file(*sys.argv[1:])" \
    docs/benchmarks.md "$section"
  summary+=("ok       docs/benchmarks.md: GPU figures written between its gpu-check markers")
else
  summary+=("SKIPPED  docs/benchmarks.md left as it was: the bench wrote no bench_cuda.md")
  failed=1
fi

echo
gpu=$("$py" -c 'import torch; print(torch.cuda.get_device_name())')
echo "== summary ($((SECONDS - started)) s in all, on $gpu)"
printf '  %s\n' "${summary[@]}"
if [ -s "$report/bench_cuda.md" ]; then
  echo
  cat "$report/bench_cuda.md"
fi
echo
echo "outputs: $report/"

if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  for f in gpu_check.log bench_cuda.md bench_cuda.json gpu_tests.log plan_validate.txt \
    natten_install.log; do
    if [ -f "$report/$f" ]; then cp "$report/$f" "$OUT/"; fi
  done
  cp docs/benchmarks.md "$OUT/benchmarks.md"
fi
exit "$failed"
