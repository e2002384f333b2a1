// Launch of one sm90 kernel configuration: a persistent grid of clusters of Cfg::kCluster CTAs, as
// many as can be resident at once, or fewer when there are fewer tiles (tiles_bound: an upper bound
// of the output tiles; the kernel reads the real count on the device). Included by the launch
// translation units only: each instantiates its own family of configurations.
#pragma once
#include <mutex>
#include <vector>

#include "src/cuda/common/check.h"
#include "src/cuda/sm90/gemm_kernel.cuh"
#include "src/cuda/sm90/kernels.h"

namespace mxmoe::cuda::sm90 {

// A value per device index, computed once (thread-safe).
class PerDevice {
 public:
  template <class F>
  int get(F compute) {
    int dev = 0;
    MXMOE_CUDA_CHECK(cudaGetDevice(&dev));
    std::lock_guard<std::mutex> lock(mu_);
    if (values_.size() <= static_cast<size_t>(dev)) values_.resize(dev + 1, 0);
    if (values_[dev] == 0) values_[dev] = compute(dev);
    return values_[dev];
  }

 private:
  std::mutex mu_;
  std::vector<int> values_;
};

// Launch configuration of `clusters` clusters of Cfg (attr must outlive the returned config).
template <class Cfg>
cudaLaunchConfig_t cluster_config(int clusters, cudaStream_t stream, cudaLaunchAttribute& attr) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(Cfg::kCluster * clusters);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = Cfg::kSmemBytes;
  cfg.stream = stream;
  attr = cudaLaunchAttribute{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = Cfg::kCluster;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cfg;
}

// Clusters of this configuration that fit on the current device at once.
template <class Cfg>
int resident_clusters() {
  static PerDevice cache;
  return cache.get([](int) {
    auto kernel = grouped_gemm_kernel<Cfg>;
    MXMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = cluster_config<Cfg>(sm_count(), nullptr, attr);
    int n = 0;
    MXMOE_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg));
    if (n <= 0) throw Error("cuda_sm90", "no cluster of this kernel fits on the device (shared memory or registers)");
    return n;
  });
}

template <class Cfg>
void launch(const KernelParams& p, int64_t tiles_bound, const CUtensorMap& a, const CUtensorMap& b0,
            const CUtensorMap& b1, cudaStream_t stream) {
  if (tiles_bound <= 0) return;
  const int64_t pairs_bound = (tiles_bound + Cfg::kCluster - 1) / Cfg::kCluster;  // grid size only
  const int clusters = resident_clusters<Cfg>();
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg =
      cluster_config<Cfg>(static_cast<int>(pairs_bound < clusters ? pairs_bound : clusters), stream, attr);
  MXMOE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, grouped_gemm_kernel<Cfg>, p, a, b0, b1));
}

template <class Cfg>
void launch(const MLaunch& l, cudaStream_t stream) {
  launch<Cfg>(l.params, l.tiles, l.a, l.b0, l.b1, stream);
}

// Every layer configuration runs CTA pairs along M that share the B tile by TMA multicast.
inline constexpr int kPair = 2;

// What varies between the m-grouped configurations of one mainloop.
struct MGroupedShape {
  int block_n;
  Major b_major;  // B_e [N, K] (fprop): k; B_e [K, N] (dgrad): mn
  Epi epi;
};
// An m-grouped configuration: K-major tokens, CTA pairs.
template <Mainloop M>
constexpr KernelSpec m_grouped(MGroupedShape s) {
  return {.block_n = s.block_n,
          .a_major = Major::k,
          .b_major = s.b_major,
          .grouping = Grouping::m,
          .epi = s.epi,
          .cluster = kPair,
          .mainloop = M};
}

// The m-grouped configurations of the mainloops that read a BF16 B (Mainloop::bf16, Mainloop::mx_a):
// store on B_e [N, K] (fprop) or [K, N] (dgrad), glu_forward (256 wide only: the a and b halves of 128
// features), glu_backward; 256 or 128 wide. One instantiation per launch translation unit.
template <Mainloop M>
void launch_m_grouped(Epi epi, bool b_kn, bool wide, const MLaunch& l, cudaStream_t stream) {
  using StoreKK = KernelConfig<m_grouped<M>({.block_n = kWideN, .b_major = Major::k, .epi = Epi::store})>;
  using StoreKMN = KernelConfig<m_grouped<M>({.block_n = kWideN, .b_major = Major::mn, .epi = Epi::store})>;
  using StoreKKNarrow = KernelConfig<m_grouped<M>({.block_n = kNarrowN, .b_major = Major::k, .epi = Epi::store})>;
  using StoreKMNNarrow = KernelConfig<m_grouped<M>({.block_n = kNarrowN, .b_major = Major::mn, .epi = Epi::store})>;
  using GluFwd = KernelConfig<m_grouped<M>({.block_n = kWideN, .b_major = Major::k, .epi = Epi::glu_forward})>;
  using GluBwd = KernelConfig<m_grouped<M>({.block_n = kWideN, .b_major = Major::mn, .epi = Epi::glu_backward})>;
  using GluBwdNarrow =
      KernelConfig<m_grouped<M>({.block_n = kNarrowN, .b_major = Major::mn, .epi = Epi::glu_backward})>;
  switch (epi) {
    case Epi::glu_forward:
      return launch<GluFwd>(l, stream);
    case Epi::glu_backward:
      return wide ? launch<GluBwd>(l, stream) : launch<GluBwdNarrow>(l, stream);
    case Epi::store:
      if (b_kn) return wide ? launch<StoreKMN>(l, stream) : launch<StoreKMNNarrow>(l, stream);
      return wide ? launch<StoreKK>(l, stream) : launch<StoreKKNarrow>(l, stream);
    case Epi::wgrad:
      break;
  }
  throw Error("cuda_sm90", "internal: no m-grouped kernel for the wgrad epilogue");
}

}  // namespace mxmoe::cuda::sm90
