// Whole-layer test harness: random problem data on the host, and a runner that executes forward +
// backward through the public API on the CPU or on a GPU and returns every output on the host.
#pragma once
#include <deque>
#include <functional>
#include <optional>
#include <vector>

#include "src/api/layer_state.h"
#include "tests/gpu_support.h"

namespace mxmoe::test {

struct LayerData {
  Problem problem;
  int64_t tokens = 0;
  std::vector<int> sizes;
  HostTensor x, offsets, probs, w1, b1, w2, b2, dy;
};

// x, dy ~ U(-1, 1); weights ~ U(-w, w) with w = 1/sqrt(fan_in) * weight_gain; biases U(-0.5, 0.5);
// probs U(0, 1). weight_gain > 1 pushes FC1 outputs past the clamp limits.
inline LayerData make_layer_data(const Problem& p, const std::vector<int>& sizes, float weight_gain = 1.0f) {
  LayerData d;
  d.problem = p;
  d.sizes = sizes;
  for (int s : sizes) d.tokens += s;
  const int64_t T = d.tokens, H = p.hidden, F = p.ffn, E = p.experts;
  d.x = random_bf16({T, H});
  d.dy = random_bf16({T, H});
  d.offsets = offsets_from_sizes(sizes);
  d.probs = random_f32({T}, 0.f, 1.f);
  const float g1 = weight_gain / std::sqrt(static_cast<float>(H)), g2 = weight_gain / std::sqrt(static_cast<float>(F));
  d.w1 = random_bf16({E, 2 * F, H}, -g1, g1);
  d.w2 = random_bf16({E, H, F}, -g2, g2);
  d.b1 = random_bf16({E, 2 * F}, -0.5f, 0.5f);
  d.b2 = random_bf16({E, H}, -0.5f, 0.5f);
  return d;
}

struct LayerOutputs {
  HostTensor y, dx, dprobs, dw1, dw2, db1, db2;
  HostTensor c;  // the forward's saved C (bf16 [T, 2F]), as the forward wrote it
  int64_t saved_bytes = 0;
  std::vector<StepRecord> report;
};

struct RunConfig {
  bool deferred_wgrad = false;
  bool accumulate = false;
  DType grad_dtype = DType::f32;
  // Initial content of the weight/bias-grad buffers (for accumulate); poisoned when absent.
  std::optional<LayerOutputs> grads_in;
  // Weights quantized once (prepare_weights), passed to forward and backward.
  const PreparedWeights* prepared = nullptr;
  // Overwrites the forward's saved C with these bf16 [T, 2F] values before backward: a reference
  // backward at another run's C (the GPU's), so that both backwards evaluate the GLU derivative,
  // and its clamp masks, at the same points (docs/numerics.md "Activation precision").
  const HostTensor* saved_c = nullptr;
  // mxfp8: X quantized beforehand by quantize_mxfp8 (row-wise and grouped column-wise, the
  // context's scale layout) and passed as ForwardArgs::x_row / x_col, with x left empty.
  bool prequantize_x = false;
};

// Memory on one device for the runner: host vectors or cudaMalloc.
struct Arena {
  Device device;
  std::deque<HostTensor> host;  // deque: views stay valid as it grows
#if defined(MXMOE_WITH_CUDA)
  std::deque<DeviceTensor> dev;
#endif
  TensorView put(const HostTensor& h) {
    if (device.type == DeviceType::cpu) {
      host.push_back(h);
      return host.back().view;
    }
#if defined(MXMOE_WITH_CUDA)
    dev.emplace_back(h);
    return dev.back().view;
#else
    throw std::runtime_error("no CUDA");
#endif
  }
  TensorView poisoned(DType t, std::initializer_list<int64_t> shape) {
    HostTensor h(t, shape);
    h.poison();
    return put(h);
  }
  HostTensor get(const TensorView& v) {
    HostTensor h;
    h.view = v;
    h.view.device = Device{};
    h.bytes.resize(static_cast<size_t>(v.bytes()));
    h.view.data = h.bytes.data();
    copy(h.bytes.data(), v.data, h.bytes.size(), false);
    return h;
  }
  // dst <- src, same byte count (dst in this arena's memory).
  void set(const TensorView& dst, const HostTensor& src) {
    if (static_cast<size_t>(dst.bytes()) != src.bytes.size()) throw std::runtime_error("Arena::set: sizes differ");
    copy(dst.data, src.bytes.data(), src.bytes.size(), true);
  }
  // n bytes between the host and this arena's memory (to_arena: host -> arena), after the stream's work.
  void copy(void* dst, const void* src, size_t n, bool to_arena) {
    if (n == 0) return;
    if (device.type == DeviceType::cpu) {
      std::memcpy(dst, src, n);
    } else {
#if defined(MXMOE_WITH_CUDA)
      cuda_ok(cudaDeviceSynchronize());
      cuda_ok(cudaMemcpy(dst, src, n, to_arena ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost));
#endif
    }
  }
  // An i64 [E] table of the addresses of each [rows, cols] slice of a dense [E, rows, cols] tensor.
  TensorView pointer_table(const TensorView& dense) {
    const int64_t E = dense.shape[0], per = dense.shape[1] * dense.shape[2] * static_cast<int64_t>(dtype_size(dense.dtype));
    HostTensor t(DType::i64, {E});
    for (int64_t e = 0; e < E; ++e) t.ptr<int64_t>()[e] = reinterpret_cast<int64_t>(static_cast<char*>(dense.data) + e * per);
    return put(t);
  }
  ExpertMatrices experts(const TensorView& dense, bool per_expert) {
    ExpertMatrices m;
    m.dtype = dense.dtype;
    if (per_expert) m.pointers = pointer_table(dense);
    else m.dense = dense;
    return m;
  }
};

inline LayerOutputs run_layer(Context& ctx, Device device, const LayerData& d, const RunConfig& cfg = {}) {
  const Problem& p = d.problem;
  const int64_t T = d.tokens, H = p.hidden, F = p.ffn, E = p.experts;
  const bool per = p.weight_layout == WeightLayout::per_expert;
  Arena m{device, {}};
  ForwardArgs fa;
  fa.x = m.put(d.x);
  fa.offsets.offsets = m.put(d.offsets);
  fa.probs = m.put(d.probs);
  fa.w1 = m.experts(m.put(d.w1), per);
  fa.w2 = m.experts(m.put(d.w2), per);
  if (p.fc1_bias) fa.b1 = m.put(d.b1);
  if (p.fc2_bias) fa.b2 = m.put(d.b2);
  fa.y = m.poisoned(DType::bf16, {T, H});
  fa.prepared = cfg.prepared;
  if (cfg.prequantize_x) {
    const ScaleLayout l = ctx.options().scale_layout;
    fa.x_row = {m.poisoned(DType::e4m3, {T, H}), m.poisoned(DType::e8m0, {rowwise_scale_bytes(T, H)}), BlockAxis::row, l};
    fa.x_col = {m.poisoned(DType::e4m3, {T, H}), m.poisoned(DType::e8m0, {colwise_scale_bytes(T, H, E)}),
                BlockAxis::col, l};
    quantize_mxfp8(ctx, {.src = fa.x, .groups = fa.offsets, .rowwise = fa.x_row, .colwise = fa.x_col});
    fa.x = {};
  }
  ctx.clear_report();
  SavedState saved = forward(ctx, p, fa);
  LayerOutputs out;
  out.saved_bytes = saved.bytes();
  const TensorView c = saved.impl().c.view;
  out.c = m.get(c);
  if (cfg.saved_c != nullptr) m.set(c, *cfg.saved_c);

  BackwardArgs ba;
  ba.dy = m.put(d.dy);
  ba.dx = m.poisoned(DType::bf16, {T, H});
  ba.dprobs = m.poisoned(DType::f32, {T});
  auto grad = [&](const HostTensor* init, std::initializer_list<int64_t> shape) {
    if (init) return m.put(*init);
    return m.poisoned(cfg.grad_dtype, shape);
  };
  const LayerOutputs* gi = cfg.grads_in ? &*cfg.grads_in : nullptr;
  TensorView dw1 = grad(gi ? &gi->dw1 : nullptr, {E, 2 * F, H});
  TensorView dw2 = grad(gi ? &gi->dw2 : nullptr, {E, H, F});
  ba.grads.dw1 = m.experts(dw1, per);
  ba.grads.dw2 = m.experts(dw2, per);
  TensorView db1, db2;
  if (p.fc1_bias) ba.grads.db1 = db1 = grad(gi ? &gi->db1 : nullptr, {E, 2 * F});
  if (p.fc2_bias) ba.grads.db2 = db2 = grad(gi ? &gi->db2 : nullptr, {E, H});
  ba.grads.accumulate = cfg.accumulate;
  ba.wgrad = cfg.deferred_wgrad ? WgradMode::deferred : WgradMode::now;
  ba.prepared = cfg.prepared;
  WgradState pending = backward(ctx, saved, ba);
  if (cfg.deferred_wgrad) compute_wgrad(ctx, pending, ba.grads);

  out.y = m.get(fa.y);
  out.dx = m.get(ba.dx);
  out.dprobs = m.get(ba.dprobs);
  out.dw1 = m.get(dw1);
  out.dw2 = m.get(dw2);
  if (p.fc1_bias) out.db1 = m.get(db1);
  if (p.fc2_bias) out.db2 = m.get(db2);
  out.report = ctx.report();
  return out;
}

// Names and views of every output, for loops over "each output within tolerance".
inline std::vector<std::pair<const char*, const HostTensor*>> outputs_of(const LayerOutputs& o, const Problem& p) {
  std::vector<std::pair<const char*, const HostTensor*>> v = {
      {"y", &o.y}, {"dx", &o.dx}, {"dprobs", &o.dprobs}, {"dw1", &o.dw1}, {"dw2", &o.dw2}};
  if (p.fc1_bias) v.push_back({"db1", &o.db1});
  if (p.fc2_bias) v.push_back({"db2", &o.db2});
  return v;
}

}  // namespace mxmoe::test
