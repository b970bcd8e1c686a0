// A dense mask holds heads * len_q * len_k bytes: that count must be addressable.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "attn2d/status.h"

namespace attn2d {
namespace patterns {

inline Status check_dense_mask_size(const char* pattern, std::int64_t heads, std::int64_t len_q,
                                    std::int64_t len_k) {
  // len_q and len_k are at most 2^31 - 1 (check_grid), so their product fits.
  const std::int64_t per_head = len_q * len_k;
  if (heads > std::numeric_limits<std::int64_t>::max() / per_head) {
    return Status::OutOfMemory(std::string(pattern) + ".dense_mask: " + std::to_string(heads) +
                               " heads of " + std::to_string(len_q) + "x" +
                               std::to_string(len_k) + " entries exceed the addressable size");
  }
  return Status::Ok();
}

}  // namespace patterns
}  // namespace attn2d
