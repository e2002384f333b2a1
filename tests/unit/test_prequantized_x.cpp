// ForwardArgs::x_row / x_col (include/mxmoe/grouped_mlp.h): a forward given X already quantized
// (as permute_tokens' MXFP8 outputs or quantize_mxfp8 write it), with x empty, gives the same bytes
// as a forward given the bf16 x, for every output of forward and backward, runs no quantize_x step
// and keeps less memory; the arguments are validated (argument and value named, nothing written).
// Run: <build>/tests/mxmoe_unit_tests --gtest_filter='PrequantizedX*'
#include <gtest/gtest.h>

#include <string>

#include "tests/layer_support.h"

namespace mxmoe::test {
namespace {

Problem problem(Recipe r = Recipe::mxfp8) {
  Problem p;
  p.hidden = 96;
  p.ffn = 64;
  p.experts = 4;
  p.recipe = r;
  p.fc1_bias = p.fc2_bias = true;
  return p;
}

bool ran(const std::vector<StepRecord>& report, const std::string& step) {
  for (const StepRecord& r : report)
    if (r.step == step) return true;
  return false;
}

TEST(PrequantizedX, ForwardAndBackwardAreBitIdenticalToTheBf16XInBothLayoutsAndWgradModes) {
  for (ScaleLayout layout : {ScaleLayout::compact, ScaleLayout::swizzled})
    for (bool deferred : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "layout " << static_cast<int>(layout) << " deferred " << deferred);
      // Sizes with an empty expert and groups that are not multiples of 32.
      const LayerData d = make_layer_data(problem(), {37, 0, 70, 5});
      Context plain_ctx(Options{.scale_layout = layout});
      RunConfig cfg;
      cfg.deferred_wgrad = deferred;
      const LayerOutputs plain = run_layer(plain_ctx, Device{}, d, cfg);
      Context pre_ctx(Options{.scale_layout = layout});
      cfg.prequantize_x = true;
      const LayerOutputs pre = run_layer(pre_ctx, Device{}, d, cfg);
      for (const auto& [name, out] : outputs_of(plain, d.problem)) {
        const HostTensor* other = nullptr;
        for (const auto& [n2, o2] : outputs_of(pre, d.problem))
          if (std::string(n2) == name) other = o2;
        ASSERT_NE(other, nullptr);
        EXPECT_TRUE(bytes_equal(out->view, other->view)) << name;
      }
      EXPECT_TRUE(bytes_equal(plain.c.view, pre.c.view)) << "c";
      EXPECT_TRUE(ran(plain.report, "quantize_x"));
      EXPECT_FALSE(ran(pre.report, "quantize_x"));
      EXPECT_LT(pre.saved_bytes, plain.saved_bytes);  // x_col is the caller's
    }
}

// A valid pre-quantized forward, then one corrupted argument at a time.
struct Fixture {
  Problem p = problem();
  LayerData d = make_layer_data(p, {10, 0, 22, 3});
  int64_t T = d.tokens, H = p.hidden, E = p.experts;
  HostTensor y{DType::bf16, {T, H}}, xr{DType::e4m3, {T, H}}, xrs{DType::e8m0, {rowwise_scale_bytes(T, H)}},
      xc{DType::e4m3, {T, H}}, xcs{DType::e8m0, {colwise_scale_bytes(T, H, E)}};
  ForwardArgs a;
  Fixture() {
    y.poison();
    a.offsets.offsets = d.offsets.view;
    a.probs = d.probs.view;
    a.w1.dense = d.w1.view;
    a.w2.dense = d.w2.view;
    a.b1 = d.b1.view;
    a.b2 = d.b2.view;
    a.y = y.view;
    a.x_row = {xr.view, xrs.view, BlockAxis::row, ScaleLayout::compact};
    a.x_col = {xc.view, xcs.view, BlockAxis::col, ScaleLayout::compact};
    Context ctx;
    quantize_mxfp8(ctx, {.src = d.x.view, .groups = a.offsets, .rowwise = a.x_row, .colwise = a.x_col});
  }
  void expect_error(const std::string& arg, const std::string& text, Recipe r = Recipe::mxfp8) {
    Problem q = p;
    q.recipe = r;
    const HostTensor before = y;
    Context ctx;
    try {
      forward(ctx, q, a);
      ADD_FAILURE() << "no error; expected one naming " << arg;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), arg) << e.what();
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
    EXPECT_TRUE(bytes_equal(y.view, before.view)) << "y was written before the error";
  }
};

TEST(PrequantizedXValidation, TheFixtureIsAValidCallWithoutX) {
  Fixture f;
  Context ctx;
  EXPECT_NO_THROW(forward(ctx, f.p, f.a));
}

TEST(PrequantizedXValidation, OnlyTheMxfp8RecipeTakesIt) {
  Fixture f;
  f.a.x = f.d.x.view;
  f.expect_error("x_row", "problem.recipe is bf16", Recipe::bf16);
  Fixture g;
  g.a.x = g.d.x.view;
  g.expect_error("x_row", "fp8_blockwise", Recipe::fp8_blockwise);
}

TEST(PrequantizedXValidation, RowAndColumnCopiesComeTogether) {
  Fixture f;
  f.a.x = f.d.x.view;
  f.a.x_col = {};
  f.expect_error("x_col.data", "x_row is given");
  Fixture g;
  g.a.x = g.d.x.view;
  g.a.x_row = {};
  g.expect_error("x_row.data", "x_col is given");
}

TEST(PrequantizedXValidation, ShapesScalesAxesAndLayoutsAreChecked) {
  Fixture f;
  f.a.x_row.scales = TensorView::of(f.xrs.view.data, DType::e8m0, {rowwise_scale_bytes(f.T, f.H) - 1});
  f.expect_error("x_row.scales", "needs " + std::to_string(rowwise_scale_bytes(f.T, f.H)));
  Fixture g;
  g.a.x_col.axis = BlockAxis::row;
  g.expect_error("x_col.axis", "col");
  Fixture h;
  h.a.x_col.layout = ScaleLayout::swizzled;  // the context's is compact
  h.expect_error("x_col.layout", "scale layout");
  Fixture i;  // T comes from x_row: x_col with another T is named
  i.a.x_col.data = TensorView::of(i.xc.view.data, DType::e4m3, {i.T - 1, i.H});
  i.expect_error("x_col.data", "shape");
  Fixture j;  // x given too: its T rules, and x_row must match it
  j.a.x = j.d.x.view;
  j.a.x_row.data = TensorView::of(j.xr.view.data, DType::e4m3, {j.T, j.H - 32});
  j.expect_error("x_row.data", "shape");
}

TEST(PrequantizedXValidation, OutputsMustNotOverlapTheQuantizedX) {
  Fixture f;
  HostTensor shared(DType::bf16, {f.T, f.H});  // y, and x_col's data in its first half
  shared.poison();
  f.a.y = shared.view;
  f.a.x_col.data = TensorView::of(shared.view.data, DType::e4m3, {f.T, f.H});
  const HostTensor before = shared;
  Context ctx;
  try {
    forward(ctx, f.p, f.a);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "y") << e.what();
    EXPECT_NE(std::string(e.what()).find("x_col.data"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(bytes_equal(shared.view, before.view));
}

}  // namespace
}  // namespace mxmoe::test
