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

TEST(GpuDispatch, PreferredBackendUnavailableFallsBackToPortableAndSaysWhy) {
  MXMOE_REQUIRE_GPU();
  LayerData d = make_layer_data(small(Recipe::mxfp8), {20, 0, 44});
  Context ctx;
  LayerOutputs o;
  ASSERT_NO_THROW(o = run_layer(ctx, Device{DeviceType::cuda, 0}, d));
  for (const StepRecord& r : o.report) {
    EXPECT_EQ(r.backend, "cuda_portable") << r.step;
    ASSERT_FALSE(r.skipped.empty()) << r.step;
    EXPECT_EQ(r.skipped[0].first, "cuda_sm90");
    EXPECT_FALSE(r.skipped[0].second.empty());
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
  Context sm90(Options{.backend = "cuda_sm90"});
  EXPECT_THROW(run_layer(sm90, Device{DeviceType::cuda, 0}, d), Error);
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
  ASSERT_EQ(list.size(), 3u);
  for (const BackendInfo& b : list) EXPECT_FALSE(b.reason.empty()) << b.name;
}

}  // namespace
}  // namespace mxmoe::test
