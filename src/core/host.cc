#include "attn2d/host.h"

#include <atomic>
#include <cstdint>
#include <new>
#include <thread>
#include <vector>

namespace attn2d {
namespace {

// 64 bytes: a cache line, and the widest SIMD vector (AVX-512) the kernels load.
constexpr std::align_val_t kAlignment{64};

void* aligned_allocate(void*, std::size_t bytes) {
  return ::operator new(bytes, kAlignment, std::nothrow);
}

void aligned_deallocate(void*, void* ptr) { ::operator delete(ptr, kAlignment); }

void threads_parallel_for(void* ctx, std::int64_t n_tasks, void* fn_ctx, TaskFn fn) {
  const int num_threads = static_cast<int>(reinterpret_cast<std::intptr_t>(ctx));
  std::atomic<std::int64_t> next{0};
  auto worker = [&](int thread) {
    for (std::int64_t task = next++; task < n_tasks; task = next++) fn(fn_ctx, task, thread);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < num_threads && t < n_tasks; ++t) pool.emplace_back(worker, t);
  worker(0);
  for (auto& th : pool) th.join();
}

}  // namespace

Host serial_host() {
  Host host;
  host.num_threads = 1;
  host.allocate = aligned_allocate;
  host.deallocate = aligned_deallocate;
  return host;
}

Host thread_host(int num_threads) {
  Host host = serial_host();
  host.num_threads = num_threads < 1 ? 1 : num_threads;
  host.ctx = reinterpret_cast<void*>(static_cast<std::intptr_t>(host.num_threads));
  host.parallel_for = threads_parallel_for;
  return host;
}

}  // namespace attn2d
