// What the caller (PyTorch, or plain C++) lends the core: threads and memory.
// The core owns no thread pool and calls no global allocator for workspace, so a host such as
// PyTorch keeps control of both (its intra-op pool, its CPU allocator).
#pragma once

#include <cstddef>
#include <cstdint>

namespace attn2d {

// fn(fn_ctx, task, thread): runs one task; `thread` in [0, Host::num_threads) names the
// per-thread scratch slot, so two tasks running at once must never share a `thread` value.
using TaskFn = void (*)(void* fn_ctx, std::int64_t task, int thread);

struct Host {
  // Number of distinct `thread` values parallel_for may pass; sizes the scratch (>= 1).
  int num_threads = 1;
  void* ctx = nullptr;
  // Runs fn for every task in [0, n_tasks), in any order, on any threads. Null: serial loop.
  void (*parallel_for)(void* ctx, std::int64_t n_tasks, void* fn_ctx, TaskFn fn) = nullptr;
  // Returns memory aligned to at least 64 bytes, or null on failure. Null: aligned new.
  void* (*allocate)(void* ctx, std::size_t bytes) = nullptr;
  void (*deallocate)(void* ctx, void* ptr) = nullptr;
  // A backward whose gradients (dQ, dK and dV together) exceed this many bytes writes them with
  // non-temporal stores (cpu/common/result_stores.h); -1: the L2 of num_threads cores, as the
  // system reports it. 0 streams every aligned row, INT64_MAX none; the gradients' bits are the
  // same.
  std::int64_t stream_result_bytes = -1;
};

// A single-threaded host with aligned heap memory.
Host serial_host();

// A host that runs tasks on `num_threads` std::threads (one batch of threads per call).
Host thread_host(int num_threads);

}  // namespace attn2d
