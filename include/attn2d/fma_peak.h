// Measures this machine's fused multiply-add throughput, the denominator of the "fraction of
// peak" that benchmarks report.
#pragma once

#include "attn2d/host.h"

namespace attn2d {

// float32 GFLOP/s (2 per lane per FMA) of independent FMA chains on every host thread, with the
// widest SIMD target the CPU runs, over about `seconds`.
double measure_fma_peak_gflops(const Host& host, double seconds = 0.2);

}  // namespace attn2d
