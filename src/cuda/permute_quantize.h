// The fused permute + MXFP8 quantize of permute_tokens (PermuteArgs::rowwise / colwise), shared by
// the CUDA backends: src/cuda/quant/permute_quantize.cu (docs/kernels/permute.md "Quantized
// outputs"). Enqueues on `stream`, never synchronises the host, never reads the offsets on the host.
#pragma once
#include "src/dispatch/backend.h"

namespace mxmoe::cuda {

void permute_quantize_rows(const detail::PermuteQuantizeStep& s, void* stream);

}  // namespace mxmoe::cuda
