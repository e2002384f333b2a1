// cuda::quantize_experts: MXFP8 quantize of E weight matrices [rows, cols] (bf16, one dense
// [E, rows, cols] tensor or E device addresses read on the device only) into dense e4m3
// [E, rows, cols] plus scales [E, bytes]: row-wise (1x32 blocks along cols, rowwise_scale_bytes
// per expert) or column-wise (32x1 blocks along rows, each matrix one group of `rows`,
// colwise_matrix_scale_bytes per expert). Same kernel as cuda::quantize, one grid row per expert.
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuQuant.QuantizeExperts*'
#include "src/cuda/common/check.h"
#include "src/cuda/cuda_ops.h"
#include "src/cuda/quant/quantize_kernel.cuh"

namespace mxmoe::cuda {
namespace {

// Two e4m3 (low byte first) -> f32; NaN as e4m3_to_f32 gives it (the host reference's NaN).
__device__ __forceinline__ void e4m3x2_f32(uint32_t two, float& lo, float& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(static_cast<uint16_t>(two)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(static_cast<uint16_t>(h & 0xFFFF)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(static_cast<uint16_t>(h >> 16)));
  if (lo != lo) lo = e4m3_to_f32(static_cast<uint8_t>(two));
  if (hi != hi) hi = e4m3_to_f32(static_cast<uint8_t>(two >> 8));
#else
  lo = e4m3_to_f32(static_cast<uint8_t>(two));
  hi = e4m3_to_f32(static_cast<uint8_t>(two >> 8));
#endif
}
// The dequantized value; NaN stays the NaN of the operand that carries it, as the host's x86
// multiply returns it (the GPU product would be the canonical NaN).
__device__ __forceinline__ uint16_t dequant_bf16(float v, float scale) {
  return bf16_from_f32(v != v ? v : scale != scale ? scale : v * scale);
}

// Rows of all experts over the grid (blocks stride over the E * rows rows), 8 consecutive values of
// a row per thread and step when cols % 8 == 0 (else 1): index math per row and chunk, not per value.
template <int kVec>
__global__ void __launch_bounds__(256) dequantize_experts_kernel(const uint8_t* __restrict__ data,
                                                                 const uint8_t* __restrict__ scales, int64_t scale_bytes,
                                                                 int64_t rows, int64_t cols, bool colwise,
                                                                 ScaleLayout layout, int64_t all_rows,
                                                                 uint16_t* __restrict__ dst) {
  const int64_t chunks = cols / kVec;
  const int64_t row_bytes = colwise_scale_row_bytes(cols), block_rows = colwise_group_scale_rows(rows);
  for (int64_t gr = blockIdx.x; gr < all_rows; gr += gridDim.x) {
    const int64_t e = gr / rows, r = gr - e * rows;
    const uint8_t* src = data + gr * cols;
    uint16_t* out = dst + gr * cols;
    const uint8_t* sc = scales + e * scale_bytes;
    const int64_t jb = r / 32;
    const uint8_t* col_base = sc + jb * row_bytes;  // column-wise, compact: the block row's scales
    for (int64_t ch = threadIdx.x; ch < chunks; ch += blockDim.x) {
      const int64_t c = ch * kVec;
      float s[kVec], v[kVec];
      if (!colwise) {
        const float one = e8m0_to_f32(__ldg(sc + rowwise_scale_index(r, c / 32, cols, layout)));
#pragma unroll
        for (int j = 0; j < kVec; ++j) s[j] = one;
      } else if (layout == ScaleLayout::compact) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) s[j] = e8m0_to_f32(__ldg(col_base + c + j));
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j) s[j] = e8m0_to_f32(__ldg(sc + swizzled_scale_index(c + j, jb, block_rows)));
      }
      if constexpr (kVec == 8) {
        const uint2 raw = __ldg(reinterpret_cast<const uint2*>(src) + ch);
        const uint32_t w[2] = {raw.x, raw.y};
#pragma unroll
        for (int j = 0; j < 4; ++j) e4m3x2_f32(w[j / 2] >> (16 * (j % 2)), v[2 * j], v[2 * j + 1]);
        uint32_t o[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
          o[j] = dequant_bf16(v[2 * j], s[2 * j]) | (static_cast<uint32_t>(dequant_bf16(v[2 * j + 1], s[2 * j + 1])) << 16);
        reinterpret_cast<uint4*>(out)[ch] = make_uint4(o[0], o[1], o[2], o[3]);
      } else {
        out[c] = dequant_bf16(e4m3_to_f32(src[c]), s[0]);
      }
    }
  }
}

}  // namespace

void dequantize_experts(const uint8_t* data, const uint8_t* scales, int64_t experts, int64_t rows, int64_t cols,
                        BlockAxis axis, ScaleLayout layout, uint16_t* dst, void* stream_ptr) {
  const cudaStream_t stream = as_stream(stream_ptr);
  const bool colwise = axis == BlockAxis::col;
  const int64_t scale_bytes = colwise ? colwise_matrix_scale_bytes(rows, cols) : rowwise_scale_bytes(rows, cols);
  const int64_t all_rows = experts * rows;
  if (all_rows == 0 || cols == 0) return;
  int dev = 0, sms = 0;
  MXMOE_CUDA_CHECK(cudaGetDevice(&dev));
  MXMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t cap = 16L * sms;
  const int blocks = static_cast<int>(all_rows < cap ? all_rows : cap);
  const bool vec = cols % 8 == 0 && reinterpret_cast<uintptr_t>(data) % 8 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  if (vec)
    dequantize_experts_kernel<8><<<blocks, 256, 0, stream>>>(data, scales, scale_bytes, rows, cols, colwise, layout,
                                                             all_rows, dst);
  else
    dequantize_experts_kernel<1><<<blocks, 256, 0, stream>>>(data, scales, scale_bytes, rows, cols, colwise, layout,
                                                             all_rows, dst);
  MXMOE_CUDA_CHECK(cudaGetLastError());
}

void quantize_experts(const detail::QuantizeExpertsStep& s, void* stream_ptr) {
  using namespace quant;
  if (s.format == QuantFormat::fp8_block) {
    quantize_experts_fp8_block(s, stream_ptr);
    if (s.transposed.data != nullptr)  // the K-major copy of cuda_sm90's FP8 dgrad (prepare_weights)
      transpose_fp8_block_weights(s.data.ptr<uint8_t>(), s.scales.ptr<float>(), s.experts, s.rows, s.cols,
                                  s.transposed.ptr<uint8_t>(), s.transposed_scales.ptr<float>(), stream_ptr);
    return;
  }
  const cudaStream_t stream = as_stream(stream_ptr);
  const bool row = s.axis == BlockAxis::row;
  if (s.scales.bytes() > 0) {
    MXMOE_CUDA_CHECK(cudaMemsetAsync(s.scales.data, 0, static_cast<size_t>(s.scales.bytes()), stream));
  }
  if (s.experts == 0 || s.rows == 0 || s.cols == 0) return;

  QuantizeParams p;
  p.src = expert_ptrs(s.src, s.rows * s.cols, sizeof(uint16_t));
  p.rows = s.rows;
  p.cols = s.cols;
  p.col_tiles = ceil_div(s.cols, kTileCols);
  p.data_stride = s.rows * s.cols;
  auto* data = s.data.ptr<uint8_t>();
  auto* scales = s.scales.ptr<uint8_t>();
  if (row) {
    p.row_data = data;
    p.row_scales = scales;
    p.row_layout = s.layout;
    p.row_scale_stride = rowwise_scale_bytes(s.rows, s.cols);
  } else {
    p.col_data = data;
    p.col_scales = scales;
    p.col_layout = s.layout;
    p.col_scale_stride = colwise_matrix_scale_bytes(s.rows, s.cols);
  }
  launch_quantize(p, ceil_div(s.rows, kTileRows), s.experts, stream);
  if (s.dequantized.data != nullptr)
    dequantize_experts(data, scales, s.experts, s.rows, s.cols, s.axis, s.layout, s.dequantized.ptr<uint16_t>(), stream);
}

}  // namespace mxmoe::cuda
