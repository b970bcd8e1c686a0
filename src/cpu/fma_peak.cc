// 12 independent accumulator chains per thread: enough to cover FMA latency (4-5 cycles) times
// throughput (2 per cycle) on current x86 cores, so the loop runs at the FMA units' peak.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/fma_peak.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <atomic>
#include <chrono>
#include <cstdint>

#include "attn2d/fma_peak.h"
#include "core/workspace.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Runs `iterations` x 12 vector FMAs; returns a value that depends on all of them so the
// compiler keeps the work.
float FmaChains(std::int64_t iterations) {
  const hn::ScalableTag<float> d;
  const auto a = hn::Set(d, 0.999999f), b = hn::Set(d, 1e-7f);
  auto c0 = hn::Set(d, 1.0f), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
  auto c6 = c0, c7 = c0, c8 = c0, c9 = c0, c10 = c0, c11 = c0;
  for (std::int64_t i = 0; i < iterations; ++i) {
    c0 = hn::MulAdd(c0, a, b), c1 = hn::MulAdd(c1, a, b), c2 = hn::MulAdd(c2, a, b);
    c3 = hn::MulAdd(c3, a, b), c4 = hn::MulAdd(c4, a, b), c5 = hn::MulAdd(c5, a, b);
    c6 = hn::MulAdd(c6, a, b), c7 = hn::MulAdd(c7, a, b), c8 = hn::MulAdd(c8, a, b);
    c9 = hn::MulAdd(c9, a, b), c10 = hn::MulAdd(c10, a, b), c11 = hn::MulAdd(c11, a, b);
  }
  const auto s = hn::Add(hn::Add(hn::Add(c0, c1), hn::Add(c2, c3)),
                         hn::Add(hn::Add(hn::Add(c4, c5), hn::Add(c6, c7)),
                                 hn::Add(hn::Add(c8, c9), hn::Add(c10, c11))));
  return hn::GetLane(hn::SumOfLanes(d, s));
}

std::int64_t FloatLanes() { return static_cast<std::int64_t>(hn::Lanes(hn::ScalableTag<float>())); }

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn2d {
namespace cpu {
HWY_EXPORT(FmaChains);
HWY_EXPORT(FloatLanes);
}  // namespace cpu

double measure_fma_peak_gflops(const Host& host, double seconds) {
  using Clock = std::chrono::steady_clock;
  const int threads = host.num_threads < 1 ? 1 : host.num_threads;
  // Calibrate a per-thread iteration count on one thread, then run all threads at once.
  std::int64_t iterations = 1 << 16;
  for (;;) {
    const auto t0 = Clock::now();
    volatile float sink = HWY_DYNAMIC_DISPATCH(cpu::FmaChains)(iterations);
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
    x.sink.store(HWY_DYNAMIC_DISPATCH(cpu::FmaChains)(x.iterations));
  });
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  const double flops = 2.0 * 12.0 * static_cast<double>(HWY_DYNAMIC_DISPATCH(cpu::FloatLanes)()) *
                       static_cast<double>(iterations) * threads;
  return flops / dt / 1e9;
}

}  // namespace attn2d
#endif  // HWY_ONCE
