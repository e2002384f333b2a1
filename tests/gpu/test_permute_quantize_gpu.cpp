// Every device backend's permute_tokens with MXFP8 outputs (PermuteArgs::rowwise / colwise: the
// gather fused into the quantizer; src/cuda/quant/permute_quantize.cu) against the CPU reference
// (permute_tokens then quantize of the kept rows, tests/unit/test_permute_quantize.cpp), bit for
// bit: offsets, row_map, invalid, permuted_probs, the optional bf16 permuted_x, both quantized data
// tensors and every scale byte. Inputs are fresh random values with magnitudes spread over
// 2^-12 .. 2^12 per token; every output buffer starts as the same poison bytes on both sides, so
// rows one side leaves untouched (past offsets[E]) must be untouched on the other. Shapes: experts
// without tokens, T*K not a multiple of 32, capacity drops, invalid ids (int32 and int64), several
// 128-column tiles and a partial one (H = 160, column-wise only: H = 48), compact and swizzled
// scales, each subset of the outputs. Also: a CUDA-graph capture replayed with new ids, and a
// GPU layer given the fused permute's X equals the layer given the bf16 X, bit for bit.
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuPermuteQuantize*'
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "tests/gpu_support.h"
#include "tests/layer_support.h"
#include "tests/permute_inputs.h"

namespace mxmoe::test {
namespace {

using detail::Step;

class GpuPermuteQuantize : public GpuBackendTest {};
MXMOE_GPU_BACKEND_SUITE(GpuPermuteQuantize);

#if defined(MXMOE_WITH_CUDA)

constexpr uint8_t kPoison = 0xB7;

struct Case {
  int64_t T, K, E, C, H;
  double invalid_fraction = 0;
  bool int64_ids = false;
};

std::string describe(const Case& c) {
  return "T=" + std::to_string(c.T) + " K=" + std::to_string(c.K) + " E=" + std::to_string(c.E) +
         " C=" + std::to_string(c.C) + " H=" + std::to_string(c.H) + " bad=" + std::to_string(c.invalid_fraction) +
         (c.int64_ids ? " i64" : "");
}

using Inputs = PermuteInputs;
Inputs make_inputs(const Case& c, std::mt19937_64& gen) {
  return make_permute_inputs({c.T, c.K, c.E, c.C, c.H, c.invalid_fraction, c.int64_ids}, gen);
}

struct Wanted {
  bool x, row, col;
};

// Every output of one call, host or device.
template <class Buf>
struct Outs {
  Buf offsets, row_map, probs, invalid, x, row, row_s, col, col_s;
};

HostTensor poisoned(DType t, std::initializer_list<int64_t> shape) {
  HostTensor h(t, shape);
  h.poison(kPoison);
  return h;
}

Outs<HostTensor> poisoned_outputs(const Case& c, int64_t R) {
  return {poisoned(DType::i32, {c.E + 1}),  poisoned(DType::i32, {c.T, c.K}),
          poisoned(DType::f32, {R}),        poisoned(DType::i32, {1}),
          poisoned(DType::bf16, {R, c.H}),  poisoned(DType::e4m3, {R, c.H}),
          poisoned(DType::e8m0, {rowwise_scale_bytes(R, c.H)}), poisoned(DType::e4m3, {R, c.H}),
          poisoned(DType::e8m0, {colwise_scale_bytes(R, c.H, c.E)})};
}

PermuteArgs args_of(const Case& c, const TensorView& x, const TensorView& ids, const TensorView& probs,
                    Outs<TensorView> o, const Wanted& w, ScaleLayout layout) {
  PermuteArgs a{.x = x,
                .expert_ids = ids,
                .probs = probs,
                .experts = c.E,
                .capacity = c.C,
                .offsets = o.offsets,
                .permuted_x = w.x ? o.x : TensorView{},
                .row_map = o.row_map,
                .permuted_probs = o.probs,
                .invalid = o.invalid};
  if (w.row) a.rowwise = {o.row, o.row_s, BlockAxis::row, layout};
  if (w.col) a.colwise = {o.col, o.col_s, BlockAxis::col, layout};
  return a;
}

Outs<TensorView> views(Outs<HostTensor>& o) {
  return {o.offsets.view, o.row_map.view, o.probs.view, o.invalid.view, o.x.view,
          o.row.view,     o.row_s.view,   o.col.view,   o.col_s.view};
}

Outs<HostTensor> run_cpu(const Case& c, Inputs& in, const Wanted& w, ScaleLayout layout) {
  Outs<HostTensor> o = poisoned_outputs(c, permuted_rows_bound(c.T, c.K, c.E, c.C));
  Context cpu(Options{.backend = "cpu", .deny = {}});
  permute_tokens(cpu, args_of(c, in.x.view, in.ids.view, in.probs.view, views(o), w, layout));
  return o;
}

struct DeviceRun {
  DeviceTensor x, ids, probs;
  std::vector<DeviceTensor> out;  // offsets, row_map, probs, invalid, x, row, row_s, col, col_s
  DeviceRun(const Inputs& in, Outs<HostTensor>& like) : x(in.x), ids(in.ids), probs(in.probs) {
    for (HostTensor* h : {&like.offsets, &like.row_map, &like.probs, &like.invalid, &like.x, &like.row, &like.row_s,
                          &like.col, &like.col_s})
      out.emplace_back(h->view);
  }
  void upload(const Inputs& in) {
    x.upload(in.x);
    ids.upload(in.ids);
    probs.upload(in.probs);
  }
  void poison() {
    for (DeviceTensor& d : out) d.poison(kPoison);
  }
  Outs<TensorView> views() const {
    return {out[0].view, out[1].view, out[2].view, out[3].view, out[4].view,
            out[5].view, out[6].view, out[7].view, out[8].view};
  }
  void run(Context& ctx, const Case& c, const Wanted& w, ScaleLayout layout) {
    permute_tokens(ctx, args_of(c, x.view, ids.view, probs.view, views(), w, layout));
  }
  void expect_equal(Outs<HostTensor>& want, const std::string& what) {
    cuda_ok(cudaDeviceSynchronize());
    SCOPED_TRACE(what);
    const char* names[] = {"offsets", "row_map", "permuted_probs", "invalid", "permuted_x",
                           "rowwise.data", "rowwise.scales", "colwise.data", "colwise.scales"};
    HostTensor* host[] = {&want.offsets, &want.row_map, &want.probs, &want.invalid, &want.x,
                          &want.row,     &want.row_s,   &want.col,   &want.col_s};
    for (int i = 0; i < 9; ++i) {
      const HostTensor got = out[i].download();
      ASSERT_EQ(got.bytes.size(), host[i]->bytes.size()) << names[i];
      for (size_t b = 0; b < got.bytes.size(); ++b)
        ASSERT_EQ(got.bytes[b], host[i]->bytes[b]) << names[i] << " differs first at byte " << b;
    }
  }
};

bool served(detail::Backend& b, const Case& c) {
  for (auto [step, recipe] : {std::pair{Step::route_tokens, Recipe::bf16}, {Step::permute_rows, Recipe::mxfp8}}) {
    const detail::Probe p = b.probe({step, kGpu0, recipe, c.H, c.K});
    if (!p.available) {
      CaseTally& t = case_tally();
      if (t.refused++ == 0) t.first_reason = p.reason;
      std::printf("[   NOTE   ] %s does not serve %s: %s\n", b.name(), detail::to_string(step), p.reason.c_str());
      return false;
    }
  }
  ++case_tally().served;
  return true;
}

void check_case(const std::string& backend, const Case& c) {
  SCOPED_TRACE(describe(c));
  std::mt19937_64 gen(rng()());
  Inputs in = make_inputs(c, gen);
  const bool row_ok = c.H % 32 == 0;
  for (ScaleLayout layout : {ScaleLayout::compact, ScaleLayout::swizzled})
    for (const Wanted& w : {Wanted{true, true, true}, Wanted{false, true, true}, Wanted{false, true, false},
                            Wanted{false, false, true}, Wanted{true, false, true}}) {
      if (w.row && !row_ok) continue;
      SCOPED_TRACE(::testing::Message() << "layout " << static_cast<int>(layout) << " x" << w.x << " row" << w.row
                                        << " col" << w.col);
      Outs<HostTensor> want = run_cpu(c, in, w, layout);
      DeviceRun dev(in, want);
      dev.poison();
      Context ctx(prefer_backend(backend));
      dev.run(ctx, c, w, layout);
      dev.expect_equal(want, "eager");
      bool fused_here = false;
      for (const StepRecord& r : ctx.report()) fused_here |= r.step == "permute_quantize_rows" && r.backend == backend;
      EXPECT_TRUE(fused_here) << "permute_quantize_rows did not run on " << backend;
      if (::testing::Test::HasFatalFailure()) return;
    }
}

#endif

TEST_P(GpuPermuteQuantize, MatchesTheCpuCompositionBitForBit) {
#if defined(MXMOE_WITH_CUDA)
  const Case cases[] = {{37, 3, 5, -1, 64},          {50, 2, 4, 9, 96},         {40, 4, 6, -1, 160, 0.15},
                        {33, 5, 7, 20, 64, 0.1, true}, {45, 1, 1, -1, 256},       {300, 8, 16, -1, 128},
                        {1000, 6, 33, 150, 2048, 0.02}, {61, 2, 3, -1, 48},        {1, 1, 3, -1, 64}};
  for (const Case& c : cases) {
    if (!served(backend(), c)) return;
    check_case(backend_name(), c);
    if (HasFatalFailure()) return;
  }
#endif
}

// No host synchronisation: the fused permute captured once, replayed after new ids and values are
// written into the same input buffers; every output must equal the CPU's on those inputs.
TEST_P(GpuPermuteQuantize, CapturedCallReplaysWithNewIdsBitExactly) {
#if defined(MXMOE_WITH_CUDA)
  const Case c{700, 4, 24, 100, 512, 0.02};
  if (!served(backend(), c)) return;
  std::mt19937_64 gen(rng()());
  Inputs a = make_inputs(c, gen), b = make_inputs(c, gen);
  const Wanted w{true, true, true};
  const ScaleLayout layout = ScaleLayout::swizzled;
  Outs<HostTensor> want_a = run_cpu(c, a, w, layout), want_b = run_cpu(c, b, w, layout);
  cudaStream_t stream;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    DeviceRun dev(a, want_a);
    Context ctx(prefer_backend(backend_name(), stream));
    dev.poison();
    dev.run(ctx, c, w, layout);
    dev.expect_equal(want_a, "eager on ids A");
    expect_graph_replays(stream, dev, [&] { dev.run(ctx, c, w, layout); }, a, want_a, b, want_b);
  }
  cuda_ok(cudaStreamDestroy(stream));
#endif
}

// The layer preferring this backend (steps it refuses fall back as in production) given X pre-quantized (ForwardArgs::x_row / x_col, x empty) gives the
// bytes of the layer given the bf16 X: y, dx, dprobs, dW, db and the saved C.
TEST_P(GpuPermuteQuantize, LayerWithPrequantizedXEqualsLayerWithBf16X) {
#if defined(MXMOE_WITH_CUDA)
  Problem p;
  p.hidden = 256;
  p.ffn = 128;
  p.experts = 5;
  p.recipe = Recipe::mxfp8;
  p.fc1_bias = p.fc2_bias = true;
  for (ScaleLayout layout : {ScaleLayout::compact, ScaleLayout::swizzled}) {
    SCOPED_TRACE(::testing::Message() << "layout " << static_cast<int>(layout));
    const LayerData d = make_layer_data(p, {70, 0, 33, 129, 1});
    Options o = prefer_backend(backend_name());
    o.scale_layout = layout;
    Context plain_ctx(o), pre_ctx(o);
    RunConfig cfg;
    const LayerOutputs plain = run_layer(plain_ctx, kGpu0, d, cfg);
    cfg.prequantize_x = true;
    const LayerOutputs pre = run_layer(pre_ctx, kGpu0, d, cfg);
    const auto a = outputs_of(plain, p), b = outputs_of(pre, p);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bytes_equal(a[i].second->view, b[i].second->view)) << a[i].first;
    EXPECT_TRUE(bytes_equal(plain.c.view, pre.c.view)) << "c";
    for (const StepRecord& r : pre.report) EXPECT_NE(r.step, "quantize_x");
  }
#endif
}

}  // namespace
}  // namespace mxmoe::test
