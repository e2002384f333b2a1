// Explicit instantiations: m-grouped GEMM, mxfp8 operands, store epilogue, both B orientations.
#include "src/cuda/portable/gemm_m_kernel.cuh"
#include "src/cuda/portable/launch.h"

namespace mxmoe::cuda::portable {
template void launch_gemm_m<true, Major::k, Epi::store>(const MGemmParams&, cudaStream_t);
template void launch_gemm_m<true, Major::mn, Epi::store>(const MGemmParams&, cudaStream_t);
}  // namespace mxmoe::cuda::portable
