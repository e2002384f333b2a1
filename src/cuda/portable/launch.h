// Host-side declarations of the portable kernels' launchers (defined in *_kernel.cuh, explicitly
// instantiated one variant family per .cu file so the build parallelises).
#pragma once
#include <cuda_runtime.h>

#include "src/cuda/portable/params.h"

namespace mxmoe::cuda::portable {

template <bool Fp8, Major BMajor, Epi E>
void launch_gemm_m(const MGemmParams& p, cudaStream_t stream);

template <bool Fp8>
void launch_gemm_k(const KGemmParams& p, int64_t experts, cudaStream_t stream);

}  // namespace mxmoe::cuda::portable
