// Library-owned memory: host memory for the CPU backend, stream-ordered device memory for CUDA from
// the library's pool of the device (src/common/pool.h; legal inside CUDA-graph capture, so
// workspaces never break a captured step). Through Options::allocator when the caller set one.
#pragma once
#include <cstdint>
#include <string>
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
// Throws OutOfMemoryError (argument "memory", or "options.allocator" when the caller's allocator
// returned null) when the memory cannot be had; never returns a null buffer for bytes > 0.
Buffer allocate(Device device, int64_t bytes, void* stream, const Allocator& allocator = {});

// "1.50 GiB (1610612736 bytes)".
std::string format_bytes(int64_t bytes);
// Bytes of memory `device` has in all (host: physical memory; CUDA: the device's global memory), or
// -1 when unknown.
int64_t device_capacity(Device device);
// Refuses, before anything is allocated, a call whose library memory `need` (an estimate, described
// by `what`) exceeds what `device` has in all: OutOfMemoryError naming the estimate. Skipped with a
// caller allocator (its capacity is the caller's to know).
void check_capacity(Device device, int64_t need, const Allocator& allocator, const std::string& what);

}  // namespace mxmoe::detail
