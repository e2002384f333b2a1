// The sm90 m-grouped GEMMs of the recipe fp8_blockwise on FP8 wgmma (gemm_kernel.cuh Mx::blk_staged):
// A e4m3 tokens with 1x128 f32 scales, B e4m3 weights [E, N, K] with 128x128 f32 scales, promotion
// per 128 values of K, the scales staged in shared memory by the producer warp group's idle warps.
// Their configurations, in a translation unit of their own.
#include "src/cuda/common/check.h"
#include "src/cuda/sm90/kernels.h"
#include "src/cuda/sm90/launch.cuh"

namespace mxmoe::cuda::sm90 {
namespace {

constexpr int kPair = 2;  // CTA pairs along M sharing (multicasting) the B tile, as the BF16 kernels
using BlkStore = KernelConfig<kBlkN, Major::k, Major::k, Grouping::m, Epi::store, kPair, Mx::blk_staged>;
using BlkGluFwd = KernelConfig<kBlkN, Major::k, Major::k, Grouping::m, Epi::glu_forward, kPair, Mx::blk_staged>;
using BlkGluBwd = KernelConfig<kBlkN, Major::k, Major::k, Grouping::m, Epi::glu_backward, kPair, Mx::blk_staged>;

}  // namespace

void launch_gemm_m_blk(Epi epi, const MLaunch& l, cudaStream_t stream) {
  switch (epi) {
    case Epi::glu_forward: return launch<BlkGluFwd>(l, stream);
    case Epi::glu_backward: return launch<BlkGluBwd>(l, stream);
    case Epi::store: return launch<BlkStore>(l, stream);
    default: throw Error("cuda_sm90", "internal: no m-grouped FP8-blockwise kernel for this epilogue");
  }
}

}  // namespace mxmoe::cuda::sm90
