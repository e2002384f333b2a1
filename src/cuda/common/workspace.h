// Stream-ordered scratch memory of the CUDA kernels' host code: one allocation per call from the
// library pool of the stream's device (pool.h), carved into pieces, released with cudaFreeAsync on
// the same stream when the object dies (both legal inside CUDA-graph capture; a captured graph owns
// its allocation).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace mxmoe::cuda {

class Workspace {
 public:
  Workspace(int64_t bytes, cudaStream_t stream);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // Carves `count` elements (rounded up to kAlign bytes) off the buffer; throws past its size.
  template <class T>
  T* take(int64_t count) {
    return reinterpret_cast<T*>(take_bytes(count * static_cast<int64_t>(sizeof(T))));
  }
  // What `bytes` occupy in a workspace: size a Workspace as the sum of aligned() of its pieces.
  static int64_t aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

 private:
  static constexpr int64_t kAlign = 256;
  char* take_bytes(int64_t bytes);
  char* base_ = nullptr;
  int64_t size_ = 0;
  int64_t used_ = 0;
  cudaStream_t stream_;
};

}  // namespace mxmoe::cuda
