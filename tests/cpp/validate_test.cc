// Bad params come back as a Status naming the field; nothing aborts.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "attention_test_util.h"

namespace attn2d {
namespace testing {
namespace {

AttentionParams good_params(Problem<float>& pr, Tensor4<float>& out, std::vector<float>& lse) {
  return forward_params(pr, out, lse);
}

TEST(Validate, AcceptsAGoodProblem) {
  auto pr = make_problem<float>(1, 1, 4, 4, 2, 2, Layout::kContiguous, 1);
  auto out = make_tensor<float>({1, 1, 4, 2}, Layout::kContiguous);
  std::vector<float> lse(4);
  EXPECT_TRUE(validate(good_params(pr, out, lse)).ok());
}

TEST(Validate, RejectsNegativeSizesNonFiniteScaleAndNullPointers) {
  auto pr = make_problem<float>(1, 1, 4, 4, 2, 2, Layout::kContiguous, 1);
  auto out = make_tensor<float>({1, 1, 4, 2}, Layout::kContiguous);
  std::vector<float> lse(4);
  struct Case {
    void (*mutate)(AttentionParams&);
    const char* field;
  } cases[] = {
      {[](AttentionParams& p) { p.len_q = -1; }, "len_q"},
      {[](AttentionParams& p) { p.dim_v = -3; }, "dim_v"},
      {[](AttentionParams& p) { p.scale = std::numeric_limits<double>::infinity(); }, "scale"},
      {[](AttentionParams& p) { p.scale = std::nan(""); }, "scale"},
      {[](AttentionParams& p) { p.q = nullptr; }, "q"},
      {[](AttentionParams& p) { p.out = nullptr; }, "out"},
      {[](AttentionParams& p) { p.mask_kind = MaskKind::kBool; }, "mask"},
      {[](AttentionParams& p) { p.mask_kind = static_cast<MaskKind>(7); }, "mask_kind"},
  };
  for (const Case& c : cases) {
    AttentionParams p = good_params(pr, out, lse);
    c.mutate(p);
    const Status s = validate(p);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(s.message().find(c.field), std::string::npos) << s.message();
    const Status run_status = attention_forward(p, serial_host());
    EXPECT_EQ(run_status.code(), StatusCode::kInvalidArgument) << c.field;
  }
}

TEST(Validate, RejectsUnknownDtype) {
  auto pr = make_problem<float>(1, 1, 4, 4, 2, 2, Layout::kContiguous, 1);
  auto out = make_tensor<float>({1, 1, 4, 2}, Layout::kContiguous);
  std::vector<float> lse(4);
  AttentionParams p = good_params(pr, out, lse);
  p.dtype = static_cast<DType>(9);
  EXPECT_EQ(validate(p).code(), StatusCode::kUnsupported);
}

TEST(Validate, BackwardNeedsLseAndGradients) {
  auto pr = make_problem<float>(1, 1, 4, 4, 2, 2, Layout::kContiguous, 1);
  auto out = make_tensor<float>({1, 1, 4, 2}, Layout::kContiguous);
  std::vector<float> lse(4);
  AttentionBackwardParams bp;
  bp.fwd = good_params(pr, out, lse);
  bp.fwd.lse = nullptr;
  EXPECT_NE(validate(bp).message().find("lse"), std::string::npos);
  bp.fwd.lse = lse.data();
  EXPECT_NE(validate(bp).message().find("dout"), std::string::npos);
  EXPECT_EQ(attention_backward(bp, serial_host()).code(), StatusCode::kInvalidArgument);
}

TEST(Validate, OutAccumIsFor16BitDtypesAndStandsInForOutInTheBackward) {
  auto pr = make_problem<float>(1, 1, 4, 4, 2, 2, Layout::kContiguous, 1);
  auto out = make_tensor<float>({1, 1, 4, 2}, Layout::kContiguous);
  std::vector<float> lse(4);
  AttentionParams p = good_params(pr, out, lse);
  p.out_accum = out.data.data();
  const Status s = validate(p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("out_accum"), std::string::npos) << s.message();
  p.dtype = DType::kBFloat16;
  EXPECT_TRUE(validate(p).ok());
  p.out = nullptr;  // the forward writes out, whatever else it writes
  EXPECT_NE(validate(p).message().find("out"), std::string::npos);

  AttentionBackwardParams bp;
  bp.fwd = good_params(pr, out, lse);
  bp.fwd.dtype = DType::kBFloat16;
  bp.dout = bp.dq = bp.dk = bp.dv = out.data.data();
  bp.fwd.out = nullptr;
  EXPECT_NE(validate(bp).message().find("out (or out_accum)"), std::string::npos);
  bp.fwd.out_accum = out.data.data();
  EXPECT_TRUE(validate(bp).ok());
}

TEST(Validate, EmptyTensorsNeedNoPointers) {
  AttentionParams p;
  p.batch = 0, p.heads = 3, p.len_q = 5, p.len_k = 5, p.dim_qk = 4, p.dim_v = 4;
  EXPECT_TRUE(validate(p).ok());
  EXPECT_TRUE(attention_forward(p, serial_host()).ok());
}

}  // namespace
}  // namespace testing
}  // namespace attn2d
