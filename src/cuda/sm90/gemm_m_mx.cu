// The sm90 m-grouped kernels with an MXFP8 A (gemm_kernel.cuh Mx::a: e4m3 tokens converted to BF16
// fragments in registers) and a BF16 B (the weights' exact bf16 copy): their configurations, in a
// translation unit of their own so that the BF16 and MXFP8 kernels compile in parallel.
#include "src/cuda/common/check.h"
#include "src/cuda/sm90/kernels.h"
#include "src/cuda/sm90/launch.cuh"

namespace mxmoe::cuda::sm90 {
namespace {

constexpr int kPair = 2;
using AStoreKK = KernelConfig<kWideN, Major::k, Major::k, Grouping::m, Epi::store, kPair, Mx::a>;
using AStoreKMN = KernelConfig<kWideN, Major::k, Major::mn, Grouping::m, Epi::store, kPair, Mx::a>;
using AStoreKKNarrow = KernelConfig<kNarrowN, Major::k, Major::k, Grouping::m, Epi::store, kPair, Mx::a>;
using AStoreKMNNarrow = KernelConfig<kNarrowN, Major::k, Major::mn, Grouping::m, Epi::store, kPair, Mx::a>;
using AGluFwd = KernelConfig<kWideN, Major::k, Major::k, Grouping::m, Epi::glu_forward, kPair, Mx::a>;
using AGluBwd = KernelConfig<kWideN, Major::k, Major::mn, Grouping::m, Epi::glu_backward, kPair, Mx::a>;
using AGluBwdNarrow = KernelConfig<kNarrowN, Major::k, Major::mn, Grouping::m, Epi::glu_backward, kPair, Mx::a>;

}  // namespace

void launch_gemm_m_mx(Epi epi, bool b_kn, bool wide, const MLaunch& l, cudaStream_t stream) {
  switch (epi) {
    case Epi::glu_forward: return launch<AGluFwd>(l, stream);
    case Epi::glu_backward: return wide ? launch<AGluBwd>(l, stream) : launch<AGluBwdNarrow>(l, stream);
    case Epi::store:
      if (b_kn) return wide ? launch<AStoreKMN>(l, stream) : launch<AStoreKMNNarrow>(l, stream);
      return wide ? launch<AStoreKK>(l, stream) : launch<AStoreKKNarrow>(l, stream);
    default: throw Error("cuda_sm90", "internal: no m-grouped MXFP8 kernel for this epilogue");
  }
}

}  // namespace mxmoe::cuda::sm90
