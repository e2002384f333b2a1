// GPU test helpers: suites parameterised over the device backends (each case skipped, with the
// probe's reason, where its backend cannot run), skip without a GPU, device copies of host
// tensors. Compiles without CUDA (every GPU test then reports SKIPPED with the reason).
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "src/dispatch/backend.h"
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

inline constexpr Device kGpu0{DeviceType::cuda, 0};

// The backends the GPU suites run over: every registered backend that does not take host data, in
// preference order ("cuda_sm90", "cuda_portable"), so a new device backend inherits every suite just
// by registering.
inline std::vector<std::string> gpu_backend_names() {
  std::vector<std::string> names;
  for (detail::Backend* b : detail::backends())
    if (!b->probe_device(Device{}).available) names.emplace_back(b->name());
  return names;
}

// Empty when backend `name` can run on cuda:0 here; else why not (its probe's reason).
inline std::string backend_unavailable_reason(const std::string& name) {
  if (std::string why = gpu_unavailable_reason(); !why.empty()) return why;
  detail::Backend* b = detail::find_backend(name);
  if (b == nullptr) return name + " is not registered";
  const detail::Probe p = b->probe_device(kGpu0);
  return p.available ? "" : name + " is unavailable: " + p.reason;
}

// A suite run once per device backend (MXMOE_GPU_BACKEND_SUITE); a backend that cannot run on this
// machine or build skips every test with its reason.
class GpuBackendTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string why = backend_unavailable_reason(GetParam());
    if (!why.empty()) GTEST_SKIP() << "GPU test skipped: " << why;
  }
  const std::string& backend_name() const { return GetParam(); }
  detail::Backend& backend() const { return *detail::find_backend(GetParam()); }
};

// Instantiates `Suite` (a GpuBackendTest) for every device backend; test names end in /<backend>.
#define MXMOE_GPU_BACKEND_SUITE(Suite)                                                           \
  INSTANTIATE_TEST_SUITE_P(Backends, Suite, testing::ValuesIn(::mxmoe::test::gpu_backend_names()), \
                           [](const testing::TestParamInfo<std::string>& info) { return info.param; })

// In a void test helper: when `backend` does not take step `query` (a case outside what it serves),
// skip the case with the reason and return; the test's other cases still run, and the test reports
// SKIPPED unless one of them fails.
#define MXMOE_SKIP_UNLESS_SERVED(backend, query)                                                       \
  do {                                                                                                 \
    const ::mxmoe::detail::Probe served_ = (backend).probe(query);                                     \
    if (!served_.available)                                                                            \
      GTEST_SKIP() << "GPU test skipped: " << (backend).name() << " does not serve this "              \
                   << ::mxmoe::detail::to_string((query).step) << " case: " << served_.reason;          \
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
