// Host entries of the sm90 (Hopper: TMA + wgmma) grouped GEMMs. Every function enqueues on
// `stream`, never synchronises the host and never reads group offsets on the host.
#pragma once
#include <string>

#include "src/dispatch/backend.h"

namespace mxmoe::cuda::sm90 {

// Empty when the sm90 kernels take the step; otherwise the reason they do not (the dispatch then
// runs it on the next backend).
std::string gemm_m_refusal(const detail::MGemmStep& s);
std::string gemm_k_refusal(const KGroupedGemmArgs& a);

// Whether an fp8_blockwise step runs on the FP8-wgmma kernels (any f32 scales): FC1 and FC2
// forward and the dgrads (on transposed weight copies). Steps they do not take need power-of-two
// scales (BF16 kernels on the dequantized operands). MXMOE_SM90_FP8_BLOCK=forward keeps the
// backward on that path, =dequant the forward too (comparison runs).
bool fp8_block_kernel_takes(const detail::MGemmStep& s);
// The same for an fp8_blockwise wgrad (with the dgrads).
bool fp8_block_wgrad_takes(const KGroupedGemmArgs& a);

void gemm_m(const detail::MGemmStep& s, void* stream);
void gemm_k(const KGroupedGemmArgs& a, void* stream);

// Number of SMs of the current device (cached per device), the persistent grid size.
int sm_count();

}  // namespace mxmoe::cuda::sm90
