// The sm90 m-grouped GEMMs of the recipe fp8_blockwise on FP8 wgmma (gemm_kernel.cuh Mx::blk): A
// e4m3 tokens with 1x128 f32 scales, B e4m3 weights [E, N, K] with 128x128 f32 scales, promotion per
// 128 values of K. Their kernel configurations, in a translation unit of their own (compiled in
// parallel with the BF16 and MXFP8 kernels).
#include <cuda_runtime.h>

#include "src/cuda/common/check.h"
#include "src/cuda/sm90/gemm_m_plan.h"
#include "src/cuda/sm90/launch.cuh"

namespace mxmoe::cuda::sm90 {
namespace {

constexpr int kPair = 2;  // CTA pairs along M sharing (multicasting) the B tile, as the BF16 kernels
using BlkStore = KernelConfig<kBlkN, Major::k, Major::k, Grouping::m, Epi::store, kPair, Mx::blk>;
using BlkGluFwd = KernelConfig<kBlkN, Major::k, Major::k, Grouping::m, Epi::glu_forward, kPair, Mx::blk>;
using BlkGluBwd = KernelConfig<kBlkN, Major::k, Major::k, Grouping::m, Epi::glu_backward, kPair, Mx::blk>;
// The same with the scales staged in shared memory by the producer's idle warps (the default).
using SBlkStore = KernelConfig<kBlkN, Major::k, Major::k, Grouping::m, Epi::store, kPair, Mx::blk_staged>;
using SBlkGluFwd = KernelConfig<kBlkN, Major::k, Major::k, Grouping::m, Epi::glu_forward, kPair, Mx::blk_staged>;
using SBlkGluBwd = KernelConfig<kBlkN, Major::k, Major::k, Grouping::m, Epi::glu_backward, kPair, Mx::blk_staged>;

template <class Store, class GluFwd, class GluBwd>
void launch_epilogue(const detail::MGemmStep& s, const MPlan& plan, cudaStream_t stream) {
  switch (s.epilogue) {
    case detail::Epilogue::glu_forward: launch<GluFwd>(plan.params, plan.launch_tiles, plan.a, plan.b0, plan.b1, stream); break;
    case detail::Epilogue::glu_backward: launch<GluBwd>(plan.params, plan.launch_tiles, plan.a, plan.b0, plan.b1, stream); break;
    case detail::Epilogue::store: launch<Store>(plan.params, plan.launch_tiles, plan.a, plan.b0, plan.b1, stream); break;
  }
}

}  // namespace

Fp8Mainloop fp8_mainloop() {
  if (env_is("MXMOE_SM90_FP8_MAINLOOP", "l2")) return Fp8Mainloop::l2;
  return Fp8Mainloop::staged;
}

void launch_gemm_m_blk(const detail::MGemmStep& s, const MPlan& plan, cudaStream_t stream) {
  switch (fp8_mainloop()) {
    case Fp8Mainloop::staged: launch_epilogue<SBlkStore, SBlkGluFwd, SBlkGluBwd>(s, plan, stream); break;
    case Fp8Mainloop::l2: launch_epilogue<BlkStore, BlkGluFwd, BlkGluBwd>(s, plan, stream); break;
  }
}

}  // namespace mxmoe::cuda::sm90
