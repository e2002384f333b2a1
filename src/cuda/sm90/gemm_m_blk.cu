// The sm90 m-grouped GEMMs of the recipe fp8_blockwise on FP8 wgmma (mainloop_fp8_block.cuh):
// A e4m3 tokens with 1x128 f32 scales, B e4m3 weights [E, N, K] (dgrad: transposed) with 128x128 f32
// scales, promotion per 128 values of K, the scales staged in shared memory by the producer warp
// group's idle warps. Their configurations, in a translation unit of their own.
#include "src/cuda/common/check.h"
#include "src/cuda/sm90/kernels.h"
#include "src/cuda/sm90/launch.cuh"

namespace mxmoe::cuda::sm90 {
namespace {

template <Epi E>
using Fp8Block = KernelConfig<m_grouped<Mainloop::fp8_block>({.block_n = kBlkN, .b_major = Major::k, .epi = E})>;

}  // namespace

void launch_gemm_m_blk(Epi epi, const MLaunch& l, cudaStream_t stream) {
  switch (epi) {
    case Epi::glu_forward:
      return launch<Fp8Block<Epi::glu_forward>>(l, stream);
    case Epi::glu_backward:
      return launch<Fp8Block<Epi::glu_backward>>(l, stream);
    case Epi::store:
      return launch<Fp8Block<Epi::store>>(l, stream);
    case Epi::wgrad:
      break;
  }
  throw Error("cuda_sm90", "internal: no m-grouped FP8-blockwise kernel for the wgrad epilogue");
}

}  // namespace mxmoe::cuda::sm90
