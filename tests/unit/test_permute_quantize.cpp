// permute_tokens with MXFP8 outputs (PermuteArgs::rowwise / colwise; include/mxmoe/permute.h)
// against its definition: permute_tokens (bf16) followed by quantize_mxfp8 of the kept rows
// 0 .. offsets[E]-1 with groups = offsets, both through the public API. Inputs are drawn fresh
// (seed printed on failure), with magnitudes spread over 2^-12 .. 2^12 per row so block scales
// differ; every output of both runs is poisoned with the same bytes beforehand, and every byte is
// compared: the quantized data rows past offsets[E] must keep their poison, the scale bytes of no
// block must be 0. Shapes: zero-token experts, T*K not a multiple of 32, capacity drops, invalid
// ids (int32 and int64), T = 0, E = 1, both scale layouts, each subset of the outputs.
// Run: <build>/tests/mxmoe_unit_tests --gtest_filter='*PermuteQuantize*'
#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "src/cpu/cpu_ops.h"
#include "src/dispatch/backend.h"
#include "support.h"
#include "tests/permute_inputs.h"

namespace mxmoe::test {
namespace {

constexpr uint8_t kPoison = 0xC3;

HostTensor poisoned(DType t, std::initializer_list<int64_t> shape) {
  HostTensor h(t, shape);
  h.poison(kPoison);
  return h;
}

using Case = PermuteCase;
using Inputs = PermuteInputs;
inline Inputs make_inputs(const Case& c, std::mt19937_64& gen) { return make_permute_inputs(c, gen); }



// Which outputs a run asks for.
struct Wanted {
  bool x = true, row = true, col = true, zero_unused = false;
  ScaleLayout layout = ScaleLayout::compact;
};

struct Outputs {
  HostTensor offsets, permuted_x, row_map, permuted_probs, invalid, row_data, row_scales, col_data, col_scales;
  Outputs(const Case& c, int64_t R)
      : offsets(poisoned(DType::i32, {c.E + 1})),
        permuted_x(poisoned(DType::bf16, {R, c.H})),
        row_map(poisoned(DType::i32, {c.T, c.K})),
        permuted_probs(poisoned(DType::f32, {R})),
        invalid(poisoned(DType::i32, {1})),
        row_data(poisoned(DType::e4m3, {R, c.H})),
        row_scales(poisoned(DType::e8m0, {rowwise_scale_bytes(R, c.H)})),
        col_data(poisoned(DType::e4m3, {R, c.H})),
        col_scales(poisoned(DType::e8m0, {colwise_scale_bytes(R, c.H, c.E)})) {}
  Mxfp8View row(ScaleLayout l) { return {row_data.view, row_scales.view, BlockAxis::row, l}; }
  Mxfp8View col(ScaleLayout l) { return {col_data.view, col_scales.view, BlockAxis::col, l}; }
};

PermuteArgs permute_args(const Case& c, Inputs& in, Outputs& o, bool with_x, bool zero_unused) {
  return {.x = in.x.view,
          .expert_ids = in.ids.view,
          .probs = in.probs.view,
          .experts = c.E,
          .capacity = c.capacity,
          .offsets = o.offsets.view,
          .permuted_x = with_x ? o.permuted_x.view : TensorView{},
          .row_map = o.row_map.view,
          .permuted_probs = o.permuted_probs.view,
          .invalid = o.invalid.view,
          .zero_unused_rows = zero_unused};
}

// The fused call.
void run_fused(Context& ctx, const Case& c, Inputs& in, Outputs& o, const Wanted& w) {
  PermuteArgs a = permute_args(c, in, o, w.x, w.zero_unused);
  if (w.row) a.rowwise = o.row(w.layout);
  if (w.col) a.colwise = o.col(w.layout);
  permute_tokens(ctx, a);
}

// The definition: permute (bf16, into permuted_x), then quantize_mxfp8 of rows 0 .. offsets[E]-1.
void run_composition(Context& ctx, const Case& c, Inputs& in, Outputs& o, const Wanted& w) {
  permute_tokens(ctx, permute_args(c, in, o, /*with_x=*/true, w.zero_unused));
  const int64_t n = o.offsets.ptr<int32_t>()[c.E];
  if (!w.row && !w.col) return;
  QuantizeArgs q;
  q.src = TensorView::of(o.permuted_x.view.data, DType::bf16, {n, c.H});
  q.groups = {o.offsets.view};
  if (w.row) q.rowwise = {TensorView::of(o.row_data.view.data, DType::e4m3, {n, c.H}), o.row_scales.view, BlockAxis::row, w.layout};
  if (w.col) q.colwise = {TensorView::of(o.col_data.view.data, DType::e4m3, {n, c.H}), o.col_scales.view, BlockAxis::col, w.layout};
  quantize_mxfp8(ctx, q);
}

void expect_same(const char* what, const HostTensor& got, const HostTensor& want) {
  ASSERT_EQ(got.bytes.size(), want.bytes.size()) << what;
  for (size_t i = 0; i < got.bytes.size(); ++i)
    ASSERT_EQ(got.bytes[i], want.bytes[i]) << what << " differs first at byte " << i << " of " << got.bytes.size();
}

void check_case(const Case& c, const Wanted& w, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << c << " seed " << seed << " x" << w.x << " row" << w.row << " col" << w.col
                                    << " zero" << w.zero_unused << " layout " << static_cast<int>(w.layout));
  std::mt19937_64 gen(seed);
  Inputs in = make_inputs(c, gen);
  const int64_t R = permuted_rows_bound(c.T, c.K, c.E, c.capacity);
  Outputs got(c, R), want(c, R);
  Context ctx;
  run_fused(ctx, c, in, got, w);
  Context ref_ctx;
  run_composition(ref_ctx, c, in, want, w);
  expect_same("offsets", got.offsets, want.offsets);
  expect_same("row_map", got.row_map, want.row_map);
  expect_same("invalid", got.invalid, want.invalid);
  expect_same("permuted_probs", got.permuted_probs, want.permuted_probs);
  if (w.x) expect_same("permuted_x", got.permuted_x, want.permuted_x);
  else expect_same("permuted_x (not given: untouched)", got.permuted_x, Outputs(c, R).permuted_x);
  expect_same("rowwise.data", got.row_data, want.row_data);
  expect_same("rowwise.scales", got.row_scales, want.row_scales);
  expect_same("colwise.data", got.col_data, want.col_data);
  expect_same("colwise.scales", got.col_scales, want.col_scales);

  // The policy itself, independent of the composition: quantized rows past offsets[E] keep their
  // poison, and the report names the fused step.
  const int64_t n = got.offsets.ptr<int32_t>()[c.E];
  for (int64_t i = n * c.H; i < R * c.H; ++i) {
    if (w.row) {
      ASSERT_EQ(got.row_data.bytes[i], kPoison) << "rowwise row " << i / c.H << " past offsets[E]=" << n;
    }
    if (w.col) {
      ASSERT_EQ(got.col_data.bytes[i], kPoison) << "colwise row " << i / c.H << " past offsets[E]=" << n;
    }
  }
  if (w.row) {
    for (int64_t r = 0; r < round_up(R, 128); ++r)
      for (int64_t j = 0; j < rowwise_scale_cols(c.H); ++j) {
        const uint8_t s = got.row_scales.bytes[rowwise_scale_index(r, j, c.H, w.layout)];
        if (r >= n || j >= c.H / 32) {
          ASSERT_EQ(s, 0) << "row-wise scale padding at (" << r << ", " << j << ")";
        }
      }
  }
  bool reported = false;
  for (const StepRecord& r : ctx.report()) reported |= r.step == "permute_quantize_rows" && r.backend == "cpu";
  EXPECT_EQ(reported, w.row || w.col);
}

class PermuteQuantizeCases : public ::testing::TestWithParam<Case> {};

TEST_P(PermuteQuantizeCases, BitIdenticalToPermuteThenQuantizeForEveryOutputSubsetAndLayout) {
  const uint64_t seed = std::random_device{}();
  for (ScaleLayout layout : {ScaleLayout::compact, ScaleLayout::swizzled})
    for (const Wanted& w0 : {Wanted{true, true, true}, Wanted{false, true, true}, Wanted{false, true, false},
                             Wanted{false, false, true}, Wanted{true, true, false, true},
                             Wanted{false, true, true, true}}) {
      Wanted w = w0;
      w.layout = layout;
      check_case(GetParam(), w, seed);
      if (::testing::Test::HasFatalFailure()) return;
    }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PermuteQuantizeCases,
    ::testing::Values(Case{37, 3, 5, -1, 64},                            // T*K = 111, experts without tokens
                      Case{50, 2, 4, 9, 96},                             // capacity drops, R = 36
                      Case{64, 4, 6, 1, 32},                             // capacity 1: R = 6, most dropped
                      Case{40, 4, 6, -1, 160, 0.15},                     // invalid ids (int32)
                      Case{33, 5, 7, 20, 64, 0.1, /*int64_ids=*/true},   // int64 ids, past int32 too
                      Case{1, 1, 3, -1, 64},                             // one token, one slot
                      Case{45, 1, 1, -1, 256},                           // one expert, 2 column tiles
                      Case{300, 8, 16, -1, 128},                         // many blocks per group
                      Case{130, 3, 9, 17, 224, 0.05, false, 2}),         // two experts take every slot
    [](const ::testing::TestParamInfo<Case>& i) {
      std::ostringstream s;
      s << i.param;
      std::string n = s.str();
      for (char& ch : n)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return n;
    });

// A backend that refuses the fused step: dispatch runs it on the next one (the CPU), records why,
// and the bytes do not change; a backend that accepts it without a kernel of its own runs the
// inherited composition (Backend::permute_quantize_rows) on its own steps.
class NoFusedPermuteBackend final : public detail::Backend {
 public:
  bool refuse_fused = true;
  int permute_calls = 0;
  const char* name() const override { return "test_no_fused_permute"; }
  detail::Probe probe_device(const detail::DeviceFacts& f) const override {
    return {f.device.type == DeviceType::cpu, "host only"};
  }
  detail::Probe probe(const detail::StepQuery& q) const override {
    if (refuse_fused && q.step == detail::Step::permute_rows && q.recipe == Recipe::mxfp8)
      return {false, "no fused permute-quantize kernel here"};
    return {true, ""};
  }
  void quantize(Context&, const QuantizeArgs& a) override { cpu::quantize(a); }
  void dequantize(Context&, const DequantizeArgs& a) override { cpu::dequantize(a); }
  void quantize_experts(Context&, const detail::QuantizeExpertsStep& s) override { cpu::quantize_experts(s); }
  void gemm_m(Context&, const detail::MGemmStep& s, const detail::StepPlan&) override { cpu::gemm_m(s); }
  void gemm_k(Context&, const KGroupedGemmArgs& a, const detail::StepPlan&) override { cpu::gemm_k(a); }
  void fc2_bias_grads(Context&, const detail::Fc2BiasGradStep& s) override { cpu::fc2_bias_grads(s); }
  void route_tokens(Context&, const detail::RouteTokensStep& s) override { cpu::route_tokens(s); }
  void permute_rows(Context&, const PermuteByMapArgs& a) override {
    ++permute_calls;
    cpu::permute_rows(a);
  }
  void unpermute_rows(Context&, const UnpermuteArgs& a) override { cpu::unpermute_rows(a); }
  uint64_t check_finite(Context&, const detail::CheckFiniteStep& s) override { return cpu::check_finite(s); }
};

TEST(PermuteQuantize, ABackendWithoutTheFusedStepIsSkippedWithItsReasonOrRunsTheComposition) {
  const Case c{29, 3, 4, 5, 64};
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (bool refuse : {true, false}) {
    std::mt19937_64 gen(seed);
    Inputs in = make_inputs(c, gen);
    const int64_t R = permuted_rows_bound(c.T, c.K, c.E, c.capacity);
    Outputs got(c, R), want(c, R);
    NoFusedPermuteBackend planted;
    planted.refuse_fused = refuse;
    detail::register_backend(&planted);
    Context ctx;
    const Wanted w{false, true, true};
    run_fused(ctx, c, in, got, w);
    detail::unregister_backend(&planted);
    Context cpu(Options{.backend = "cpu", .deny = {}});
    run_composition(cpu, c, in, want, w);
    expect_same("rowwise.data", got.row_data, want.row_data);
    expect_same("rowwise.scales", got.row_scales, want.row_scales);
    expect_same("colwise.data", got.col_data, want.col_data);
    expect_same("colwise.scales", got.col_scales, want.col_scales);
    const StepRecord* rec = nullptr;
    for (const StepRecord& r : ctx.report())
      if (r.step == "permute_quantize_rows") rec = &r;
    ASSERT_NE(rec, nullptr);
    EXPECT_EQ(rec->backend, refuse ? "cpu" : "test_no_fused_permute");
    bool reason = false;
    for (const auto& [name, why] : rec->skipped) reason |= why.find("no fused permute-quantize") != std::string::npos;
    EXPECT_EQ(reason, refuse);
    EXPECT_EQ(planted.permute_calls, refuse ? 0 : 1);
  }
}

// ---------------- validation: the argument and value named, nothing written ----------------

struct Fixture {
  static constexpr int64_t T = 12, K = 2, E = 3, H = 64, R = T * K;
  Case c{T, K, E, -1, H};
  std::mt19937_64 gen{7};
  Inputs in = make_inputs(c, gen);
  Outputs o{c, R};
  PermuteArgs a;
  Fixture() {
    a = permute_args(c, in, o, /*with_x=*/false, false);
    a.rowwise = o.row(ScaleLayout::compact);
    a.colwise = o.col(ScaleLayout::swizzled);
  }
  // The call throws an Error naming `arg` whose message contains `text`, and writes nothing.
  void expect_error(const std::string& arg, const std::string& text) {
    const Outputs before = o;
    Context ctx;
    try {
      permute_tokens(ctx, a);
      ADD_FAILURE() << "no error; expected one naming " << arg;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), arg) << e.what();
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
    for (const auto& [got, want] : {std::pair{&o.offsets, &before.offsets}, {&o.row_map, &before.row_map},
                                    {&o.row_data, &before.row_data}, {&o.row_scales, &before.row_scales},
                                    {&o.col_data, &before.col_data}, {&o.col_scales, &before.col_scales},
                                    {&o.permuted_probs, &before.permuted_probs}})
      EXPECT_TRUE(bytes_equal(got->view, want->view)) << "an output was written before the error";
  }
};

TEST(PermuteQuantizeValidation, TheFixtureIsAValidCall) {
  Fixture f;
  Context ctx;
  EXPECT_NO_THROW(permute_tokens(ctx, f.a));
}

TEST(PermuteQuantizeValidation, PermutedXIsRequiredOnlyWithoutQuantizedOutputs) {
  Fixture f;
  f.a.rowwise = f.a.colwise = {};
  f.expect_error("permuted_x", "missing");
}

TEST(PermuteQuantizeValidation, QuantizedShapesFollowRAndH) {
  Fixture f;
  f.a.rowwise.data = TensorView::of(f.o.row_data.view.data, DType::e4m3, {f.R - 1, f.H});
  f.expect_error("rowwise.data", "R >= 24");
  Fixture g;
  g.a.colwise.data = TensorView::of(g.o.col_data.view.data, DType::e4m3, {g.R, g.H - 32});
  g.expect_error("colwise.data", "shape");
  Fixture h;  // permuted_x given: the quantized outputs must have its R
  h.a.permuted_x = h.o.permuted_x.view;
  h.a.rowwise.data = TensorView::of(h.o.row_data.view.data, DType::e4m3, {h.R + 1, h.H});
  h.expect_error("rowwise.data", "shape");
}

TEST(PermuteQuantizeValidation, ScaleBuffersAxesFormatsAndDtypesAreChecked) {
  Fixture f;
  f.a.rowwise.scales = TensorView::of(f.o.row_scales.view.data, DType::e8m0, {rowwise_scale_bytes(f.R, f.H) - 1});
  f.expect_error("rowwise.scales", "needs " + std::to_string(rowwise_scale_bytes(f.R, f.H)));
  Fixture g;
  g.a.colwise.scales = TensorView::of(g.o.col_scales.view.data, DType::e8m0, {colwise_scale_bytes(g.R, g.H, g.E) - 1});
  g.expect_error("colwise.scales", "needs " + std::to_string(colwise_scale_bytes(g.R, g.H, g.E)));
  Fixture h;
  h.a.colwise.axis = BlockAxis::row;
  h.expect_error("colwise.axis", "col");
  Fixture i;
  i.a.rowwise.format = QuantFormat::fp8_block;
  i.expect_error("rowwise.format", "fp8_block");
  Fixture j;
  j.a.rowwise.data.dtype = DType::bf16;
  j.expect_error("rowwise.data", "dtype");
  Fixture k;
  k.a.colwise.data = {};
  k.expect_error("colwise.data", "colwise.scales is given");
}

TEST(PermuteQuantizeValidation, RowwiseNeedsHMultipleOf32) {
  const Case c{8, 2, 3, -1, 48};
  std::mt19937_64 gen(3);
  Inputs in = make_inputs(c, gen);
  Outputs o(c, 16);
  PermuteArgs a = permute_args(c, in, o, false, false);
  a.rowwise = o.row(ScaleLayout::compact);
  Context ctx;
  try {
    permute_tokens(ctx, a);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "rowwise") << e.what();
    EXPECT_NE(std::string(e.what()).find("H=48"), std::string::npos) << e.what();
  }
  // Column-wise alone takes any H, as quantize_mxfp8 does.
  a.rowwise = {};
  a.colwise = o.col(ScaleLayout::compact);
  EXPECT_NO_THROW(permute_tokens(ctx, a));
}

TEST(PermuteQuantizeValidation, QuantizedOutputsMustNotAliasInputsOrEachOther) {
  Fixture f;
  f.a.colwise.data = TensorView::of(f.o.row_data.view.data, DType::e4m3, {f.R, f.H});
  f.expect_error("rowwise.data", "overlaps output colwise.data");
  Fixture g;
  g.a.rowwise.scales = TensorView::of(g.in.x.view.data, DType::e8m0, {rowwise_scale_bytes(g.R, g.H)});
  g.expect_error("rowwise.scales", "overlaps");
}

}  // namespace
}  // namespace mxmoe::test
