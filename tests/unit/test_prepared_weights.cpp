// Weights quantized once per version (prepare_weights): forward and backward given the prepared
// copies are bit-identical to the calls that quantize the weights themselves, skip their weight
// quantize steps, reuse one object across micro-batches, and refuse an object made for another
// problem before writing anything.
#include <gtest/gtest.h>

#include <string>

#include "tests/layer_support.h"

namespace mxmoe::test {
namespace {

Problem make_problem(Recipe r, GluLayout g, bool biases) {
  Problem p;
  p.hidden = 128;
  p.ffn = 96;
  p.experts = 4;
  p.recipe = r;
  p.activation = Activation::clamped_swiglu;
  p.glu_layout = g;
  p.fc1_bias = biases;
  p.fc2_bias = biases;
  p.scale_fc2_bias = biases;
  return p;
}

const std::vector<int> kSizes = {37, 0, 64, 95};

// prepare_weights over d's weights, in d's weight layout (the arena keeps the copies it reads).
PreparedWeights prepare(Context& ctx, Arena& m, const LayerData& d) {
  const bool per = d.problem.weight_layout == WeightLayout::per_expert;
  return prepare_weights(ctx, d.problem, {.w1 = m.experts(m.put(d.w1), per), .w2 = m.experts(m.put(d.w2), per)});
}

void expect_bit_identical(const LayerOutputs& a, const LayerOutputs& b, const Problem& p) {
  const auto bo = outputs_of(b, p);
  const auto ao = outputs_of(a, p);
  ASSERT_EQ(ao.size(), bo.size());
  for (size_t i = 0; i < ao.size(); ++i)
    EXPECT_TRUE(bytes_equal(ao[i].second->view, bo[i].second->view)) << ao[i].first;
}

bool has_weight_quantize(const std::vector<StepRecord>& report) {
  for (const StepRecord& r : report)
    if (r.step.rfind("quantize_w", 0) == 0) return true;
  return false;
}

TEST(PreparedWeights, ForwardAndBackwardBitIdenticalToQuantizingPerCall) {
  for (Recipe r : {Recipe::mxfp8, Recipe::bf16, Recipe::fp8_blockwise})
    for (GluLayout g : {GluLayout::halves, GluLayout::interleave32})
      for (bool biases : {false, true})
        for (WeightLayout wl : {WeightLayout::dense, WeightLayout::per_expert}) {
          Problem p = make_problem(r, g, biases);
          p.weight_layout = wl;
          SCOPED_TRACE(describe(p));
          LayerData d = make_layer_data(p, kSizes, 4.0f);
          Context ctx({.backend = "cpu"});
          LayerOutputs plain = run_layer(ctx, Device{}, d);
          Arena m{Device{}, {}};
          PreparedWeights pw = prepare(ctx, m, d);
          ASSERT_TRUE(pw.valid());
          RunConfig cfg;
          cfg.prepared = &pw;
          expect_bit_identical(plain, run_layer(ctx, Device{}, d, cfg), p);
          cfg.deferred_wgrad = true;
          expect_bit_identical(plain, run_layer(ctx, Device{}, d, cfg), p);
        }
}

TEST(PreparedWeights, ReportHasPrepareStepsAndNoPerCallWeightQuantize) {
  Problem p = make_problem(Recipe::mxfp8, GluLayout::interleave32, true);
  LayerData d = make_layer_data(p, kSizes);
  Context ctx({.backend = "cpu"});
  EXPECT_TRUE(has_weight_quantize(run_layer(ctx, Device{}, d).report));

  ctx.clear_report();
  Arena m{Device{}, {}};
  PreparedWeights pw = prepare(ctx, m, d);
  std::vector<std::string> steps;
  for (const StepRecord& r : ctx.report()) steps.push_back(r.step);
  EXPECT_EQ(steps, (std::vector<std::string>{"prepare.quantize_w1", "prepare.quantize_w2", "prepare.quantize_w1_col",
                                             "prepare.quantize_w2_col"}));

  RunConfig cfg;
  cfg.prepared = &pw;
  LayerOutputs o = run_layer(ctx, Device{}, d, cfg);  // forward + backward, one report
  EXPECT_FALSE(has_weight_quantize(o.report));
  bool quantize_x = false;
  for (const StepRecord& r : o.report) quantize_x |= r.step == "quantize_x";
  EXPECT_TRUE(quantize_x);  // activations are still quantized per call
}

TEST(PreparedWeights, ReusedAcrossMicroBatchesWithDifferentSplits) {
  for (Recipe r : {Recipe::mxfp8, Recipe::bf16, Recipe::fp8_blockwise}) {
    Problem p = make_problem(r, GluLayout::halves, true);
    SCOPED_TRACE(describe(p));
    LayerData first = make_layer_data(p, kSizes);
    LayerData second = make_layer_data(p, {0, 120, 1, 33});
    second.w1 = first.w1;  // one weight version, two micro-batches
    second.w2 = first.w2;
    second.b1 = first.b1;
    second.b2 = first.b2;
    Context ctx({.backend = "cpu"});
    Arena m{Device{}, {}};
    PreparedWeights pw = prepare(ctx, m, first);
    RunConfig cfg;
    cfg.prepared = &pw;
    for (const LayerData* d : {&first, &second, &first})
      expect_bit_identical(run_layer(ctx, Device{}, *d), run_layer(ctx, Device{}, *d, cfg), p);
  }
}

TEST(PreparedWeights, BytesAreTheFourQuantizedCopies) {
  Problem p = make_problem(Recipe::mxfp8, GluLayout::halves, false);
  LayerData d = make_layer_data(p, kSizes);
  Context ctx({.backend = "cpu"});
  Arena m{Device{}, {}};
  PreparedWeights pw = prepare(ctx, m, d);
  const int64_t E = p.experts, H = p.hidden, F = p.ffn;
  // Every copy holds the E4M3 data (one byte an element) plus its scales.
  EXPECT_GT(pw.bytes(), 2 * (E * 2 * F * H + E * H * F));
  EXPECT_LT(pw.bytes(), 2 * (E * 2 * F * H + E * H * F) * 9 / 8);

  PreparedWeights moved = std::move(pw);
  EXPECT_FALSE(pw.valid());  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(pw.bytes(), 0);  // NOLINT(bugprone-use-after-move)
  EXPECT_GT(moved.bytes(), 0);

  Problem b = make_problem(Recipe::bf16, GluLayout::halves, false);
  LayerData db = make_layer_data(b, kSizes);
  PreparedWeights none = prepare(ctx, m, db);
  EXPECT_TRUE(none.valid());
  EXPECT_EQ(none.bytes(), 0);  // the bf16 recipe reads the weights as given
}

// Runs forward (and backward) with `wrong` prepared weights: an Error naming "prepared" whose
// message contains `differs`, with every output still poisoned.
void expect_refused(const LayerData& d, const PreparedWeights& good, const PreparedWeights& wrong,
                    const std::string& differs, ScaleLayout layout = ScaleLayout::compact) {
  const Problem& p = d.problem;
  const int64_t T = d.tokens, H = p.hidden, F = p.ffn, E = p.experts;
  Context ctx({.backend = "cpu", .scale_layout = layout});
  Arena m{Device{}, {}};
  ForwardArgs fa{.x = m.put(d.x),
                 .offsets = {m.put(d.offsets)},
                 .probs = m.put(d.probs),
                 .w1 = m.experts(m.put(d.w1), false),
                 .b1 = p.fc1_bias ? m.put(d.b1) : TensorView{},
                 .w2 = m.experts(m.put(d.w2), false),
                 .b2 = p.fc2_bias ? m.put(d.b2) : TensorView{},
                 .y = m.poisoned(DType::bf16, {T, H}),
                 .prepared = &wrong};
  const HostTensor y_before = m.get(fa.y);
  try {
    (void)forward(ctx, p, fa);
    ADD_FAILURE() << "forward accepted mismatched prepared weights (" << differs << ")";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "prepared");
    EXPECT_NE(std::string(e.what()).find(differs), std::string::npos) << e.what();
  }
  EXPECT_TRUE(bytes_equal(m.get(fa.y).view, y_before.view)) << "y written";
  if (layout != ScaleLayout::compact) return;  // `good` was made with a compact context

  fa.prepared = &good;
  SavedState saved = forward(ctx, p, fa);
  BackwardArgs ba{.dy = m.put(d.dy),
                  .dx = m.poisoned(DType::bf16, {T, H}),
                  .dprobs = m.poisoned(DType::f32, {T}),
                  .grads = {.dw1 = m.experts(m.poisoned(DType::f32, {E, 2 * F, H}), false),
                            .dw2 = m.experts(m.poisoned(DType::f32, {E, H, F}), false),
                            .db1 = p.fc1_bias ? m.poisoned(DType::f32, {E, 2 * F}) : TensorView{},
                            .db2 = p.fc2_bias ? m.poisoned(DType::f32, {E, H}) : TensorView{}},
                  .prepared = &wrong};
  const HostTensor dx_before = m.get(ba.dx), dw1_before = m.get(ba.grads.dw1.dense);
  try {
    (void)backward(ctx, saved, ba);
    ADD_FAILURE() << "backward accepted mismatched prepared weights (" << differs << ")";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "prepared");
    EXPECT_NE(std::string(e.what()).find(differs), std::string::npos) << e.what();
  }
  EXPECT_TRUE(bytes_equal(m.get(ba.dx).view, dx_before.view)) << "dx written";
  EXPECT_TRUE(bytes_equal(m.get(ba.grads.dw1.dense).view, dw1_before.view)) << "dw1 written";
  // The refused call consumed nothing: the same saved state still runs backward.
  ba.prepared = &good;
  EXPECT_NO_THROW((void)backward(ctx, saved, ba));
}

TEST(PreparedWeights, MismatchedObjectIsAClearErrorThatWritesNothing) {
  Problem p = make_problem(Recipe::mxfp8, GluLayout::halves, true);
  LayerData d = make_layer_data(p, kSizes);
  Context ctx({.backend = "cpu"});
  Arena m{Device{}, {}};
  PreparedWeights good = prepare(ctx, m, d);

  auto prepared_for = [&](Problem q) {
    return prepare(ctx, m, make_layer_data(q, std::vector<int>(static_cast<size_t>(q.experts), 1)));
  };
  Problem q = p;
  q.hidden = 64;
  expect_refused(d, good, prepared_for(q), "problem.hidden=64 but this call has problem.hidden=128");
  q = p;
  q.ffn = 64;
  expect_refused(d, good, prepared_for(q), "problem.ffn=64");
  q = p;
  q.experts = 8;
  expect_refused(d, good, prepared_for(q), "problem.experts=8");
  q = p;
  q.recipe = Recipe::bf16;
  expect_refused(d, good, prepared_for(q), "problem.recipe=bf16");
  q = p;
  q.glu_layout = GluLayout::interleave32;
  expect_refused(d, good, prepared_for(q), "problem.glu_layout");
  // Made with compact scales, used by a context with swizzled ones.
  expect_refused(d, good, good, "scale_layout", ScaleLayout::swizzled);
  PreparedWeights empty;
  expect_refused(d, good, empty, "empty PreparedWeights");
}

TEST(PreparedWeights, PrepareValidatesTheWeights) {
  Problem p = make_problem(Recipe::mxfp8, GluLayout::halves, false);
  LayerData d = make_layer_data(p, kSizes);
  Context ctx({.backend = "cpu"});
  Arena m{Device{}, {}};
  try {
    (void)prepare_weights(ctx, p, {.w1 = m.experts(m.put(d.w2), false), .w2 = m.experts(m.put(d.w2), false)});
    ADD_FAILURE() << "w2 accepted as w1";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "w1") << e.what();
  }
}

}  // namespace
}  // namespace mxmoe::test
