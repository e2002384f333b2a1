// cuda_sm100: the k-grouped MXFP8 GEMM (weight gradients, K = the group's tokens), 1-SM, 128 x 128 x 128,
// fp32 out with beta 0 or 1 (C = D).
// One explicit instantiation per translation unit (about 1.5 min of nvcc each on 2 cores).
#include "src/cuda/sm100/grouped_gemm.cuh"

namespace mxmoe::cuda::sm100 {
void run_kgrouped_1sm(const KGroupedOperands& op, cudaStream_t stream) { run_kgrouped<KGrouped1Sm>(op, stream); }
}  // namespace mxmoe::cuda::sm100
