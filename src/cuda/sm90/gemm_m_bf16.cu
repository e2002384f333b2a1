// The sm90 m-grouped kernels with BF16 A and B (fprop and dgrad, every epilogue): their
// configurations, in a translation unit of their own.
#include "src/cuda/common/check.h"
#include "src/cuda/sm90/kernels.h"
#include "src/cuda/sm90/launch.cuh"

namespace mxmoe::cuda::sm90 {
namespace {

// Every layer configuration runs CTA pairs along M that share B by multicast (gemm_kernel.cuh Tile).
constexpr int kPair = 2;
using StoreKK = KernelConfig<kWideN, Major::k, Major::k, Grouping::m, Epi::store, kPair>;
using StoreKMN = KernelConfig<kWideN, Major::k, Major::mn, Grouping::m, Epi::store, kPair>;
using StoreKKNarrow = KernelConfig<kNarrowN, Major::k, Major::k, Grouping::m, Epi::store, kPair>;
using StoreKMNNarrow = KernelConfig<kNarrowN, Major::k, Major::mn, Grouping::m, Epi::store, kPair>;
using GluFwd = KernelConfig<kWideN, Major::k, Major::k, Grouping::m, Epi::glu_forward, kPair>;
using GluBwd = KernelConfig<kWideN, Major::k, Major::mn, Grouping::m, Epi::glu_backward, kPair>;
using GluBwdNarrow = KernelConfig<kNarrowN, Major::k, Major::mn, Grouping::m, Epi::glu_backward, kPair>;

}  // namespace

int sm_count() {
  static PerDevice cache;
  return cache.get([](int dev) {
    int n = 0;
    MXMOE_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  });
}

void launch_gemm_m_bf16(Epi epi, bool b_kn, bool wide, const MLaunch& l, cudaStream_t stream) {
  switch (epi) {
    case Epi::glu_forward: return launch<GluFwd>(l, stream);  // 256 wide only: a and b halves of 128
    case Epi::glu_backward: return wide ? launch<GluBwd>(l, stream) : launch<GluBwdNarrow>(l, stream);
    case Epi::store:
      if (b_kn) return wide ? launch<StoreKMN>(l, stream) : launch<StoreKMNNarrow>(l, stream);
      return wide ? launch<StoreKK>(l, stream) : launch<StoreKKNarrow>(l, stream);
    default: throw Error("cuda_sm90", "internal: no m-grouped BF16 kernel for this epilogue");
  }
}

}  // namespace mxmoe::cuda::sm90
