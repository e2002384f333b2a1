// cuda_sm100 on a real GPU. On anything but a compute capability 10.0 device (the H200 this project
// has) the backend is unavailable with a reason naming the device's compute capability, the layer
// runs on the other backends, and forcing cuda_sm100 is a clear error, never a crash. On a 10.0
// device (never run by this project) the self-check's verdict is cached, shown by Context::backends
// (`mxmoe info`), and, when it passed, the layer's plain MXFP8 GEMM steps run on cuda_sm100 with
// the same numbers as without it. Every backend-parameterised suite (test names ending in
// /cuda_sm100) also runs the sm100 kernels against the CPU reference there.
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='GpuSm100.*:*/cuda_sm100'
#include <gtest/gtest.h>

#include <string>

#include "tests/layer_support.h"

namespace mxmoe::test {
namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

#if defined(MXMOE_WITH_CUDA)
// The device's compute capability as the probes name it ("sm_90"), or "" where it cannot be read.
std::string device_cc() {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "";
  return "sm_" + std::to_string(p.major) + std::to_string(p.minor);
}
#else
std::string device_cc() { return ""; }
#endif

Problem small_mxfp8() {
  Problem p;
  p.hidden = 128;
  p.ffn = 64;
  p.experts = 4;
  p.recipe = Recipe::mxfp8;
  return p;
}

BackendInfo info_of(const std::string& name) {
  for (const BackendInfo& b : Context().backends(kGpu0))
    if (b.name == name) return b;
  return {};
}

TEST(GpuSm100, ElsewhereUnavailableWithTheComputeCapabilityInTheReason) {
  MXMOE_REQUIRE_GPU();
  const std::string cc = device_cc();
  if (cc == "sm_100")
    GTEST_SKIP() << "GPU test skipped: this is a compute capability 10.0 device (the self-check test covers it)";
  const BackendInfo b = info_of("cuda_sm100");
  ASSERT_EQ(b.name, "cuda_sm100");
  EXPECT_FALSE(b.available);
  EXPECT_TRUE(has(b.reason, "device is " + cc + " (")) << b.reason;
  EXPECT_TRUE(has(b.reason, cc.rfind("sm_10", 0) == 0 ? "sm_100a" : "needs compute capability 10.0")) << b.reason;
  // The layer runs, every step on another backend, each recording why cuda_sm100 did not.
  Context ctx;
  const LayerOutputs o = run_layer(ctx, kGpu0, make_layer_data(small_mxfp8(), {37, 0, 200, 1}));
  ASSERT_FALSE(o.report.empty());
  for (const StepRecord& r : o.report) {
    EXPECT_NE(r.backend, "cuda_sm100") << r.step;
    ASSERT_FALSE(r.skipped.empty()) << r.step;
    EXPECT_EQ(r.skipped[0].first, "cuda_sm100") << r.step;
    EXPECT_EQ(r.skipped[0].second, b.reason) << r.step;
  }
}

TEST(GpuSm100, ForcedWhereItCannotRunIsAClearErrorAndWritesNothing) {
  MXMOE_REQUIRE_GPU();
  const BackendInfo b = info_of("cuda_sm100");
  if (b.available) GTEST_SKIP() << "GPU test skipped: cuda_sm100 is available here: " << b.reason;
  const LayerData d = make_layer_data(small_mxfp8(), {20, 7, 0, 44});
  Context forced(Options{.backend = "cuda_sm100"});
  try {
    run_layer(forced, kGpu0, d);
    FAIL() << "forcing cuda_sm100 should fail here";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "options.backend");
    EXPECT_TRUE(has(e.what(), "forced backend 'cuda_sm100' cannot run step")) << e.what();
    EXPECT_TRUE(has(e.what(), b.reason)) << e.what();
  }
  // A direct call on the backend (a bug, a test) is an Error too, not a launch on the wrong device.
  detail::Backend* sm100 = detail::find_backend("cuda_sm100");
  ASSERT_NE(sm100, nullptr);
  EXPECT_THROW(sm100->quantize(forced, QuantizeArgs{}), Error);
}

TEST(GpuSm100, OnComputeCapability10TheSelfCheckIsCachedShownAndServesTheLayer) {
  MXMOE_REQUIRE_GPU();
  const std::string cc = device_cc();
  if (cc != "sm_100")
    GTEST_SKIP() << "GPU test skipped: the self-check runs on compute capability 10.0 only, this is " << cc;
  const BackendInfo first = info_of("cuda_sm100");
  EXPECT_TRUE(has(first.reason, "self-check against cuda_portable")) << first.reason;
  EXPECT_EQ(info_of("cuda_sm100").reason, first.reason);  // cached: the same verdict, word for word
  if (!first.available) {
    ADD_FAILURE() << "cuda_sm100 failed its self-check on this device: " << first.reason;
    return;
  }
  const LayerData d = make_layer_data(small_mxfp8(), {37, 0, 200, 1});
  Context with;
  const LayerOutputs o = run_layer(with, kGpu0, d);
  int on_sm100 = 0;
  for (const StepRecord& r : o.report) on_sm100 += r.backend == "cuda_sm100";
  EXPECT_GT(on_sm100, 0) << "no step ran on cuda_sm100";
  Context without(Options{.deny = {"cuda_sm100"}});
  const LayerOutputs ref = run_layer(without, kGpu0, d);
  EXPECT_LT(rel_error(o.y.view, ref.y.view), 1e-2);
  EXPECT_LT(rel_error(o.dx.view, ref.dx.view), 1e-2);
  EXPECT_LT(rel_error(o.dw1.view, ref.dw1.view), 1e-2);
  EXPECT_LT(rel_error(o.dw2.view, ref.dw2.view), 1e-2);
}

}  // namespace
}  // namespace mxmoe::test
