// run_task_chunks (core/workspace.h): every task runs once, a run of consecutive tasks on one
// thread, under a host that splits its tasks into one contiguous range a thread (as PyTorch's
// at::parallel_for does) and under the serial host.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "attn2d/host.h"
#include "core/workspace.h"

namespace attn2d {
namespace {

// A host whose parallel_for gives thread t the t-th contiguous range of the tasks.
void contiguous_ranges(void* ctx, std::int64_t n_tasks, void* fn_ctx, TaskFn fn) {
  const int threads = static_cast<int>(reinterpret_cast<std::intptr_t>(ctx));
  const std::int64_t per = (n_tasks + threads - 1) / threads;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([=] {
      for (std::int64_t i = t * per; i < std::min(n_tasks, (t + 1) * per); ++i) fn(fn_ctx, i, t);
    });
  }
  for (auto& th : pool) th.join();
}

struct Record {
  std::vector<std::atomic<int>> runs;
  std::vector<int> thread;  // the thread that ran each task
  explicit Record(std::int64_t n)
      : runs(static_cast<size_t>(n)), thread(static_cast<size_t>(n), -1) {}
};

void note(void* ctx, std::int64_t task, int thread) {
  Record& r = *static_cast<Record*>(ctx);
  ++r.runs[static_cast<size_t>(task)];
  r.thread[static_cast<size_t>(task)] = thread;
}

TEST(RunTaskChunks, EveryTaskOnceAndEachChunkOnOneThread) {
  Host ranges = serial_host();
  ranges.num_threads = 3;
  ranges.ctx = reinterpret_cast<void*>(std::intptr_t{3});
  ranges.parallel_for = contiguous_ranges;
  for (const Host& host : {ranges, serial_host(), thread_host(4)}) {
    for (const std::int64_t n : {1, 2, 7, 64, 1000}) {
      for (const std::int64_t chunk : {0, 1, 5, 64, 2000}) {
        Record r(n);
        run_task_chunks(host, n, chunk, &r, note);
        const std::int64_t c = std::max<std::int64_t>(chunk, 1);
        for (std::int64_t t = 0; t < n; ++t) {
          const size_t i = static_cast<size_t>(t);
          ASSERT_EQ(r.runs[i].load(), 1) << "task " << t << " of " << n << ", chunk " << chunk;
          ASSERT_GE(r.thread[i], 0);
          ASSERT_LT(r.thread[i], host.num_threads);
          if (t % c != 0) {
            EXPECT_EQ(r.thread[i], r.thread[i - 1]) << "task " << t << " left its chunk";
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace attn2d
