// cuda_sm100's self-check (sm100_ops.h): the kernels have never run on Blackwell hardware in this
// project, so before the backend serves a step on a device it runs one small fixed MXFP8 problem
// through every sm100 kernel and through cuda_portable, and compares the outputs point by point
// (probe.h: tolerance, verdict). Groups of 37, 0, 200, 1 and 91 rows (tails, an empty group, a
// group over two 128-row tiles), K = 160 (five scale blocks, not a multiple of 128), N = 208; the
// scales in both layouts, every scale byte random (a misread byte is a power of two off); outputs
// NaN-poisoned, the beta-1 wgrad on a random start.
//
// It runs on a stream of its own with the thread's capture mode relaxed, so a first use inside a
// caller's CUDA-graph capture does not break the capture; a device fault in it (a kernel that
// misbehaves on hardware) is sticky for the process and reported as its reason.
#if defined(MXMOE_WITH_SM100)
#include <cuda_runtime.h>

#include <cstdint>
#include <exception>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "mxmoe/numerics.h"
#include "src/cuda/common/check.h"
#include "src/cuda/sm100/probe.h"
#include "src/cuda/sm100/sm100_ops.h"

namespace mxmoe::cuda::sm100 {
namespace {

const std::vector<int32_t> kGroupRows = {37, 0, 200, 1, 91};
constexpr int64_t kK = 160;  // GEMM K of fprop / dgrad, and M of wgrad
constexpr int64_t kN = 208;

// Deterministic bytes (a 64-bit LCG): the problem is the same on every run and device.
class Bytes {
 public:
  uint8_t next() {
    state_ = state_ * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<uint8_t>(state_ >> 56);
  }
  // E4M3 without NaN (0x7f / 0xff) and below 2^4 in magnitude, either sign.
  std::vector<uint8_t> e4m3(int64_t count) {
    std::vector<uint8_t> v(static_cast<size_t>(count));
    for (uint8_t& b : v) {
      const uint8_t sign = next() & 0x80;  // drawn first: the operands of | are unsequenced
      b = static_cast<uint8_t>(sign | (next() % 0x58));
    }
    return v;
  }
  // E8M0 exponents 2^-7 .. 2^7 in every byte, padding included.
  std::vector<uint8_t> e8m0(int64_t count) {
    std::vector<uint8_t> v(static_cast<size_t>(count));
    for (uint8_t& b : v) b = static_cast<uint8_t>(120 + next() % 15);
    return v;
  }

 private:
  uint64_t state_ = 0x5eed5eed5eed5eedULL;
};

// Device memory on the check's stream, released on the same stream.
class DeviceBuffer {
 public:
  DeviceBuffer(int64_t bytes, cudaStream_t stream) : bytes_(bytes), stream_(stream) {
    MXMOE_CUDA_CHECK(cudaMallocAsync(&ptr_, static_cast<size_t>(bytes > 0 ? bytes : 1), stream));
  }
  ~DeviceBuffer() { cudaFreeAsync(ptr_, stream_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  void upload(const std::vector<T>& h) {
    MXMOE_CUDA_CHECK(cudaMemcpyAsync(ptr_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, stream_));
  }
  void poison() { MXMOE_CUDA_CHECK(cudaMemsetAsync(ptr_, 0xff, static_cast<size_t>(bytes_), stream_)); }
  template <class T>
  std::vector<T> download() const {
    std::vector<T> h(static_cast<size_t>(bytes_) / sizeof(T));
    MXMOE_CUDA_CHECK(cudaMemcpyAsync(h.data(), ptr_, h.size() * sizeof(T), cudaMemcpyDeviceToHost, stream_));
    MXMOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return h;
  }
  TensorView view(DType dt, std::initializer_list<int64_t> shape, int device) const {
    return TensorView::of(ptr_, dt, shape, Device{DeviceType::cuda, device});
  }

 private:
  void* ptr_ = nullptr;
  int64_t bytes_;
  cudaStream_t stream_;
};

// The calling thread's device and capture mode, set for the check and put back afterwards.
class CheckScope {
 public:
  explicit CheckScope(int device) {
    MXMOE_CUDA_CHECK(cudaGetDevice(&old_device_));
    MXMOE_CUDA_CHECK(cudaSetDevice(device));
    MXMOE_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode_));
    MXMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  ~CheckScope() {
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
    cudaThreadExchangeStreamCaptureMode(&mode_);
    cudaSetDevice(old_device_);
  }
  cudaStream_t stream = nullptr;

 private:
  int old_device_ = 0;
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

std::vector<float> floats_of_bf16(const std::vector<uint16_t>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = f32_from_bf16(v[i]);
  return f;
}

std::string group_of_row(const std::vector<int32_t>& offsets, int64_t row) {
  size_t e = 0;
  while (e + 1 < offsets.size() && offsets[e + 1] <= row) ++e;
  return std::to_string(e);
}

std::vector<Comparison> run_problem(int device, cudaStream_t stream) {
  const int64_t experts = static_cast<int64_t>(kGroupRows.size());
  std::vector<int32_t> offsets_h(1, 0);
  for (int32_t m : kGroupRows) offsets_h.push_back(offsets_h.back() + m);
  const int64_t t = offsets_h.back();
  Bytes rnd;
  auto dev = [&](const std::vector<uint8_t>& h) {
    auto b = std::make_unique<DeviceBuffer>(static_cast<int64_t>(h.size()), stream);
    b->upload(h);
    return b;
  };
  DeviceBuffer offsets(static_cast<int64_t>(offsets_h.size() * sizeof(int32_t)), stream);
  offsets.upload(offsets_h);
  const GroupOffsets groups{offsets.view(DType::i32, {experts + 1}, device)};

  // A [T, K] with row-wise scales (compact) and column-wise scales (swizzled, the wgrad's A).
  auto a = dev(rnd.e4m3(t * kK));
  auto a_row = dev(rnd.e8m0(rowwise_scale_bytes(t, kK)));
  auto a_col = dev(rnd.e8m0(colwise_scale_bytes(t, kK, experts)));
  // fprop weights [E, N, K] row-wise (swizzled); dgrad weights [E, K, N] column-wise (compact).
  auto w_nk = dev(rnd.e4m3(experts * kN * kK));
  auto w_nk_s = dev(rnd.e8m0(experts * rowwise_scale_bytes(kN, kK)));
  auto w_kn = dev(rnd.e4m3(experts * kK * kN));
  auto w_kn_s = dev(rnd.e8m0(experts * colwise_matrix_scale_bytes(kK, kN)));
  // The wgrad's B [T, N] with column-wise scales (compact).
  auto x = dev(rnd.e4m3(t * kN));
  auto x_col = dev(rnd.e8m0(colwise_scale_bytes(t, kN, experts)));
  auto mx = [&](const DeviceBuffer& data, const DeviceBuffer& scales, int64_t rows, int64_t cols, int64_t scale_bytes,
                BlockAxis axis, ScaleLayout layout) {
    return Mxfp8View{data.view(DType::e4m3, {rows, cols}, device), scales.view(DType::e8m0, {scale_bytes}, device),
                     axis, layout};
  };
  auto weights = [&](const DeviceBuffer& data, const DeviceBuffer& scales, int64_t rows, int64_t cols,
                     int64_t scale_bytes, ScaleLayout layout) {
    ExpertOperand b;
    b.data.dense = data.view(DType::e4m3, {experts, rows, cols}, device);
    b.data.dtype = DType::e4m3;
    b.scales.dense = scales.view(DType::e8m0, {experts, scale_bytes}, device);
    b.scales.dtype = DType::e8m0;
    b.layout = layout;
    return b;
  };

  Context ctx(Options{.stream = stream});
  detail::Backend* portable = detail::cuda_portable_backend();
  std::vector<Comparison> results;
  auto where_row = [&](int64_t i) {
    return "row " + std::to_string(i / kN) + " (group " + group_of_row(offsets_h, i / kN) + ") col " +
           std::to_string(i % kN);
  };

  // m-grouped: fprop (B_e [N, K]) and dgrad (B_e [K, N]).
  struct MCase {
    const char* what;
    bool b_kn;
  };
  for (const MCase& c : {MCase{"fprop", false}, MCase{"dgrad (B_e [K, N])", true}}) {
    DeviceBuffer d_sm100(t * kN * 2, stream), d_portable(t * kN * 2, stream);
    d_sm100.poison();
    d_portable.poison();
    detail::MGemmStep s;
    s.gemm.a.mx = mx(*a, *a_row, t, kK, rowwise_scale_bytes(t, kK), BlockAxis::row, ScaleLayout::compact);
    s.gemm.offsets = groups;
    s.gemm.b = c.b_kn ? weights(*w_kn, *w_kn_s, kK, kN, colwise_matrix_scale_bytes(kK, kN), ScaleLayout::compact)
                      : weights(*w_nk, *w_nk_s, kN, kK, rowwise_scale_bytes(kN, kK), ScaleLayout::swizzled);
    s.gemm.b_kn = c.b_kn;
    s.epilogue = detail::Epilogue::store;
    s.gemm.d = d_portable.view(DType::bf16, {t, kN}, device);
    portable->gemm_m(ctx, s, detail::StepPlan{});
    s.gemm.d = d_sm100.view(DType::bf16, {t, kN}, device);
    gemm_m(s, stream);
    results.push_back(compare_points(c.what, floats_of_bf16(d_sm100.download<uint16_t>()),
                                     floats_of_bf16(d_portable.download<uint16_t>()), where_row));
  }

  // k-grouped: D_e [K, N] = A_e^T X_e, beta 0 (NaN-poisoned start: the empty group must come out 0)
  // and beta 1 (a random start: the empty group must keep it).
  std::vector<float> start(static_cast<size_t>(experts * kK * kN));
  for (float& v : start) v = static_cast<float>(rnd.next()) / 64.0f - 2.0f;
  auto where_group = [&](int64_t i) {
    return "group " + std::to_string(i / (kK * kN)) + " row " + std::to_string(i / kN % kK) + " col " +
           std::to_string(i % kN);
  };
  for (const bool accumulate : {false, true}) {
    DeviceBuffer d_sm100(experts * kK * kN * 4, stream), d_portable(experts * kK * kN * 4, stream);
    if (accumulate) {
      d_sm100.upload(start);
      d_portable.upload(start);
    } else {
      d_sm100.poison();
      d_portable.poison();
    }
    KGroupedGemmArgs k;
    k.a.mx = mx(*a, *a_col, t, kK, colwise_scale_bytes(t, kK, experts), BlockAxis::col, ScaleLayout::swizzled);
    k.b.mx = mx(*x, *x_col, t, kN, colwise_scale_bytes(t, kN, experts), BlockAxis::col, ScaleLayout::compact);
    k.offsets = groups;
    k.accumulate = accumulate;
    k.d.dense = d_portable.view(DType::f32, {experts, kK, kN}, device);
    portable->gemm_k(ctx, k, detail::StepPlan{});
    k.d.dense = d_sm100.view(DType::f32, {experts, kK, kN}, device);
    gemm_k(k, stream);
    results.push_back(compare_points(accumulate ? "wgrad (beta 1)" : "wgrad (beta 0)", d_sm100.download<float>(),
                                     d_portable.download<float>(), where_group));
  }
  return results;
}

}  // namespace

detail::Probe run_self_check(int device) {
  try {
    CheckScope scope(device);
    const std::vector<Comparison> results = run_problem(device, scope.stream);
    MXMOE_CUDA_CHECK(cudaStreamSynchronize(scope.stream));
    return self_check_verdict(results);
  } catch (const std::exception& e) {
    cudaGetLastError();
    return {false, std::string("self-check against cuda_portable could not run: ") + e.what()};
  }
}

}  // namespace mxmoe::cuda::sm100
#endif
