// cuda_sm100: the k-grouped MXFP8 GEMM (weight gradients, K = the group's tokens), 1-SM, 128 x 128 x 128.
// One explicit instantiation per translation unit (about 1.5 min of nvcc each on 2 cores).
#include "src/cuda/sm100/grouped_gemm.cuh"

namespace mxmoe::cuda::sm100 {
template __global__ void kgrouped_prepare<KGrouped1Sm>(KGroupedDeviceArgs<KGrouped1Sm>, int const*, int, int, int,
                                                       KGrouped1Sm::ElementAData const*, KGrouped1Sm::ElementSF const*,
                                                       KGrouped1Sm::ElementBData const*, KGrouped1Sm::ElementSF const*,
                                                       KGrouped1Sm::ElementDOut*);
template cutlass::Status run_kgrouped<KGrouped1Sm>(KGroupedDeviceArgs<KGrouped1Sm> const&, int, int, void*, size_t,
                                                   cudaStream_t);
}  // namespace mxmoe::cuda::sm100
