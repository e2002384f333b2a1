// Cached device facts for the CUDA backends' probes, and the device queries of mxmoe/context.h.
#include "src/cuda/common/device_facts.h"

#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <vector>

#include "mxmoe/context.h"

namespace mxmoe {
namespace cuda {

const DeviceFacts& device_facts(int index) {
  static std::mutex mu;
  static std::vector<std::unique_ptr<DeviceFacts>> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (index < 0) {
    static const DeviceFacts bad{.device = {DeviceType::cuda, index}, .problem = "negative device index"};
    return bad;
  }
  if (cache.size() <= static_cast<size_t>(index)) cache.resize(index + 1);
  if (!cache[index]) {
    auto f = std::make_unique<DeviceFacts>();
    f->device = {DeviceType::cuda, index};
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

}  // namespace cuda

const detail::DeviceFacts& detail::cuda_device_facts(int index) { return cuda::device_facts(index); }

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
