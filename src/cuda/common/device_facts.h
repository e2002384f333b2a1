// The driver's facts of a CUDA device for the CUDA backends' probes, read once per device index
// (probing must be cheap: it runs for every step).
#pragma once
#include <string>

#include "src/dispatch/device_facts.h"

namespace mxmoe::cuda {

using DeviceFacts = detail::DeviceFacts;
const DeviceFacts& device_facts(int index);

// Empty when a kernel of this build can load on `device`; else why not (probe.cu).
std::string kernel_image_problem(int device);

}  // namespace mxmoe::cuda
