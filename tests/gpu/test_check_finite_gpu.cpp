// Options::check_finite on CUDA tensors (docs/numerics.md "Non-finite values"): as on the CPU
// (tests/unit/test_check_finite.cpp), every input, NaN, +Inf and -Inf, the first bad value named,
// nothing written on refusal, nothing changed when every value is finite, off by default; the device
// scan agrees with the CPU's on a tensor spread over many blocks; and a call made while the stream
// is captured into a CUDA graph is refused naming options.check_finite.
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuCheckFinite*'
#include "src/common/finite.h"
#include "src/cpu/cpu_ops.h"
#include "tests/check_finite_support.h"

namespace mxmoe::test {
namespace {

Options checked() {
  Options o;
  o.check_finite = true;
  return o;
}

TEST(GpuCheckFinite, RefusesEveryInputNamingItsFirstBadValueAndWritesNothing) {
  MXMOE_REQUIRE_GPU();
  for (Recipe r : {Recipe::mxfp8, Recipe::bf16, Recipe::fp8_blockwise}) {
    Context ctx(checked());
    expect_check_finite(ctx, kGpu0, r);
  }
  Context ctx(checked());
  expect_check_finite(ctx, kGpu0, Recipe::mxfp8, WeightLayout::per_expert);
}

TEST(GpuCheckFinite, FiniteInputsRunBitIdenticallyWithTheStepInTheReport) {
  MXMOE_REQUIRE_GPU();
  for (Recipe r : {Recipe::mxfp8, Recipe::bf16, Recipe::fp8_blockwise}) {
    Context on(checked()), off;
    expect_check_finite_transparent(on, off, kGpu0, r);
  }
}

TEST(GpuCheckFinite, OffByDefaultANanPropagates) {
  MXMOE_REQUIRE_GPU();
  Context ctx;
  expect_check_finite_off_by_default(ctx, kGpu0);
}

#if defined(MXMOE_WITH_CUDA)
// Many blocks, each thread several grid-stride iterations: the device's first equals the host's.
TEST(GpuCheckFinite, DeviceScanMatchesTheHostScan) {
  MXMOE_REQUIRE_GPU();
  detail::Backend* portable = detail::find_backend("cuda_portable");
  ASSERT_NE(portable, nullptr);
  Context ctx;
  for (DType dtype : {DType::f32, DType::bf16}) {
    HostTensor h = dtype == DType::f32 ? random_f32({4, 1500, 1024}) : random_bf16({4, 1500, 1024});
    const int64_t count = 1500 * 1024;
    const std::vector<int64_t> bad = {3 * count + 17, count + 999'999, count + 1'048'577, 2 * count};
    for (int64_t i : bad) {
      if (dtype == DType::f32) h.ptr<float>()[i] = i % 2 ? NAN : -INFINITY;
      else h.ptr<uint16_t>()[i] = i % 2 ? 0x7fc0 : 0xff80;
      DeviceTensor dev(h);
      detail::CheckFiniteStep s{.src = {.dense = h.view}, .dtype = dtype, .experts = 4, .count = count};
      const uint64_t want = cpu::check_finite(s);
      s.src.dense = dev.view;
      EXPECT_EQ(portable->check_finite(ctx, s), want) << dtype_name(dtype) << ", bad value at " << i;
    }
  }
}

TEST(GpuCheckFinite, RefusedWhileTheStreamIsCaptured) {
  MXMOE_REQUIRE_GPU();
  cudaStream_t stream;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Options o = checked();
  o.stream = stream;
  Context ctx(o);
  const Problem p = finite_problem(Recipe::bf16, kGpu0);
  const LayerData d = make_layer_data(p, {7, 0, 9});
  Arena m{kGpu0, {}};
  FiniteCall call = finite_call(m, d);
  forward(ctx, p, call.fa);  // eager: checked and run (device facts and kernels loaded before capture)
  cuda_ok(cudaStreamSynchronize(stream));
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  std::string what;
  try {
    forward(ctx, p, call.fa);
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "options.check_finite");
    what = e.what();
  }
  cudaGraph_t graph = nullptr;
  cuda_ok(cudaStreamEndCapture(stream, &graph));
  if (graph) cuda_ok(cudaGraphDestroy(graph));
  cuda_ok(cudaStreamDestroy(stream));
  EXPECT_NE(what.find("captured"), std::string::npos) << "no refusal: '" << what << "'";
}
#endif

}  // namespace
}  // namespace mxmoe::test
