// `mxmoe bench`: times each step of the grouped MLP on the GPU (FC1/FC2 fprop with their fused
// epilogues, both dgrads, both k-grouped wgrads, the activation quantizer) and the whole layer
// forward and forward+backward, per preset, balanced and skewed. CUDA events around each run after
// warm-up; the median of the timed runs; TFLOP/s and GB/s (minimum bytes: every operand read once,
// every output written once). bench/peer_torch.py measures torch._grouped_mm on the same shapes
// in the same session and prints ratios against the JSON this writes.
//
//   mxmoe bench [--preset NAME] [--recipe mxfp8|bf16|fp8_blockwise [--pow2-scales]] [--skew] [--dw-dtype bf16|f32] [--seed N] [--json FILE]
// The problem's sizes are the presets' (bench/peer_torch.py re-times the same shapes): the run
// flags that change them (--hidden, --tokens, ...) are not bench flags and are rejected.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <tuple>

#include "src/api/tooling.h"
#include "tools/mxmoe/cli.h"

#if defined(MXMOE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace mxmoe::cli {

namespace {
// Usage errors of the recipe flags, the same with and without CUDA.
void check_bench_recipe(const CliOptions& o) {
  if (o.pow2_scales && o.recipe != Recipe::fp8_blockwise) throw UsageError("--pow2-scales is for --recipe fp8_blockwise");
}
}  // namespace

#if defined(MXMOE_WITH_CUDA)
namespace {

constexpr int kWarmup = 3;
constexpr int kIters = 10;

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Device buffer filled with random (never zero) bf16 values in [-scale, scale]; a 4M-value random
// pattern is tiled over the buffer, which is enough for timing and cheap to make at model sizes.
struct DevBuf {
  void* p = nullptr;
  int64_t bytes = 0;
  explicit DevBuf(int64_t n) : bytes(n) { ok(cudaMalloc(&p, std::max<int64_t>(n, 16)), "cudaMalloc"); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

std::unique_ptr<DevBuf> random_bf16(int64_t n, float scale, std::mt19937_64& g) {
  auto b = std::make_unique<DevBuf>(n * 2);
  constexpr int64_t kPattern = int64_t{1} << 22;
  std::vector<uint16_t> h(static_cast<size_t>(std::min(n, kPattern)));
  std::uniform_real_distribution<float> d(-scale, scale);
  for (auto& v : h) v = bf16_from_f32(d(g));
  for (int64_t off = 0; off < n; off += kPattern) {
    const int64_t m = std::min<int64_t>(kPattern, n - off);
    ok(cudaMemcpy(static_cast<uint16_t*>(b->p) + off, h.data(), m * 2, cudaMemcpyHostToDevice), "upload");
  }
  return b;
}

struct Row {
  std::string preset, split, recipe, op;
  double ms = 0, flops = 0, bytes = 0;
  double peak_mib = -1;  // layer rows: peak device memory of one run (< 0: not measured)
  double plan_mib = -1;  // the same from the plan: the resident tensors + the planned library peak
};

// The token split of each (preset, split) benchmarked, for the peer script to reuse.
struct SplitRecord {
  std::string preset, split;
  int64_t hidden, ffn, experts, tokens;
  std::vector<int64_t> sizes;
};

// MXMOE_BENCH_TRACE=1: each run of the next op is marked on stderr as it is issued and once it has
// finished (w: warm-up, i: timed), so a run that never finishes shows which one it was (scripts/gpu_check.sh hang).
bool bench_trace() {
  static const bool on = [] {
    const char* v = std::getenv("MXMOE_BENCH_TRACE");
    return v != nullptr && *v != '\0' && *v != '0';
  }();
  return on;
}

double median_ms(const std::function<void()>& f, cudaStream_t s) {
  const bool trace = bench_trace();
  if (trace) std::fprintf(stderr, "  ..");
  for (int i = 0; i < kWarmup; ++i) {
    if (trace) std::fprintf(stderr, " w%d", i);
    f();
    if (trace) {
      ok(cudaStreamSynchronize(s), "sync");
      std::fprintf(stderr, "+");
    }
  }
  std::vector<float> t;
  cudaEvent_t a, b;
  ok(cudaEventCreate(&a), "event");
  ok(cudaEventCreate(&b), "event");
  for (int i = 0; i < kIters; ++i) {
    if (trace) std::fprintf(stderr, " i%d", i);
    ok(cudaEventRecord(a, s), "record");
    f();
    ok(cudaEventRecord(b, s), "record");
    ok(cudaEventSynchronize(b), "sync");
    if (trace) std::fprintf(stderr, "+");
    float ms = 0;
    ok(cudaEventElapsedTime(&ms, a, b), "elapsed");
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (trace) std::fprintf(stderr, "\n");
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

TensorView dv(const DevBuf& b, DType t, std::initializer_list<int64_t> shape) {
  return TensorView::of(b.p, t, shape, Device{DeviceType::cuda, 0});
}

void bench_one(const Preset& pr, bool skew, Recipe recipe, bool pow2, DType dw_dtype, uint64_t seed,
               const std::vector<StepOverride>& overrides, std::vector<Row>& rows, std::vector<SplitRecord>& splits) {
  using namespace detail;
  Problem p;
  p.hidden = pr.hidden;
  p.ffn = pr.ffn;
  p.experts = pr.experts;
  p.activation = pr.activation;
  p.glu_layout = pr.glu_layout;
  p.recipe = recipe;
  p.pow2_scales = recipe == Recipe::fp8_blockwise && pow2;
  const int64_t T = pr.tokens, H = p.hidden, F = p.ffn, E = p.experts;
  std::mt19937_64 g(seed);
  // Declared first so it is destroyed last: library buffers free themselves on this stream.
  struct Stream {
    cudaStream_t s;
    Stream() { ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream"); }
    ~Stream() {
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    }
  } owned_stream;
  cudaStream_t stream = owned_stream.s;
  Context ctx(Options{.stream = stream, .overrides = overrides});

  auto x = random_bf16(T * H, 1.0f, g), dy = random_bf16(T * H, 1.0f, g);
  auto w1 = random_bf16(E * 2 * F * H, 1.0f / std::sqrt(float(H)), g);
  auto w2 = random_bf16(E * H * F, 1.0f / std::sqrt(float(F)), g);
  std::vector<int64_t> split = token_split(T, E, skew, seed);
  const char* split_label = skew ? "skew" : "balanced";
  if (std::none_of(splits.begin(), splits.end(),
                   [&](const SplitRecord& r) { return r.preset == pr.name && r.split == split_label; }))
    splits.push_back({pr.name, split_label, H, F, E, T, split});
  std::vector<int32_t> off(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) off[e + 1] = off[e] + static_cast<int32_t>(split[e]);
  DevBuf offsets(4 * (E + 1)), probs(4 * T), y(2 * T * H), dx(2 * T * H), dprobs(4 * T);
  const int64_t dw_size = dtype_size(dw_dtype);
  DevBuf dw1(dw_size * E * 2 * F * H), dw2(dw_size * E * H * F);
  ok(cudaMemcpy(offsets.p, off.data(), 4 * (E + 1), cudaMemcpyHostToDevice), "offsets");
  std::vector<float> hp(T);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (auto& v : hp) v = u(g);
  ok(cudaMemcpy(probs.p, hp.data(), 4 * T, cudaMemcpyHostToDevice), "probs");

  ForwardArgs fa;
  fa.x = dv(*x, DType::bf16, {T, H});
  fa.offsets.offsets = dv(offsets, DType::i32, {E + 1});
  fa.probs = dv(probs, DType::f32, {T});
  fa.w1.dense = dv(*w1, DType::bf16, {E, 2 * F, H});
  fa.w2.dense = dv(*w2, DType::bf16, {E, H, F});
  fa.y = dv(y, DType::bf16, {T, H});
  BackwardArgs ba;
  ba.dy = dv(*dy, DType::bf16, {T, H});
  ba.dx = dv(dx, DType::bf16, {T, H});
  ba.dprobs = dv(dprobs, DType::f32, {T});
  ba.grads.dw1.dense = dv(dw1, dw_dtype, {E, 2 * F, H});
  ba.grads.dw2.dense = dv(dw2, dw_dtype, {E, H, F});

  auto add = [&](const char* op, double ms, double flops, double bytes) {
    const std::string rname = p.pow2_scales ? "fp8_blockwise_pow2" : to_string(recipe);
    rows.push_back({pr.name, split_label, rname, op, ms, flops, bytes});
    std::fprintf(stderr, "  %-12s %-8s %-5s %-14s %9.3f ms %8.1f TFLOP/s %7.0f GB/s\n", pr.name, split_label,
                 rname.c_str(), op, ms, flops / ms * 1e-9, bytes / ms * 1e-6);
  };
  const double tHF = double(T) * H * F;
  // Peak device memory of one run of `f`, as the peer counts it: the resident inputs, weights,
  // outputs and gradients (this function's buffers) plus the most the library held at once (the
  // high watermark of the library's memory pool of the device, src/common/pool.h, reset first).
  const double resident = double(x->bytes + dy->bytes + w1->bytes + w2->bytes + offsets.bytes + probs.bytes +
                                 y.bytes + dx.bytes + dprobs.bytes + dw1.bytes + dw2.bytes);
  auto peak_mib = [&](const std::function<void()>& f) {
    int dev_index = 0;
    ok(cudaGetDevice(&dev_index), "device");
    ok(cudaStreamSynchronize(stream), "sync");
    cuda::pool_used_high(dev_index, /*reset=*/true);
    f();
    ok(cudaStreamSynchronize(stream), "sync");
    const uint64_t high = cuda::pool_used_high(dev_index, /*reset=*/false);
    return (resident + double(high)) / (1024.0 * 1024.0);
  };

  // Whole layer.
  const double fwd_ms = median_ms([&] { SavedState s = forward(ctx, p, fa); }, stream);
  add("layer_fwd", fwd_ms, 6 * tHF, 0);
  const double fb_ms = median_ms([&] {
    SavedState s = forward(ctx, p, fa);
    backward(ctx, s, ba);
  }, stream);
  add("layer_fwd_bwd", fb_ms, 18 * tHF, 0);
  rows.back().peak_mib = peak_mib([&] {
    SavedState s = forward(ctx, p, fa);
    backward(ctx, s, ba);
  });
  auto plan_mib = [&](bool prepared) {
    return (resident + double(plan_layer(ctx, p, T, fa.x.device, prepared).peak_bytes)) / (1024.0 * 1024.0);
  };
  rows.back().plan_mib = plan_mib(false);
  if (recipe != Recipe::bf16) {
    // Weights quantized once per version (prepare_weights, timed on its own) and reused, as across
    // micro-batches or with the PyTorch module's cache; the rows above quantize them in the call.
    WeightsArgs wa{fa.w1, fa.w2};
    add("prepare_weights", median_ms([&] { PreparedWeights w = prepare_weights(ctx, p, wa); }, stream), 0, 0);
    PreparedWeights pw = prepare_weights(ctx, p, wa);
    ForwardArgs fp = fa;
    fp.prepared = &pw;
    BackwardArgs bp = ba;
    bp.prepared = &pw;
    add("layer_fwd_prepared", median_ms([&] { SavedState s = forward(ctx, p, fp); }, stream), 6 * tHF, 0);
    add("layer_fwd_bwd_prepared", median_ms([&] {
      SavedState s = forward(ctx, p, fp);
      backward(ctx, s, bp);
    }, stream), 18 * tHF, 0);
    // The prepared copies are in the pool's use when it is reset, so they count in the peak.
    rows.back().peak_mib = peak_mib([&] {
      SavedState s = forward(ctx, p, fp);
      backward(ctx, s, bp);
    });
    rows.back().plan_mib = plan_mib(true);
  }

  // The layer's steps (src/api/layer_steps.h), on operands prepared once in the recipe's format,
  // each on the backend the layer would choose for it, with the step's own FLOP/byte model.
  const Options& opt = ctx.options();
  const Device dev = fa.x.device;
  const bool mx = recipe != Recipe::bf16;  // mxfp8 or fp8_blockwise
  const QuantSpec qs = quant_spec(p, opt.scale_layout);
  auto time_step = [&](const LayerStep& st) {
    const Choice c = plan(ctx, st);
    add(st.label.c_str(), median_ms([&] { run(ctx, c, st); }, stream), st.cost.flops, st.cost.bytes);
  };
  auto prepare = [&](const LayerStep& st) { run(ctx, plan(ctx, st), st); };
  auto act = [&](int64_t cols, BlockAxis axis) { return make_quant(opt, dev, qs, T, cols, axis, E); };
  auto weights = [&](int64_t r, int64_t c, BlockAxis axis) { return make_expert_quant(opt, dev, qs, E, r, c, axis); };
  auto mx_op = [](const OwnedMxfp8& m) { return Operand{{}, m.view}; };
  auto bf16_op = [](const TensorView& t) { return Operand{t, {}}; };

  OwnedTensor c = make_tensor(opt, dev, DType::bf16, {T, 2 * F}), a16, dc16;
  OwnedMxfp8 x_row, x_col, dy_row, dy_col, a_row, a_col, dc_row, dc_col;
  OwnedExpertMxfp8 w1_row, w2_row, w2_col, w1_col;
  // Operands as fprop/dgrad (row-wise) and wgrad (column-wise) read them.
  Operand x_in = bf16_op(fa.x), dy_in = bf16_op(ba.dy), a_in, dc_in, x_w = x_in, dy_w = dy_in, a_w, dc_w;
  ExpertOperand w1_f{fa.w1, {}, {}}, w2_f{fa.w2, {}, {}}, w1_d = w1_f, w2_d = w2_f;
  GluOutput a_out, dc_out;
  if (mx) {
    x_row = act(H, BlockAxis::row), x_col = act(H, BlockAxis::col);
    dy_row = act(H, BlockAxis::row), dy_col = act(H, BlockAxis::col);
    a_row = act(F, BlockAxis::row), a_col = act(F, BlockAxis::col);
    dc_row = act(2 * F, BlockAxis::row), dc_col = act(2 * F, BlockAxis::col);
    w1_row = weights(2 * F, H, BlockAxis::row), w2_row = weights(H, F, BlockAxis::row);
    w2_col = weights(H, F, BlockAxis::col), w1_col = weights(2 * F, H, BlockAxis::col);
    // The forms prepare_weights makes where the GEMMs' plans read them: bf16 copies of the
    // dequantized MXFP8 weights, and fp8_blockwise's transposed copies, which its FP8 dgrads read.
    // fp8_blockwise's second pair of weight copies (w*_col) holds the same 128x128 blocks: the
    // dgrads read them.
    const WeightsArgs wargs{fa.w1, fa.w2};
    const PreparedForms forms = prepared_forms(ctx, p, wargs, dev);
    if (forms.bf16_copies)
      for (OwnedExpertMxfp8* w : {&w1_row, &w2_row, &w2_col, &w1_col}) w->add_bf16_copy(opt, dev);
    if (forms.bf16_copies) {
      // The layer's per-call weights where the GEMMs read bf16 copies: each weight quantized
      // straight into its copy alone (rows "quantize_w1_copy", "quantize_w2_copy"; row-wise, the
      // column-wise ones move the same bytes).
      for (auto [rows, cols, src, label] : {std::tuple{2 * F, H, fa.w1, "quantize_w1_copy"},
                                            std::tuple{H, F, fa.w2, "quantize_w2_copy"}}) {
        const OwnedExpertMxfp8 copy =
            make_expert_copy_only(opt, dev, E, rows, cols, BlockAxis::row, qs.layout, /*allocate_copy=*/true);
        LayerStep st = quantize_w1(copy.quantize_from(src));
        st.label = label;
        time_step(st);
      }
    }
    if (forms.transposed)
      for (OwnedExpertMxfp8* w : {&w2_col, &w1_col}) w->add_transposed_copy(opt, dev);
    time_step(quantize_x({fa.x, fa.offsets, x_row.view, x_col.view, qs.pow2_scales}));
    if (p.recipe == Recipe::mxfp8) {
      // The wgrad's operand copy on GPUs whose k-grouped GEMM computes in BF16 (cuda_sm90): X
      // column-wise back to bf16, groups restarting the 32-token blocks (1 byte in, 2 out a value).
      const OwnedTensor x16 = make_tensor(opt, dev, DType::bf16, {T, H});
      const DequantizeArgs da{x_col.view, fa.offsets, x16.view};
      add("dequantize_x_col", median_ms([&] { dequantize_mxfp8(ctx, da); }, stream), 0, 3.0 * T * H);
    }
    prepare(quantize_dy({ba.dy, fa.offsets, dy_row.view, dy_col.view, qs.pow2_scales}));
    for (const OwnedExpertMxfp8* q : {&w1_row, &w1_col}) prepare(quantize_w1(q->quantize_from(fa.w1)));
    for (const OwnedExpertMxfp8* q : {&w2_row, &w2_col}) prepare(quantize_w2(q->quantize_from(fa.w2)));
    x_in = mx_op(x_row), x_w = mx_op(x_col), dy_in = mx_op(dy_row), dy_w = mx_op(dy_col);
    a_in = mx_op(a_row), a_w = mx_op(a_col), dc_in = mx_op(dc_row), dc_w = mx_op(dc_col);
    w1_f = w1_row.operand, w2_f = w2_row.operand, w1_d = w1_col.operand, w2_d = w2_col.operand;
    a_out = {.row = a_row.view, .col = a_col.view};
    dc_out = {.row = dc_row.view, .col = dc_col.view};
  } else {
    a16 = make_tensor(opt, dev, DType::bf16, {T, F});
    dc16 = make_tensor(opt, dev, DType::bf16, {T, 2 * F});
    a_in = a_w = bf16_op(a16.view);
    dc_in = dc_w = bf16_op(dc16.view);
    a_out.bf16 = a16.view;
    dc_out.bf16 = dc16.view;
  }
  time_step(fc1_fprop(p, {.x = x_in, .w1 = w1_f, .offsets = fa.offsets, .probs = fa.probs, .c = c.view, .a = a_out}));
  time_step(fc2_fprop(p, {.a = a_in, .w2 = w2_f, .offsets = fa.offsets, .probs = fa.probs, .y = fa.y}));
  time_step(fc2_dgrad(p, {.dy = dy_in, .w2 = w2_d, .offsets = fa.offsets, .probs = fa.probs, .c = c.view,
                          .dprobs = ba.dprobs, .dc = dc_out}));
  time_step(fc1_dgrad(p, {.dc = dc_in, .w1 = w1_d, .offsets = fa.offsets, .dx = ba.dx}));
  time_step(fc2_wgrad(p, {dy_w, a_w, fa.offsets, ba.grads.dw2, false}));
  time_step(fc1_wgrad(p, {dc_w, x_w, fa.offsets, ba.grads.dw1, false}));
  ok(cudaStreamSynchronize(stream), "sync");
  ok(cudaGetLastError(), "bench");
}

}  // namespace

int command_bench(const CliOptions& o) {
  check_bench_recipe(o);
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "mxmoe bench: no CUDA GPU on this machine (the benchmark times GPU kernels)\n");
    return kExitError;
  }
  if (!o.json_path.empty()) check_output_file("--json", o.json_path);  // before minutes of timing
  std::vector<const Preset*> list;
  if (!o.preset.empty()) {
    const Preset* p = find_preset(o.preset);
    if (!p) throw UsageError("unknown preset '" + o.preset + "'");
    list.push_back(p);
  } else {
    for (const Preset& p : presets())
      if (std::string(p.name) != "small") list.push_back(&p);
  }
  std::vector<Recipe> recipes = o.recipe ? std::vector<Recipe>{*o.recipe} : std::vector<Recipe>{Recipe::mxfp8, Recipe::bf16};
  std::vector<Row> rows;
  std::vector<SplitRecord> splits;
  const DType dw_dtype = o.dw_dtype.value_or(DType::bf16);
  std::fprintf(stderr, "mxmoe bench on %s (median of %d after %d warm-up runs; dW in %s)\n",
               cuda_device_description(0).c_str(), kIters, kWarmup, dtype_name(dw_dtype));
  for (const Preset* p : list)
    for (bool skew : o.skew ? std::vector<bool>{true} : std::vector<bool>{false, true})
      for (Recipe r : recipes) bench_one(*p, skew, r, o.pow2_scales, dw_dtype, o.seed, o.overrides, rows, splits);

  std::printf("| preset | split | recipe | op | ms | TFLOP/s | GB/s |\n|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows)
    std::printf("| %s | %s | %s | %s | %.3f | %.1f | %.0f |\n", r.preset.c_str(), r.split.c_str(), r.recipe.c_str(),
                r.op.c_str(), r.ms, r.flops / r.ms * 1e-9, r.bytes / r.ms * 1e-6);
  std::printf("\n| preset | split | recipe | op | measured peak MiB | planned MiB | planned / measured |\n"
              "|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows)
    if (r.peak_mib >= 0 && r.plan_mib >= 0)
      std::printf("| %s | %s | %s | %s | %.1f | %.1f | %.3f |\n", r.preset.c_str(), r.split.c_str(), r.recipe.c_str(),
                  r.op.c_str(), r.peak_mib, r.plan_mib, r.plan_mib / r.peak_mib);
  if (!o.json_path.empty()) {
    using json = nlohmann::ordered_json;
    auto rounded = [](double v, double scale) { return json(std::round(v * scale) / scale); };
    json j;
    j["mxmoe_version"] = mxmoe::version();
    j["device"] = cuda_device_description(0);
    j["dw_dtype"] = dtype_name(dw_dtype);
    // What the library's memory pool keeps across the timed calls (src/common/pool.h): "all",
    // or the MXMOE_POOL_RELEASE_BYTES value (0: every sync returns it, so each call maps it again).
    const char* keep = std::getenv("MXMOE_POOL_RELEASE_BYTES");
    j["pool_release_bytes"] = keep != nullptr && *keep != '\0' ? std::string(keep) : std::string("all");
    j["rows"] = json::array();
    for (const Row& r : rows)
      j["rows"].push_back({{"preset", r.preset},
                           {"split", r.split},
                           {"recipe", r.recipe},
                           {"op", r.op},
                           {"ms", rounded(r.ms, 1e5)},
                           {"tflops", rounded(r.flops / r.ms * 1e-9, 1e3)},
                           {"gbps", rounded(r.bytes / r.ms * 1e-6, 1e1)}});
    for (size_t i = 0; i < rows.size(); ++i)
      if (rows[i].peak_mib >= 0) j["rows"][i]["peak_mib"] = rounded(rows[i].peak_mib, 10);
    for (size_t i = 0; i < rows.size(); ++i)
      if (rows[i].plan_mib >= 0) j["rows"][i]["plan_mib"] = rounded(rows[i].plan_mib, 10);
    j["splits"] = json::array();
    for (const SplitRecord& r : splits)
      j["splits"].push_back({{"preset", r.preset},
                             {"split", r.split},
                             {"hidden", r.hidden},
                             {"ffn", r.ffn},
                             {"experts", r.experts},
                             {"tokens", r.tokens},
                             {"sizes", r.sizes}});
    write_text_file("--json", o.json_path, j.dump(1, ' ', false, json::error_handler_t::replace) + "\n");
  }
  return kExitOk;
}
#else
int command_bench(const CliOptions& o) {
  check_bench_recipe(o);
  std::fprintf(stderr, "mxmoe bench: this build has no CUDA support (the benchmark times GPU kernels)\n");
  return kExitError;
}
#endif

}  // namespace mxmoe::cli
