// GPU test helpers: suites parameterised over the device backends (each case skipped, with the
// probe's reason, where its backend cannot run), skip without a GPU, device copies of host
// tensors. Compiles without CUDA (every GPU test then reports SKIPPED with the reason).
#pragma once
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "src/api/layer_steps.h"
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

// The configuration the step helpers below run GEMM steps in on the backend under test (empty: the
// backend's own plan), set for a scope: the test-side twin of Options::overrides for steps run on
// one backend directly. A name the backend does not have, or one that cannot run the step, fails
// the step with the backend's Error.
inline std::string& step_config() {
  static std::string config;
  return config;
}
class ScopedStepConfig {
 public:
  explicit ScopedStepConfig(std::string config) : old_(step_config()) { step_config() = std::move(config); }
  ~ScopedStepConfig() { step_config() = old_; }
  ScopedStepConfig(const ScopedStepConfig&) = delete;
  ScopedStepConfig& operator=(const ScopedStepConfig&) = delete;

 private:
  std::string old_;
};

// The backends the GPU suites run over: every registered backend that does not take host data, in
// preference order ("cuda_sm100", "cuda_sm90", "cuda_portable"), so a new device backend inherits every suite just
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

// Cases of the running test that the backend served and refused (MXMOE_SKIP_UNLESS_SERVED).
struct CaseTally {
  int served = 0, refused = 0;
  std::string first_reason;
};
inline CaseTally& case_tally() {
  static CaseTally t;
  return t;
}

// A suite run once per device backend (MXMOE_GPU_BACKEND_SUITE); a backend that cannot run on this
// machine or build skips every test with its reason. A test whose every case the backend refused
// reports SKIPPED with the first refusal; one that ran some cases reports their outcome (the refused
// ones are NOTE lines in its log).
class GpuBackendTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    case_tally() = CaseTally{};
    const std::string why = backend_unavailable_reason(GetParam());
    if (!why.empty()) GTEST_SKIP() << "GPU test skipped: " << why;
  }
  void TearDown() override {
    const CaseTally& t = case_tally();
    if (t.served == 0 && t.refused > 0 && !HasFailure())
      GTEST_SKIP() << "GPU test skipped: " << GetParam() << " serves none of this test's cases: " << t.first_reason;
  }
  const std::string& backend_name() const { return GetParam(); }
  detail::Backend& backend() const { return *detail::find_backend(GetParam()); }
};

// Instantiates `Suite` (a GpuBackendTest) for every device backend; test names end in /<backend>.
#define MXMOE_GPU_BACKEND_SUITE(Suite)                                                           \
  INSTANTIATE_TEST_SUITE_P(Backends, Suite, testing::ValuesIn(::mxmoe::test::gpu_backend_names()), \
                           [](const testing::TestParamInfo<std::string>& info) { return info.param; })

// What `b`'s probe answers for a step, asked as dispatch asks it: GEMM steps travel with the query,
// so a backend that takes only some shapes, layouts or outputs can judge this one.
inline detail::Probe probe_step(detail::Backend& b, detail::StepQuery q, const detail::MGemmStep& s) {
  q.gemm_m = &s;
  return b.probe(q);
}
inline detail::Probe probe_step(detail::Backend& b, detail::StepQuery q, const KGroupedGemmArgs& a) {
  q.gemm_k = &a;
  return b.probe(q);
}
inline detail::Probe probe_step(detail::Backend& b, const detail::LayerStep& st) {
  detail::StepQuery q = st.query;
  q.gemm_m = std::get_if<detail::MGemmStep>(&st.args);
  q.gemm_k = std::get_if<KGroupedGemmArgs>(&st.args);
  return b.probe(q);
}

// A GEMM step run on backend b directly, as planned there in step_config().
inline void run_gemm_m(Context& ctx, detail::Backend& b, detail::StepQuery q, const detail::MGemmStep& s) {
  q.gemm_m = &s;
  b.gemm_m(ctx, s, b.plan(q, step_config()));
}
inline void run_gemm_k(Context& ctx, detail::Backend& b, detail::StepQuery q, const KGroupedGemmArgs& a) {
  q.gemm_k = &a;
  b.gemm_k(ctx, a, b.plan(q, step_config()));
}
inline void run_on(Context& ctx, detail::Backend& b, const detail::LayerStep& st) {
  detail::StepQuery q = st.query;
  q.gemm_m = std::get_if<detail::MGemmStep>(&st.args);
  q.gemm_k = std::get_if<KGroupedGemmArgs>(&st.args);
  detail::run(ctx, detail::Choice{&b, b.plan(q, q.gemm_m || q.gemm_k ? step_config() : "")}, st);
}
// The configurations of cuda_sm90's m-grouped steps a test runs besides the backend's own choice
// (other backends: the choice alone).
inline std::vector<std::string> configs_of(const detail::Backend& b, std::vector<std::string> sm90) {
  std::vector<std::string> all{""};
  if (std::string(b.name()) == "cuda_sm90") all.insert(all.end(), sm90.begin(), sm90.end());
  return all;
}

// A variant of a case (per-expert pointers, a second layout) that the backend refuses is not run
// on it (dispatch would send it elsewhere); say so in the log.
inline void note_refused(const detail::Backend& b, const char* what, const detail::Probe& p) {
  std::printf("[   NOTE   ] %s does not serve %s: %s\n", b.name(), what, p.reason.c_str());
}

// In a void test helper: when the backend's probe answer `probe` refuses the case, note it with the
// reason and return (dispatch would run the case elsewhere); the test's other cases still run, and
// GpuBackendTest reports the test SKIPPED only when no case at all was served.
#define MXMOE_SKIP_UNLESS_SERVED(backend, probe)                                                      \
  do {                                                                                                \
    const ::mxmoe::detail::Probe served_ = (probe);                                                   \
    ::mxmoe::test::CaseTally& tally_ = ::mxmoe::test::case_tally();                                   \
    if (!served_.available) {                                                                         \
      if (tally_.refused++ == 0) tally_.first_reason = served_.reason;                                \
      std::printf("[   NOTE   ] %s does not serve this case: %s\n", (backend).name(), served_.reason.c_str()); \
      return;                                                                                         \
    }                                                                                                 \
    ++tally_.served;                                                                                  \
  } while (0)

// Options that make device backend `name` the first choice: the device backends ahead of it in the
// registry are denied, and a step it refuses falls back down the chain as in production (the
// report says which backend ran each step). The layer suites run this way: a backend may serve
// only some steps.
inline Options prefer_backend(const std::string& name, void* stream = nullptr) {
  Options o;
  o.stream = stream;
  for (const std::string& other : gpu_backend_names()) {
    if (other == name) break;
    o.deny.push_back(other);
  }
  return o;
}

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

// `run` captured once on `stream` into a CUDA graph, then replayed in two rounds on inputs b and a in
// turn (dev.upload, dev.poison, launch, dev.expect_equal against want_b / want_a): a host read of
// device data at capture time (the group offsets, say) would freeze the first inputs into the graph.
template <class Dev, class In, class Want, class Run>
void expect_graph_replays(cudaStream_t stream, Dev& dev, Run run, const In& a, Want& want_a, const In& b,
                          Want& want_b) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  run();
  cuda_ok(cudaStreamEndCapture(stream, &graph));
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    dev.upload(b);
    dev.poison();
    cuda_ok(cudaGraphLaunch(exec, stream));
    dev.expect_equal(want_b, "replay on ids B");
    dev.upload(a);
    dev.poison();
    cuda_ok(cudaGraphLaunch(exec, stream));
    dev.expect_equal(want_a, "replay on ids A");
  }
  cuda_ok(cudaGraphExecDestroy(exec));
  cuda_ok(cudaGraphDestroy(graph));
}
#endif

}  // namespace mxmoe::test
