// The CTA of the sm90 grouped GEMM kernels: 384 threads in three warp groups, and the named
// barriers the roles use among themselves (barrier 0 is __syncthreads).
//
//   warp group 0  producer: warp 0 lane 0 issues the TMA loads; warps 1-3 (the scale loaders) stage
//                 each stage's scales in shared memory where the mainloop has any (MXFP8, FP8 blockwise)
//   warp group 1  consumer 0: rows 0-63 of the 128-row tile (wgmma m64), then its epilogue
//   warp group 2  consumer 1: rows 64-127
#pragma once
#include <cstdint>

#include "src/cuda/sm90/ptx.cuh"

namespace mxmoe::cuda::sm90 {

enum class WarpGroupRole : int { producer = 0, consumer0 = 1, consumer1 = 2 };

inline constexpr int kThreads = 384;
inline constexpr int kConsumerThreads = 256;  // both consumer warp groups
inline constexpr int kLoaderThreads = 96;     // warps 1-3 of the producer warp group

// Named barriers (bar.sync ids). One per consumer warp group (consumer_wg0 + cw) keeps the 128
// threads of a warp group in step around its epilogue stage and its dummy passes.
enum class NamedBarrier : uint32_t {
  tail_zeroed = 1,   // k-grouped: the last k-block's foreign token rows are zeroed (both consumer warp groups)
  glu_bwd_sums = 2,  // glu_backward: the 8 consumer warps' db1 column sums are in shared memory
  consumer_wg0 = 3,  // consumer warp group 0 (1: consumer_wg0 + 1)
};
__device__ __forceinline__ void named_barrier_sync(NamedBarrier id, uint32_t threads) {
  named_barrier_sync(static_cast<uint32_t>(id), threads);
}
// The 128 threads of consumer warp group cw (0 or 1).
__device__ __forceinline__ void wg_sync(int cw) {
  named_barrier_sync(static_cast<uint32_t>(NamedBarrier::consumer_wg0) + cw, 128);
}

}  // namespace mxmoe::cuda::sm90
