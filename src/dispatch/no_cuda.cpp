// Without CUDA the GPU backends still exist in the registry, so `mxmoe info` and every report say
// why they are unavailable instead of silently omitting them.
#include "src/dispatch/device_facts.h"
#include "src/dispatch/refusing_backend.h"

#if !defined(MXMOE_WITH_CUDA)
namespace mxmoe {
namespace detail {
namespace {

class UnbuiltBackend final : public RefusingBackend {
 public:
  explicit UnbuiltBackend(const char* name) : RefusingBackend("mxmoe was built without CUDA"), name_(name) {}
  const char* name() const override { return name_; }
  Probe probe_device(const DeviceFacts&) const override {
    return {false, "mxmoe was built without CUDA (" MXMOE_NO_CUDA_WHY ")"};
  }

 private:
  const char* name_;
};

}  // namespace

Backend* cuda_portable_backend() {
  static UnbuiltBackend b("cuda_portable");
  return &b;
}
Backend* cuda_sm90_backend() {
  static UnbuiltBackend b("cuda_sm90");
  return &b;
}
Backend* cuda_sm100_backend() {
  static UnbuiltBackend b("cuda_sm100");
  return &b;
}

const DeviceFacts& cuda_device_facts(int index) {
  static const DeviceFacts none{.problem = "mxmoe was built without CUDA"};
  return none;
}

}  // namespace detail

int cuda_device_count() { return 0; }
std::string cuda_device_description(int) { return "mxmoe was built without CUDA"; }

}  // namespace mxmoe
#endif
