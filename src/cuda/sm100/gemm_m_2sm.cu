// cuda_sm100: the m-grouped MXFP8 GEMM, 2-SM schedule (UTCQMMA.2CTA), 256 x 256 x 128 tiles over a 2 x 1 cluster.
// One explicit instantiation per translation unit (about 1.5 min of nvcc each on 2 cores).
#include "src/cuda/sm100/grouped_gemm.cuh"

namespace mxmoe::cuda::sm100 {
template __global__ void mgrouped_prepare<MGrouped2Sm>(MGroupedDeviceArgs<MGrouped2Sm>, int const*, int, int, int,
                                                       MGrouped2Sm::ElementAData const*, MGrouped2Sm::ElementSF const*,
                                                       MGrouped2Sm::ElementBData const*, MGrouped2Sm::ElementSF const*,
                                                       MGrouped2Sm::ElementDOut*);
template cutlass::Status run_mgrouped<MGrouped2Sm>(MGroupedDeviceArgs<MGrouped2Sm> const&, int, int, void*, size_t,
                                                   cudaStream_t, dim3);
}  // namespace mxmoe::cuda::sm100
