// The sm90 k-grouped (wgrad) kernels: BF16 operands token-major (MN-major tiles), and FP8 blockwise
// on both operands transposed to token blocks (mainloop_fp8_block.cuh, k-grouped). CTA pairs share
// B. Their configurations, in a translation unit of their own.
#include "src/cuda/common/check.h"
#include "src/cuda/sm90/kernels.h"
#include "src/cuda/sm90/launch.cuh"

namespace mxmoe::cuda::sm90 {
namespace {

using Wgrad = KernelConfig<KernelSpec{.block_n = kWideN,
                                      .a_major = Major::mn,
                                      .b_major = Major::mn,
                                      .grouping = Grouping::k,
                                      .epi = Epi::wgrad,
                                      .cluster = kPair,
                                      .mainloop = Mainloop::bf16}>;
using Fp8BlockWgrad = KernelConfig<KernelSpec{.block_n = kBlkN,
                                              .a_major = Major::k,
                                              .b_major = Major::k,
                                              .grouping = Grouping::k,
                                              .epi = Epi::wgrad,
                                              .cluster = kPair,
                                              .mainloop = Mainloop::fp8_block}>;

}  // namespace

void launch_gemm_k(bool fp8_block, const KLaunch& l, cudaStream_t stream) {
  if (fp8_block) return launch<Fp8BlockWgrad>(l.params, l.tiles, l.a, l.b, l.b, stream);
  launch<Wgrad>(l.params, l.tiles, l.a, l.b, l.b, stream);
}

}  // namespace mxmoe::cuda::sm90
