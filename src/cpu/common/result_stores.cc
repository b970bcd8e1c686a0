#include "cpu/common/result_stores.h"

#include <unistd.h>

#include <algorithm>

namespace attn2d {
namespace cpu {

std::int64_t l2_cache_bytes() {
  static const std::int64_t bytes = [] {
    const long reported = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return reported > 0 ? static_cast<std::int64_t>(reported) : std::int64_t{1} << 20;
  }();
  return bytes;
}

bool stream_results(const Host& host, std::int64_t bytes) {
  const std::int64_t limit = host.stream_result_bytes >= 0
                                 ? host.stream_result_bytes
                                 : l2_cache_bytes() * std::max(host.num_threads, 1);
  return bytes > limit;
}

std::int64_t gradient_bytes(const AttentionParams& p, std::int64_t elem_bytes) {
  return p.batch * p.heads * (p.len_q * p.dim_qk + p.len_k * (p.dim_qk + p.dim_v)) * elem_bytes;
}

}  // namespace cpu
}  // namespace attn2d
