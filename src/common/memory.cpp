// Library-owned memory (src/common/memory.h).
#include "src/common/memory.h"

#include <cstdlib>
#include <new>
#include <string>

#if defined(MXMOE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace mxmoe::detail {

namespace {
constexpr int64_t kHostAlign = 64;

void release(Buffer& b) {
  if (!b.ptr) return;
  if (b.allocator.set()) {
    b.allocator.release(b.ptr, b.bytes, b.device, b.stream, b.allocator.user);
  } else if (b.device.type == DeviceType::cpu) {
    std::free(b.ptr);
  } else {
#if defined(MXMOE_WITH_CUDA)
    cudaFreeAsync(b.ptr, static_cast<cudaStream_t>(b.stream));  // destructor: no throw
#endif
  }
  b.ptr = nullptr;
}
}  // namespace

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release(*this);
    ptr = o.ptr;
    bytes = o.bytes;
    device = o.device;
    stream = o.stream;
    allocator = o.allocator;
    o.ptr = nullptr;
    o.bytes = 0;
  }
  return *this;
}

Buffer::~Buffer() { release(*this); }

Buffer allocate(Device device, int64_t bytes, void* stream, const Allocator& allocator) {
  const int64_t n = bytes > 0 ? bytes : 1;
  if (allocator.set()) {
    void* p = allocator.allocate(n, device, stream, allocator.user);
    if (!p) throw Error("options.allocator", "the caller's allocator returned null for " + std::to_string(bytes) + " bytes");
    return Buffer(p, bytes, device, stream, allocator);
  }
  if (device.type == DeviceType::cpu) {
    void* p = std::aligned_alloc(kHostAlign, static_cast<size_t>((n + kHostAlign - 1) / kHostAlign * kHostAlign));
    if (!p) throw Error("memory", "host allocation of " + std::to_string(bytes) + " bytes failed");
    return Buffer(p, bytes, device, stream);
  }
#if defined(MXMOE_WITH_CUDA)
  void* p = nullptr;
  const cudaError_t err = cudaMallocAsync(&p, static_cast<size_t>(n), static_cast<cudaStream_t>(stream));
  if (err != cudaSuccess)
    throw Error("memory", "device allocation of " + std::to_string(bytes) + " bytes on " + device_name(device) +
                              " failed: " + cudaGetErrorString(err));
  return Buffer(p, bytes, device, stream);
#else
  throw Error("device", "cannot allocate on " + device_name(device) + ": mxmoe was built without CUDA");
#endif
}

}  // namespace mxmoe::detail
