// cuda::quantize_experts: MXFP8 quantize of E weight matrices [rows, cols] (bf16, one dense
// [E, rows, cols] tensor or E device addresses read on the device only) into dense e4m3
// [E, rows, cols] plus scales [E, bytes]: row-wise (1x32 blocks along cols, rowwise_scale_bytes
// per expert) or column-wise (32x1 blocks along rows, each matrix one group of `rows`,
// colwise_matrix_scale_bytes per expert). Same kernel as cuda::quantize, one grid row per expert.
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuQuant.QuantizeExperts*'
#include "src/cuda/common/check.h"
#include "src/cuda/common/convert.cuh"
#include "src/cuda/common/workspace.h"
#include "src/cuda/cuda_ops.h"
#include "src/cuda/quant/quantize_kernel.cuh"

namespace mxmoe::cuda {
namespace {

// The dequantized value (the e4m3 pair decoded by e4m3x2_f32, src/cuda/common/convert.cuh); NaN stays the NaN of the operand that carries it, as the host's x86
// multiply returns it (the GPU product would be the canonical NaN).
__device__ __forceinline__ uint16_t dequant_bf16(float v, float scale) {
  return bf16_from_f32(v != v ? v : scale != scale ? scale : v * scale);
}

// Eight E4M3 bytes (low byte first) under per-value scales -> eight bf16 values.
template <class Scale>
__device__ __forceinline__ uint4 dequant8(uint2 q, Scale scale) {
  const uint32_t w[2] = {q.x, q.y};
  uint32_t o[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float lo, hi;
    e4m3x2_f32(w[j / 2] >> (16 * (j % 2)), lo, hi);
    o[j] = dequant_bf16(lo, scale(2 * j)) | (static_cast<uint32_t>(dequant_bf16(hi, scale(2 * j + 1))) << 16);
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// The same on the hardware conversions (convert.cuh e4m3x2_scaled_bf16x2: cvt e4m3x2 -> f16x2, the
// f32 product, cvt.rn.bf16x2.f32, which give bf16_from_f32(e4m3 * s) for every non-NaN result) where
// no byte is a NaN (S.1111.111, from NaN inputs) and no scale is NaN; those take dequant8's exact
// path, which keeps the host's NaN bits. The exact path alone costs about three times the
// instructions per value (its per-value NaN branches and the software bf16 rounding); the
// measurement is in docs/kernels/quant.md "The weights' bf16 copies".
template <class Scale>
__device__ __forceinline__ uint4 dequant8_fast(uint2 q, Scale scale, bool scale_nan) {
  const uint32_t nan_bytes = (((q.x & 0x7f7f7f7fu) + 0x01010101u) | ((q.y & 0x7f7f7f7fu) + 0x01010101u)) & 0x80808080u;
  if (nan_bytes != 0 || scale_nan) return dequant8(q, scale);
  const uint32_t w[2] = {q.x, q.y};
  uint32_t o[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) o[j] = e4m3x2_scaled_bf16x2(w[j / 2] >> (16 * (j % 2)), scale(2 * j), scale(2 * j + 1));
  return make_uint4(o[0], o[1], o[2], o[3]);
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
      float s[kVec];
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
        bool scale_nan = false;
#pragma unroll
        for (int j = 0; j < kVec; ++j) scale_nan |= s[j] != s[j];
        reinterpret_cast<uint4*>(out)[ch] = dequant8_fast(raw, [&](int j) { return s[j]; }, scale_nan);
      } else {
        out[c] = dequant_bf16(e4m3_to_f32(src[c]), s[0]);
      }
    }
  }
}

// The bf16 copy alone (QuantizeExpertsStep with `dequantized` only): each value quantized to E4M3
// under its block's E8M0 scale by the quantizer's own quantize8 (quant_tile.cuh) and decoded back
// to bf16 in registers as dequantize_experts_kernel decodes it, so the bytes equal quantize, then
// dequantize, without the FP8 round trip through memory (bf16 read, bf16 written). Row-wise: one
// thread per 1x32 block (cols % 32 == 0); column-wise: one thread per 32x1 block of 8 adjacent
// columns (cols % 8 == 0), the matrix's last block partial. Dense 16-byte-aligned source and copy.

__global__ void __launch_bounds__(256) qdq_rowwise_kernel(const uint16_t* __restrict__ src, int64_t blocks,
                                                          uint16_t* __restrict__ dst) {
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b < blocks;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4* in = reinterpret_cast<const uint4*>(src + b * kMxBlock);
    uint32_t w[4][4];
    float amax = 0.0f;  // fmaxf returns the non-NaN operand: NaN inputs are skipped, as in the quantizer
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint4 v = __ldg(in + q);
      w[q][0] = v.x, w[q][1] = v.y, w[q][2] = v.z, w[q][3] = v.w;
#pragma unroll
      for (int j = 0; j < 4; ++j) amax = fmaxf(fmaxf(amax, fabsf(quant::bf16_lo(w[q][j]))), fabsf(quant::bf16_hi(w[q][j])));
    }
    const uint8_t e = e8m0_from_amax(amax);
    const float mult = e8m0_encode_multiplier(e), scale = e8m0_to_f32(e);
    uint4* out = reinterpret_cast<uint4*>(dst + b * kMxBlock);
#pragma unroll
    for (int q = 0; q < 4; ++q)
      out[q] = dequant8_fast(quant::quantize8(w[q], mult), [&](int) { return scale; }, scale != scale);
  }
}

__global__ void __launch_bounds__(256) qdq_colwise_kernel(const uint16_t* __restrict__ src, int64_t experts,
                                                          int64_t rows, int64_t cols, uint16_t* __restrict__ dst) {
  const int64_t chunks = cols / 8, row_blocks = (rows + kMxBlock - 1) / kMxBlock;
  const int64_t tasks = experts * row_blocks * chunks;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < tasks;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t ch = t % chunks, eb = t / chunks;  // eb = e * row_blocks + row block
    const int64_t e = eb / row_blocks, r0 = (eb - e * row_blocks) * kMxBlock;
    const int64_t n = rows - r0 < kMxBlock ? rows - r0 : kMxBlock;
    const int64_t at = (e * rows + r0) * cols + ch * 8;  // the block's first row, first column
    float amax[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t r = 0; r < n; ++r) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(src + at + r * cols));
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        amax[2 * j] = fmaxf(amax[2 * j], fabsf(quant::bf16_lo(w[j])));
        amax[2 * j + 1] = fmaxf(amax[2 * j + 1], fabsf(quant::bf16_hi(w[j])));
      }
    }
    float mult[8], scale[8];
    bool scale_nan = false;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint8_t e8 = e8m0_from_amax(amax[j]);
      mult[j] = e8m0_encode_multiplier(e8);
      scale[j] = e8m0_to_f32(e8);
      scale_nan |= scale[j] != scale[j];
    }
    for (int64_t r = 0; r < n; ++r) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(src + at + r * cols));
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      *reinterpret_cast<uint4*>(dst + at + r * cols) =
          dequant8_fast(quant::quantize8(w, mult), [&](int j) { return scale[j]; }, scale_nan);
    }
  }
}

// Launches the fused kernel where it applies; false: the caller takes the two-pass route.
bool quantize_dequantize_experts(const detail::QuantizeExpertsStep& s, cudaStream_t stream) {
  const bool row = s.axis == BlockAxis::row;
  const auto* src = static_cast<const uint16_t*>(s.src.dense.data);
  auto* dst = s.dequantized.ptr<uint16_t>();
  const bool aligned = reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  if (s.src.per_expert() || !aligned || s.cols % (row ? kMxBlock : 8) != 0) return false;
  const int64_t elems = s.experts * s.rows * s.cols;
  if (elems == 0) return true;
  int dev = 0, sms = 0;
  MXMOE_CUDA_CHECK(cudaGetDevice(&dev));
  MXMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t tasks = row ? elems / kMxBlock : s.experts * ((s.rows + kMxBlock - 1) / kMxBlock) * (s.cols / 8);
  const int64_t want = (tasks + 255) / 256, cap = 8L * sms;
  const int blocks = static_cast<int>(want < cap ? want : cap);
  if (row)
    qdq_rowwise_kernel<<<blocks, 256, 0, stream>>>(src, tasks, dst);
  else
    qdq_colwise_kernel<<<blocks, 256, 0, stream>>>(src, s.experts, s.rows, s.cols, dst);
  MXMOE_CUDA_CHECK(cudaGetLastError());
  return true;
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
  if (s.data.data == nullptr && s.dequantized.data != nullptr) {
    // Only the bf16 copy is asked for (cuda_sm90's per-call weights): fused where it applies, else
    // the FP8 bytes go to stream-ordered scratch that is freed once the copy is written.
    if (quantize_dequantize_experts(s, stream)) return;
    const int64_t elems = s.experts * s.rows * s.cols;
    const int64_t per = row ? rowwise_scale_bytes(s.rows, s.cols) : colwise_matrix_scale_bytes(s.rows, s.cols);
    const int64_t scale_bytes = s.experts * per;
    Workspace tmp(Workspace::aligned(elems) + Workspace::aligned(scale_bytes), stream);
    detail::QuantizeExpertsStep full = s;
    const Device d = s.dequantized.device;
    full.data = TensorView::of(tmp.take<uint8_t>(elems), DType::e4m3, {s.experts, s.rows, s.cols}, d);
    full.scales = TensorView::of(tmp.take<uint8_t>(scale_bytes), DType::e8m0, {s.experts, per}, d);
    if (s.experts > 0) quantize_experts(full, stream_ptr);
    return;
  }
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
