// The sm90 m-grouped GEMMs with an MXFP8 A (gemm_kernel.cuh Mx): their kernel configurations, in a
// translation unit of their own so that the BF16 and MXFP8 kernels compile in parallel.
#include <cuda_runtime.h>

#include "src/cuda/common/check.h"
#include "src/cuda/sm90/gemm_m_plan.h"
#include "src/cuda/sm90/launch.cuh"

namespace mxmoe::cuda::sm90 {
namespace {

constexpr int kWideN = 256, kNarrowN = 128, kPair = 2;
// FP8 A, BF16 B: every epilogue.
using AStoreKK = KernelConfig<kWideN, Major::k, Major::k, Grouping::m, Epi::store, kPair, Mx::a>;
using AStoreKMN = KernelConfig<kWideN, Major::k, Major::mn, Grouping::m, Epi::store, kPair, Mx::a>;
using AStoreKKNarrow = KernelConfig<kNarrowN, Major::k, Major::k, Grouping::m, Epi::store, kPair, Mx::a>;
using AStoreKMNNarrow = KernelConfig<kNarrowN, Major::k, Major::mn, Grouping::m, Epi::store, kPair, Mx::a>;
using AGluFwd = KernelConfig<kWideN, Major::k, Major::k, Grouping::m, Epi::glu_forward, kPair, Mx::a>;
// With pingpong consumers (MXMOE_SM90_MX_GLU_FWD=pp, comparison runs).
using AGluFwdPP = KernelConfig<kWideN, Major::k, Major::k, Grouping::m, Epi::glu_forward, kPair, Mx::a, true>;
using AGluBwd = KernelConfig<kWideN, Major::k, Major::mn, Grouping::m, Epi::glu_backward, kPair, Mx::a>;
using AGluBwdNarrow = KernelConfig<kNarrowN, Major::k, Major::mn, Grouping::m, Epi::glu_backward, kPair, Mx::a>;
// The same with pingpong consumers (MXMOE_SM90_MX_GLU_BWD=pp, comparison runs; no db1).
using AGluBwdPP = KernelConfig<kWideN, Major::k, Major::mn, Grouping::m, Epi::glu_backward, kPair, Mx::a, true>;
using AGluBwdNarrowPP = KernelConfig<kNarrowN, Major::k, Major::mn, Grouping::m, Epi::glu_backward, kPair, Mx::a, true>;
// FP8 A, FC2 dgrad with epilogue warps (warps 1-3 of the producer warp group), A scales from L2.
using AGluBwdEw = KernelConfig<kMxEwN, Major::k, Major::mn, Grouping::m, Epi::glu_backward_ew, kPair, Mx::a>;
using AGluBwdEwNarrow = KernelConfig<kNarrowN, Major::k, Major::mn, Grouping::m, Epi::glu_backward_ew, kPair, Mx::a>;
// FP8 A and B (B converted in shared memory): the store epilogue.
using ABStoreKK = KernelConfig<kWideN, Major::k, Major::k, Grouping::m, Epi::store, kPair, Mx::ab>;
using ABStoreKMN = KernelConfig<kWideN, Major::k, Major::mn, Grouping::m, Epi::store, kPair, Mx::ab>;
using ABStoreKKNarrow = KernelConfig<kNarrowN, Major::k, Major::k, Grouping::m, Epi::store, kPair, Mx::ab>;
using ABStoreKMNNarrow = KernelConfig<kNarrowN, Major::k, Major::mn, Grouping::m, Epi::store, kPair, Mx::ab>;

template <class Wide, class Narrow>
void launch_width(const MPlan& plan, bool wide, cudaStream_t stream) {
  if (wide) launch<Wide>(plan.params, plan.launch_tiles, plan.a, plan.b0, plan.b1, stream);
  else launch<Narrow>(plan.params, plan.launch_tiles, plan.a, plan.b0, plan.b1, stream);
}

}  // namespace

void launch_gemm_m_mx(const detail::MGemmStep& s, const MPlan& plan, int bn, cudaStream_t stream) {
  const bool wide = bn == kWideN;
  if (s.gemm.b.is_mxfp8()) {
    if (s.gemm.b_kn) launch_width<ABStoreKMN, ABStoreKMNNarrow>(plan, wide, stream);
    else launch_width<ABStoreKK, ABStoreKKNarrow>(plan, wide, stream);
    return;
  }
  switch (s.epilogue) {
    case detail::Epilogue::glu_forward:
      if (env_is("MXMOE_SM90_MX_GLU_FWD", "pp"))
        launch<AGluFwdPP>(plan.params, plan.launch_tiles, plan.a, plan.b0, plan.b1, stream);
      else
        launch<AGluFwd>(plan.params, plan.launch_tiles, plan.a, plan.b0, plan.b1, stream);
      break;
    case detail::Epilogue::glu_backward:
      // Pingpong where asked and no db1 is summed (its column sums cross the two warp groups).
      if (env_is("MXMOE_SM90_MX_GLU_BWD", "pp") && plan.params.ws_db1 == nullptr)
        launch_width<AGluBwdPP, AGluBwdNarrowPP>(plan, wide, stream);
      else
        launch_width<AGluBwd, AGluBwdNarrow>(plan, wide, stream);
      break;
    case detail::Epilogue::store:
      if (s.gemm.b_kn) launch_width<AStoreKMN, AStoreKMNNarrow>(plan, wide, stream);
      else launch_width<AStoreKK, AStoreKKNarrow>(plan, wide, stream);
      break;
  }
}

void launch_gemm_m_mx_ew(const MPlan& plan, int bn, cudaStream_t stream) {
  launch_width<AGluBwdEw, AGluBwdEwNarrow>(plan, bn == kMxEwN, stream);
}

int mx_epilogue_warps_n() {
  if (env_is("MXMOE_SM90_MX_GLU_BWD", "ew")) return kMxEwN;
  if (env_is("MXMOE_SM90_MX_GLU_BWD", "ew128")) return kNarrowN;
  return 0;
}

}  // namespace mxmoe::cuda::sm90
