// The sm90 k-grouped (wgrad) kernels: BF16 operands, and FP8 blockwise on both operands transposed
// to token blocks (gemm_kernel.cuh Mx::blk_staged, k-grouped). CTA pairs share B. Their
// configurations, in a translation unit of their own.
#include "src/cuda/common/check.h"
#include "src/cuda/sm90/kernels.h"
#include "src/cuda/sm90/launch.cuh"

namespace mxmoe::cuda::sm90 {
namespace {
using Wgrad = KernelConfig<kWideN, Major::mn, Major::mn, Grouping::k, Epi::wgrad, 2>;
using BlkWgrad = KernelConfig<kBlkN, Major::k, Major::k, Grouping::k, Epi::wgrad, 2, Mx::blk_staged>;
}  // namespace

void launch_gemm_k(bool fp8_block, const KLaunch& l, cudaStream_t stream) {
  if (fp8_block) return launch<BlkWgrad>(l.params, l.tiles, l.a, l.b, l.b, stream);
  launch<Wgrad>(l.params, l.tiles, l.a, l.b, l.b, stream);
}

}  // namespace mxmoe::cuda::sm90
