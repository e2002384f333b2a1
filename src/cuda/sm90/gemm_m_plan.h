// The host side of the sm90 grouped GEMMs: the plan of a step (its configuration, launches and
// workspace: plan_gemm_m / plan_gemm_k, the one place that decides how a step runs on cuda_sm90),
// and the pieces the runner and the kernel benchmark (bench/sm90_kernels.cu) share: a step turned
// into kernel parameters, TMA descriptors and the device schedule for a tile width, and the
// fixed-order dprob / db1 reductions of glu_backward.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <string>

#include "src/cuda/common/workspace.h"
#include "src/cuda/sm90/kernels.h"
#include "src/dispatch/backend.h"

namespace mxmoe::cuda::sm90 {

// Empty when the sm90 kernels take the step in some configuration; otherwise the reason they do not
// (the dispatch then runs it on the next backend).
std::string gemm_m_refusal(const detail::MGemmStep& s);
std::string gemm_k_refusal(const KGroupedGemmArgs& a);

// Whether an fp8_blockwise step runs on the FP8-wgmma kernels (any f32 scales): FC1 and FC2
// forward and the dgrads (on transposed weights), and the wgrads. Steps they do not take need
// power-of-two scales (the BF16 kernels on the exactly dequantized operands).
bool fp8_block_kernel_takes(const detail::MGemmStep& s);
bool fp8_block_wgrad_takes(const KGroupedGemmArgs& a);

// The plan of a step gemm_*_refusal takes: `config` empty for this backend's choice, or a
// configuration name (Options::overrides; an Error where it does not exist or cannot run the step).
detail::StepPlan plan_gemm_m(const detail::MGemmStep& s, bool pow2_scales, const std::string& config);
detail::StepPlan plan_gemm_k(const KGroupedGemmArgs& a, bool pow2_scales, const std::string& config);
// Run a plan of the step.
void gemm_m(const detail::MGemmStep& s, const detail::StepPlan& plan, void* stream);
void gemm_k(const KGroupedGemmArgs& a, const detail::StepPlan& plan, void* stream);

// A step's kernel launch at tile width bn: enqueues the device schedule (and clears the dprob
// partials) on `stream`; `ws` must hold gemm_m_workspace_bytes(s, bn). Requires gemm_m_refusal(s)
// empty and every operand in the kernel's format (B BF16 or fp8_block [N, K]).
int64_t gemm_m_workspace_bytes(const detail::MGemmStep& s, int bn);
MLaunch make_launch(const detail::MGemmStep& s, int bn, Workspace& ws, cudaStream_t stream);
void finish_gemm_m(const detail::MGemmStep& s, const MLaunch& l, cudaStream_t stream);
// The kernel epilogue of a step's epilogue.
Epi kernel_epi(const detail::MGemmStep& s);
// The mx_a kernels' epilogue quantizes the step's MXFP8 GLU outputs itself (else the quantizer reads bf16).
bool fused_quantizing_epilogue(const detail::MGemmStep& s);

int64_t gemm_k_workspace_bytes(const KGroupedGemmArgs& a);
KLaunch make_launch(const KGroupedGemmArgs& a, int bn, Workspace& ws, cudaStream_t stream);

}  // namespace mxmoe::cuda::sm90
