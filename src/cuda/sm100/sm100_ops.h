// Host entries of the sm100 (Blackwell: tcgen05 block-scaled MMA) MXFP8 grouped GEMMs (gemm.cu).
// Every function enqueues on `stream`, never synchronises the host and never reads group offsets
// on the host. Never run on Blackwell hardware by this project: the backend self-checks them
// against cuda_portable before it serves a step (backend.cpp, docs/kernels/sm100.md).
#pragma once
#include <string>

#include "src/dispatch/backend.h"

namespace mxmoe::cuda::sm100 {

// Empty when the sm100 kernels take the step; otherwise the reason they do not (the dispatch then
// runs it on the next backend).
//   gemm_m: MXFP8 A (row-wise) and B (dense, row-wise [N, K] or column-wise [K, N]), the store
//           epilogue without bias into bf16 D; K % 32, N % 8 (N % 16 for [K, N]), 16-byte aligned data.
//   gemm_k: MXFP8 column-wise A [T, M] and B [T, N], dense f32 D (beta 0 or 1); M % 16, N % 16.
// Scales in either layout (compact or swizzled): every call repacks them (scale_repack.h).
std::string gemm_m_refusal(const detail::MGemmStep& s);
std::string gemm_k_refusal(const KGroupedGemmArgs& a);

// Throw mxmoe::Error("cuda_sm100", reason) for a step they refuse.
void gemm_m(const detail::MGemmStep& s, void* stream);
void gemm_k(const KGroupedGemmArgs& a, void* stream);

// Empty when the sm_100a kernels of this build can load on `device`; else why not.
std::string kernel_image_problem(int device);

// Runs one small fixed MXFP8 problem through every sm100 kernel and through cuda_portable on
// `device` and compares the outputs point by point (self_check.cpp); available when all agree,
// with the numbers in the reason either way. Synchronises its own stream; never throws.
detail::Probe run_self_check(int device);

}  // namespace mxmoe::cuda::sm100
