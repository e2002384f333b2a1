// What the CUDA backends' probes need to know about a device, read once per device index (probing
// must be cheap: it runs for every step).
#pragma once
#include <string>

namespace mxmoe::cuda {

struct DeviceFacts {
  bool ok = false;      // a device exists at this index and this build's kernels load on it
  std::string problem;  // why not, when !ok
  int major = 0, minor = 0;
  std::string name;
  std::string cc() const { return "sm_" + std::to_string(major) + std::to_string(minor); }
};

const DeviceFacts& device_facts(int index);

// Empty when a kernel of this build can load on `device`; else why not (probe.cu).
std::string kernel_image_problem(int device);

}  // namespace mxmoe::cuda
