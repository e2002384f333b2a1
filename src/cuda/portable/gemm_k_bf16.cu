// Explicit instantiation: k-grouped GEMM, bf16 operands.
#include "src/cuda/portable/gemm_k_kernel.cuh"
#include "src/cuda/portable/launch.h"

namespace mxmoe::cuda::portable {
template void launch_gemm_k<false>(const KGemmParams&, int64_t, cudaStream_t);
}  // namespace mxmoe::cuda::portable
