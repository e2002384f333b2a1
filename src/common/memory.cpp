// Library-owned memory (src/common/memory.h).
#include "src/common/memory.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#if defined(MXMOE_WITH_CUDA)
#include <cuda_runtime.h>

#include "src/common/pool.h"
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
    if (!p)
      throw OutOfMemoryError("options.allocator", "the caller's allocator returned null for " + format_bytes(bytes) +
                                                      " on " + device_name(device));
    return Buffer(p, bytes, device, stream, allocator);
  }
  if (device.type == DeviceType::cpu) {
    const int64_t rounded = n <= INT64_MAX - kHostAlign ? (n + kHostAlign - 1) / kHostAlign * kHostAlign : -1;
    void* p = rounded > 0 ? std::aligned_alloc(kHostAlign, static_cast<size_t>(rounded)) : nullptr;
    if (!p) throw OutOfMemoryError("memory", "host allocation of " + format_bytes(bytes) + " failed");
    return Buffer(p, bytes, device, stream);
  }
#if defined(MXMOE_WITH_CUDA)
  void* p = nullptr;
  const cudaError_t err =
      cuda::pool_malloc_async(&p, static_cast<size_t>(n), static_cast<cudaStream_t>(stream), device.index);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: clear it so later calls do not report it
    throw OutOfMemoryError("memory", "device allocation of " + format_bytes(bytes) + " on " + device_name(device) +
                                         " failed: " + cudaGetErrorString(err));
  }
  if (err != cudaSuccess)
    throw Error("cuda", "device allocation of " + format_bytes(bytes) + " on " + device_name(device) +
                            " failed: " + cudaGetErrorString(err));
  return Buffer(p, bytes, device, stream);
#else
  throw Error("device", "cannot allocate on " + device_name(device) + ": mxmoe was built without CUDA");
#endif
}

std::string format_bytes(int64_t bytes) {
  static const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) v /= 1024.0, ++u;
  if (u == 0) return std::to_string(bytes) + " bytes";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %s (%lld bytes)", v, units[u], static_cast<long long>(bytes));
  return buf;
}

int64_t device_capacity(Device device) {
  if (device.type == DeviceType::cpu) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page <= 0) return -1;
    return static_cast<int64_t>(pages) * static_cast<int64_t>(page);
  }
#if defined(MXMOE_WITH_CUDA)
  // Total global memory per device, asked once (a property, legal during graph capture).
  static std::mutex mu;
  static std::vector<int64_t> known;
  std::lock_guard<std::mutex> lock(mu);
  if (device.index < 0) return -1;
  if (static_cast<size_t>(device.index) >= known.size()) known.resize(static_cast<size_t>(device.index) + 1, 0);
  int64_t& total = known[static_cast<size_t>(device.index)];
  if (total == 0) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device.index) != cudaSuccess) {
      (void)cudaGetLastError();
      return -1;
    }
    total = static_cast<int64_t>(prop.totalGlobalMem);
  }
  return total;
#else
  return -1;
#endif
}

void check_capacity(Device device, int64_t need, const Allocator& allocator, const std::string& what) {
  if (allocator.set()) return;
  const int64_t have = device_capacity(device);
  if (have > 0 && need > have)
    throw OutOfMemoryError("memory", what + " needs about " + format_bytes(need) + " of library memory, more than the " +
                                         format_bytes(have) + " " + device_name(device) + " has in all");
}

}  // namespace mxmoe::detail
