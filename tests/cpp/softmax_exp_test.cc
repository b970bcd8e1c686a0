// The kernels' float32 exp (SoftmaxExp) on every compiled SIMD target: accuracy against the
// float64 exp over the softmax's arguments, the range rules (0 below -87 and for -inf, NaN kept),
// and the same bits on every target with fused multiply-adds, where AVX-512 scales by 2^n with
// VSCALEFPS and the others add n to the exponent bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/common/softmax_exp.h"
#include "hwy/targets.h"
#include "hwy/tests/hwy_gtest.h"

namespace attn2d {
namespace {

// Arguments x <= 0: a dense sweep of [-87, 0], the ends and their neighbours, the underflow
// region below -87, -inf and NaN; 1003 values, so that the last vector is a partial one.
std::vector<float> Arguments() {
  std::vector<float> x;
  for (int i = 0; i <= 980; ++i) x.push_back(-87.0f * static_cast<float>(i) / 980.0f);
  for (float v : {-0.0f, -1e-30f, -1e-7f, std::nextafter(-87.0f, 0.0f), -87.0f,
                  std::nextafter(-87.0f, -100.0f), -87.3f, -88.0f, -100.0f, -1e30f,
                  -0.34657359f, -0.34657360f, -0.6931472f, -42.5f, -86.99f, -12.0f, -3.5f,
                  -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), -1.0f, -2.0f, -64.0f}) {
    x.push_back(v);
  }
  return x;
}

std::vector<float> ExpOnTarget(std::int64_t target, const std::vector<float>& x) {
  hwy::SetSupportedTargetsForTest(target);
  std::vector<float> out(x.size());
  cpu::softmax_exp(x.data(), x.size(), out.data());
  hwy::SetSupportedTargetsForTest(0);
  return out;
}

bool HasFma(std::int64_t target) {
#if HWY_ARCH_X86
  return target <= HWY_AVX2;
#else
  (void)target;
  return false;
#endif
}

// Each test on every SIMD target this build compiled and this CPU runs.
class SoftmaxExpOnTarget : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(SoftmaxExpOnTarget);

TEST_P(SoftmaxExpOnTarget, AccurateAndInRange) {
  const std::vector<float> x = Arguments();
  std::vector<float> y(x.size());
  cpu::softmax_exp(x.data(), x.size(), y.data());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(y[i]));
    } else if (x[i] < -87.0f) {
      EXPECT_EQ(y[i], 0.0f) << "x = " << x[i];
    } else {
      const double want = std::exp(static_cast<double>(x[i]));
      worst = std::max(worst, std::abs(y[i] - want) / want);
    }
  }
  // The polynomial costs 1.7e-8 relative (minimax, float32 coefficients), float32 rounding a
  // few units of 2^-24 (6e-8): 2.9 units over 2 million arguments in [-87, 0] on AVX3, AVX2,
  // SSE4, SSSE3 and the scalar target. Bound: 4 units.
  EXPECT_LT(worst, 4 * 0x1p-24);
}

TEST(SoftmaxExp, SameBitsOnEveryTargetWithFusedMultiplyAdds) {
  std::vector<std::int64_t> fma_targets;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    if (HasFma(target)) fma_targets.push_back(target);
  }
  // One such target (a CPU without AVX-512) leaves nothing to compare; say so rather than pass.
  if (fma_targets.size() < 2) GTEST_SKIP() << "fewer than two targets with fused multiply-adds";
  const std::vector<float> x = Arguments();
  std::vector<float> first;
  const char* first_name = nullptr;
  for (std::int64_t target : fma_targets) {
    const std::vector<float> y = ExpOnTarget(target, x);
    if (first_name == nullptr) {
      first = y;
      first_name = hwy::TargetName(target);
      continue;
    }
    for (size_t i = 0; i < x.size(); ++i) {
      if (std::isnan(x[i])) continue;
      EXPECT_EQ(std::memcmp(&y[i], &first[i], sizeof(float)), 0)
          << "x = " << x[i] << ": " << y[i] << " on " << hwy::TargetName(target) << ", "
          << first[i] << " on " << first_name;
    }
  }
}

}  // namespace
}  // namespace attn2d
