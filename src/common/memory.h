// Library-owned memory: host memory for the CPU backend, stream-ordered device memory for CUDA
// (cudaMallocAsync is legal inside CUDA-graph capture, so workspaces never break a captured step).
// Through Options::allocator when the caller set one.
#pragma once
#include <cstdint>
#include <utility>

#include "mxmoe/context.h"
#include "mxmoe/types.h"

namespace mxmoe::detail {

// Memory the library holds for one device; freed on the stream it was allocated on.
struct Buffer {
  Buffer() = default;
  Buffer(void* p, int64_t n, Device d, void* stream, Allocator a = {})
      : ptr(p), bytes(n), device(d), stream(stream), allocator(a) {}
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();
  void* ptr = nullptr;
  int64_t bytes = 0;
  Device device{};
  void* stream = nullptr;
  Allocator allocator{};  // the caller's, when Options::allocator is set
};
Buffer allocate(Device device, int64_t bytes, void* stream, const Allocator& allocator = {});

}  // namespace mxmoe::detail
