// Explicit instantiations: m-grouped GEMM, mxfp8 operands, glu_backward epilogue, both B orientations.
#include "src/cuda/portable/gemm_m_kernel.cuh"
#include "src/cuda/portable/launch.h"

namespace mxmoe::cuda::portable {
template void launch_gemm_m<true, Major::k, Epi::glu_backward>(const MGemmParams&, cudaStream_t);
template void launch_gemm_m<true, Major::mn, Epi::glu_backward>(const MGemmParams&, cudaStream_t);
}  // namespace mxmoe::cuda::portable
