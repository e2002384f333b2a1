// Registry entry of cuda_sm90, the Hopper fast path. It is registered ahead of cuda_portable so
// dispatch always asks it first; until its kernels land it answers "unavailable" with the reason
// (never throws from a probe), and the chain falls through to cuda_portable.
#include "src/cuda/common/device_facts.h"
#include "src/dispatch/refusing_backend.h"

namespace mxmoe {
namespace cuda::sm90 {
namespace {

class CudaSm90Backend final : public detail::RefusingBackend {
 public:
  CudaSm90Backend() : RefusingBackend("Hopper wgmma/TMA kernels are not in this build yet") {}
  const char* name() const override { return "cuda_sm90"; }
  detail::Probe probe_device(Device d) const override {
    if (d.type != DeviceType::cuda) return {false, "data is in host memory"};
    const DeviceFacts& f = device_facts(d.index);
    if (!f.ok) return {false, f.problem};
    if (f.major != 9) return {false, f.name + " is " + f.cc() + "; cuda_sm90 needs sm_90"};
    return {false, "Hopper wgmma/TMA kernels are not in this build yet"};
  }
};

}  // namespace
}  // namespace cuda::sm90

detail::Backend* detail::cuda_sm90_backend() {
  static cuda::sm90::CudaSm90Backend b;
  return &b;
}

}  // namespace mxmoe
