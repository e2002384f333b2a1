#include "src/cuda/common/workspace.h"

#include <string>

#include "src/cuda/common/check.h"
#include "src/common/pool.h"

namespace mxmoe::cuda {

Workspace::Workspace(int64_t bytes, cudaStream_t stream) : size_(bytes), stream_(stream) {
  if (bytes > 0)
    MXMOE_CUDA_CHECK(pool_malloc_async(reinterpret_cast<void**>(&base_), static_cast<size_t>(bytes), stream));
}

Workspace::~Workspace() {
  if (base_ != nullptr) cudaFreeAsync(base_, stream_);  // errors surface at the next check
}

char* Workspace::take_bytes(int64_t bytes) {
  const int64_t at = used_;
  used_ += aligned(bytes);
  if (used_ > size_) {
    throw Error("workspace", "kernel scratch of " + std::to_string(size_) + " bytes is too small for " +
                                 std::to_string(used_) + " (a workspace_bytes() is out of step with its use)");
  }
  return base_ + at;
}

}  // namespace mxmoe::cuda
