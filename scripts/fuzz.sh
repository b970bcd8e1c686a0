#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with Clang (-fsanitize=fuzzer,address,undefined) in
# build/fuzz and runs each for 60 s from a copy of its seed corpus (tests/fuzz/corpus/<target>);
# --quick (or ATTN2D_FUZZ_SECONDS) shortens the runs, to 20 s for CI. Fails on the first target
# that crashes, aborts, leaks or trips a sanitizer, naming the input that did (kept in
# build/fuzz/artifacts/). Needs clang-16 and libclang-rt-16-dev (Debian 12) beside what
# scripts/setup.sh installs. ATTN2D_JOBS: build jobs (default: all cores).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${ATTN2D_FUZZ_SECONDS:-60}"
[ "${1:-}" = "--quick" ] && seconds="${ATTN2D_FUZZ_SECONDS:-20}"
jobs="${ATTN2D_JOBS:-$(nproc)}"
targets="validate_fuzz layout_fuzz window_fuzz patterns_fuzz"

cmake -S . -B build/fuzz -DCMAKE_CXX_COMPILER="${ATTN2D_FUZZ_CXX:-clang++-16}" \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only" \
  -DATTN2D_FUZZ=ON -DATTN2D_BUILD_TESTS=OFF >/dev/null
cmake --build build/fuzz -j "$jobs" --target $targets

mkdir -p build/fuzz/artifacts
# allocator_may_return_null: a huge allocation throws std::bad_alloc, as it does outside ASan,
# so that the core's own handling of it (a Status) is what runs.
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1"
for t in $targets; do
  # A copy, so that the inputs the run adds do not land in the committed seeds.
  work="build/fuzz/corpus/$t"
  rm -rf "$work" && mkdir -p "$work" && cp tests/fuzz/corpus/"$t"/* "$work"/
  echo "fuzz: $t for ${seconds}s"
  if ! "build/fuzz/$t" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 \
      -print_final_stats=1 -artifact_prefix="build/fuzz/artifacts/$t-" "$work" \
      >"build/fuzz/$t.log" 2>&1; then
    tail -n 60 "build/fuzz/$t.log"
    echo "fuzz: $t FAILED; reproduce with build/fuzz/$t build/fuzz/artifacts/$t-*" >&2
    exit 1
  fi
  grep -E "^#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|stat::peak_rss_mb" \
    "build/fuzz/$t.log" || true
done
