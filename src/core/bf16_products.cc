#include "attn2d/bf16_products.h"

#include <atomic>

#if defined(ATTN2D_HAVE_AVX512_BF16)
#include "cpu/common/bf16_pairs_avx512.h"
#endif

namespace attn2d {
namespace {
std::atomic<int> g_choice{static_cast<int>(Bf16Products::kAuto)};
}  // namespace

void set_bf16_products(Bf16Products choice) {
  g_choice.store(static_cast<int>(choice), std::memory_order_relaxed);
}

Bf16Products bf16_products() {
  return static_cast<Bf16Products>(g_choice.load(std::memory_order_relaxed));
}

bool bf16_pairs_in_use() {
#if defined(ATTN2D_HAVE_AVX512_BF16)
  return cpu::use_bf16_pairs();
#else
  return false;  // built without the pair kernels
#endif
}

}  // namespace attn2d
