#include "cpu/common/tiling.h"

#include <gtest/gtest.h>

namespace attn2d {
namespace cpu {
namespace {

TEST(Tiling, TilesAreWholeVectorsAndRowBlocks) {
  for (std::int64_t len : {1, 7, 97, 1025, 65536}) {
    for (std::int64_t E : {1, 3, 8, 59, 64, 128, 512, 1024}) {
      for (std::int64_t Ev : {1, 8, 64, 513}) {
        for (std::size_t eb : {4u, 8u}) {
          const TileSizes t = choose_tiles(len, len, E, Ev, eb, 16);
          EXPECT_EQ(t.block_k % 16, 0);
          EXPECT_GE(t.block_k, 16);
          EXPECT_LE(t.block_k, 256);
          EXPECT_EQ(t.block_q % 4, 0);
          EXPECT_GE(t.block_q, 4);
          EXPECT_LE(t.block_q, 256);
          EXPECT_LE(t.block_q * t.block_k, 65536);
          // Never much larger than the problem.
          EXPECT_LE(t.block_k, round_up(len, 16));
          EXPECT_LE(t.block_q, round_up(len, 4));
          // The packed K/V tile fits the 128 KiB budget unless a single vector already exceeds it.
          if (t.block_k > 16) EXPECT_LE(t.block_k * (E + Ev) * static_cast<std::int64_t>(eb), 128 * 1024);
        }
      }
    }
  }
}

TEST(Tiling, WideHeadsGetFewerKeys) {
  EXPECT_GT(choose_tiles(4096, 4096, 8, 8, 4, 16).block_k,
            choose_tiles(4096, 4096, 256, 256, 4, 16).block_k);
}

TEST(Tiling, IsAPureFunction) {
  const TileSizes a = choose_tiles(1000, 2000, 59, 17, 4, 8);
  const TileSizes b = choose_tiles(1000, 2000, 59, 17, 4, 8);
  EXPECT_EQ(a.block_q, b.block_q);
  EXPECT_EQ(a.block_k, b.block_k);
  EXPECT_EQ(a.block_k % 8, 0);
}

TEST(Tiling, BackwardScheduleKeepsEveryThreadBusy) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  const std::size_t share = 4096 * 16;  // len_q 4096, E_pad 16
  // One thread: whole heads, always.
  EXPECT_EQ(choose_backward_schedule(1, 1, 8, 64, 8, share, 4, 256 * kMiB),
            Schedule::kWholeHeads);
  // SAGAN (one head) on two threads: its 8 key-tile groups split evenly.
  EXPECT_EQ(choose_backward_schedule(1, 2, 8, 64, 8, share, 4, 256 * kMiB),
            Schedule::kKeyTileGroups);
  // ViT-B (12 heads) on two threads: whole heads.
  EXPECT_EQ(choose_backward_schedule(12, 2, 64, 64, 4, 1024 * 64, 4, 256 * kMiB),
            Schedule::kWholeHeads);
  // One head of one key tile on four threads: only two passes split it.
  EXPECT_EQ(choose_backward_schedule(1, 4, 8, 64, 1, share, 4, 256 * kMiB),
            Schedule::kTwoPasses);
  // Shares over the cap: two passes, which need none.
  EXPECT_EQ(choose_backward_schedule(1, 2, 8, 64, 8, share, 4, share * 4),
            Schedule::kTwoPasses);
  EXPECT_EQ(backward_dq_groups(1), 1);
  EXPECT_EQ(backward_dq_groups(3), 3);
  EXPECT_EQ(backward_dq_groups(100), 8);
}

}  // namespace
}  // namespace cpu
}  // namespace attn2d

#include <cmath>
#include <cstdint>

#include "attn2d/fma_peak.h"
#include "attn2d/host.h"
#include "hwy/targets.h"
#include "hwy/tests/hwy_gtest.h"

namespace attn2d {
namespace {

// Every chain of the peak probe must run on its own: with equal starts GCC once merged the 12
// chains into one, so the probe timed one dependent FMA per iteration and reported 1.5x the
// machine's peak. Distinct starts must come back as 12 distinct, correct values on every target.
class FmaPeakOnTarget : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(FmaPeakOnTarget);

TEST_P(FmaPeakOnTarget, EveryChainRuns) {
  constexpr std::int64_t kIterations = 1000;
  float starts[kFmaChains], expected[kFmaChains];
  for (int i = 0; i < kFmaChains; ++i) {
    starts[i] = 1.0f + 0.125f * static_cast<float>(i);
    float c = starts[i];
    for (std::int64_t k = 0; k < kIterations; ++k) c = std::fma(c, 0.999999f, 1e-7f);
    expected[i] = c;
  }
  float ends[kFmaChains];
  run_fma_chains(starts, kIterations, ends);
  for (int i = 0; i < kFmaChains; ++i) {
    // Targets without a fused multiply-add round twice a step: up to an ulp (2^-23) each.
    EXPECT_NEAR(ends[i], expected[i], kIterations * 0x1p-23f * expected[i]) << "chain " << i;
  }
}

TEST(FmaPeak, MeasuresAPositiveRate) {
  const double gflops = measure_fma_peak_gflops(serial_host(), 0.01);
  EXPECT_GT(gflops, 0.5);
  EXPECT_LT(gflops, 1e5);
}

}  // namespace
}  // namespace attn2d
