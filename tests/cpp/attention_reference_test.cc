// The oracle itself, against values worked out by hand.
#include <gtest/gtest.h>

#include <cmath>

#include "attention_test_util.h"

namespace attn2d {
namespace testing {
namespace {

// One query, two keys: softmax([s0, s1]) weights the two value rows.
TEST(Reference, TwoKeysByHand) {
  auto pr = make_problem<double>(1, 1, 1, 2, 1, 2, Layout::kContiguous, 1);
  pr.scale = 0.5;
  pr.q.at(0, 0, 0, 0) = 2.0;
  pr.k.at(0, 0, 0, 0) = 1.0;   // s0 = 0.5 * 2 * 1 = 1
  pr.k.at(0, 0, 1, 0) = -1.0;  // s1 = -1
  pr.v.at(0, 0, 0, 0) = 1.0, pr.v.at(0, 0, 0, 1) = 0.0;
  pr.v.at(0, 0, 1, 0) = 0.0, pr.v.at(0, 0, 1, 1) = 1.0;
  pr.dout.at(0, 0, 0, 0) = 1.0, pr.dout.at(0, 0, 0, 1) = 0.0;
  const Result<double> r = run(pr, Backend::kReference, serial_host());
  ASSERT_TRUE(r.forward_status.ok() && r.backward_status.ok());
  const double p0 = 1.0 / (1.0 + std::exp(-2.0)), p1 = 1.0 - p0;
  EXPECT_NEAR(r.out.at(0, 0, 0, 0), p0, 1e-15);
  EXPECT_NEAR(r.out.at(0, 0, 0, 1), p1, 1e-15);
  EXPECT_NEAR(r.lse[0], std::log(std::exp(1.0) + std::exp(-1.0)), 1e-15);
  // dL/dout = (1, 0): dP = (1, 0), D = p0, dS = (p0 (1 - p0), -p1 p0).
  const double ds0 = p0 * (1 - p0), ds1 = -p1 * p0;
  EXPECT_NEAR(r.dq.at(0, 0, 0, 0), 0.5 * (ds0 * 1.0 + ds1 * -1.0), 1e-15);
  EXPECT_NEAR(r.dk.at(0, 0, 0, 0), 0.5 * ds0 * 2.0, 1e-15);
  EXPECT_NEAR(r.dk.at(0, 0, 1, 0), 0.5 * ds1 * 2.0, 1e-15);
  EXPECT_NEAR(r.dv.at(0, 0, 0, 0), p0, 1e-15);
  EXPECT_NEAR(r.dv.at(0, 0, 1, 0), p1, 1e-15);
  EXPECT_EQ(r.dv.at(0, 0, 0, 1), 0.0);
}

// Gradients of the oracle against central finite differences of its own forward.
TEST(Reference, GradientsMatchFiniteDifferences) {
  auto pr = make_problem<double>(1, 2, 4, 5, 3, 2, Layout::kSequenceMajor, 2, MaskKind::kAdditive,
                                 {true, false, false, false}, /*causal=*/true);
  const Result<double> r = run(pr, Backend::kReference, serial_host());
  auto loss = [&](const Problem<double>& p) {
    const Result<double> f = run(p, Backend::kReference, serial_host());
    double s = 0;
    f.out.for_each([&](auto b, auto h, auto i, auto e) {
      s += f.out.at(b, h, i, e) * p.dout.at(b, h, i, e);
    });
    return s;
  };
  const double eps = 1e-6;
  struct Case {
    Tensor4<double> Problem<double>::*input;
    const Tensor4<double>& grad;
  } cases[] = {{&Problem<double>::q, r.dq}, {&Problem<double>::k, r.dk}, {&Problem<double>::v, r.dv}};
  for (const Case& c : cases) {
    (pr.*c.input).for_each([&](auto b, auto h, auto i, auto e) {
      Problem<double> plus = pr, minus = pr;
      (plus.*c.input).at(b, h, i, e) += eps;
      (minus.*c.input).at(b, h, i, e) -= eps;
      const double numeric = (loss(plus) - loss(minus)) / (2 * eps);
      EXPECT_NEAR(c.grad.at(b, h, i, e), numeric, 1e-8);
    });
  }
}

}  // namespace
}  // namespace testing
}  // namespace attn2d
