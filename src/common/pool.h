// The device memory the library takes without a caller allocator (layer buffers, kernel scratch):
// one stream-ordered pool per device, made on first use, that keeps the memory it has reserved
// across calls (release threshold: everything, or MXMOE_POOL_RELEASE_BYTES), as a framework's
// caching allocator does. The device's default pool (what plain cudaMallocAsync uses) releases its
// reserved memory back to the driver at every stream, event or device synchronize (threshold 0),
// so each call after a sync mapped its workspaces again. release_cached_memory() (mxmoe/context.h)
// trims the pools. Inside CUDA-graph capture the allocations are plain cudaMallocAsync: graph memory
// nodes, as before the library had a pool.
#pragma once
#if defined(MXMOE_WITH_CUDA)
#include <cuda_runtime.h>

#include <cstdint>

namespace mxmoe::cuda {

// cudaMallocAsync's contract, from the library pool of `device` (-1: the stream's device). While
// `stream` is being captured it is plain cudaMallocAsync (a graph memory node); also where pools
// cannot be made.
cudaError_t pool_malloc_async(void** ptr, size_t bytes, cudaStream_t stream, int device = -1);

// The most bytes in use at once from the library pool of `device` since the last reset (reset:
// start again from what is in use now). Where the library has no pool for the device, the device's
// default pool's watermark.
uint64_t pool_used_high(int device, bool reset);

// Bytes the library pool of `device` holds reserved now (in use or kept); 0 where it has none.
uint64_t pool_reserved(int device);

// Returns the library pools' reserved but unused memory to the driver (cudaMemPoolTrimTo 0); memory
// of buffers still alive, or freed on a stream that has not reached the free, stays.
void pool_trim_all();

}  // namespace mxmoe::cuda
#endif  // MXMOE_WITH_CUDA
