// Dispatch never crashes where a path is missing: an unavailable backend is a reason, the next
// backend runs, and the report says who ran each step and why the others did not.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <tuple>

#include "src/cpu/cpu_ops.h"
#include "tests/layer_support.h"

namespace mxmoe::test {
namespace {

Problem small_problem(Recipe r) {
  Problem p;
  p.hidden = 64;
  p.ffn = 64;
  p.experts = 3;
  p.recipe = r;
  p.fc1_bias = p.fc2_bias = true;
  return p;
}

const StepRecord* find_step(const std::vector<StepRecord>& rep, const std::string& step) {
  for (const StepRecord& r : rep)
    if (r.step == step) return &r;
  return nullptr;
}

// A "fast" backend whose wgrad kernel is missing: exactly the model system's failure. It serves
// everything else by delegating to the CPU code so the layer is complete.
class MissingWgradBackend final : public detail::Backend {
 public:
  int gemm_m_calls = 0;
  const char* name() const override { return "test_fast"; }
  detail::Probe probe_device(const detail::DeviceFacts& f) const override {
    return {f.device.type == DeviceType::cpu, "host only"};
  }
  detail::Probe probe(const detail::StepQuery& q) const override {
    if (q.step == detail::Step::gemm_k) return {false, "grouped wgrad kernel not found for this configuration"};
    return {true, ""};
  }
  void quantize(Context&, const QuantizeArgs& a) override { cpu::quantize(a); }
  void dequantize(Context&, const DequantizeArgs& a) override { cpu::dequantize(a); }
  void quantize_experts(Context&, const detail::QuantizeExpertsStep& s) override { cpu::quantize_experts(s); }
  void gemm_m(Context&, const detail::MGemmStep& s, const detail::StepPlan&) override {
    ++gemm_m_calls;
    cpu::gemm_m(s);
  }
  void gemm_k(Context&, const KGroupedGemmArgs&, const detail::StepPlan&) override { ADD_FAILURE() << "gemm_k must not be called"; }
  void fc2_bias_grads(Context&, const detail::Fc2BiasGradStep& s) override { cpu::fc2_bias_grads(s); }
  void route_tokens(Context&, const detail::RouteTokensStep& s) override { cpu::route_tokens(s); }
  void permute_rows(Context&, const PermuteByMapArgs& a) override { cpu::permute_rows(a); }
  void unpermute_rows(Context&, const UnpermuteArgs& a) override { cpu::unpermute_rows(a); }
  uint64_t check_finite(Context&, const detail::CheckFiniteStep& s) override { return cpu::check_finite(s); }
};

TEST(Dispatch, MissingPreferredWgradKernelFallsBackWithoutException) {
  MissingWgradBackend fast;
  detail::register_backend(&fast);
  Problem p = small_problem(Recipe::mxfp8);
  LayerData d = make_layer_data(p, {10, 0, 23});
  LayerOutputs out;
  Context ctx;
  EXPECT_NO_THROW(out = run_layer(ctx, Device{}, d));
  detail::unregister_backend(&fast);
  EXPECT_GT(fast.gemm_m_calls, 0);
  const StepRecord* w = find_step(out.report, "fc1_wgrad");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->backend, "cpu");
  bool reason_seen = false;
  for (auto& [name, why] : w->skipped) reason_seen |= name == "test_fast" && why.find("not found") != std::string::npos;
  EXPECT_TRUE(reason_seen);
  EXPECT_EQ(find_step(out.report, "fc1_fprop")->backend, "test_fast");
  // Same numbers as the plain CPU run: the fallback is a real path, not a different function.
  Context cpu(Options{.backend = "cpu", .deny = {}});
  LayerOutputs ref = run_layer(cpu, Device{}, d);
  EXPECT_TRUE(bytes_equal(out.dw1.view, ref.dw1.view));
  EXPECT_TRUE(bytes_equal(out.y.view, ref.y.view));
}

// A backend that, like cuda_sm90, reads MXFP8 weights from their bf16 copy alone and takes only the
// m-grouped GEMMs (the quantize steps run on the CPU). Its GEMM is the CPU's on the copy.
class CopyReadingBackend final : public detail::Backend {
 public:
  int copy_gemms = 0, fp8_gemms = 0;
  const char* name() const override { return "test_copy_reader"; }
  detail::Probe probe_device(const detail::DeviceFacts& f) const override {
    return {f.device.type == DeviceType::cpu, "host only"};
  }
  bool refuse_glu_backward = false;  // as cuda_sm90 refuses a step for its shapes or alignment
  detail::Probe probe(const detail::StepQuery& q) const override {
    if (refuse_glu_backward && q.gemm_m != nullptr && q.gemm_m->epilogue == detail::Epilogue::glu_backward)
      return {false, "glu_backward refused (test)"};
    return {q.step == detail::Step::gemm_m, "m-grouped GEMMs only"};
  }
  // "copy" (the choice): reads the weights' bf16 copy where the step carries only that; "fp8": reads
  // FP8 weights, so the layer gives it FP8 weights.
  detail::StepPlan plan(const detail::StepQuery& q, const std::string& config) const override {
    if (!config.empty() && config != "copy" && config != "fp8")
      throw Error("options.overrides", "test_copy_reader has no configuration '" + config + "'");
    detail::StepPlan p;
    p.config = config.empty() ? "copy" : config;
    const bool copy = p.config == "copy" && q.gemm_m != nullptr && q.gemm_m->b_copy_only;
    p.weights = copy ? detail::WeightForm::bf16_copy : detail::WeightForm::quantized;
    return p;
  }
  void quantize(Context&, const QuantizeArgs&) override { ADD_FAILURE() << "quantize"; }
  void dequantize(Context&, const DequantizeArgs&) override { ADD_FAILURE() << "dequantize"; }
  void quantize_experts(Context&, const detail::QuantizeExpertsStep&) override { ADD_FAILURE() << "quantize_experts"; }
  void gemm_m(Context&, const detail::MGemmStep& s, const detail::StepPlan&) override {
    if (!s.b_copy_only) {
      ++fp8_gemms;
      return cpu::gemm_m(s);
    }
    ++copy_gemms;
    EXPECT_EQ(s.gemm.b.data.dense.data, nullptr) << "a copy-only step carries no FP8 bytes";
    EXPECT_EQ(s.gemm.b.scales.dense.data, nullptr);
    EXPECT_NE(s.gemm.b.dequantized.dense.data, nullptr);
    detail::MGemmStep t = s;
    t.gemm.b = ExpertOperand{};
    t.gemm.b.data = s.gemm.b.dequantized;
    t.b_copy_only = false;
    cpu::gemm_m(t);
  }
  void gemm_k(Context&, const KGroupedGemmArgs&, const detail::StepPlan&) override { ADD_FAILURE() << "gemm_k"; }
  void fc2_bias_grads(Context&, const detail::Fc2BiasGradStep&) override { ADD_FAILURE() << "fc2_bias_grads"; }
  void route_tokens(Context&, const detail::RouteTokensStep&) override { ADD_FAILURE() << "route_tokens"; }
  void permute_rows(Context&, const PermuteByMapArgs&) override { ADD_FAILURE() << "permute_rows"; }
  void unpermute_rows(Context&, const UnpermuteArgs&) override { ADD_FAILURE() << "unpermute_rows"; }
  uint64_t check_finite(Context&, const detail::CheckFiniteStep&) override {
    ADD_FAILURE() << "check_finite";
    return 0;
  }
};

// Where the GEMMs' backend reads weight copies, the layer's per-call MXFP8 weights go straight into
// one shared bf16 copy (no FP8 weight bytes): same bytes out as the CPU's FP8 route, for both scale
// layouts, dense and per-expert weights, now and deferred wgrad; the GEMMs overridden to a
// configuration that reads FP8 weights (Options::overrides) get FP8 operands; the bf16 and
// fp8_blockwise recipes are untouched.
TEST(Dispatch, PerCallWeightsGoStraightToTheBf16CopyWhereTheGemmBackendReadsCopies) {
  CopyReadingBackend reader;
  for (ScaleLayout layout : {ScaleLayout::compact, ScaleLayout::swizzled}) {
    for (WeightLayout wl : {WeightLayout::dense, WeightLayout::per_expert}) {
      SCOPED_TRACE("layout " + std::to_string(static_cast<int>(layout)) + " weights " +
                   std::to_string(static_cast<int>(wl)));
      Problem p = small_problem(Recipe::mxfp8);
      p.weight_layout = wl;
      const LayerData d = make_layer_data(p, {10, 0, 23});
      Options o;
      o.scale_layout = layout;
      Options cpu_only = o;
      cpu_only.backend = "cpu";
      Context cpu(cpu_only);
      const LayerOutputs ref = run_layer(cpu, Device{}, d);
      for (bool deferred : {false, true}) {
        for (bool fp8 : {false, true}) {
          SCOPED_TRACE(std::string(deferred ? "deferred" : "now") + (fp8 ? " GEMMs overridden to fp8" : ""));
          Options with = o;
          if (fp8)
            for (const char* step : {"fc1_fprop", "fc2_fprop", "fc2_dgrad", "fc1_dgrad"})
              with.overrides.push_back({step, "fp8"});
          reader.copy_gemms = reader.fp8_gemms = 0;
          detail::register_backend(&reader);
          Context ctx(with);
          LayerOutputs out;
          EXPECT_NO_THROW(out = run_layer(ctx, Device{}, d, RunConfig{.deferred_wgrad = deferred}));
          detail::unregister_backend(&reader);
          EXPECT_EQ(reader.copy_gemms, fp8 ? 0 : 4);
          EXPECT_EQ(reader.fp8_gemms, fp8 ? 4 : 0);
          EXPECT_EQ(find_step(out.report, "fc1_dgrad")->backend, "test_copy_reader");
          EXPECT_EQ(find_step(out.report, "quantize_w1_col")->backend, "cpu");
          for (auto [got, want, what] : {std::tuple{&out.y, &ref.y, "y"}, {&out.dx, &ref.dx, "dx"},
                                         {&out.dprobs, &ref.dprobs, "dprobs"}, {&out.dw1, &ref.dw1, "dw1"},
                                         {&out.dw2, &ref.dw2, "dw2"}, {&out.db1, &ref.db1, "db1"},
                                         {&out.db2, &ref.db2, "db2"}})
            EXPECT_TRUE(bytes_equal(got->view, want->view)) << what;
        }
      }
    }
  }
  // The other routes never hand the reader a copy-only step.
  for (Recipe r : {Recipe::bf16, Recipe::fp8_blockwise}) {
    Problem p = small_problem(r);
    p.pow2_scales = r == Recipe::fp8_blockwise;
    const LayerData d = make_layer_data(p, {10, 0, 23});
    reader.copy_gemms = reader.fp8_gemms = 0;
    detail::register_backend(&reader);
    Context ctx;
    EXPECT_NO_THROW(run_layer(ctx, Device{}, d));
    detail::unregister_backend(&reader);
    EXPECT_EQ(reader.copy_gemms, 0) << to_string(r);
    EXPECT_EQ(reader.fp8_gemms, 4) << to_string(r);
  }
}

// Where the device's first backend reads weight copies, prepare_weights keeps the bf16 copies alone
// (no FP8 bytes); the GEMMs read them, bit-identical to the CPU's FP8 route; a GEMM the reader
// refuses quantizes its weight in the call from the call's weights instead of failing.
TEST(Dispatch, PreparedWeightsAreCopiesAloneWhereTheBackendReadsCopies) {
  CopyReadingBackend reader;
  Problem p = small_problem(Recipe::mxfp8);
  const LayerData d = make_layer_data(p, {10, 0, 23});
  const int64_t E = p.experts, H = p.hidden, F = p.ffn;
  Context cpu(Options{.backend = "cpu", .deny = {}});
  const LayerOutputs ref = run_layer(cpu, Device{}, d);
  ExpertMatrices w1, w2;
  w1.dense = d.w1.view;
  w1.dtype = DType::bf16;
  w2.dense = d.w2.view;
  w2.dtype = DType::bf16;
  {  // without the reader: FP8 copies, as before
    PreparedWeights fp8 = prepare_weights(cpu, p, {.w1 = w1, .w2 = w2});
    EXPECT_GT(fp8.bytes(), E * 3 * F * H * 2);
    EXPECT_LT(fp8.bytes(), E * 3 * F * H * 2 * 9 / 8);
  }
  for (bool refuse : {false, true}) {
    SCOPED_TRACE(refuse ? "reader refuses glu_backward" : "reader takes every GEMM");
    reader.refuse_glu_backward = refuse;
    reader.copy_gemms = reader.fp8_gemms = 0;
    detail::register_backend(&reader);
    Context ctx;
    PreparedWeights pw = prepare_weights(ctx, p, {.w1 = w1, .w2 = w2});
    EXPECT_EQ(pw.bytes(), 2 * 2 * E * 3 * F * H);  // two orientations of W1 and W2, bf16, nothing else
    LayerOutputs out;
    EXPECT_NO_THROW(out = run_layer(ctx, Device{}, d, RunConfig{.prepared = &pw}));
    detail::unregister_backend(&reader);
    EXPECT_EQ(reader.copy_gemms, refuse ? 3 : 4);
    EXPECT_EQ(reader.fp8_gemms, 0);
    EXPECT_EQ(find_step(out.report, "fc2_dgrad")->backend, refuse ? "cpu" : "test_copy_reader");
    EXPECT_EQ(find_step(out.report, "quantize_w2_col") != nullptr, refuse) << "W2 quantized in the call";
    EXPECT_EQ(find_step(out.report, "quantize_w1"), nullptr);
    for (auto [got, want, what] : {std::tuple{&out.y, &ref.y, "y"}, {&out.dx, &ref.dx, "dx"},
                                   {&out.dprobs, &ref.dprobs, "dprobs"}, {&out.dw1, &ref.dw1, "dw1"},
                                   {&out.dw2, &ref.dw2, "dw2"}, {&out.db1, &ref.db1, "db1"}})
      EXPECT_TRUE(bytes_equal(got->view, want->view)) << what;
  }
}

TEST(Dispatch, HostDataRunsOnCpuAndReportsWhyGpuBackendsWereSkipped) {
  Problem p = small_problem(Recipe::bf16);
  LayerData d = make_layer_data(p, {5, 6, 7});
  Context ctx;
  LayerOutputs out = run_layer(ctx, Device{}, d);
  ASSERT_FALSE(out.report.empty());
  for (const StepRecord& r : out.report) {
    EXPECT_EQ(r.backend, "cpu") << r.step;
    EXPECT_EQ(r.skipped.size(), detail::backends().size() - 1) << r.step;  // every GPU backend, each with a reason
    for (auto& [name, why] : r.skipped) EXPECT_FALSE(why.empty()) << name;
  }
}

TEST(Dispatch, ForcingAnUnavailableBackendIsAClearErrorAndWritesNothing) {
  Problem p = small_problem(Recipe::mxfp8);
  LayerData d = make_layer_data(p, {5, 6, 7});
  Context ctx(Options{.backend = "cuda_portable", .deny = {}});
  try {
    run_layer(ctx, Device{}, d);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "options.backend");
    EXPECT_NE(std::string(e.what()).find("cuda_portable"), std::string::npos) << e.what();
  }
}

TEST(Dispatch, DenyingEveryUsableBackendNamesTheReasons) {
  Problem p = small_problem(Recipe::bf16);
  LayerData d = make_layer_data(p, {5, 6, 7});
  Context ctx(Options{.backend = "", .deny = {"cpu"}});
  try {
    run_layer(ctx, Device{}, d);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("denied"), std::string::npos) << e.what();
  }
}

TEST(Dispatch, EnvironmentForcesAndDeniesBackends) {
  ::setenv("MXMOE_BACKEND", "cpu", 1);
  {
    Context ctx;
    EXPECT_EQ(ctx.options().backend, "cpu");
  }
  ::unsetenv("MXMOE_BACKEND");
  ::setenv("MXMOE_DENY", "cuda_sm100,cuda_sm90,cuda_portable", 1);
  {
    Context ctx;
    for (const BackendInfo& b : ctx.backends(Device{DeviceType::cuda, 0}))
      if (b.name != "cpu") {
        EXPECT_FALSE(b.available);
        EXPECT_NE(b.reason.find("denied"), std::string::npos);
      }
  }
  ::setenv("MXMOE_DENY", "no_such_backend", 1);
  EXPECT_THROW(Context{}, Error);
  ::unsetenv("MXMOE_DENY");
}

TEST(Dispatch, UnknownBackendNameIsRejected) {
  try {
    Context ctx(Options{.backend = "cuda_sm120", .deny = {}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "options.backend");
    EXPECT_NE(std::string(e.what()).find("cuda_sm120"), std::string::npos);
  }
}

TEST(Dispatch, CpuBackendIsAlwaysAvailableForHostData) {
  Context ctx;
  bool cpu = false;
  for (const BackendInfo& b : ctx.backends(Device{}))
    if (b.name == "cpu") cpu = b.available;
  EXPECT_TRUE(cpu);
}

}  // namespace
}  // namespace mxmoe::test

namespace mxmoe::test {
namespace {

struct CountingAllocator {
  int64_t live_bytes = 0, peak_bytes = 0, calls = 0;
  static void* allocate(int64_t bytes, Device, void*, void* user) {
    auto* self = static_cast<CountingAllocator*>(user);
    self->live_bytes += bytes;
    self->peak_bytes = std::max(self->peak_bytes, self->live_bytes);
    ++self->calls;
    return std::malloc(static_cast<size_t>(bytes));
  }
  static void release(void* p, int64_t bytes, Device, void*, void* user) {
    static_cast<CountingAllocator*>(user)->live_bytes -= bytes;
    std::free(p);
  }
};

TEST(Allocator, CallerAllocatorServesEveryLibraryBufferAndGetsThemBack) {
  Problem p = small_problem(Recipe::mxfp8);
  LayerData d = make_layer_data(p, {10, 0, 23});
  CountingAllocator counter;
  Context ctx(Options{.backend = "cpu", .allocator = {&CountingAllocator::allocate, &CountingAllocator::release, &counter}});
  LayerOutputs with = run_layer(ctx, Device{}, d);
  EXPECT_GT(counter.calls, 10);
  EXPECT_GE(counter.peak_bytes, with.saved_bytes);
  EXPECT_EQ(counter.live_bytes, 0);
  Context plain(Options{.backend = "cpu"});
  EXPECT_TRUE(bytes_equal(run_layer(plain, Device{}, d).dw1.view, with.dw1.view));
}

// The layer's library memory where its GEMMs' backend reads weight copies, every buffer through a
// counting allocator: the peak is what forward or backward holds at its fullest step, computed from
// the buffers' sizes (FC1 fprop with W1's copy; FC2 dgrad with W2's copy; FC1 dgrad with W1's copy
// once C, dY's row-wise copy and W2's copy are freed), and everything comes back.
TEST(Allocator, WeightCopiesAndReleasesSetThePeak) {
  CopyReadingBackend reader;
  const Problem p = small_problem(Recipe::mxfp8);
  const LayerData d = make_layer_data(p, {10, 0, 23});
  const int64_t T = d.tokens, H = p.hidden, F = p.ffn, E = p.experts;
  const detail::QuantSpec q = detail::quant_spec(p, ScaleLayout::compact);
  auto mx = [&](int64_t cols, BlockAxis axis) { return detail::quant_bytes(q, T, cols, axis, E, "test"); };
  const int64_t c = detail::tensor_bytes(DType::bf16, {T, 2 * F}, "test");
  const int64_t x_row = mx(H, BlockAxis::row), x_col = mx(H, BlockAxis::col), a_row = mx(F, BlockAxis::row),
                a_col = mx(F, BlockAxis::col), dy_row = mx(H, BlockAxis::row), dy_col = mx(H, BlockAxis::col),
                dc_row = mx(2 * F, BlockAxis::row), dc_col = mx(2 * F, BlockAxis::col);
  const int64_t w1_copy = E * 2 * F * H * 2, w2_copy = E * H * F * 2;
  const int64_t saved = c + x_col + a_col;
  const int64_t fc1_fprop = c + x_row + x_col + a_row + a_col + w1_copy;
  const int64_t fc2_dgrad = saved + dy_row + dy_col + dc_row + dc_col + w2_copy;
  const int64_t fc1_dgrad = saved - c + dy_col + dc_row + dc_col + w1_copy;
  CountingAllocator counter;
  Options o;
  o.allocator = {&CountingAllocator::allocate, &CountingAllocator::release, &counter};
  detail::register_backend(&reader);
  Context ctx(o);
  LayerOutputs out;
  EXPECT_NO_THROW(out = run_layer(ctx, Device{}, d));
  detail::unregister_backend(&reader);
  EXPECT_EQ(reader.copy_gemms, 4);
  EXPECT_EQ(counter.peak_bytes, std::max({fc1_fprop, fc2_dgrad, fc1_dgrad}))
      << "fc1 fprop " << fc1_fprop << ", fc2 dgrad " << fc2_dgrad << ", fc1 dgrad " << fc1_dgrad;
  EXPECT_EQ(counter.live_bytes, 0);
}

}  // namespace
}  // namespace mxmoe::test
