// The scaled GLU activations of src/common/glu.h (docs/numerics.md "SwiGLU", "Clamped SwiGLU"):
// glu_backward's da, db and the dprob term against central finite differences of p * act in fp64
// (tests/unit/glu_reference.h), the inclusive clamp masks, and the GLU column mapping.
// Run: <build>/tests/mxmoe_unit_tests --gtest_filter='GluActivation*'
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "glu_reference.h"
#include "support.h"

namespace mxmoe {
namespace {

using test::glu_act_f64;
using test::glu_ref_f64;
using test::GluRef;

constexpr double kStep = 1e-5;  // central-difference step (error ~ step^2 * f''' plus rounding)

GluParams swiglu() { return GluParams{}; }
GluParams clamped(float limit = 7.0f, float alpha = 1.702f, float offset = 1.0f) {
  GluParams p;
  p.activation = Activation::clamped_swiglu;
  p.clamp = ClampedSwiglu{limit, alpha, offset};
  return p;
}

// d/dx of g * p * act by central differences in fp64.
double fd_a(double a, double b, double g, double p, const GluParams& gp) {
  return g * p * (glu_act_f64(a + kStep, b, gp) - glu_act_f64(a - kStep, b, gp)) / (2 * kStep);
}
double fd_b(double a, double b, double g, double p, const GluParams& gp) {
  return g * p * (glu_act_f64(a, b + kStep, gp) - glu_act_f64(a, b - kStep, gp)) / (2 * kStep);
}
double fd_p(double a, double b, double g, double p, const GluParams& gp) {
  return g * ((p + kStep) * glu_act_f64(a, b, gp) - (p - kStep) * glu_act_f64(a, b, gp)) / (2 * kStep);
}

// Points whose a and b are not within 1e-3 of a clamp kink (finite differences straddle a kink).
bool near_kink(double a, double b, const GluParams& gp) {
  if (gp.activation == Activation::swiglu) return false;
  const double lim = gp.clamp.limit;
  return std::abs(a - lim) < 1e-3 || std::abs(b - lim) < 1e-3 || std::abs(b + lim) < 1e-3;
}

// Random points in [-10, 10]^2 plus points just either side of the limits.
std::vector<std::pair<double, double>> sample_points(const GluParams& gp) {
  std::vector<std::pair<double, double>> pts;
  std::uniform_real_distribution<double> u(-10.0, 10.0);
  for (int i = 0; i < 400; ++i) pts.emplace_back(u(test::rng()), u(test::rng()));
  const double lim = gp.clamp.limit;
  for (double a : {lim - 0.01, lim + 0.01, -lim - 0.01, -lim + 0.01, 0.0, 2.5})
    for (double b : {lim - 0.01, lim + 0.01, -lim - 0.01, -lim + 0.01, 0.0, -1.5}) pts.emplace_back(a, b);
  return pts;
}

void expect_close(double got, double want, double what_scale, const char* what, double a, double b) {
  EXPECT_NEAR(got, want, 2e-4 * (std::abs(want) + what_scale)) << what << " at a=" << a << " b=" << b;
}

void check_against_finite_differences(const GluParams& gp) {
  std::uniform_real_distribution<double> ug(-2.0, 2.0), up(0.05, 1.0);
  int checked = 0, masked_a = 0, masked_b = 0;
  for (auto [a64, b64] : sample_points(gp)) {
    // Evaluate at the fp32 points the float code sees.
    const float a = static_cast<float>(a64), b = static_cast<float>(b64);
    const float g = static_cast<float>(ug(test::rng())), p = static_cast<float>(up(test::rng()));
    if (near_kink(a, b, gp)) continue;
    const GluGrad r = glu_backward(a, b, g, p, gp);
    const double da = fd_a(a, b, g, p, gp), db = fd_b(a, b, g, p, gp), dp = fd_p(a, b, g, p, gp);
    const double scale = std::abs(g) * p;  // natural magnitude of the gradients
    expect_close(r.da, da, scale, "da", a, b);
    expect_close(r.db, db, scale, "db", a, b);
    expect_close(static_cast<double>(g) * r.act, dp, std::abs(g), "dprob", a, b);
    expect_close(glu_forward(a, b, gp), glu_act_f64(a, b, gp), 1.0, "act", a, b);
    // The fp64 reference derivative the GEMM tests use agrees with the differences too.
    const GluRef ref = glu_ref_f64(a, b, g, p, gp);
    expect_close(ref.da, da, scale, "ref da", a, b);
    expect_close(ref.db, db, scale, "ref db", a, b);
    masked_a += r.da == 0.0f;
    masked_b += r.db == 0.0f;
    ++checked;
  }
  EXPECT_GT(checked, 300);
  if (gp.activation == Activation::clamped_swiglu) {
    EXPECT_GT(masked_a, 10) << "samples must cross a > L";
    EXPECT_GT(masked_b, 10) << "samples must cross |b| > L";
  }
}

TEST(GluActivation, SwigluGradientsMatchFiniteDifferences) { check_against_finite_differences(swiglu()); }

TEST(GluActivation, ClampedSwigluGradientsMatchFiniteDifferences) {
  check_against_finite_differences(clamped());
}

TEST(GluActivation, ClampedSwigluWithNonDefaultParametersMatchesFiniteDifferences) {
  check_against_finite_differences(clamped(5.0f, 1.5f, 0.5f));
}

TEST(GluActivation, ClampMasksAreInclusiveAtTheLimits) {
  const GluParams gp = clamped();
  const float lim = gp.clamp.limit, above = std::nextafter(lim, 100.f), g = 0.75f, p = 0.5f;
  // a == L: the gradient passes, and equals the one-sided derivative from below.
  const GluGrad at = glu_backward(lim, 1.0f, g, p, gp);
  EXPECT_NE(at.da, 0.0f);
  EXPECT_NEAR(at.da, glu_ref_f64(lim, 1.0, g, p, gp).da, 1e-5);
  const double left = g * p * (glu_act_f64(lim, 1.0, gp) - glu_act_f64(lim - 1e-5, 1.0, gp)) / 1e-5;
  EXPECT_NEAR(at.da, left, 1e-3);
  EXPECT_EQ(glu_backward(above, 1.0f, g, p, gp).da, 0.0f);
  // b == +-L: passes; just outside: masked. The value uses the clamped b either way.
  for (float sign : {1.0f, -1.0f}) {
    const GluGrad in = glu_backward(2.0f, sign * lim, g, p, gp);
    EXPECT_NE(in.db, 0.0f);
    EXPECT_NEAR(in.db, g * p * 2.0 * test::sigmoid_f64(gp.clamp.alpha * 2.0), 1e-6);
    const GluGrad out = glu_backward(2.0f, sign * above, g, p, gp);
    EXPECT_EQ(out.db, 0.0f);
    EXPECT_EQ(out.act, in.act);
  }
  // No lower clamp on a: a large negative a still has a gradient.
  EXPECT_NE(glu_backward(-20.0f, 1.0f, g, p, gp).da, 0.0f);
}

TEST(GluActivation, ColumnMappingCoversEveryColumnOnce) {
  for (GluLayout layout : {GluLayout::halves, GluLayout::interleave32}) {
    const int64_t f = 96;
    std::set<int64_t> seen;
    for (int64_t n = 0; n < f; ++n) {
      seen.insert(glu_a_col(n, f, layout));
      seen.insert(glu_b_col(n, f, layout));
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), 2 * f);
    EXPECT_EQ(*seen.rbegin(), 2 * f - 1);
  }
  EXPECT_EQ(glu_a_col(33, 64, GluLayout::interleave32), 65);
  EXPECT_EQ(glu_b_col(33, 64, GluLayout::interleave32), 97);
  EXPECT_EQ(glu_b_col(5, 64, GluLayout::halves), 69);
}

}  // namespace
}  // namespace mxmoe
