// The CPU reference backend's steps (docs/numerics.md). Plain loops, fp32 accumulation (fp64 where
// noted), OpenMP over rows/experts, deterministic. Arguments arrive validated.
#pragma once
#include "src/dispatch/backend.h"

namespace mxmoe::cpu {

void quantize(const QuantizeArgs& a);                    // src/cpu/quant.cpp
void dequantize(const DequantizeArgs& a);                // src/cpu/quant.cpp
void quantize_experts(const detail::QuantizeExpertsStep& s);  // src/cpu/quant.cpp
void gemm_m(const detail::MGemmStep& s);                 // src/cpu/gemm.cpp
void gemm_k(const KGroupedGemmArgs& a);                  // src/cpu/gemm.cpp
void fc2_bias_grads(const detail::Fc2BiasGradStep& s);   // src/cpu/gemm.cpp
void route_tokens(const detail::RouteTokensStep& s);     // src/cpu/permute.cpp
void permute_rows(const PermuteByMapArgs& a);            // src/cpu/permute.cpp
void unpermute_rows(const UnpermuteArgs& a);             // src/cpu/permute.cpp
uint64_t check_finite(const detail::CheckFiniteStep& s);  // src/cpu/finite.cpp

}  // namespace mxmoe::cpu
