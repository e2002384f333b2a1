// MXFP8 expert weights -> their BF16 quantize-dequantize (dequant_weights.cu), the B operand of the
// sm90 MXFP8 GEMMs.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "mxmoe/mxfp8_layout.h"

namespace mxmoe::cuda::sm90 {

// q: e4m3 [experts, rows, cols] (cols % 8 == 0, 8-byte aligned); scales: e8m0, per expert
// rowwise_scale_bytes(rows, cols) (blocks along cols) or, col_axis, colwise_matrix_scale_bytes(rows,
// cols) (blocks along rows); out: bf16 [experts, rows, cols] (16-byte aligned). Enqueued on stream.
void dequantize_expert_weights(const uint8_t* q, const uint8_t* scales, int64_t experts, int64_t rows, int64_t cols,
                               bool col_axis, ScaleLayout layout, uint16_t* out, cudaStream_t stream);

}  // namespace mxmoe::cuda::sm90
