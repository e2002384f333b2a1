// cuda_sm100: the m-grouped MXFP8 GEMM (fprop, dgrad with B_e [N, K]), 1-SM schedule, 128 x 256 x 128 tiles.
// One explicit instantiation per translation unit (about 1.5 min of nvcc each on 2 cores).
#include "src/cuda/sm100/grouped_gemm.cuh"

namespace mxmoe::cuda::sm100 {
void run_mgrouped_1sm(const MGroupedOperands& op, cudaStream_t stream) { run_mgrouped<MGrouped1Sm>(op, stream); }
}  // namespace mxmoe::cuda::sm100
