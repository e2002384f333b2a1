// Dispatch on a GPU: each CUDA backend can be forced and denied; the Hopper fast path, missing in
// this build, falls through to cuda_portable with its reason; denying every GPU backend for
// device data is a clear error, never a crash.
#include <gtest/gtest.h>

#include "tests/layer_support.h"

namespace mxmoe::test {
namespace {

Problem small(Recipe r) {
  Problem p;
  p.hidden = 128;
  p.ffn = 64;
  p.experts = 3;
  p.recipe = r;
  return p;
}

// The MXFP8 layer: the steps cuda_sm90 does not take (the quantizers) fall back to cuda_portable
// with its reason; its GEMM steps run on cuda_sm90 where that backend is available (on any other
// GPU every step falls back, each with the reason).
TEST(GpuDispatch, PreferredBackendUnavailableFallsBackToPortableAndSaysWhy) {
  MXMOE_REQUIRE_GPU();
  LayerData d = make_layer_data(small(Recipe::mxfp8), {20, 0, 44});
  Context ctx;
  bool sm90 = false;
  for (const BackendInfo& b : ctx.backends(Device{DeviceType::cuda, 0}))
    if (b.name == "cuda_sm90") sm90 = b.available;
  LayerOutputs o;
  ASSERT_NO_THROW(o = run_layer(ctx, Device{DeviceType::cuda, 0}, d));
  int fell_back = 0, on_sm90 = 0;
  for (const StepRecord& r : o.report) {
    const bool gemm = r.step.rfind("fc", 0) == 0;
    if (r.backend == "cuda_sm90") {
      EXPECT_TRUE(sm90 && gemm) << r.step;
      ++on_sm90;
      continue;
    }
    EXPECT_EQ(r.backend, "cuda_portable") << r.step;
    bool sm90_said_why = false;
    for (const auto& [name, why] : r.skipped) sm90_said_why |= name == "cuda_sm90" && !why.empty();
    EXPECT_TRUE(sm90_said_why) << r.step;
    ++fell_back;
  }
  EXPECT_GT(fell_back, 0);
  if (sm90) {
    EXPECT_GT(on_sm90, 0);
  }
}

TEST(GpuDispatch, ForcingPortableRunsItAndForcingCpuOnDeviceDataIsAnError) {
  MXMOE_REQUIRE_GPU();
  LayerData d = make_layer_data(small(Recipe::bf16), {20, 7, 44});
  Context portable(Options{.backend = "cuda_portable"});
  LayerOutputs o = run_layer(portable, Device{DeviceType::cuda, 0}, d);
  for (const StepRecord& r : o.report) EXPECT_EQ(r.backend, "cuda_portable");
  Context cpu(Options{.backend = "cpu"});
  try {
    run_layer(cpu, Device{DeviceType::cuda, 0}, d);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "options.backend");
    EXPECT_NE(std::string(e.what()).find("cpu"), std::string::npos);
  }
}

// Forcing cuda_sm90: on Hopper it serves every step of a BF16 layer without biases; an MXFP8
// layer needs quantizers it does not have, so forcing it there is an error naming the step and why.
TEST(GpuDispatch, ForcingSm90RunsTheBf16LayerOnItAndRefusesMxfp8WithTheReason) {
  MXMOE_REQUIRE_GPU();
  Context probe;
  bool sm90 = false;
  std::string why;
  for (const BackendInfo& b : probe.backends(Device{DeviceType::cuda, 0}))
    if (b.name == "cuda_sm90") sm90 = b.available, why = b.reason;
  if (!sm90) GTEST_SKIP() << "GPU test skipped: cuda_sm90 unavailable: " << why;
  LayerData d = make_layer_data(small(Recipe::bf16), {20, 7, 44});
  Context forced(Options{.backend = "cuda_sm90"});
  LayerOutputs o = run_layer(forced, Device{DeviceType::cuda, 0}, d);
  for (const StepRecord& r : o.report) EXPECT_EQ(r.backend, "cuda_sm90") << r.step;
  LayerData m = make_layer_data(small(Recipe::mxfp8), {20, 7, 44});
  try {
    run_layer(forced, Device{DeviceType::cuda, 0}, m);
    FAIL() << "forcing cuda_sm90 on an MXFP8 layer should fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda_sm90"), std::string::npos) << e.what();
  }
}

TEST(GpuDispatch, DenyingPortableLeavesNoGpuPathAndSaysSo) {
  MXMOE_REQUIRE_GPU();
  LayerData d = make_layer_data(small(Recipe::mxfp8), {5, 5, 5});
  Context ctx(Options{.deny = {"cuda_portable"}});
  try {
    run_layer(ctx, Device{DeviceType::cuda, 0}, d);
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("denied"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cuda_sm90"), std::string::npos) << msg;
  }
}

TEST(GpuDispatch, InfoListsEveryBackendWithAReason) {
  MXMOE_REQUIRE_GPU();
  Context ctx;
  auto list = ctx.backends(Device{DeviceType::cuda, 0});
  ASSERT_EQ(list.size(), detail::backends().size());
  for (const BackendInfo& b : list) EXPECT_FALSE(b.reason.empty()) << b.name;
}

}  // namespace
}  // namespace mxmoe::test
