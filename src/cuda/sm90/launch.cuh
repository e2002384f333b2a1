// Launch of one sm90 kernel configuration: a persistent grid of clusters of Cfg::kCluster CTAs, as
// many as can be resident at once, or fewer when there are fewer tiles (tiles_bound: an upper bound
// of the output tiles; the kernel reads the real count on the device).
#pragma once
#include <mutex>
#include <vector>

#include "src/cuda/common/check.h"
#include "src/cuda/sm90/gemm_kernel.cuh"
#include "src/cuda/sm90/sm90_ops.h"

namespace mxmoe::cuda::sm90 {

// Clusters of this configuration that fit on the current device at once (cached per device).
template <class Cfg>
int resident_clusters() {
  static std::mutex mu;
  static std::vector<int> cache;
  int dev = 0;
  MXMOE_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() <= static_cast<size_t>(dev)) cache.resize(dev + 1, 0);
  if (cache[dev] == 0) {
    auto kernel = grouped_gemm_kernel<Cfg>;
    MXMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(Cfg::kCluster * sm_count());
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = Cfg::kSmemBytes;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = Cfg::kCluster;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int n = 0;
    MXMOE_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg));
    if (n <= 0) throw Error("cuda_sm90", "no cluster of this kernel fits on the device (shared memory or registers)");
    cache[dev] = n;
  }
  return cache[dev];
}

template <class Cfg>
void launch(const KernelParams& p, int64_t tiles_bound, const CUtensorMap& a, const CUtensorMap& b0,
            const CUtensorMap& b1, cudaStream_t stream) {
  if (tiles_bound <= 0) return;
  const int64_t pairs_bound = (tiles_bound + Cfg::kCluster - 1) / Cfg::kCluster;  // grid size only
  auto kernel = grouped_gemm_kernel<Cfg>;
  const int clusters = resident_clusters<Cfg>();
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(Cfg::kCluster * static_cast<int>(pairs_bound < clusters ? pairs_bound : clusters));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = Cfg::kSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = Cfg::kCluster;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  MXMOE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, p, a, b0, b1));
}

}  // namespace mxmoe::cuda::sm90
