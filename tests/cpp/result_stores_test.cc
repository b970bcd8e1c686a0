// When the backward writes its gradients past the caches (cpu/common/result_stores.h).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "attn2d/attention_params.h"
#include "attn2d/host.h"
#include "cpu/common/result_stores.h"

namespace attn2d {
namespace cpu {
namespace {

TEST(ResultStores, GradientsPastTheThreadsL2Stream) {
  const std::int64_t l2 = l2_cache_bytes();
  ASSERT_GT(l2, 0);
  Host host = thread_host(3);
  EXPECT_FALSE(stream_results(host, 3 * l2));
  EXPECT_TRUE(stream_results(host, 3 * l2 + 1));
  host.num_threads = 1;
  EXPECT_TRUE(stream_results(host, l2 + 1));
}

TEST(ResultStores, TheHostsLimitOverridesTheL2) {
  Host host = serial_host();
  host.stream_result_bytes = 0;
  EXPECT_TRUE(stream_results(host, 1));
  EXPECT_FALSE(stream_results(host, 0));
  host.stream_result_bytes = std::numeric_limits<std::int64_t>::max();
  EXPECT_FALSE(stream_results(host, std::int64_t{1} << 40));
}

TEST(ResultStores, GradientBytesCountDqDkAndDv) {
  AttentionParams p;
  p.batch = 2, p.heads = 3, p.len_q = 100, p.len_k = 25, p.dim_qk = 16, p.dim_v = 8;
  // dQ (100 x 16), dK (25 x 16) and dV (25 x 8) per (batch, head), 4-byte elements.
  EXPECT_EQ(gradient_bytes(p, 4), 2 * 3 * (1600 + 400 + 200) * 4);
}

}  // namespace
}  // namespace cpu
}  // namespace attn2d
