// kFmaChains independent accumulator chains per thread: enough to cover FMA latency (4-5 cycles)
// times throughput (2 per cycle) on current x86 cores, so the loop runs at the FMA units' peak.
// The chains start from values the compiler cannot see: when they all started at 1.0f, GCC 12
// proved them equal and kept one, so the loop ran one dependent FMA per iteration while the
// count said 12, and the "peak" came out 1.5x the machine's (on an AMD EPYC Zen 4).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/common/fma_peak.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <atomic>
#include <chrono>
#include <cstdint>

#include "attn2d/fma_peak.h"
#include "core/workspace.h"
#include "cpu/attention_cpu.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Chain i starts at starts[i] in every lane and steps c = c * a + b `iterations` times;
// ends[i] gets its final value (so every chain's work is observable and checked by the tests).
void FmaChains(const float* HWY_RESTRICT starts, std::int64_t iterations,
               float* HWY_RESTRICT ends) {
  static_assert(kFmaChains == 12, "the loop below spells out 12 chains");
  const hn::ScalableTag<float> d;
  const auto a = hn::Set(d, 0.999999f), b = hn::Set(d, 1e-7f);
  auto c0 = hn::Set(d, starts[0]), c1 = hn::Set(d, starts[1]), c2 = hn::Set(d, starts[2]);
  auto c3 = hn::Set(d, starts[3]), c4 = hn::Set(d, starts[4]), c5 = hn::Set(d, starts[5]);
  auto c6 = hn::Set(d, starts[6]), c7 = hn::Set(d, starts[7]), c8 = hn::Set(d, starts[8]);
  auto c9 = hn::Set(d, starts[9]), c10 = hn::Set(d, starts[10]), c11 = hn::Set(d, starts[11]);
  for (std::int64_t i = 0; i < iterations; ++i) {
    c0 = hn::MulAdd(c0, a, b), c1 = hn::MulAdd(c1, a, b), c2 = hn::MulAdd(c2, a, b);
    c3 = hn::MulAdd(c3, a, b), c4 = hn::MulAdd(c4, a, b), c5 = hn::MulAdd(c5, a, b);
    c6 = hn::MulAdd(c6, a, b), c7 = hn::MulAdd(c7, a, b), c8 = hn::MulAdd(c8, a, b);
    c9 = hn::MulAdd(c9, a, b), c10 = hn::MulAdd(c10, a, b), c11 = hn::MulAdd(c11, a, b);
  }
  ends[0] = hn::GetLane(c0), ends[1] = hn::GetLane(c1), ends[2] = hn::GetLane(c2);
  ends[3] = hn::GetLane(c3), ends[4] = hn::GetLane(c4), ends[5] = hn::GetLane(c5);
  ends[6] = hn::GetLane(c6), ends[7] = hn::GetLane(c7), ends[8] = hn::GetLane(c8);
  ends[9] = hn::GetLane(c9), ends[10] = hn::GetLane(c10), ends[11] = hn::GetLane(c11);
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn2d {
namespace cpu {
HWY_EXPORT(FmaChains);
}  // namespace cpu

void run_fma_chains(const float* starts, std::int64_t iterations, float* ends) {
  HWY_DYNAMIC_DISPATCH(cpu::FmaChains)(starts, iterations, ends);
}

namespace {
// Distinct starts, read at run time: see the note at the top of the file.
float ChainsOnce(std::int64_t iterations) {
  volatile float first = 1.0f;
  float starts[kFmaChains], ends[kFmaChains];
  for (int i = 0; i < kFmaChains; ++i) starts[i] = first + 0.125f * static_cast<float>(i);
  run_fma_chains(starts, iterations, ends);
  float sum = 0;
  for (float e : ends) sum += e;
  return sum;
}
}  // namespace

double measure_fma_peak_gflops(const Host& host, double seconds) {
  using Clock = std::chrono::steady_clock;
  const int threads = host.num_threads < 1 ? 1 : host.num_threads;
  // Calibrate a per-thread iteration count on one thread, then run all threads at once.
  std::int64_t iterations = 1 << 16;
  for (;;) {
    const auto t0 = Clock::now();
    volatile float sink = ChainsOnce(iterations);
    (void)sink;
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (dt > seconds / 4 || iterations > (std::int64_t{1} << 40)) break;
    iterations *= 2;
  }
  struct Ctx {
    std::int64_t iterations;
    std::atomic<float> sink{0};
  } ctx;
  ctx.iterations = iterations;
  const auto t0 = Clock::now();
  run_tasks(host, threads, &ctx, [](void* c, std::int64_t, int) {
    Ctx& x = *static_cast<Ctx*>(c);
    x.sink.store(ChainsOnce(x.iterations));
  });
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  const double lanes = static_cast<double>(cpu::vector_lanes(/*float64=*/false));
  const double flops = 2.0 * kFmaChains * lanes * static_cast<double>(iterations) * threads;
  return flops / dt / 1e9;
}

}  // namespace attn2d
#endif  // HWY_ONCE
