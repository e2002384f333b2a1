// The sm90 m-grouped kernels with an MXFP8 A (mainloop_mx.cuh: e4m3 tokens converted to BF16
// fragments in registers) and a BF16 B (the weights' exact bf16 copy): the configurations of
// launch.cuh launch_m_grouped, in a translation unit of their own so that the BF16 and MXFP8 kernels
// compile in parallel.
#include "src/cuda/common/check.h"
#include "src/cuda/sm90/kernels.h"
#include "src/cuda/sm90/launch.cuh"

namespace mxmoe::cuda::sm90 {

void launch_gemm_m_mx(Epi epi, bool b_kn, bool wide, const MLaunch& l, cudaStream_t stream) {
  launch_m_grouped<Mainloop::mx_a>(epi, b_kn, wide, l, stream);
}

}  // namespace mxmoe::cuda::sm90
