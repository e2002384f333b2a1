// Library memory pools (src/common/pool.h).
#include "src/common/pool.h"

#if defined(MXMOE_WITH_CUDA)

#include <cstdlib>
#include <mutex>
#include <vector>

namespace mxmoe::cuda {
namespace {

uint64_t release_threshold() {
  const char* v = std::getenv("MXMOE_POOL_RELEASE_BYTES");
  if (v != nullptr && *v != '\0') {
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v, &end, 10);
    if (end != nullptr && *end == '\0') return n;
  }
  return UINT64_MAX;
}

struct Pools {
  std::mutex mu;
  std::vector<cudaMemPool_t> pool;  // per device; nullptr: not made (yet, or it cannot be)
  std::vector<bool> failed;
};
// Never destroyed: library buffers may be freed by static destructors after this file's statics.
Pools& pools() {
  static Pools* p = new Pools;
  return *p;
}

cudaMemPool_t make_pool(int device) {
  // Relaxed capture mode for this thread while the pool is made, so that another thread's global
  // capture is not invalidated by the call.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  if (cudaMemPoolCreate(&pool, &props) == cudaSuccess) {
    uint64_t keep = release_threshold();
    if (cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess) {
      cudaMemPoolDestroy(pool);
      pool = nullptr;
    }
  }
  if (pool == nullptr) (void)cudaGetLastError();  // not sticky: the default pool serves instead
  cudaThreadExchangeStreamCaptureMode(&mode);
  return pool;
}

// The library pool of `device`, made on first use (pool_malloc_async never asks while its stream is
// being captured; make_pool relaxes this thread's capture mode for other threads' captures).
cudaMemPool_t library_pool(int device) {
  Pools& p = pools();
  std::lock_guard<std::mutex> lock(p.mu);
  if (device < 0) return nullptr;
  const size_t d = static_cast<size_t>(device);
  if (d >= p.pool.size()) {
    p.pool.resize(d + 1, nullptr);
    p.failed.resize(d + 1, false);
  }
  if (p.pool[d] == nullptr && !p.failed[d]) {
    p.pool[d] = make_pool(device);
    p.failed[d] = p.pool[d] == nullptr;
  }
  return p.pool[d];
}

}  // namespace

cudaError_t pool_malloc_async(void** ptr, size_t bytes, cudaStream_t stream, int device) {
  // Under capture the allocation is plain cudaMallocAsync, a graph memory node, as before the library
  // had a pool. The capture check comes first: cudaStreamGetDevice under a global capture fails with
  // cudaErrorStreamCaptureUnsupported and invalidates the capture (seen on the H200 with CUDA 13.0).
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t e = cudaStreamIsCapturing(stream, &status);
  if (e != cudaSuccess) return e;
  if (status != cudaStreamCaptureStatusNone) return cudaMallocAsync(ptr, bytes, stream);
  if (device < 0) {
    const cudaError_t d = cudaStreamGetDevice(stream, &device);
    if (d != cudaSuccess) return d;
  }
  const cudaMemPool_t pool = library_pool(device);
  return pool != nullptr ? cudaMallocFromPoolAsync(ptr, bytes, pool, stream) : cudaMallocAsync(ptr, bytes, stream);
}

uint64_t pool_used_high(int device, bool reset) {
  cudaMemPool_t pool = library_pool(device);
  if (pool == nullptr && cudaDeviceGetDefaultMemPool(&pool, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  uint64_t high = 0;
  if (reset) {
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high);
    return 0;
  }
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high);
  return high;
}

uint64_t pool_reserved(int device) {
  const cudaMemPool_t pool = library_pool(device);
  uint64_t bytes = 0;
  if (pool != nullptr) cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &bytes);
  return bytes;
}

void pool_trim_all() {
  Pools& p = pools();
  std::lock_guard<std::mutex> lock(p.mu);
  for (cudaMemPool_t pool : p.pool)
    if (pool != nullptr) cudaMemPoolTrimTo(pool, 0);
}

}  // namespace mxmoe::cuda
#endif  // MXMOE_WITH_CUDA
