// The non-finite policy on the GPU, every recipe, once per device backend (docs/numerics.md
// "Non-finite values"): as on the CPU (tests/unit/test_nonfinite.cpp), a NaN or Inf in x stays
// non-finite in y and dx, and the rows without one stay finite.
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuNonFinite*'
#include "tests/gpu_support.h"
#include "tests/nonfinite_support.h"

namespace mxmoe::test {
namespace {

class GpuNonFinite : public GpuBackendTest {};

TEST_P(GpuNonFinite, NanAndInfStayNonFiniteInEveryRecipe) {
  for (Recipe r : {Recipe::mxfp8, Recipe::bf16, Recipe::fp8_blockwise}) {
    Context ctx(prefer_backend(backend_name()));
    expect_nonfinite_policy(ctx, kGpu0, r);
  }
}

MXMOE_GPU_BACKEND_SUITE(GpuNonFinite);

}  // namespace
}  // namespace mxmoe::test
