// cuda_sm100's probe logic on the CPU (src/cuda/sm100/probe.h, backend.cpp, gemm.cu's refusals):
// which devices it refuses and with what words, how the self-check's comparison becomes a verdict
// with its numbers and place, that the verdict is computed once per device, what each GEMM step is
// refused for, and that the registered backend on this machine (no Blackwell GPU) answers every
// probe with a reason and, forced, gives an error that names it. No GPU needed.
// Run: <build>/tests/mxmoe_unit_tests --gtest_filter='Sm100Probe.*'
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "src/cuda/sm100/probe.h"
#include "tests/layer_support.h"
#if defined(MXMOE_WITH_SM100)
#include "src/cuda/sm100/sm100_ops.h"
#endif

namespace mxmoe::cuda::sm100 {
namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

DeviceFacts facts(int major, int minor, const char* name) {
  DeviceFacts f;
  f.ok = true;
  f.major = major;
  f.minor = minor;
  f.name = name;
  return f;
}

TEST(Sm100Probe, RefusesEveryDeviceButComputeCapability10_0NamingIt) {
  EXPECT_EQ(device_refusal(facts(9, 0, "NVIDIA H200"), ""),
            "device is sm_90 (NVIDIA H200): cuda_sm100 needs compute capability 10.0");
  EXPECT_EQ(device_refusal(facts(8, 0, "NVIDIA A100-SXM4-80GB"), ""),
            "device is sm_80 (NVIDIA A100-SXM4-80GB): cuda_sm100 needs compute capability 10.0");
  EXPECT_EQ(device_refusal(facts(12, 0, "NVIDIA GeForce RTX 5090"), ""),
            "device is sm_120 (NVIDIA GeForce RTX 5090): cuda_sm100 needs compute capability 10.0");
  // sm_100a code loads only on 10.0: a 10.3 part is told so, not left to a failed kernel load.
  const std::string b300 = device_refusal(facts(10, 3, "NVIDIA B300"), "");
  EXPECT_TRUE(has(b300, "device is sm_103 (NVIDIA B300)")) << b300;
  EXPECT_TRUE(has(b300, "sm_100a")) << b300;
  EXPECT_EQ(device_refusal(facts(10, 0, "NVIDIA B200"), ""), "");
}

TEST(Sm100Probe, ABuildWithoutTheKernelsSaysSoOnABlackwellDevice) {
  EXPECT_EQ(device_refusal(facts(10, 0, "NVIDIA B200"), "not built: nvcc 12.4 cannot compile for sm_100a"),
            "not built: nvcc 12.4 cannot compile for sm_100a");
  // The device's compute capability is the first answer: a Hopper is refused for what it is.
  EXPECT_TRUE(has(device_refusal(facts(9, 0, "NVIDIA H200"), "not built"), "compute capability 10.0"));
}

TEST(Sm100Probe, NoDeviceOrAnUnloadableBuildPassesTheProblemOn) {
  DeviceFacts none;
  none.problem = "no usable CUDA driver/GPU: no CUDA-capable device is detected";
  EXPECT_EQ(device_refusal(none, ""), none.problem);
  DeviceFacts bad = facts(10, 0, "NVIDIA B200");
  bad.ok = false;
  bad.problem = "kernels of this build cannot load: no kernel image is available";
  EXPECT_EQ(device_refusal(bad, ""), bad.problem);
}

std::string at(int64_t i) { return "point " + std::to_string(i); }

TEST(Sm100Probe, SelfCheckVerdictNamesTheLargestDifferenceAndWhere) {
  std::vector<float> want(1000), got;
  for (size_t i = 0; i < want.size(); ++i) want[i] = std::sin(static_cast<float>(i)) * 40.0f;
  got = want;
  got[123] = want[123] * 2.0f + 1.0f;  // a scale a power of two off
  const Comparison c = compare_points("fprop (1-SM)", got, want, at);
  EXPECT_EQ(c.points, 1000);
  EXPECT_EQ(c.bad, 1);
  EXPECT_EQ(c.worst, 123);
  const detail::Probe v = self_check_verdict({compare_points("wgrad (beta 0)", want, want, at), c});
  EXPECT_FALSE(v.available);
  EXPECT_TRUE(has(v.reason, "self-check against cuda_portable failed: fprop (1-SM): 1 of 1000 points differ"))
      << v.reason;
  EXPECT_TRUE(has(v.reason, "max abs diff " + format_number(std::fabs(got[123] - want[123])))) << v.reason;
  EXPECT_TRUE(has(v.reason, "at point 123")) << v.reason;
  EXPECT_TRUE(has(v.reason, "cuda_sm100 " + format_number(got[123]))) << v.reason;
  EXPECT_TRUE(has(v.reason, "cuda_portable " + format_number(want[123]))) << v.reason;
}

TEST(Sm100Probe, SelfCheckTakesRoundingAndRefusesNaNAndUnwrittenPoints) {
  std::vector<float> want = {1.0f, -3.0f, 250.0f, 0.0f}, got = want;
  got[2] = 251.0f;  // one bf16 ulp at 250 is 2: within 2^-7 relative
  const detail::Probe pass = self_check_verdict({compare_points("dgrad", got, want, at)});
  EXPECT_TRUE(pass.available) << pass.reason;
  EXPECT_TRUE(has(pass.reason, "passed (1 GEMMs, 4 points, max abs diff 1)")) << pass.reason;
  got[3] = NAN;  // a point the kernel never wrote (poisoned)
  const detail::Probe nan = self_check_verdict({compare_points("dgrad", got, want, at)});
  EXPECT_FALSE(nan.available);
  EXPECT_TRUE(has(nan.reason, "max abs diff inf at point 3")) << nan.reason;
  EXPECT_FALSE(self_check_verdict({}).available);  // nothing compared is no pass
}

TEST(Sm100Probe, VerdictIsComputedOncePerDevice) {
  VerdictCache cache;
  int runs = 0;
  auto run = [&] {
    ++runs;
    return detail::Probe{false, "self-check against cuda_portable failed: run " + std::to_string(runs)};
  };
  const detail::Probe first = cache.get(0, run);
  EXPECT_EQ(cache.get(0, run).reason, first.reason);
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(cache.get(1, run).reason, "self-check against cuda_portable failed: run 2");
  EXPECT_EQ(runs, 2);
}

// ---- the registered backend on this machine ----

TEST(Sm100Probe, RegisteredFirstAndUnavailableHereWithAReason) {
  ASSERT_FALSE(detail::backends().empty());
  EXPECT_STREQ(detail::backends().front()->name(), "cuda_sm100");
  detail::Backend* b = detail::cuda_sm100_backend();
  const detail::Probe host = b->probe_device(Device{});
  EXPECT_FALSE(host.available);
  EXPECT_FALSE(host.reason.empty());
  const detail::Probe gpu = b->probe_device(Device{DeviceType::cuda, 0});
  // This suite runs where no Blackwell GPU exists (a GPU test checks the device case).
  if (gpu.available) GTEST_SKIP() << "cuda_sm100 is available here: " << gpu.reason;
  EXPECT_FALSE(gpu.reason.empty());
  for (const BackendInfo& info : Context().backends(Device{DeviceType::cuda, 0})) {
    if (info.name == "cuda_sm100") {
      EXPECT_EQ(info.reason, gpu.reason);
    }
  }
}

TEST(Sm100Probe, ForcingItWhereItCannotRunIsAnErrorNamingIt) {
  Problem p;
  p.hidden = 64;
  p.ffn = 32;
  p.experts = 3;
  p.recipe = Recipe::mxfp8;
  const test::LayerData d = test::make_layer_data(p, {5, 0, 7});
  Context ctx(Options{.backend = "cuda_sm100"});
  try {
    test::run_layer(ctx, Device{}, d);
    FAIL() << "forcing cuda_sm100 on host data should fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "options.backend");
    EXPECT_TRUE(has(e.what(), "forced backend 'cuda_sm100' cannot run step")) << e.what();
    EXPECT_TRUE(has(e.what(), "cuda_sm100: data is in host memory") || has(e.what(), "built without CUDA")) << e.what();
  }
}

#if defined(MXMOE_WITH_SM100)
// ---- what each GEMM step is refused for (gemm.cu; the views are never dereferenced) ----

void* fake(uintptr_t at) { return reinterpret_cast<void*>(at); }
constexpr Device kGpu{DeviceType::cuda, 0};

// A valid MXFP8 store step: A [T, K] row-wise, B [E, N, K] (or [E, K, N]), bf16 D [T, N].
detail::MGemmStep store_step(int64_t k, int64_t n, bool b_kn) {
  detail::MGemmStep s;
  s.gemm.a.mx = {TensorView::of(fake(0x10000), DType::e4m3, {300, k}, kGpu),
                 TensorView::of(fake(0x20000), DType::e8m0, {rowwise_scale_bytes(300, k)}, kGpu), BlockAxis::row,
                 ScaleLayout::compact};
  s.gemm.offsets.offsets = TensorView::of(fake(0x30000), DType::i32, {4}, kGpu);
  s.gemm.b.data.dense = TensorView::of(fake(0x40000), DType::e4m3, {3, b_kn ? k : n, b_kn ? n : k}, kGpu);
  s.gemm.b.data.dtype = DType::e4m3;
  s.gemm.b.scales.dense = TensorView::of(fake(0x50001), DType::e8m0, {3, rowwise_scale_bytes(n, k)}, kGpu);
  s.gemm.b_kn = b_kn;
  s.gemm.d = TensorView::of(fake(0x60000), DType::bf16, {300, n}, kGpu);
  return s;
}

TEST(Sm100Probe, GemmMTakesMxfp8StoreStepsInEitherWeightOrientation) {
  EXPECT_EQ(gemm_m_refusal(store_step(160, 208, false)), "");
  EXPECT_EQ(gemm_m_refusal(store_step(160, 208, true)), "");
  EXPECT_EQ(gemm_m_refusal(store_step(32, 8, false)), "");  // odd scale addresses are fine: they are repacked
}

TEST(Sm100Probe, GemmMRefusesWhatItCannotExpressWithTheReason) {
  auto refusal = [](auto change) {
    detail::MGemmStep s = store_step(160, 208, false);
    change(s);
    return gemm_m_refusal(s);
  };
  EXPECT_TRUE(has(refusal([](detail::MGemmStep& s) {
                    s.gemm.a = Operand{.bf16 = TensorView::of(fake(0x10000), DType::bf16, {300, 160}, kGpu)};
                    s.gemm.b.data.dtype = DType::bf16;
                    s.gemm.b.data.dense.dtype = DType::bf16;
                  }),
                  "BF16 operands"));
  EXPECT_TRUE(has(refusal([](detail::MGemmStep& s) { s.gemm.a.mx.scales.dtype = DType::f32; }), "not E8M0"));
  EXPECT_TRUE(has(refusal([](detail::MGemmStep& s) { s.gemm.b.scales.dense.dtype = DType::f32; }), "not E8M0"));
  EXPECT_TRUE(has(refusal([](detail::MGemmStep& s) { s.epilogue = detail::Epilogue::glu_forward; }), "glu_forward"));
  EXPECT_TRUE(has(refusal([](detail::MGemmStep& s) { s.epilogue = detail::Epilogue::glu_backward; }), "glu_backward"));
  EXPECT_TRUE(has(refusal([](detail::MGemmStep& s) {
                    s.gemm.bias = TensorView::of(fake(0x70000), DType::bf16, {3, 208}, kGpu);
                  }),
                  "bias"));
  EXPECT_TRUE(has(refusal([](detail::MGemmStep& s) { s.gemm.d.dtype = DType::f32; }), "f32 output"));
  EXPECT_TRUE(has(refusal([](detail::MGemmStep& s) { s.gemm.a.mx.axis = BlockAxis::col; }), "row-wise"));
  EXPECT_TRUE(has(refusal([](detail::MGemmStep& s) {
                    s.gemm.b.data.dense = TensorView{};
                    s.gemm.b.data.pointers = TensorView::of(fake(0x80000), DType::i64, {3}, kGpu);
                  }),
                  "per-expert weight pointers"));
  EXPECT_TRUE(has(refusal([](detail::MGemmStep& s) { s.gemm.d.data = fake(0x60008); }), "16-byte aligned"));
  EXPECT_EQ(gemm_m_refusal(store_step(96, 208, false)), "");  // K = 96: three blocks, a partial 128-wide K tile
  EXPECT_TRUE(has(gemm_m_refusal(store_step(100, 208, false)), "K = 100 is not a multiple of 32"));
  EXPECT_TRUE(has(gemm_m_refusal(store_step(160, 204, false)), "N = 204 is not a multiple of 8"));
  EXPECT_TRUE(has(gemm_m_refusal(store_step(160, 200, true)), "N = 200 not a multiple of 16"));
}

KGroupedGemmArgs wgrad_args(int64_t m, int64_t n) {
  KGroupedGemmArgs a;
  a.a.mx = {TensorView::of(fake(0x10000), DType::e4m3, {300, m}, kGpu),
            TensorView::of(fake(0x20003), DType::e8m0, {colwise_scale_bytes(300, m, 3)}, kGpu), BlockAxis::col,
            ScaleLayout::compact};
  a.b.mx = {TensorView::of(fake(0x30000), DType::e4m3, {300, n}, kGpu),
            TensorView::of(fake(0x40000), DType::e8m0, {colwise_scale_bytes(300, n, 3)}, kGpu), BlockAxis::col,
            ScaleLayout::swizzled};
  a.offsets.offsets = TensorView::of(fake(0x50000), DType::i32, {4}, kGpu);
  a.d.dense = TensorView::of(fake(0x60000), DType::f32, {3, m, n}, kGpu);
  return a;
}

TEST(Sm100Probe, GemmKTakesMxfp8ColumnWiseIntoF32AndRefusesTheRestWithTheReason) {
  EXPECT_EQ(gemm_k_refusal(wgrad_args(160, 208)), "");
  KGroupedGemmArgs acc = wgrad_args(160, 208);
  acc.accumulate = true;
  EXPECT_EQ(gemm_k_refusal(acc), "");
  KGroupedGemmArgs bf16_out = wgrad_args(160, 208);
  bf16_out.d.dense.dtype = DType::bf16;
  EXPECT_TRUE(has(gemm_k_refusal(bf16_out), "stores f32"));
  KGroupedGemmArgs per_expert = wgrad_args(160, 208);
  per_expert.d.dense = TensorView{};
  per_expert.d.pointers = TensorView::of(fake(0x70000), DType::i64, {3}, kGpu);
  per_expert.d.dtype = DType::f32;
  EXPECT_TRUE(has(gemm_k_refusal(per_expert), "per-expert output pointers"));
  EXPECT_TRUE(has(gemm_k_refusal(wgrad_args(40, 208)), "M = 40, N = 208: both must be multiples of 16"));
  KGroupedGemmArgs f32_scales = wgrad_args(160, 208);
  f32_scales.b.mx.scales.dtype = DType::f32;
  EXPECT_TRUE(has(gemm_k_refusal(f32_scales), "not E8M0"));
  KGroupedGemmArgs row = wgrad_args(160, 208);
  row.b.mx.axis = BlockAxis::row;
  EXPECT_TRUE(has(gemm_k_refusal(row), "column-wise"));
  KGroupedGemmArgs bf16 = wgrad_args(160, 208);
  bf16.a = Operand{.bf16 = TensorView::of(fake(0x10000), DType::bf16, {300, 160}, kGpu)};
  bf16.b = Operand{.bf16 = TensorView::of(fake(0x30000), DType::bf16, {300, 208}, kGpu)};
  EXPECT_TRUE(has(gemm_k_refusal(bf16), "BF16 operands"));
}

TEST(Sm100Probe, NonGemmStepsAreLeftToTheNextBackendWithTheReason) {
  detail::Backend* b = detail::cuda_sm100_backend();
  for (detail::Step s :
       {detail::Step::quantize, detail::Step::dequantize, detail::Step::quantize_experts, detail::Step::fc2_bias_grads,
        detail::Step::route_tokens, detail::Step::permute_rows, detail::Step::unpermute_rows}) {
    const detail::Probe p = b->probe({s, kGpu, Recipe::mxfp8});
    EXPECT_FALSE(p.available) << detail::to_string(s);
    EXPECT_FALSE(p.reason.empty()) << detail::to_string(s);
  }
  EXPECT_FALSE(b->probe({detail::Step::gemm_m, kGpu, Recipe::mxfp8}).available);  // no step in the query
  // A GEMM step of another recipe is refused by the recipe, whatever its operands look like.
  const detail::MGemmStep fprop = store_step(160, 208, false);
  const detail::Probe bf16 = b->probe({detail::Step::gemm_m, kGpu, Recipe::bf16, 208, 160, &fprop});
  EXPECT_FALSE(bf16.available);
  EXPECT_TRUE(has(bf16.reason, "the bf16 recipe")) << bf16.reason;
  EXPECT_TRUE(b->probe({detail::Step::gemm_m, kGpu, Recipe::mxfp8, 208, 160, &fprop}).available);
}
#endif

}  // namespace
}  // namespace mxmoe::cuda::sm100
