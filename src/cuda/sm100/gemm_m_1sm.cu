// cuda_sm100: the m-grouped MXFP8 GEMM (fprop, dgrad), 1-SM schedule, 128 x 256 x 128 tiles.
// One explicit instantiation per translation unit (about 1.5 min of nvcc each on 2 cores).
#include "src/cuda/sm100/grouped_gemm.cuh"

namespace mxmoe::cuda::sm100 {
template __global__ void mgrouped_prepare<MGrouped1Sm>(MGroupedDeviceArgs<MGrouped1Sm>, int const*, int, int, int,
                                                       MGrouped1Sm::ElementAData const*, MGrouped1Sm::ElementSF const*,
                                                       MGrouped1Sm::ElementBData const*, MGrouped1Sm::ElementSF const*,
                                                       MGrouped1Sm::ElementDOut*);
template cutlass::Status run_mgrouped<MGrouped1Sm>(MGroupedDeviceArgs<MGrouped1Sm> const&, int, int, void*, size_t,
                                                   cudaStream_t, dim3);
size_t mgrouped_1sm_workspace(int num_groups, int sm_count) {
  typename MGrouped1Sm::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {num_groups, nullptr, nullptr};
  args.hw_info.sm_count = sm_count;
  return MGrouped1Sm::Gemm::get_workspace_size(args);
}
}  // namespace mxmoe::cuda::sm100
