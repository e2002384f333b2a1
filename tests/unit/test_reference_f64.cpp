// The unquantized fp64 reference: its backward is the exact gradient of its forward (central finite
// differences of loss = sum(Y * dY) for every input entry), and its forward is the layer's formula
// (checked on single rows with an independently written GLU column mapping).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "src/cpu/reference_f64.h"
#include "tests/support.h"

namespace mxmoe::cpu {
namespace {

struct Case {
  Activation activation;
  GluLayout layout;
  bool biases;
  bool scale_fc2_bias;
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string s = c.activation == Activation::swiglu ? "swiglu" : "clamped";
  s += c.layout == GluLayout::halves ? "_halves" : "_interleave32";
  s += !c.biases ? "_nobias" : (c.scale_fc2_bias ? "_scaledbias" : "_bias");
  return s;
}

std::vector<double> uniform(int64_t n, double lo, double hi) {
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = d(test::rng());
  return v;
}

// Independent of glu.h: interleave32 puts a in the even 32-column blocks and b in the odd ones.
double glu_a(const double* c, int64_t n, int64_t F, GluLayout l) {
  return l == GluLayout::halves ? c[n] : c[(n / 32) * 64 + n % 32];
}
double glu_b(const double* c, int64_t n, int64_t F, GluLayout l) {
  return l == GluLayout::halves ? c[F + n] : c[(n / 32) * 64 + 32 + n % 32];
}

double act_value(double a, double b, const Problem& p) {
  if (p.activation == Activation::swiglu) return a * b / (1 + std::exp(-a));
  const double L = p.clamp.limit;
  const double ac = a > L ? L : a;
  const double bc = b > L ? L : (b < -L ? -L : b);
  return ac * (bc + p.clamp.linear_offset) / (1 + std::exp(-p.clamp.alpha * ac));
}

// Tiny problem with a zero-size expert. Clamped cases draw FC1 outputs with std ~5 so that a > L,
// b > L and b < -L all occur, and redraw until they do.
RefLayerInputs make_inputs(const Case& c) {
  RefLayerInputs in;
  Problem& p = in.problem;
  p.hidden = 8;
  p.ffn = c.layout == GluLayout::halves ? 16 : 64;  // 64: two a/b block pairs, unlike halves
  p.experts = 3;
  p.activation = c.activation;
  p.glu_layout = c.layout;
  p.fc1_bias = p.fc2_bias = c.biases;
  p.scale_fc2_bias = c.scale_fc2_bias;
  in.offsets = {0, 4, 4, 10};
  in.tokens = 10;
  const int64_t T = in.tokens, H = p.hidden, F = p.ffn, E = p.experts;
  const double w1_bound = c.activation == Activation::swiglu ? 1.0 : 6.0;
  for (int attempt = 0; attempt < 100; ++attempt) {
    in.x = uniform(T * H, -1, 1);
    in.probs = uniform(T, 0.1, 1);
    in.w1 = uniform(E * 2 * F * H, -w1_bound, w1_bound);
    in.w2 = uniform(E * H * F, -0.5, 0.5);
    in.b1.clear();
    in.b2.clear();
    if (c.biases) {
      in.b1 = uniform(E * 2 * F, -0.5, 0.5);
      in.b2 = uniform(E * H, -0.5, 0.5);
    }
    in.dy = uniform(T * H, -1, 1);
    if (c.activation == Activation::swiglu) break;
    const RefLayerOutputs o = reference_layer_f64(in);
    int a_above = 0, b_above = 0, b_below = 0, near_kink = 0;
    const double L = p.clamp.limit;
    // A central difference that straddles a clamp kink measures the mean of two one-sided slopes:
    // keep every pre-activation well away from +-L (a 1e-6 step moves C by far less than 1e-3).
    constexpr double kKinkMargin = 1e-3;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < F; ++n) {
        const double a = glu_a(&o.c[t * 2 * F], n, F, p.glu_layout), b = glu_b(&o.c[t * 2 * F], n, F, p.glu_layout);
        a_above += a > L;
        b_above += b > L;
        b_below += b < -L;
        near_kink += std::abs(a - L) < kKinkMargin || std::abs(std::abs(b) - L) < kKinkMargin;
      }
    if (a_above > 0 && b_above > 0 && b_below > 0 && near_kink == 0) break;
  }
  return in;
}

double loss(const RefLayerInputs& in) {
  RefLayerInputs fwd = in;
  fwd.dy.clear();  // forward only
  const RefLayerOutputs out = reference_layer_f64(fwd);
  double l = 0;
  for (size_t i = 0; i < out.y.size(); ++i) l += out.y[i] * in.dy[i];
  return l;
}

// Central differences of loss() over every entry of in.*member, against the analytic gradient.
void expect_gradient_matches(RefLayerInputs in, std::vector<double> RefLayerInputs::*member,
                             const std::vector<double>& analytic, const char* what) {
  std::vector<double>& v = in.*member;
  ASSERT_EQ(v.size(), analytic.size()) << what;
  constexpr double kStep = 1e-6;
  std::vector<double> numeric(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const double saved = v[i];
    v[i] = saved + kStep;
    const double up = loss(in);
    v[i] = saved - kStep;
    const double down = loss(in);
    v[i] = saved;
    numeric[i] = (up - down) / (2 * kStep);
  }
  double num = 0, den = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    num += (numeric[i] - analytic[i]) * (numeric[i] - analytic[i]);
    den += analytic[i] * analytic[i];
  }
  ASSERT_GT(den, 0.0) << what << ": analytic gradient is all zeros";
  const double rms = std::sqrt(den / static_cast<double>(v.size()));
  EXPECT_LE(std::sqrt(num / den), 1e-6) << what;
  int bad = 0;
  for (size_t i = 0; i < v.size() && bad < 5; ++i) {
    if (std::abs(numeric[i] - analytic[i]) > 1e-6 * std::max(rms, std::abs(analytic[i]))) {
      ADD_FAILURE() << what << "[" << i << "]: finite difference " << numeric[i] << " vs backward " << analytic[i];
      ++bad;
    }
  }
}

class ReferenceF64 : public testing::TestWithParam<Case> {};

TEST_P(ReferenceF64, BackwardEqualsFiniteDifferencesOfForward) {
  const RefLayerInputs in = make_inputs(GetParam());
  const RefLayerOutputs out = reference_layer_f64(in);
  expect_gradient_matches(in, &RefLayerInputs::x, out.dx, "dx");
  expect_gradient_matches(in, &RefLayerInputs::probs, out.dprobs, "dprobs");
  expect_gradient_matches(in, &RefLayerInputs::w1, out.dw1, "dw1");
  expect_gradient_matches(in, &RefLayerInputs::w2, out.dw2, "dw2");
  if (GetParam().biases) {
    expect_gradient_matches(in, &RefLayerInputs::b1, out.db1, "db1");
    expect_gradient_matches(in, &RefLayerInputs::b2, out.db2, "db2");
  } else {
    EXPECT_TRUE(out.db1.empty());
    EXPECT_TRUE(out.db2.empty());
  }
}

TEST_P(ReferenceF64, ForwardRowsFollowTheLayerFormula) {
  const RefLayerInputs in = make_inputs(GetParam());
  const Problem& p = in.problem;
  const int64_t H = p.hidden, F = p.ffn, F2 = 2 * F;
  const RefLayerOutputs out = reference_layer_f64(in);
  for (int64_t t : {0, 3, 4, 9}) {
    const int64_t e = t < 4 ? 0 : 2;  // offsets {0, 4, 4, 10}
    std::vector<double> c(static_cast<size_t>(F2));
    for (int64_t j = 0; j < F2; ++j) {
      c[j] = p.fc1_bias ? in.b1[e * F2 + j] : 0.0;
      for (int64_t k = 0; k < H; ++k) c[j] += in.x[t * H + k] * in.w1[(e * F2 + j) * H + k];
      EXPECT_NEAR(out.c[t * F2 + j], c[j], 1e-12 * (1 + std::abs(c[j])));
    }
    for (int64_t h = 0; h < H; ++h) {
      double y = 0;
      if (p.fc2_bias) y = (p.scale_fc2_bias ? in.probs[t] : 1.0) * in.b2[e * H + h];
      for (int64_t n = 0; n < F; ++n)
        y += in.probs[t] * act_value(glu_a(c.data(), n, F, p.glu_layout), glu_b(c.data(), n, F, p.glu_layout), p) *
             in.w2[(e * H + h) * F + n];
      EXPECT_NEAR(out.y[t * H + h], y, 1e-12 * (1 + std::abs(y))) << "row " << t << " col " << h;
    }
  }
}

TEST_P(ReferenceF64, EmptyExpertHasZeroWeightAndBiasGradients) {
  const RefLayerInputs in = make_inputs(GetParam());
  const Problem& p = in.problem;
  const int64_t H = p.hidden, F = p.ffn, F2 = 2 * F;
  const RefLayerOutputs out = reference_layer_f64(in);
  auto all_zero = [](const std::vector<double>& v, int64_t begin, int64_t count) {
    return std::all_of(v.begin() + begin, v.begin() + begin + count, [](double x) { return x == 0.0; });
  };
  EXPECT_TRUE(all_zero(out.dw1, 1 * F2 * H, F2 * H));
  EXPECT_TRUE(all_zero(out.dw2, 1 * H * F, H * F));
  EXPECT_FALSE(all_zero(out.dw1, 0, F2 * H));
  EXPECT_FALSE(all_zero(out.dw2, 2 * H * F, H * F));
  if (p.fc1_bias) {
    EXPECT_TRUE(all_zero(out.db1, 1 * F2, F2));
    EXPECT_TRUE(all_zero(out.db2, 1 * H, H));
    EXPECT_FALSE(all_zero(out.db2, 0, H));
  }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, ReferenceF64,
                         testing::Values(Case{Activation::swiglu, GluLayout::halves, false, false},
                                         Case{Activation::swiglu, GluLayout::halves, true, false},
                                         Case{Activation::swiglu, GluLayout::halves, true, true},
                                         Case{Activation::swiglu, GluLayout::interleave32, false, false},
                                         Case{Activation::swiglu, GluLayout::interleave32, true, false},
                                         Case{Activation::swiglu, GluLayout::interleave32, true, true},
                                         Case{Activation::clamped_swiglu, GluLayout::halves, false, false},
                                         Case{Activation::clamped_swiglu, GluLayout::halves, true, false},
                                         Case{Activation::clamped_swiglu, GluLayout::halves, true, true},
                                         Case{Activation::clamped_swiglu, GluLayout::interleave32, false, false},
                                         Case{Activation::clamped_swiglu, GluLayout::interleave32, true, false},
                                         Case{Activation::clamped_swiglu, GluLayout::interleave32, true, true}),
                         case_name);

TEST(ReferenceF64Rows, SkippingWeightGradsKeepsRowOutputs) {
  RefLayerInputs in = make_inputs({Activation::swiglu, GluLayout::interleave32, true, true});
  const RefLayerOutputs full = reference_layer_f64(in);
  in.compute_weight_grads = false;
  const RefLayerOutputs rows = reference_layer_f64(in);
  EXPECT_EQ(rows.y, full.y);
  EXPECT_EQ(rows.dx, full.dx);
  EXPECT_EQ(rows.dprobs, full.dprobs);
  EXPECT_TRUE(rows.dw1.empty());
  EXPECT_TRUE(rows.db2.empty());
}

}  // namespace
}  // namespace mxmoe::cpu
