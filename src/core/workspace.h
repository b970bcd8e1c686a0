// Scratch memory borrowed from the host for the length of one core call.
#pragma once

#include <cstddef>
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

}  // namespace attn2d
