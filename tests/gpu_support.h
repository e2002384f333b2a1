// GPU test helpers: skip without a GPU, device copies of host tensors. Compiles without CUDA
// (every GPU test then reports SKIPPED with the reason).
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "tests/support.h"

#if defined(MXMOE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace mxmoe::test {

// Empty when a GPU test can run here; else the reason it cannot.
inline std::string gpu_unavailable_reason() {
#if defined(MXMOE_WITH_CUDA)
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return "no CUDA GPU on this machine";
  return "";
#else
  return "mxmoe was built without CUDA";
#endif
}

#define MXMOE_REQUIRE_GPU()                                              \
  do {                                                                   \
    const std::string why_ = ::mxmoe::test::gpu_unavailable_reason();    \
    if (!why_.empty()) GTEST_SKIP() << "GPU test skipped: " << why_;     \
  } while (0)

#if defined(MXMOE_WITH_CUDA)
inline void cuda_ok(cudaError_t e) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA: ") + cudaGetErrorString(e));
}

// Device copy of a HostTensor with the same dtype and shape; freed on destruction.
struct DeviceTensor {
  void* ptr = nullptr;
  TensorView view;
  DeviceTensor() = default;
  explicit DeviceTensor(const HostTensor& h) : DeviceTensor(h.view) {
    cuda_ok(cudaMemcpy(ptr, h.bytes.data(), h.bytes.size(), cudaMemcpyHostToDevice));
  }
  explicit DeviceTensor(const TensorView& like) {
    view = like;
    cuda_ok(cudaMalloc(&ptr, static_cast<size_t>(std::max<int64_t>(like.bytes(), 1))));
    view.data = ptr;
    view.device = Device{DeviceType::cuda, 0};
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  DeviceTensor(DeviceTensor&& o) noexcept : ptr(o.ptr), view(o.view) { o.ptr = nullptr; }
  ~DeviceTensor() {
    if (ptr) cudaFree(ptr);
  }
  // Synchronous: cudaMemset runs on the legacy stream, which does not order against the
  // non-blocking streams the tests launch on.
  void poison(int byte = 0xA5) {
    cuda_ok(cudaMemset(ptr, byte, static_cast<size_t>(view.bytes())));
    cuda_ok(cudaDeviceSynchronize());
  }
  void upload(const HostTensor& h) {
    cuda_ok(cudaMemcpy(ptr, h.bytes.data(), h.bytes.size(), cudaMemcpyHostToDevice));
  }
  HostTensor download() const {
    HostTensor h;
    h.view = view;
    h.view.device = Device{};
    h.bytes.resize(static_cast<size_t>(view.bytes()));
    h.view.data = h.bytes.data();
    cuda_ok(cudaMemcpy(h.bytes.data(), ptr, h.bytes.size(), cudaMemcpyDeviceToHost));
    return h;
  }
};
#endif

}  // namespace mxmoe::test
