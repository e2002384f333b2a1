// CTA-wide inclusive scans over one int per thread (warp shuffles, then one warp over the warp
// totals), as the device-side schedule builders use them. A scan ends with a barrier, so the same
// 32-int shared scratch serves the next scan.
#pragma once
#include <cuda_runtime.h>

namespace mxmoe::cuda {

struct ScanMax {
  __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};
struct ScanSum {
  __device__ int operator()(int a, int b) const { return a + b; }
};

// Inclusive scan of `v` over the kThreads threads of the CTA; returns the thread's inclusive value
// and sets `total` to the CTA-wide result. `identity` fills the lanes past the last warp.
// warp_totals: 32 ints of shared memory. Every thread of the CTA must call it.
template <int kThreads, class Op>
__device__ int block_inclusive_scan(int v, Op op, int identity, int* warp_totals, int& total) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, at most 32 of them");
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int n = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v = op(v, n);
  }
  if (lane == 31) warp_totals[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int w = lane < kWarps ? warp_totals[lane] : identity;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int n = __shfl_up_sync(0xffffffffu, w, d);
      if (lane >= d) w = op(w, n);
    }
    warp_totals[lane] = w;
  }
  __syncthreads();
  if (warp > 0) v = op(v, warp_totals[warp - 1]);
  total = warp_totals[kWarps - 1];
  __syncthreads();  // warp_totals is reused by the next scan
  return v;
}

}  // namespace mxmoe::cuda
