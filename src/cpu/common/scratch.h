// Carves one thread's slice of the workspace into 64-byte aligned arrays. Run with a null base
// it only counts, so the same code both sizes and lays out the scratch.
#pragma once

#include <cstddef>

namespace attn2d {
namespace cpu {

template <typename T>
class ScratchCarver {
 public:
  explicit ScratchCarver(T* base) : base_(base) {}
  // 64 bytes per array keeps every array on its own cache lines and vector loads aligned.
  static std::size_t padded(std::size_t n) {
    constexpr std::size_t kGrain = 64 / sizeof(T);
    return (n + kGrain - 1) / kGrain * kGrain;
  }
  T* take(std::size_t n) {
    T* p = base_ == nullptr ? nullptr : base_ + used_;
    used_ += padded(n);
    return p;
  }
  std::size_t used() const { return used_; }

 private:
  T* base_;
  std::size_t used_ = 0;
};

}  // namespace cpu
}  // namespace attn2d
