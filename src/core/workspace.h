// Scratch memory borrowed from the host for the length of one core call.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>
#include <string>

#include "attn2d/host.h"
#include "attn2d/status.h"

namespace attn2d {

class Workspace {
 public:
  explicit Workspace(const Host& host) : host_(host) {}
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() {
    if (ptr_ == nullptr) return;
    if (host_.deallocate != nullptr) {
      host_.deallocate(host_.ctx, ptr_);
    } else {
      ::operator delete(ptr_, std::align_val_t{64});
    }
  }

  // Returns false when the host could not provide `bytes`.
  bool allocate(std::size_t bytes) {
    if (bytes == 0) return true;
    ptr_ = host_.allocate != nullptr ? host_.allocate(host_.ctx, bytes)
                                     : ::operator new(bytes, std::align_val_t{64}, std::nothrow);
    return ptr_ != nullptr;
  }

  // allocate(bytes), or an OutOfMemory status naming the op when the host refused.
  Status reserve(std::size_t bytes, const char* op) {
    if (allocate(bytes)) return Status::Ok();
    return Status::OutOfMemory(std::string(op) + ": the host could not allocate " +
                               std::to_string(bytes) + " bytes of workspace");
  }

  unsigned char* data() const { return static_cast<unsigned char*>(ptr_); }

 private:
  const Host& host_;
  void* ptr_ = nullptr;
};

// Runs fn for every task through the host's hook, or serially when it has none.
inline void run_tasks(const Host& host, std::int64_t n_tasks, void* fn_ctx, TaskFn fn) {
  if (n_tasks <= 0) return;
  if (host.parallel_for == nullptr || host.num_threads <= 1 || n_tasks == 1) {
    for (std::int64_t t = 0; t < n_tasks; ++t) fn(fn_ctx, t, 0);
    return;
  }
  host.parallel_for(host.ctx, n_tasks, fn_ctx, fn);
}

// run_tasks, with the tasks handed out in runs of `chunk` consecutive ones to whichever thread
// asks next. A host may split the tasks into one contiguous range a thread, as PyTorch's
// at::parallel_for does, which leaves threads idle where tasks cost unequally: a run of YLG's
// heads (rtl-floor, rtl-floor, rtl-repetitive, rtl-repetitive) gave one thread the cheap floor
// heads and the other the repetitive ones.
inline void run_task_chunks(const Host& host, std::int64_t n_tasks, std::int64_t chunk,
                            void* fn_ctx, TaskFn fn) {
  chunk = std::max<std::int64_t>(chunk, 1);
  const std::int64_t chunks = (n_tasks + chunk - 1) / chunk;
  if (chunks <= 1 || host.parallel_for == nullptr || host.num_threads <= 1) {
    for (std::int64_t t = 0; t < n_tasks; ++t) fn(fn_ctx, t, 0);
    return;
  }
  struct Claims {
    std::atomic<std::int64_t> next{0};
    std::int64_t n_tasks, chunk;
    void* fn_ctx;
    TaskFn fn;
  } claims;
  claims.n_tasks = n_tasks;
  claims.chunk = chunk;
  claims.fn_ctx = fn_ctx;
  claims.fn = fn;
  run_tasks(host, std::min<std::int64_t>(host.num_threads, chunks), &claims,
            [](void* ctx, std::int64_t, int thread) {
              Claims& c = *static_cast<Claims*>(ctx);
              for (std::int64_t first = c.next.fetch_add(c.chunk); first < c.n_tasks;
                   first = c.next.fetch_add(c.chunk)) {
                const std::int64_t end = std::min(c.n_tasks, first + c.chunk);
                for (std::int64_t t = first; t < end; ++t) c.fn(c.fn_ctx, t, thread);
              }
            });
}

}  // namespace attn2d
