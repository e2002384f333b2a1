// No host synchronisation in forward or backward: a whole training step, with one device backend as
// the first choice (run once per backend, test names ending in /<backend>), is captured in a CUDA
// graph once, then new inputs AND new token splits are written into the same device buffers and
// the graph is replayed; every output must equal an eager run on the same data, bit for bit.
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuGraph*'
#include <gtest/gtest.h>

#include "tests/layer_support.h"

namespace mxmoe::test {
namespace {

#if defined(MXMOE_WITH_CUDA)
struct DeviceStep {
  Problem p;
  int64_t T;
  DeviceTensor x, offsets, probs, w1, w2, b1, b2, y, dy, dx, dprobs, dw1, dw2, db1, db2;
  ForwardArgs fa;
  BackwardArgs ba;

  DeviceStep(const LayerData& d)
      : p(d.problem), T(d.tokens), x(d.x), offsets(d.offsets), probs(d.probs), w1(d.w1), w2(d.w2), b1(d.b1),
        b2(d.b2), y(TensorView::of(nullptr, DType::bf16, {d.tokens, p.hidden})), dy(d.dy),
        dx(TensorView::of(nullptr, DType::bf16, {d.tokens, p.hidden})),
        dprobs(TensorView::of(nullptr, DType::f32, {d.tokens})),
        dw1(TensorView::of(nullptr, DType::f32, {p.experts, 2 * p.ffn, p.hidden})),
        dw2(TensorView::of(nullptr, DType::f32, {p.experts, p.hidden, p.ffn})),
        db1(TensorView::of(nullptr, DType::f32, {p.experts, 2 * p.ffn})),
        db2(TensorView::of(nullptr, DType::f32, {p.experts, p.hidden})) {
    fa.x = x.view;
    fa.offsets.offsets = offsets.view;
    fa.probs = probs.view;
    fa.w1.dense = w1.view;
    fa.w2.dense = w2.view;
    fa.b1 = b1.view;
    fa.b2 = b2.view;
    fa.y = y.view;
    ba.dy = dy.view;
    ba.dx = dx.view;
    ba.dprobs = dprobs.view;
    ba.grads.dw1.dense = dw1.view;
    ba.grads.dw2.dense = dw2.view;
    ba.grads.db1 = db1.view;
    ba.grads.db2 = db2.view;
  }
  void upload(const LayerData& d) {
    x.upload(d.x);
    offsets.upload(d.offsets);
    probs.upload(d.probs);
    dy.upload(d.dy);
    for (DeviceTensor* t : {&y, &dx, &dprobs, &dw1, &dw2, &db1, &db2}) t->poison();
  }
  void run(Context& ctx) {
    SavedState s = forward(ctx, p, fa);
    backward(ctx, s, ba);
  }
  std::vector<HostTensor> outputs() {
    cuda_ok(cudaDeviceSynchronize());
    return {y.download(), dx.download(), dprobs.download(), dw1.download(), dw2.download(), db1.download(), db2.download()};
  }
};

void expect_same(const std::vector<HostTensor>& a, const std::vector<HostTensor>& b, const char* what) {
  const char* names[] = {"y", "dx", "dprobs", "dw1", "dw2", "db1", "db2"};
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bytes_equal(a[i].view, b[i].view)) << what << ": " << names[i];
}
#endif

class GpuGraph : public GpuBackendTest {};
MXMOE_GPU_BACKEND_SUITE(GpuGraph);

TEST_P(GpuGraph, CapturedStepReplaysWithNewInputsAndSplitsBitIdentically) {
#if defined(MXMOE_WITH_CUDA)
  for (Recipe r : {Recipe::mxfp8, Recipe::bf16}) {
    SCOPED_TRACE(to_string(r));
    Problem p;
    p.hidden = 256;
    p.ffn = 128;
    p.experts = 4;
    p.recipe = r;
    p.fc1_bias = p.fc2_bias = p.scale_fc2_bias = true;
    LayerData a = make_layer_data(p, {100, 0, 37, 119});
    LayerData b = make_layer_data(p, {0, 200, 56, 0});  // same T, different split and values
    b.w1 = a.w1;  // weights live in the same buffers: keep them fixed
    b.w2 = a.w2;
    b.b1 = a.b1;
    b.b2 = a.b2;
    DeviceStep step(a);
    cudaStream_t stream;
    cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    Context ctx(prefer_backend(backend_name(), stream));

    step.upload(a);
    step.run(ctx);
    auto eager_a = step.outputs();
    step.upload(b);
    step.run(ctx);
    auto eager_b = step.outputs();

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    step.run(ctx);
    cuda_ok(cudaStreamEndCapture(stream, &graph));
    cuda_ok(cudaGraphInstantiate(&exec, graph, 0));

    for (int replay = 0; replay < 2; ++replay) {
      step.upload(a);
      cuda_ok(cudaGraphLaunch(exec, stream));
      expect_same(step.outputs(), eager_a, "replay on split A");
      step.upload(b);
      cuda_ok(cudaGraphLaunch(exec, stream));
      expect_same(step.outputs(), eager_b, "replay on split B");
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
#endif
}

}  // namespace
}  // namespace mxmoe::test
