// The library's whole backward (BF16 recipe, CPU backend) against central finite differences of
// the forward computed in double (loss = sum(Y * dY)): every gradient the layer returns is the
// derivative of what it computes, for both activations, both GLU layouts, with and without biases
// and scale_fc2_bias.
#include <gtest/gtest.h>

#include "src/cpu/reference_f64.h"
#include "tests/layer_support.h"

namespace mxmoe::test {
namespace {

std::vector<double> as_f64(const HostTensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = value_at(t.view, i);
  return v;
}

cpu::RefLayerInputs ref_inputs(const LayerData& d) {
  cpu::RefLayerInputs in;
  in.problem = d.problem;
  in.tokens = d.tokens;
  in.offsets.assign(d.offsets.ptr<int32_t>(), d.offsets.ptr<int32_t>() + d.offsets.numel());
  in.x = as_f64(d.x);
  in.probs = as_f64(d.probs);
  in.w1 = as_f64(d.w1);
  in.w2 = as_f64(d.w2);
  if (d.problem.fc1_bias) in.b1 = as_f64(d.b1);
  if (d.problem.fc2_bias) in.b2 = as_f64(d.b2);
  return in;
}

bool bf16_rounding_flips_a_mask(const LayerData& d) {
  const std::vector<double> c = cpu::reference_layer_f64(ref_inputs(d)).c;
  const double L = d.problem.clamp.limit;
  for (double v : c) {
    const double r = round_bf16(static_cast<float>(v));
    if ((v <= L) != (r <= L) || (v >= -L) != (r >= -L)) return true;
  }
  return false;
}

struct FdCase {
  Activation act;
  GluLayout glu;
  bool biases, scale;
};

class LayerFiniteDifferences : public testing::TestWithParam<FdCase> {};

TEST_P(LayerFiniteDifferences, Bf16RecipeBackwardMatchesFiniteDifferencesOfForward) {
  const FdCase c = GetParam();
  Problem p;
  p.hidden = 32;
  p.ffn = 32;
  p.experts = 3;
  p.recipe = Recipe::bf16;
  p.activation = c.act;
  p.glu_layout = c.glu;
  p.fc1_bias = p.fc2_bias = c.biases;
  p.scale_fc2_bias = c.scale;
  const bool clamped = c.act == Activation::clamped_swiglu;
  // The backward differentiates at the saved bf16 C; finite differences of the fp64 forward see the
  // exact C. Where bf16 rounding moves a pre-activation across +-limit the two legitimately differ
  // (a mask flips), so draw inputs until no value of C is that close to a clamp limit.
  LayerData d;
  for (int attempt = 0; attempt < 50; ++attempt) {
    d = make_layer_data(p, {5, 0, 6}, clamped ? 8.0f : 1.5f);
    if (!clamped || !bf16_rounding_flips_a_mask(d)) break;
  }
  Context ctx(Options{.backend = "cpu"});
  LayerOutputs lib = run_layer(ctx, Device{}, d);

  cpu::RefLayerInputs in = ref_inputs(d);
  const std::vector<double> dy = as_f64(d.dy);
  auto loss = [&](const cpu::RefLayerInputs& q) {
    const std::vector<double> y = cpu::reference_layer_f64(q).y;
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * dy[i];
    return s;
  };
  // Relative Frobenius distance between the library's gradient and the finite differences.
  auto check = [&](std::vector<double> cpu::RefLayerInputs::*member, const HostTensor& grad, const char* name) {
    std::vector<double>& v = in.*member;
    double num = 0, den = 0;
    int64_t kinks = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      const double h = 1e-4 * std::max(1.0, std::abs(v[i])), orig = v[i];
      v[i] = orig + h;
      const double up = loss(in);
      v[i] = orig - h;
      const double down = loss(in);
      v[i] = orig;
      const double fd = (up - down) / (2 * h);
      const double g = value_at(grad.view, static_cast<int64_t>(i));
      num += (g - fd) * (g - fd);
      den += fd * fd;
      kinks += std::abs(g - fd) > 0.1 * (std::abs(fd) + 1e-3);
    }
    const double err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    EXPECT_LE(err, 2e-2) << name << " (" << kinks << " entries far off)";
  };
  check(&cpu::RefLayerInputs::x, lib.dx, "dx");
  check(&cpu::RefLayerInputs::probs, lib.dprobs, "dprobs");
  check(&cpu::RefLayerInputs::w1, lib.dw1, "dw1");
  check(&cpu::RefLayerInputs::w2, lib.dw2, "dw2");
  if (c.biases) {
    check(&cpu::RefLayerInputs::b1, lib.db1, "db1");
    check(&cpu::RefLayerInputs::b2, lib.db2, "db2");
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllVariants, LayerFiniteDifferences,
    testing::Values(FdCase{Activation::swiglu, GluLayout::halves, false, false},
                    FdCase{Activation::swiglu, GluLayout::interleave32, true, false},
                    FdCase{Activation::swiglu, GluLayout::halves, true, true},
                    FdCase{Activation::clamped_swiglu, GluLayout::halves, true, false},
                    FdCase{Activation::clamped_swiglu, GluLayout::interleave32, true, true},
                    FdCase{Activation::clamped_swiglu, GluLayout::interleave32, false, false}));

}  // namespace
}  // namespace mxmoe::test
