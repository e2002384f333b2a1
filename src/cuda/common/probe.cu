// Can this build's kernels load on a device? A module built without a matching SASS or PTX image
// fails here with cudaErrorNoKernelImageForDevice, which the probes turn into a reason.
#include <cuda_runtime.h>

#include <string>

namespace mxmoe::cuda {
namespace {
__global__ void probe_kernel() {}
}  // namespace

std::string kernel_image_problem(int device) {
  int old = 0;
  cudaGetDevice(&old);
  if (cudaSetDevice(device) != cudaSuccess) return "cannot select device " + std::to_string(device);
  cudaFuncAttributes attr{};
  const cudaError_t err = cudaFuncGetAttributes(&attr, probe_kernel);
  cudaSetDevice(old);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls are unaffected
    return std::string("kernels of this build cannot load: ") + cudaGetErrorString(err);
  }
  return "";
}

}  // namespace mxmoe::cuda
