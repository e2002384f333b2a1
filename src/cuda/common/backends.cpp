// The CUDA backends' registry entries and probes. cuda_portable serves every step on any GPU from
// sm_80; cuda_sm90 (the Hopper fast path) reports itself unavailable until its kernels exist, so
// the chain falls through to cuda_portable with the reason in every report.
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <vector>
#include <string>

#include "src/cuda/common/check.h"
#include "src/cuda/cuda_ops.h"

namespace mxmoe {
namespace cuda {
std::string kernel_image_problem(int device);  // probe.cu

namespace {

struct DeviceFacts {
  bool ok = false;
  std::string problem;
  int major = 0, minor = 0;
  std::string name;
};

// Device facts, read once per device index (probing must be cheap: it runs for every step).
const DeviceFacts& facts(int index) {
  static std::mutex mu;
  static std::vector<std::unique_ptr<DeviceFacts>> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (index < 0) {
    static DeviceFacts bad{false, "negative device index", 0, 0, ""};
    return bad;
  }
  if (cache.size() <= static_cast<size_t>(index)) cache.resize(index + 1);
  if (!cache[index]) {
    auto f = std::make_unique<DeviceFacts>();
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      cudaGetLastError();
      f->problem = std::string("no usable CUDA driver/GPU: ") + cudaGetErrorString(err);
    } else if (index >= n) {
      f->problem = "device cuda:" + std::to_string(index) + " does not exist (" + std::to_string(n) + " GPUs)";
    } else {
      cudaDeviceProp prop{};
      cudaGetDeviceProperties(&prop, index);
      f->major = prop.major;
      f->minor = prop.minor;
      f->name = prop.name;
      f->problem = kernel_image_problem(index);
      f->ok = f->problem.empty();
    }
    cache[index] = std::move(f);
  }
  return *cache[index];
}

std::string cc(const DeviceFacts& f) { return "sm_" + std::to_string(f.major) + std::to_string(f.minor); }

class CudaPortableBackend final : public detail::Backend {
 public:
  const char* name() const override { return "cuda_portable"; }
  detail::Probe probe_device(Device d) const override {
    if (d.type != DeviceType::cuda) return {false, "data is in host memory"};
    const DeviceFacts& f = facts(d.index);
    if (!f.ok) return {false, f.problem};
    if (f.major < 8) return {false, f.name + " is " + cc(f) + "; cuda_portable needs sm_80 or newer"};
    return {true, f.name + " (" + cc(f) + "), mma.sync bf16 kernels"};
  }
  detail::Probe probe(const detail::StepQuery&) const override { return {true, ""}; }
  void quantize(Context& c, const QuantizeArgs& a) override { cuda::quantize(a, c.options().stream); }
  void dequantize(Context& c, const DequantizeArgs& a) override { cuda::dequantize(a, c.options().stream); }
  void quantize_experts(Context& c, const detail::QuantizeExpertsStep& s) override {
    cuda::quantize_experts(s, c.options().stream);
  }
  void gemm_m(Context& c, const detail::MGemmStep& s) override { portable::gemm_m(s, c.options().stream); }
  void gemm_k(Context& c, const KGroupedGemmArgs& a) override { portable::gemm_k(a, c.options().stream); }
  void fc2_bias_grads(Context& c, const detail::Fc2BiasGradStep& s) override {
    portable::fc2_bias_grads(s, c.options().stream);
  }
};

// The Hopper fast path is registered ahead of cuda_portable so dispatch always asks it first;
// until its kernels land it answers "unavailable" with the reason and never throws.
class CudaSm90Backend final : public detail::Backend {
 public:
  const char* name() const override { return "cuda_sm90"; }
  detail::Probe probe_device(Device d) const override {
    if (d.type != DeviceType::cuda) return {false, "data is in host memory"};
    const DeviceFacts& f = facts(d.index);
    if (!f.ok) return {false, f.problem};
    if (f.major != 9) return {false, f.name + " is " + cc(f) + "; cuda_sm90 needs sm_90"};
    return {false, "Hopper wgmma/TMA kernels are not in this build yet"};
  }
  detail::Probe probe(const detail::StepQuery&) const override { return {false, "not implemented"}; }
  [[noreturn]] void unreachable() const { throw Error("backend", "cuda_sm90 has no kernels in this build"); }
  void quantize(Context&, const QuantizeArgs&) override { unreachable(); }
  void dequantize(Context&, const DequantizeArgs&) override { unreachable(); }
  void quantize_experts(Context&, const detail::QuantizeExpertsStep&) override { unreachable(); }
  void gemm_m(Context&, const detail::MGemmStep&) override { unreachable(); }
  void gemm_k(Context&, const KGroupedGemmArgs&) override { unreachable(); }
  void fc2_bias_grads(Context&, const detail::Fc2BiasGradStep&) override { unreachable(); }
};

}  // namespace
}  // namespace cuda

namespace detail {
Backend* cuda_portable_backend() {
  static cuda::CudaPortableBackend b;
  return &b;
}
Backend* cuda_sm90_backend() {
  static cuda::CudaSm90Backend b;
  return &b;
}
}  // namespace detail

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string cuda_device_description(int index) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, index) != cudaSuccess) {
    cudaGetLastError();
    return "unavailable";
  }
  return std::string(p.name) + ", sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
         std::to_string(p.multiProcessorCount) + " SMs, " + std::to_string(p.totalGlobalMem >> 20) + " MiB, L2 " +
         std::to_string(p.l2CacheSize >> 20) + " MiB";
}

}  // namespace mxmoe
