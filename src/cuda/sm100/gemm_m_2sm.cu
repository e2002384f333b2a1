// cuda_sm100: the m-grouped MXFP8 GEMM, 2-SM schedule (UTCQMMA.2CTA), 256 x 256 x 128 tiles over a 2 x 1 cluster.
// One explicit instantiation per translation unit (about 1.5 min of nvcc each on 2 cores).
#include "src/cuda/sm100/grouped_gemm.cuh"

namespace mxmoe::cuda::sm100 {
void run_mgrouped_2sm(const MGroupedOperands& op, cudaStream_t stream) { run_mgrouped<MGrouped2Sm>(op, stream); }
}  // namespace mxmoe::cuda::sm100
