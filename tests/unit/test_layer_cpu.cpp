// The whole layer on the CPU backend: against the independent unquantized fp64 reference
// (docs/numerics.md "Tolerances"), and the exactness properties of the API (weight layouts, deferred wgrad,
// main-grad accumulation, empty experts).
#include <gtest/gtest.h>

#include "src/common/fp8_block.h"
#include "src/common/glu.h"
#include "src/cpu/fp8_block.h"
#include "src/cpu/reference_f64.h"
#include "tests/layer_support.h"

namespace mxmoe::test {
namespace {

std::vector<double> to_f64(const HostTensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = value_at(t.view, i);
  return v;
}

cpu::RefLayerOutputs reference(const LayerData& d) {
  cpu::RefLayerInputs in;
  in.problem = d.problem;
  in.tokens = d.tokens;
  in.offsets.assign(d.offsets.ptr<int32_t>(), d.offsets.ptr<int32_t>() + d.offsets.numel());
  in.x = to_f64(d.x);
  in.probs = to_f64(d.probs);
  in.w1 = to_f64(d.w1);
  in.w2 = to_f64(d.w2);
  if (d.problem.fc1_bias) in.b1 = to_f64(d.b1);
  if (d.problem.fc2_bias) in.b2 = to_f64(d.b2);
  in.dy = to_f64(d.dy);
  return cpu::reference_layer_f64(in);
}

double rel_error_vs(const HostTensor& out, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < out.numel(); ++i) {
    const double a = value_at(out.view, i);
    if (!std::isfinite(a)) return INFINITY;
    num += (a - ref[i]) * (a - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// `masked_tol` bounds the outputs that pass through the clamp masks' derivative (dx, dw1, db1):
// the backward differentiates at the saved bf16 C, and a C within half a bf16 ulp of +-limit can
// land on the other side of it, switching one gradient entry on or off (docs/numerics.md
// "Tolerances"); the unquantized reference cannot model that, so those outputs get a looser bound.
void expect_near_reference(const LayerOutputs& o, const cpu::RefLayerOutputs& r, const Problem& p, double tol,
                           double masked_tol) {
  EXPECT_LE(rel_error_vs(o.y, r.y), tol) << "y";
  EXPECT_LE(rel_error_vs(o.dx, r.dx), masked_tol) << "dx";
  EXPECT_LE(rel_error_vs(o.dprobs, r.dprobs), tol) << "dprobs";
  EXPECT_LE(rel_error_vs(o.dw1, r.dw1), masked_tol) << "dw1";
  EXPECT_LE(rel_error_vs(o.dw2, r.dw2), tol) << "dw2";
  if (p.fc1_bias) {
    EXPECT_LE(rel_error_vs(o.db1, r.db1), masked_tol) << "db1";
  }
  if (p.fc2_bias) {
    EXPECT_LE(rel_error_vs(o.db2, r.db2), tol) << "db2";
  }
}

Problem make_problem(Recipe r, Activation a, GluLayout g, bool fc1_bias, bool fc2_bias, bool scale_bias) {
  Problem p;
  p.hidden = 128;
  p.ffn = 96;
  p.experts = 4;
  p.recipe = r;
  p.activation = a;
  p.glu_layout = g;
  p.fc1_bias = fc1_bias;
  p.fc2_bias = fc2_bias;
  p.scale_fc2_bias = scale_bias;
  return p;
}

const std::vector<int> kSizes = {37, 0, 64, 95};

struct Variant {
  Activation act;
  GluLayout glu;
  bool b1, b2, scale;
};
const Variant kVariants[] = {
    {Activation::swiglu, GluLayout::halves, false, false, false},
    {Activation::swiglu, GluLayout::interleave32, true, true, false},
    {Activation::swiglu, GluLayout::halves, true, true, true},
    {Activation::clamped_swiglu, GluLayout::interleave32, false, true, true},
    {Activation::clamped_swiglu, GluLayout::halves, true, false, false},
};

TEST(CpuLayer, Bf16RecipeMatchesUnquantizedFp64Reference) {
  for (const Variant& v : kVariants) {
    Problem p = make_problem(Recipe::bf16, v.act, v.glu, v.b1, v.b2, v.scale);
    SCOPED_TRACE(describe(p));
    // Clamped variants use large weights so FC1 outputs cross the limits.
    LayerData d = make_layer_data(p, kSizes, v.act == Activation::clamped_swiglu ? 6.0f : 1.0f);
    Context ctx({.backend = "cpu"});
    const bool clamped = v.act == Activation::clamped_swiglu;
    expect_near_reference(run_layer(ctx, Device{}, d), reference(d), p, 2e-2, clamped ? 0.1 : 2e-2);
  }
}

TEST(CpuLayer, Mxfp8RecipeSwigluWithinSanityToleranceOfFp64) {
  for (const Variant& v : kVariants) {
    // clamped: a quantized value may flip a mask (docs/numerics.md "Tolerances")
    if (v.act != Activation::swiglu) continue;
    Problem p = make_problem(Recipe::mxfp8, v.act, v.glu, v.b1, v.b2, v.scale);
    SCOPED_TRACE(describe(p));
    LayerData d = make_layer_data(p, kSizes);
    Context ctx({.backend = "cpu"});
    expect_near_reference(run_layer(ctx, Device{}, d), reference(d), p, 0.1, 0.1);
  }
}

TEST(CpuLayer, Mxfp8ClampedForwardStaysNearFp64) {
  Problem p = make_problem(Recipe::mxfp8, Activation::clamped_swiglu, GluLayout::interleave32, true, true, true);
  LayerData d = make_layer_data(p, kSizes, 6.0f);
  Context ctx({.backend = "cpu"});
  LayerOutputs o = run_layer(ctx, Device{}, d);
  cpu::RefLayerOutputs r = reference(d);
  EXPECT_LE(rel_error_vs(o.y, r.y), 0.1);
  EXPECT_LE(rel_error_vs(o.dw2, r.dw2), 0.1);
  EXPECT_LE(rel_error_vs(o.dx, r.dx), 0.25);
}

TEST(CpuLayer, DenseAndPerExpertWeightsAreBitIdentical) {
  for (Recipe r : {Recipe::mxfp8, Recipe::bf16, Recipe::fp8_blockwise}) {
    Problem p = make_problem(r, Activation::clamped_swiglu, GluLayout::interleave32, true, true, true);
    LayerData d = make_layer_data(p, kSizes, 4.0f);
    Context ctx({.backend = "cpu"});
    LayerOutputs dense = run_layer(ctx, Device{}, d);
    d.problem.weight_layout = WeightLayout::per_expert;
    LayerOutputs per = run_layer(ctx, Device{}, d);
    for (auto [name, t] : outputs_of(dense, p)) {
      const HostTensor* other = nullptr;
      for (auto [n2, t2] : outputs_of(per, p))
        if (std::string(n2) == name) other = t2;
      EXPECT_TRUE(bytes_equal(t->view, other->view)) << name << " recipe " << to_string(r);
    }
  }
}

TEST(CpuLayer, DeferredWgradIsBitIdenticalToImmediate) {
  for (Recipe r : {Recipe::mxfp8, Recipe::bf16, Recipe::fp8_blockwise}) {
    Problem p = make_problem(r, Activation::swiglu, GluLayout::halves, true, true, false);
    LayerData d = make_layer_data(p, kSizes);
    Context ctx({.backend = "cpu"});
    LayerOutputs now = run_layer(ctx, Device{}, d);
    RunConfig cfg;
    cfg.deferred_wgrad = true;
    LayerOutputs later = run_layer(ctx, Device{}, d, cfg);
    EXPECT_TRUE(bytes_equal(now.dw1.view, later.dw1.view));
    EXPECT_TRUE(bytes_equal(now.dw2.view, later.dw2.view));
    EXPECT_TRUE(bytes_equal(now.dx.view, later.dx.view));
  }
}

// RunConfig::saved_c (the GPU layer tests' backward at the GPU's C): the backward reads the C it is
// given. Its own C back gives the same bytes; a changed C changes every output made from dC while y
// (the forward's) stays, and the run reports the C its forward wrote.
TEST(CpuLayer, BackwardRunsFromTheGivenSavedC) {
  for (Recipe r : {Recipe::bf16, Recipe::fp8_blockwise}) {
    SCOPED_TRACE(to_string(r));
    Problem p = make_problem(r, Activation::clamped_swiglu, GluLayout::interleave32, true, true, true);
    LayerData d = make_layer_data(p, kSizes, 4.0f);
    Context ctx({.backend = "cpu"});
    const LayerOutputs base = run_layer(ctx, Device{}, d);
    ASSERT_EQ(base.c.view.numel(), d.tokens * 2 * p.ffn);
    RunConfig same;
    same.saved_c = &base.c;
    const LayerOutputs again = run_layer(ctx, Device{}, d, same);
    for (auto [name, t] : outputs_of(base, p)) {
      const HostTensor* other = nullptr;
      for (auto [n2, t2] : outputs_of(again, p))
        if (std::string(n2) == name) other = t2;
      EXPECT_TRUE(bytes_equal(t->view, other->view)) << name;
    }
    HostTensor moved = base.c;  // every C value halved: away from the clamp limits, another dC
    for (int64_t i = 0; i < moved.view.numel(); ++i) {
      uint16_t& v = moved.ptr<uint16_t>()[i];
      v = bf16_from_f32(0.5f * f32_from_bf16(v));
    }
    RunConfig other_c;
    other_c.saved_c = &moved;
    const LayerOutputs changed = run_layer(ctx, Device{}, d, other_c);
    EXPECT_TRUE(bytes_equal(base.y.view, changed.y.view)) << "y comes from the forward";
    EXPECT_TRUE(bytes_equal(base.c.view, changed.c.view)) << "the reported C is the forward's";
    EXPECT_FALSE(bytes_equal(base.dx.view, changed.dx.view)) << "dx did not follow the given C";
    EXPECT_FALSE(bytes_equal(base.dw1.view, changed.dw1.view)) << "dw1 did not follow the given C";
    EXPECT_FALSE(bytes_equal(base.dprobs.view, changed.dprobs.view)) << "dprobs did not follow the given C";
  }
}

TEST(CpuLayer, MainGradBetaOneAddsAndBetaZeroOverwrites) {
  Problem p = make_problem(Recipe::mxfp8, Activation::swiglu, GluLayout::halves, true, true, false);
  LayerData d = make_layer_data(p, kSizes);  // expert 1 is empty
  Context ctx({.backend = "cpu"});
  LayerOutputs fresh = run_layer(ctx, Device{}, d);  // beta 0 into poisoned buffers
  LayerOutputs prior = fresh;
  for (HostTensor* t : {&prior.dw1, &prior.dw2, &prior.db1, &prior.db2}) {
    HostTensor r = random_f32({t->numel()});
    std::memcpy(t->bytes.data(), r.bytes.data(), r.bytes.size());
  }
  RunConfig acc;
  acc.accumulate = true;
  acc.grads_in = prior;
  LayerOutputs summed = run_layer(ctx, Device{}, d, acc);
  for (auto [f, pr, s] : {std::tuple{&fresh.dw1, &prior.dw1, &summed.dw1}, std::tuple{&fresh.dw2, &prior.dw2, &summed.dw2},
                          std::tuple{&fresh.db1, &prior.db1, &summed.db1}, std::tuple{&fresh.db2, &prior.db2, &summed.db2}})
    for (int64_t i = 0; i < f->numel(); ++i)
      ASSERT_EQ(s->ptr<float>()[i], pr->ptr<float>()[i] + f->ptr<float>()[i]) << i;
  // Expert 1 has no tokens: beta 0 wrote zeros, beta 1 left the prior values untouched.
  const int64_t per1 = 2 * p.ffn * p.hidden;
  for (int64_t i = per1; i < 2 * per1; ++i) {
    ASSERT_EQ(fresh.dw1.ptr<float>()[i], 0.0f);
    ASSERT_EQ(summed.dw1.ptr<float>()[i], prior.dw1.ptr<float>()[i]);
  }
  RunConfig overwrite;
  overwrite.grads_in = prior;  // beta 0 over random content
  LayerOutputs over = run_layer(ctx, Device{}, d, overwrite);
  EXPECT_TRUE(bytes_equal(over.dw1.view, fresh.dw1.view));
  EXPECT_TRUE(bytes_equal(over.db2.view, fresh.db2.view));
}

TEST(CpuLayer, Bf16WeightGradientsMatchF32Rounded) {
  Problem p = make_problem(Recipe::bf16, Activation::swiglu, GluLayout::halves, false, false, false);
  LayerData d = make_layer_data(p, kSizes);
  Context ctx({.backend = "cpu"});
  LayerOutputs f32 = run_layer(ctx, Device{}, d);
  RunConfig cfg;
  cfg.grad_dtype = DType::bf16;
  LayerOutputs b16 = run_layer(ctx, Device{}, d, cfg);
  for (int64_t i = 0; i < f32.dw1.numel(); ++i)
    ASSERT_EQ(b16.dw1.ptr<uint16_t>()[i], bf16_from_f32(f32.dw1.ptr<float>()[i])) << i;
}

TEST(CpuLayer, EdgeSplitsRunAndEveryOutputIsWritten) {
  const std::vector<std::vector<int>> splits = {{0, 0, 0, 0}, {1, 0, 0, 0}, {0, 0, 0, 200}, {1, 1, 1, 1}};
  for (Recipe r : {Recipe::mxfp8, Recipe::bf16, Recipe::fp8_blockwise}) {
    for (const auto& s : splits) {
      Problem p = make_problem(r, Activation::swiglu, GluLayout::interleave32, true, true, true);
      LayerData d = make_layer_data(p, s);
      Context ctx({.backend = "cpu"});
      LayerOutputs o = run_layer(ctx, Device{}, d);
      for (auto [name, t] : outputs_of(o, p))
        for (int64_t i = 0; i < t->numel(); ++i) ASSERT_TRUE(std::isfinite(value_at(t->view, i))) << name << "[" << i << "]";
      if (d.tokens == 0) {
        for (int64_t i = 0; i < o.dw1.numel(); ++i) ASSERT_EQ(o.dw1.ptr<float>()[i], 0.0f);
      }
      if (d.tokens > 0) {
        EXPECT_LE(rel_error_vs(o.y, reference(d).y), 0.1);
      }
    }
  }
}

TEST(CpuLayer, OneExpertProblem) {
  Problem p = make_problem(Recipe::mxfp8, Activation::swiglu, GluLayout::halves, true, true, false);
  p.experts = 1;
  LayerData d = make_layer_data(p, {150});
  Context ctx({.backend = "cpu"});
  expect_near_reference(run_layer(ctx, Device{}, d), reference(d), p, 0.1, 0.1);
}

TEST(CpuLayer, SavedBytesMatchTheSavedTensors) {
  Problem p = make_problem(Recipe::mxfp8, Activation::swiglu, GluLayout::halves, false, false, false);
  LayerData d = make_layer_data(p, kSizes);
  Context ctx({.backend = "cpu"});
  LayerOutputs o = run_layer(ctx, Device{}, d);
  const int64_t T = d.tokens, H = p.hidden, F = p.ffn, E = p.experts;
  const int64_t expected = T * 2 * F * 2 + T * H + colwise_scale_bytes(T, H, E) + T * F + colwise_scale_bytes(T, F, E);
  EXPECT_EQ(o.saved_bytes, expected);
}

// ---- fp8_blockwise (docs/numerics.md "FP8 blockwise") ----

TEST(CpuLayer, Fp8BlockwiseRecipeSwigluWithinSanityToleranceOfFp64) {
  for (bool pow2 : {false, true})
    for (const Variant& v : kVariants) {
      if (v.act != Activation::swiglu) continue;  // clamped: a quantized value may flip a mask
      Problem p = make_problem(Recipe::fp8_blockwise, v.act, v.glu, v.b1, v.b2, v.scale);
      p.pow2_scales = pow2;
      SCOPED_TRACE(describe(p));
      LayerData d = make_layer_data(p, kSizes);
      Context ctx({.backend = "cpu"});
      expect_near_reference(run_layer(ctx, Device{}, d), reference(d), p, 0.1, 0.1);
    }
}

// The layer's y and dW2 against the same points composed here from the fp8_block primitives: X and
// A row-wise (1x128), W1 and W2 in 128x128 blocks, the GEMM rule with promotion every 128, the GLU
// of src/common/glu.h; dY and A in 128-token blocks restarting at each group for dW2. Bit for bit:
// the layer must apply exactly these points in this order (H = 128, F = 96: partial blocks along F,
// 2F and every group's tokens).
TEST(CpuLayer, Fp8BlockwiseForwardAndFc2WgradAreTheComposedSamePoints) {
  for (bool pow2 : {false, true}) {
    Problem p = make_problem(Recipe::fp8_blockwise, Activation::clamped_swiglu, GluLayout::interleave32, true, true, true);
    p.pow2_scales = pow2;
    SCOPED_TRACE(describe(p));
    LayerData d = make_layer_data(p, {37, 0, 150, 95}, 4.0f);
    Context ctx({.backend = "cpu"});
    const LayerOutputs o = run_layer(ctx, Device{}, d);
    const int64_t T = d.tokens, H = p.hidden, F = p.ffn, E = p.experts;
    const int32_t* off = d.offsets.ptr<int32_t>();
    const auto* x = d.x.ptr<uint16_t>();
    const auto* probs = d.probs.ptr<float>();

    std::vector<uint8_t> xq(T * H), w1q(E * 2 * F * H), aq(T * F), w2q(E * H * F);
    std::vector<float> xs(fp8_rowwise_scale_count(T, H)), w1s(E * fp8_weight_scale_count(2 * F, H)),
        as(fp8_rowwise_scale_count(T, F)), w2s(E * fp8_weight_scale_count(H, F));
    cpu::fp8_quantize_rows(x, T, H, pow2, xq.data(), xs.data());
    cpu::fp8_quantize_weights(d.w1.ptr<uint16_t>(), E, 2 * F, H, pow2, w1q.data(), w1s.data());
    std::vector<float> c(T * 2 * F);
    cpu::fp8_gemm_fprop(xq.data(), xs.data(), T, H, w1q.data(), w1s.data(), E, 2 * F, off, c.data());
    std::vector<uint16_t> a(T * F);
    const GluParams glu{p.activation, p.clamp};
    for (int64_t e = 0; e < E; ++e)
      for (int64_t t = off[e]; t < off[e + 1]; ++t) {
        float* row = c.data() + t * 2 * F;
        for (int64_t j = 0; j < 2 * F; ++j) row[j] += f32_from_bf16(d.b1.ptr<uint16_t>()[e * 2 * F + j]);
        for (int64_t i = 0; i < F; ++i)
          a[t * F + i] = bf16_from_f32(probs[t] * glu_forward(row[glu_a_col(i, F, p.glu_layout)],
                                                              row[glu_b_col(i, F, p.glu_layout)], glu));
      }
    cpu::fp8_quantize_rows(a.data(), T, F, pow2, aq.data(), as.data());
    cpu::fp8_quantize_weights(d.w2.ptr<uint16_t>(), E, H, F, pow2, w2q.data(), w2s.data());
    std::vector<float> y(T * H);
    cpu::fp8_gemm_fprop(aq.data(), as.data(), T, F, w2q.data(), w2s.data(), E, H, off, y.data());
    int64_t y_diff = 0;
    for (int64_t e = 0; e < E; ++e)
      for (int64_t t = off[e]; t < off[e + 1]; ++t)
        for (int64_t j = 0; j < H; ++j) {
          const float b = probs[t] * f32_from_bf16(d.b2.ptr<uint16_t>()[e * H + j]);  // scale_fc2_bias
          y_diff += o.y.ptr<uint16_t>()[t * H + j] != bf16_from_f32(y[t * H + j] + b);
        }
    EXPECT_EQ(y_diff, 0) << "y elements differing from the composed same points";

    const int64_t rows = fp8_token_block_rows_capacity(T, E);
    std::vector<uint8_t> dyt(T * H), at(T * F);
    std::vector<float> dys(rows * H), ats(rows * F), dw2(E * H * F);
    cpu::fp8_quantize_token_blocks(d.dy.ptr<uint16_t>(), T, H, off, E, pow2, dyt.data(), dys.data(), rows);
    cpu::fp8_quantize_token_blocks(a.data(), T, F, off, E, pow2, at.data(), ats.data(), rows);
    cpu::fp8_gemm_wgrad(dyt.data(), dys.data(), H, at.data(), ats.data(), F, T, off, E, dw2.data());
    int64_t w_diff = 0;
    for (int64_t i = 0; i < E * H * F; ++i) w_diff += o.dw2.ptr<float>()[i] != dw2[i];
    EXPECT_EQ(w_diff, 0) << "dW2 elements differing from the composed same points";
  }
}

TEST(CpuLayer, Fp8BlockwiseSavesFp8ColumnsWithTokenBlockScales) {
  Problem p = make_problem(Recipe::fp8_blockwise, Activation::swiglu, GluLayout::halves, false, false, false);
  LayerData d = make_layer_data(p, kSizes);
  Context ctx({.backend = "cpu"});
  LayerOutputs o = run_layer(ctx, Device{}, d);
  const int64_t T = d.tokens, H = p.hidden, F = p.ffn, E = p.experts;
  const int64_t blocks = ceil_div(T, kFp8Block) + E;
  EXPECT_EQ(o.saved_bytes, T * 2 * F * 2 + T * H + 4 * blocks * H + T * F + 4 * blocks * F);
  std::vector<std::string> steps;
  for (const StepRecord& r : o.report) steps.push_back(r.step);
  // One weight copy (128x128 blocks serve fprop and dgrad): quantize_w1 / quantize_w2 (repeated
  // steps are merged in the report), never a column-wise copy.
  for (const std::string& s : steps) EXPECT_EQ(s.find("_col"), std::string::npos) << s;
  EXPECT_EQ(std::count(steps.begin(), steps.end(), "quantize_w1"), 1);
  EXPECT_EQ(std::count(steps.begin(), steps.end(), "quantize_w2"), 1);
  EXPECT_EQ(std::count(steps.begin(), steps.end(), "quantize_dy"), 1);
}

TEST(CpuLayer, Pow2ScalesAreFp8BlockwiseOnly) {
  Problem p = make_problem(Recipe::mxfp8, Activation::swiglu, GluLayout::halves, false, false, false);
  p.pow2_scales = true;
  try {
    validate_problem(p);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "problem.pow2_scales");
  }
  p.recipe = Recipe::fp8_blockwise;
  p.hidden = 40;
  try {
    validate_problem(p);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "problem.hidden");
    EXPECT_NE(std::string(e.what()).find("multiple of 16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mxmoe::test
