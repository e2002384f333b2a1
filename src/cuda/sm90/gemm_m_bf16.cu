// The sm90 m-grouped kernels with BF16 A and B (fprop and dgrad, every epilogue; launch.cuh
// launch_m_grouped), in a translation unit of their own so that the families compile in parallel.
#include "src/cuda/common/check.h"
#include "src/cuda/sm90/kernels.h"
#include "src/cuda/sm90/launch.cuh"

namespace mxmoe::cuda::sm90 {

int sm_count() {
  static PerDevice cache;
  return cache.get([](int dev) {
    int n = 0;
    MXMOE_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  });
}

void launch_gemm_m_bf16(Epi epi, bool b_kn, bool wide, const MLaunch& l, cudaStream_t stream) {
  launch_m_grouped<Mainloop::bf16>(epi, b_kn, wide, l, stream);
}

}  // namespace mxmoe::cuda::sm90
