// The typed plan of each step: the report carries each step's configuration, launches, workspace
// and weight form; Options::overrides names a configuration; a planning context plans a layer for
// a named target without memory or a device.
#include <gtest/gtest.h>

#include <string>

#include "src/api/layer_plan.h"
#include "src/dispatch/backend.h"
#include "src/dispatch/device_facts.h"
#include "tests/layer_support.h"

namespace mxmoe::test {
namespace {

Problem problem_of(Recipe r) {
  Problem p;
  p.hidden = 256;
  p.ffn = 128;
  p.experts = 4;
  p.recipe = r;
  return p;
}

StepRecord step_named(const std::vector<StepRecord>& steps, const std::string& name) {
  for (const StepRecord& r : steps)
    if (r.step == name) return r;
  throw std::runtime_error("no step " + name);
}

TEST(Plan, CpuTargetPlansEveryStepOnTheCpuWithItsLaunches) {
  for (Recipe r : {Recipe::bf16, Recipe::mxfp8, Recipe::fp8_blockwise}) {
    SCOPED_TRACE(to_string(r));
    Context ctx;
    detail::set_planning_target(ctx, "cpu");
    const detail::LayerPlan plan = detail::plan_layer(ctx, problem_of(r), 512, Device{}, /*prepared=*/true);
    for (const char* s : {"fc1_fprop", "fc2_fprop", "fc2_dgrad", "fc1_dgrad", "fc2_wgrad", "fc1_wgrad"}) {
      const StepRecord rec = step_named(plan.steps, s);
      EXPECT_EQ(rec.backend, "cpu") << s;
      EXPECT_EQ(rec.config, "default") << s;
      EXPECT_FALSE(rec.launches.empty()) << s;
    }
    EXPECT_EQ(step_named(plan.steps, "fc1_fprop").weights, r == Recipe::bf16 ? "as given" : "quantized");
    // The layer's buffers were counted, not allocated: the peak is what the calls hold at once.
    EXPECT_GT(plan.peak_bytes, int64_t{512} * 2 * 128 * 2);  // at least C [T, 2F] bf16
    EXPECT_TRUE(ctx.report().empty()) << "planning records nothing in the caller's context";
  }
}

TEST(Plan, UnknownTargetIsAnErrorNamingTheKnownOnes) {
  Context ctx;
  try {
    detail::set_planning_target(ctx, "sm_75");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "arch");
    EXPECT_NE(std::string(e.what()).find("sm_90a"), std::string::npos) << e.what();
  }
}

TEST(Plan, AnOverrideTheServingBackendLacksIsAnErrorNamingIt) {
  Options o;
  o.backend = "cpu";
  o.overrides = {{"fc2_dgrad", "mxfp8_dequant_n256"}};
  Context ctx(o);
  detail::set_planning_target(ctx, "cpu");
  try {
    detail::plan_layer(ctx, problem_of(Recipe::mxfp8), 64, Device{}, false);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "options.overrides");
    const std::string what = e.what();
    EXPECT_NE(what.find("fc2_dgrad=mxfp8_dequant_n256"), std::string::npos) << what;
    EXPECT_NE(what.find("cpu"), std::string::npos) << what;
  }
  // The configuration a backend does have is accepted and reported.
  o.overrides = {{"fc2_dgrad", "default"}};
  Context ok(o);
  detail::set_planning_target(ok, "cpu");
  EXPECT_EQ(step_named(detail::plan_layer(ok, problem_of(Recipe::mxfp8), 64, Device{}, false).steps, "fc2_dgrad").config,
            "default");
}

TEST(Plan, AnOverrideOfAnUnknownStepOrWithNoConfigurationIsRefusedAtTheContext) {
  try {
    Context ctx(Options{.overrides = {{"fc2_dgard", "mxfp8_regs_n128"}}});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "options.overrides");
    EXPECT_NE(std::string(e.what()).find("fc2_dgard"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fc2_dgrad"), std::string::npos) << e.what();  // among the known
  }
  EXPECT_THROW(Context(Options{.overrides = {{"fc2_dgrad", ""}}}), Error);
  EXPECT_NO_THROW(Context(Options{.overrides = {{"fc2_dgrad", "default"}}}));
}

// A GPU target on a planning context: every GEMM step gets a GPU backend where this build has one,
// and a build without CUDA says so instead of planning.
TEST(Plan, GpuTargetsPlanWithoutADevice) {
  for (const char* arch : {"sm_80", "sm_90a", "sm_100a"}) {
    SCOPED_TRACE(arch);
    Context ctx;
    detail::set_planning_target(ctx, arch);
    Problem p = problem_of(Recipe::mxfp8);
    const Device gpu{DeviceType::cuda, 0};
    const detail::DeviceFacts f = detail::facts_for(ctx, gpu);
    EXPECT_TRUE(f.planned);
    if (!detail::find_backend("cuda_portable")->probe_device(f).available) {
      EXPECT_THROW(detail::plan_layer(ctx, p, 1024, gpu, false), Error);
      continue;
    }
    const detail::LayerPlan plan = detail::plan_layer(ctx, p, 1024, gpu, false);
    for (const StepRecord& r : plan.steps) EXPECT_NE(r.backend, "cpu") << r.step;
    if (std::string(arch) == "sm_80") {
      for (const StepRecord& r : plan.steps) EXPECT_EQ(r.backend, "cuda_portable") << r.step;
    }
  }
}

}  // namespace
}  // namespace mxmoe::test
