// MXFP8 expert weights -> BF16, for the sm90 MXFP8 GEMMs (gemm_m.cu): they read B as the BF16
// copy of its quantize-dequantize (issue 9's math: an e4m3 value times its E8M0 scale is exactly a
// BF16 value), while A (the tokens) stays e4m3 and is dequantized in registers by the kernel.
// One thread per 8 consecutive values of a row (cols % 8 == 0, which the caller's refusal checks).
// Same values as cuda::dequantize (NaN in the data or the scale stays NaN; bf16_from_f32 is exact on
// these products except below bf16's normal range).
#include <cuda_runtime.h>

#include "mxmoe/mxfp8_layout.h"
#include "mxmoe/numerics.h"
#include "src/cuda/common/check.h"
#include "src/cuda/sm90/dequant_weights.h"

namespace mxmoe::cuda::sm90 {
namespace {

struct Params {
  const uint8_t* q;       // e4m3 [E, rows, cols]
  const uint8_t* scales;  // e8m0 [E, scale_bytes]
  uint16_t* out;          // bf16 [E, rows, cols]
  int64_t rows, cols, scale_bytes;
  bool col_axis;          // blocks of 32 along rows (else along cols)
  ScaleLayout layout;
};

__device__ __forceinline__ float dequant_value(uint8_t q, float scale) {
  const float v = e4m3_to_f32(q);
  if (v != v) return v;
  if (scale != scale) return scale;
  return v * scale;
}

__global__ void dequant_experts_kernel(const Params p) {
  const int64_t chunks = p.rows * (p.cols / 8);
  const int64_t e = blockIdx.y;
  const uint8_t* q = p.q + e * p.rows * p.cols;
  const uint8_t* s = p.scales + e * p.scale_bytes;
  uint16_t* out = p.out + e * p.rows * p.cols;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < chunks;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = c / (p.cols / 8), col = (c % (p.cols / 8)) * 8;
    const uint2 raw = *reinterpret_cast<const uint2*>(q + r * p.cols + col);
    const uint8_t* b = reinterpret_cast<const uint8_t*>(&raw);
    uint16_t v[8];
    if (p.col_axis) {
#pragma unroll
      for (int i = 0; i < 8; ++i)
        v[i] = bf16_from_f32(dequant_value(
            b[i], e8m0_to_f32(s[colwise_scale_index(0, p.rows, r / 32, col + i, p.cols, p.layout)])));
    } else {
      const float sc = e8m0_to_f32(s[rowwise_scale_index(r, col / 32, p.cols, p.layout)]);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = bf16_from_f32(dequant_value(b[i], sc));
    }
    *reinterpret_cast<uint4*>(out + r * p.cols + col) =
        make_uint4(v[0] | (uint32_t{v[1]} << 16), v[2] | (uint32_t{v[3]} << 16), v[4] | (uint32_t{v[5]} << 16),
                   v[6] | (uint32_t{v[7]} << 16));
  }
}

}  // namespace

void dequantize_expert_weights(const uint8_t* q, const uint8_t* scales, int64_t experts, int64_t rows, int64_t cols,
                               bool col_axis, ScaleLayout layout, uint16_t* out, cudaStream_t stream) {
  if (experts <= 0 || rows <= 0 || cols <= 0) return;
  Params p{q, scales, out, rows, cols, 0, col_axis, layout};
  p.scale_bytes = col_axis ? colwise_matrix_scale_bytes(rows, cols) : rowwise_scale_bytes(rows, cols);
  const int64_t chunks = rows * (cols / 8);
  constexpr int kThreads = 256;
  const int64_t blocks = (chunks + kThreads - 1) / kThreads;
  const unsigned gx = static_cast<unsigned>(blocks < 4096 ? blocks : 4096);
  dequant_experts_kernel<<<dim3(gx, static_cast<unsigned>(experts)), kThreads, 0, stream>>>(p);
  MXMOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mxmoe::cuda::sm90
