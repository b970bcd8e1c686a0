// Measures this machine's fused multiply-add throughput, the denominator of the "fraction of
// peak" that benchmarks report.
#pragma once

#include <cstdint>

#include "attn2d/host.h"

namespace attn2d {

// float32 GFLOP/s (2 per lane per FMA) of independent FMA chains on every host thread, with the
// widest SIMD target the CPU runs, over about `seconds`.
double measure_fma_peak_gflops(const Host& host, double seconds = 0.2);

constexpr int kFmaChains = 12;

// The measurement's loop, once, on the best SIMD target: chain i (of kFmaChains) starts at
// starts[i] and steps c = c * 0.999999f + 1e-7f `iterations` times; ends[i] gets its value.
void run_fma_chains(const float* starts, std::int64_t iterations, float* ends);

}  // namespace attn2d
