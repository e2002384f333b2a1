// The Context owns the backend choice, device facts, the stream and the per-call report.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mxmoe/mxfp8_layout.h"
#include "mxmoe/types.h"

namespace mxmoe {

// Where the library's own memory (workspaces, saved-for-backward state) comes from. Unset: host
// memory for the CPU backend, stream-ordered allocations on the stream from the library's pool of
// the device for CUDA (legal in CUDA-graph capture; see release_cached_memory). Frameworks plug in their caching allocator here (PyTorch does). Every
// buffer keeps a copy of this struct and calls `release` with `user` when it is freed, so the
// functions and `user` must stay valid until the last SavedState / WgradState allocated through it is
// destroyed, which may be after the Context (the C ABI keeps its own bridge alive that way).
struct Allocator {
  void* (*allocate)(int64_t bytes, Device device, void* stream, void* user) = nullptr;
  void (*release)(void* ptr, int64_t bytes, Device device, void* stream, void* user) = nullptr;
  void* user = nullptr;
  bool set() const { return allocate != nullptr && release != nullptr; }
};

// A step run in a named configuration instead of the one its backend's plan picks: for tests and
// benches (`mxmoe bench --override fc2_dgrad=mxfp8_regs_n128`). `mxmoe plan` prints each step's
// configuration; a name the serving backend does not have, or one that cannot run the step, is an
// mxmoe::Error naming the override when the step is planned.
struct StepOverride {
  std::string step;    // a step label, e.g. "fc2_dgrad"
  std::string config;  // a configuration name of the backend that serves it
};

struct Options {
  // Force one backend by name (`mxmoe info` lists the registered ones); empty = best available.
  // Environment: MXMOE_BACKEND. A forced backend that cannot serve a step is an error naming why.
  std::string backend;
  // Never use these backends. Environment: MXMOE_DENY=name[,name...].
  std::vector<std::string> deny;
  // Scale layout of the MXFP8 tensors the layer makes internally.
  ScaleLayout scale_layout = ScaleLayout::compact;
  // cudaStream_t to run on (nullptr = the legacy default stream). Ignored on the CPU.
  void* stream = nullptr;
  Allocator allocator{};
  std::vector<StepOverride> overrides;
  // Scan the inputs for NaN and +-Inf before anything is written (docs/numerics.md "Non-finite
  // values"): forward's x, probs, w1, w2, b1, b2 (those given), backward's dy, prepare_weights' w1
  // and w2. The first non-finite value is an mxmoe::Error whose argument is the tensor ("x", "w1",
  // ...) and whose message gives its coordinates and NaN / +Inf / -Inf. Off by default. On CUDA it
  // reads one result back to the host: it synchronises the stream, and a call made while the stream
  // is captured into a CUDA graph is an Error naming "options.check_finite".
  bool check_finite = false;
};

// One kernel or memory operation of a step, in the order the step enqueues them.
struct LaunchRecord {
  std::string kernel;  // e.g. "gemm", "dequantize_b", "quantize_out"
  std::string config;  // its configuration, where it has several
};

// One dispatch decision: which backend ran a step, why each better one did not, and its plan there.
struct StepRecord {
  std::string step;
  std::string backend;
  std::vector<std::pair<std::string, std::string>> skipped;  // (backend, reason)
  std::string config;                // the step's named configuration on `backend`
  std::vector<LaunchRecord> launches;
  int64_t workspace_bytes = 0;       // library memory the step takes while it runs
  std::string weights;               // what the step reads of the weights ("" where none)
};

struct BackendInfo {
  std::string name;
  bool available = false;
  std::string reason;  // why not, or what it runs on
};

namespace detail {
struct ContextImpl;
}

class MXMOE_API Context {
 public:
  explicit Context(Options options = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const Options& options() const;
  // Dispatch decisions since the last clear_report(), in call order (repeated steps merged).
  const std::vector<StepRecord>& report() const;
  void clear_report();
  // Every registered backend with its availability for data on `device`.
  std::vector<BackendInfo> backends(Device device) const;

  detail::ContextImpl& impl() { return *impl_; }
  const detail::ContextImpl& impl() const { return *impl_; }

 private:
  std::unique_ptr<detail::ContextImpl> impl_;
};

// Device memory the library allocated without a caller allocator (Options::allocator unset: layer
// buffers; kernel scratch always) comes from one pool per device that keeps what it reserved across
// calls, as a framework's caching allocator does (environment: MXMOE_POOL_RELEASE_BYTES, the bytes a
// pool keeps before it returns memory to the driver at a synchronize; unset keeps all). This returns
// the pools' reserved memory that no live buffer holds. No-op without CUDA.
MXMOE_API void release_cached_memory();

// Library facts for `mxmoe info`.
MXMOE_API const char* version();
MXMOE_API std::string build_options();
MXMOE_API int cuda_device_count();  // 0 without a GPU or without CUDA support compiled in
MXMOE_API std::string cuda_device_description(int index);

}  // namespace mxmoe
