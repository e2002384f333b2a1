// One forward + backward of the layer on one device: allocate, upload, (warm up), poison the
// outputs, time each phase, download every output. The CLI may synchronize; the library does not.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "tools/mxmoe/cli.h"

#if defined(MXMOE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace mxmoe::cli {
namespace {

#if defined(MXMOE_WITH_CUDA)
void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw Error("cuda", std::string(what) + ": " + cudaGetErrorString(err));
}
#endif

// Host copies of model-size tensors (GBs for the sampled-row CPU check) in parallel.
void host_copy(void* dst, const void* src, size_t bytes) {
  constexpr size_t kChunk = size_t{16} << 20;
  const int64_t chunks = static_cast<int64_t>((bytes + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t i = 0; i < chunks; ++i) {
    const size_t begin = static_cast<size_t>(i) * kChunk;
    std::memcpy(static_cast<char*>(dst) + begin, static_cast<const char*>(src) + begin,
                std::min(kChunk, bytes - begin));
  }
}

// Memory on the run's device (host memory for the CPU).
class DeviceBuffer {
 public:
  DeviceBuffer(Device device, size_t bytes) : device_(device), bytes_(bytes) {
    const size_t n = bytes ? bytes : 1;
    if (device.type == DeviceType::cuda) {
#if defined(MXMOE_WITH_CUDA)
      cuda_check(cudaMalloc(&ptr_, n), "cudaMalloc");
#else
      throw Error("device", "this mxmoe was built without CUDA");
#endif
    } else {
      ptr_ = std::aligned_alloc(256, (n + 255) / 256 * 256);
      if (!ptr_) throw Error("host memory", "cannot allocate " + std::to_string(bytes) + " bytes");
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
#if defined(MXMOE_WITH_CUDA)
    if (device_.type == DeviceType::cuda) {
      cudaFree(ptr_);
      return;
    }
#endif
    std::free(ptr_);
  }
  char* data() const { return static_cast<char*>(ptr_); }
  void upload(const void* src, size_t bytes, size_t offset = 0) {
    if (bytes == 0) return;
#if defined(MXMOE_WITH_CUDA)
    if (device_.type == DeviceType::cuda) {
      cuda_check(cudaMemcpy(data() + offset, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
      return;
    }
#endif
    host_copy(data() + offset, src, bytes);
  }
  void download(void* dst, size_t bytes, size_t offset = 0) const {
    if (bytes == 0) return;
#if defined(MXMOE_WITH_CUDA)
    if (device_.type == DeviceType::cuda) {
      cuda_check(cudaMemcpy(dst, data() + offset, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
      return;
    }
#endif
    host_copy(dst, data() + offset, bytes);
  }
  // 0xFF bytes read as NaN in bf16 and f32: an output element the library leaves unwritten fails.
  void poison() {
#if defined(MXMOE_WITH_CUDA)
    if (device_.type == DeviceType::cuda) {
      cuda_check(cudaMemset(ptr_, 0xFF, bytes_), "cudaMemset");
      return;
    }
#endif
    std::memset(ptr_, 0xFF, bytes_);
  }

 private:
  Device device_;
  size_t bytes_;
  void* ptr_ = nullptr;
};

void synchronize(Device d) {
#if defined(MXMOE_WITH_CUDA)
  if (d.type == DeviceType::cuda) cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#endif
}

// E matrices of [rows, cols]: dense, or per-expert with expert e stored in slot E-1-e of one buffer,
// so a backend that ignored the pointer table would read the wrong expert and fail the checks.
struct ExpertBuffer {
  ExpertBuffer(Device d, int64_t experts, int64_t rows, int64_t cols, DType t, bool per_expert)
      : experts(experts),
        matrix_bytes(static_cast<size_t>(rows * cols) * dtype_size(t)),
        per_expert(per_expert),
        buf(d, matrix_bytes * experts),
        table(d, per_expert ? sizeof(int64_t) * experts : 0) {
    view.dtype = t;
    if (per_expert) {
      std::vector<int64_t> addresses(static_cast<size_t>(experts));
      for (int64_t e = 0; e < experts; ++e) addresses[e] = reinterpret_cast<int64_t>(buf.data() + offset(e));
      table.upload(addresses.data(), addresses.size() * sizeof(int64_t));
      view.pointers = TensorView::of(table.data(), DType::i64, {experts}, d);
    } else {
      view.dense = TensorView::of(buf.data(), t, {experts, rows, cols}, d);
    }
  }
  size_t offset(int64_t e) const { return matrix_bytes * static_cast<size_t>(per_expert ? experts - 1 - e : e); }
  void upload(const void* src) {
    for (int64_t e = 0; e < experts; ++e)
      buf.upload(static_cast<const char*>(src) + matrix_bytes * e, matrix_bytes, offset(e));
  }
  void download(void* dst) const {
    for (int64_t e = 0; e < experts; ++e)
      buf.download(static_cast<char*>(dst) + matrix_bytes * e, matrix_bytes, offset(e));
  }
  int64_t experts;
  size_t matrix_bytes;
  bool per_expert;
  DeviceBuffer buf, table;
  ExpertMatrices view;
};

// Forward is about a third of a layer's work, backward two thirds (forward_flops, backward_flops).
void progress(const RunSettings& s, const char* phase, double share = 0) {
  if (!s.label.empty()) cli::progress(s.label + ": " + phase, s.estimate_s * share);
}

}  // namespace

LayerResult run_layer(const LayerData& data, const RunSettings& s) {
  const Problem& p = data.problem;
  const Device d = s.device;
  const int64_t T = data.tokens, H = p.hidden, F = p.ffn, E = p.experts;
  const bool per_expert = p.weight_layout == WeightLayout::per_expert;
  progress(s, "upload");

  DeviceBuffer x(d, data.x.size() * 2), dy(d, data.dy.size() * 2), probs(d, data.probs.size() * 4),
      offsets(d, data.offsets.size() * 4), b1(d, data.b1->size() * 2), b2(d, data.b2->size() * 2);
  ExpertBuffer w1(d, E, 2 * F, H, DType::bf16, per_expert), w2(d, E, H, F, DType::bf16, per_expert);
  x.upload(data.x.data(), data.x.size() * 2);
  dy.upload(data.dy.data(), data.dy.size() * 2);
  probs.upload(data.probs.data(), data.probs.size() * 4);
  offsets.upload(data.offsets.data(), data.offsets.size() * 4);
  b1.upload(data.b1->data(), data.b1->size() * 2);
  b2.upload(data.b2->data(), data.b2->size() * 2);
  w1.upload(data.w1->data());
  w2.upload(data.w2->data());

  DeviceBuffer y(d, T * H * 2), dx(d, T * H * 2), dprobs(d, T * 4), db1(d, p.fc1_bias ? E * 2 * F * 4 : 0),
      db2(d, p.fc2_bias ? E * H * 4 : 0);
  ExpertBuffer dw1(d, E, 2 * F, H, DType::f32, per_expert), dw2(d, E, H, F, DType::f32, per_expert);

  ForwardArgs fa;
  fa.x = TensorView::of(x.data(), DType::bf16, {T, H}, d);
  fa.offsets.offsets = TensorView::of(offsets.data(), DType::i32, {E + 1}, d);
  fa.probs = TensorView::of(probs.data(), DType::f32, {T}, d);
  fa.w1 = w1.view;
  fa.w2 = w2.view;
  if (p.fc1_bias) fa.b1 = TensorView::of(b1.data(), DType::bf16, {E, 2 * F}, d);
  if (p.fc2_bias) fa.b2 = TensorView::of(b2.data(), DType::bf16, {E, H}, d);
  fa.y = TensorView::of(y.data(), DType::bf16, {T, H}, d);
  BackwardArgs ba;
  ba.dy = TensorView::of(dy.data(), DType::bf16, {T, H}, d);
  ba.dx = TensorView::of(dx.data(), DType::bf16, {T, H}, d);
  ba.dprobs = TensorView::of(dprobs.data(), DType::f32, {T}, d);
  ba.grads.dw1 = dw1.view;
  ba.grads.dw2 = dw2.view;
  if (p.fc1_bias) ba.grads.db1 = TensorView::of(db1.data(), DType::f32, {E, 2 * F}, d);
  if (p.fc2_bias) ba.grads.db2 = TensorView::of(db2.data(), DType::f32, {E, H}, d);
  ba.grads.accumulate = false;
  ba.wgrad = WgradMode::now;

  Context ctx(s.options);
  if (s.warmup) {
    progress(s, "warm-up");
    SavedState saved = forward(ctx, p, fa);
    backward(ctx, saved, ba);
    synchronize(d);
  }
  for (DeviceBuffer* out : {&y, &dx, &dprobs, &db1, &db2, &dw1.buf, &dw2.buf}) out->poison();
  synchronize(d);
  ctx.clear_report();

  LayerResult r;
  using Clock = std::chrono::steady_clock;
  progress(s, "forward", 1.0 / 3);
  const auto t0 = Clock::now();
  SavedState saved = forward(ctx, p, fa);
  synchronize(d);
  const auto t1 = Clock::now();
  r.saved_bytes = saved.bytes();
  progress(s, "backward", 2.0 / 3);
  const auto t2 = Clock::now();
  backward(ctx, saved, ba);
  synchronize(d);
  const auto t3 = Clock::now();
  r.forward_s = std::chrono::duration<double>(t1 - t0).count();
  r.backward_s = std::chrono::duration<double>(t3 - t2).count();
  r.steps = ctx.report();

  progress(s, "download");
  r.y.resize(static_cast<size_t>(T * H));
  r.dx.resize(static_cast<size_t>(T * H));
  r.dprobs.resize(static_cast<size_t>(T));
  r.dw1.resize(static_cast<size_t>(E * 2 * F * H));
  r.dw2.resize(static_cast<size_t>(E * H * F));
  y.download(r.y.data(), r.y.size() * 2);
  dx.download(r.dx.data(), r.dx.size() * 2);
  dprobs.download(r.dprobs.data(), r.dprobs.size() * 4);
  dw1.download(r.dw1.data());
  dw2.download(r.dw2.data());
  if (p.fc1_bias) {
    r.db1.resize(static_cast<size_t>(E * 2 * F));
    db1.download(r.db1.data(), r.db1.size() * 4);
  }
  if (p.fc2_bias) {
    r.db2.resize(static_cast<size_t>(E * H));
    db2.download(r.db2.data(), r.db2.size() * 4);
  }
  return r;
}

}  // namespace mxmoe::cli
