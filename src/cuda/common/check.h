// CUDA error checks. A failed CUDA call becomes mxmoe::Error naming the call and the CUDA message.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "mxmoe/types.h"

namespace mxmoe::cuda {

inline void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw Error("cuda", std::string(what) + " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace mxmoe::cuda

#define MXMOE_CUDA_CHECK(call) ::mxmoe::cuda::check((call), #call)
// After a kernel launch: launch-configuration errors surface here, asynchronous faults later.
#define MXMOE_CUDA_CHECK_LAUNCH() ::mxmoe::cuda::check(cudaGetLastError(), "kernel launch")
