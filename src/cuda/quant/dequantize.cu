// cuda::dequantize: MXFP8 -> f32 or bf16.
//
// In:  e4m3 data [M, K] with E8M0 scales, row-wise (1x32 along K) or column-wise (32x1 along M,
//      blocks restarting at each group's first row; group offsets on the device, group schedule as
//      in quantize), compact or swizzled scale layout.
// Out: dst [M, K] f32, or bf16 (round to nearest even) = e4m3_to_f32(q) * e8m0_to_f32(e).
// Same 32 x 128 tile as quantize (4 rows x 8 columns per thread); no shared memory. bf16 output
// converts two values at a time with the hardware e4m3 conversion (e4m3x2_scaled_bf16x2) where the
// f32 output keeps the scalar reference conversion.
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuQuant.Dequantize*'
#include "src/cuda/common/check.h"
#include "src/cuda/common/convert.cuh"
#include "src/cuda/cuda_ops.h"
#include "src/cuda/quant/quant_tile.cuh"

namespace mxmoe::cuda {
namespace quant {
namespace {

struct DequantizeParams {
  const uint8_t* data = nullptr;    // e4m3 [rows, cols]
  const uint8_t* scales = nullptr;
  ScaleLayout layout = ScaleLayout::compact;
  int64_t rows = 0, cols = 0, col_tiles = 0;
  GroupSchedule sched;              // column-wise with groups (block_m 32); none = one group / row-wise
  void* dst = nullptr;
};

// NaN is kept as the NaN of the operand that carries it (the GPU product would be the canonical NaN),
// which is what the host reference's x86 multiply returns.
__device__ __forceinline__ float dequant_value(uint8_t q, float scale) {
  const float v = e4m3_to_f32(q);
  if (v != v) return v;
  if (scale != scale) return scale;
  return v * scale;
}

__device__ __forceinline__ void store8(float* p, int64_t col, int64_t k, bool vec, const float (&v)[kVec]) {
  if (vec) {
    auto* p4 = reinterpret_cast<float4*>(p);
    p4[0] = make_float4(v[0], v[1], v[2], v[3]);
    p4[1] = make_float4(v[4], v[5], v[6], v[7]);
    return;
  }
  for (int i = 0; i < kVec; ++i)
    if (col + i < k) p[i] = v[i];
}

// Out = float (f32) or uint16_t (bf16 bits).
template <bool kColwise, class Out>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const DequantizeParams p) {
  const int64_t row_tile = blockIdx.x / p.col_tiles;
  const int64_t col_tile = blockIdx.x % p.col_tiles;
  const RowTile tile = resolve_tile(p.sched, row_tile, p.rows);
  const int n_rows = tile_rows(tile);
  if (n_rows == 0) return;

  const int c8 = threadIdx.x % kColThreads, rg = threadIdx.x / kColThreads;
  const int64_t k = p.cols;
  const int64_t col = col_tile * kTileCols + c8 * kVec;
  if (col >= k) return;  // no block-wide synchronisation below
  auto* dst = static_cast<Out*>(p.dst);
  const bool vec = k % kVec == 0 && aligned(p.data, 8) && aligned(dst, 16);

  // Column-wise: one scale per column, shared by all rows of the tile.
  float col_scale[kVec];
  if constexpr (kColwise) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      col_scale[i] = col + i < k ? e8m0_to_f32(p.scales[colwise_scale_index(tile.chunk_row, tile.group_rows,
                                                                            tile.block, col + i, k, p.layout)])
                                 : 0.0f;
    }
  }

#pragma unroll
  for (int r_i = 0; r_i < kRowsPerThread; ++r_i) {
    const int r = rg + r_i * kRowGroups;
    if (r >= n_rows) break;
    const int64_t row = tile.row_begin + r;
    const uint8_t* src = p.data + row * k + col;
    uint8_t q[kVec];
    if (vec) {
      const uint2 u = __ldg(reinterpret_cast<const uint2*>(src));
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        q[i] = static_cast<uint8_t>(u.x >> (8 * i));
        q[i + 4] = static_cast<uint8_t>(u.y >> (8 * i));
      }
    } else {
      for (int i = 0; i < kVec; ++i) q[i] = col + i < k ? src[i] : uint8_t{0};
    }
    float s[kVec];
    if constexpr (kColwise) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) s[i] = col_scale[i];
    } else {
      // K % 32 == 0 for row-wise data, so the 8 columns share one block.
      const float rs = e8m0_to_f32(p.scales[rowwise_scale_index(row, col / kMxBlock, k, p.layout)]);
#pragma unroll
      for (int i = 0; i < kVec; ++i) s[i] = rs;
    }
    if constexpr (sizeof(Out) == 2) {
      // bf16: two values a conversion (hardware from sm_89 on), same bits as bf16_from_f32 of the
      // f32 product below but for a NaN's payload.
      uint32_t w[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        w[i] = e4m3x2_scaled_bf16x2(q[2 * i] | (uint32_t{q[2 * i + 1]} << 8), s[2 * i], s[2 * i + 1]);
      store_bf16x8(dst + row * k + col, col, k, vec, w);
    } else {
      float v[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) v[i] = dequant_value(q[i], s[i]);
      store8(dst + row * k + col, col, k, vec, v);
    }
  }
}

template <bool kColwise>
void launch(const DequantizeParams& p, int64_t row_tiles, bool bf16, cudaStream_t stream) {
  const int64_t blocks = row_tiles * p.col_tiles;
  if (blocks == 0) return;
  if (blocks > 0x7fffffff) throw Error("src", "tensor too large for the dequantize grid");
  if (bf16) {
    dequantize_kernel<kColwise, uint16_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  } else {
    dequantize_kernel<kColwise, float><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  }
  MXMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace
}  // namespace quant

void dequantize(const DequantizeArgs& a, void* stream_ptr) {
  using namespace quant;
  const cudaStream_t stream = as_stream(stream_ptr);
  const int64_t m = a.src.data.size(0), k = a.src.data.size(1);
  if (m == 0 || k == 0) return;
  DequantizeParams p;
  p.data = a.src.data.ptr<const uint8_t>();
  p.scales = a.src.scales.ptr<const uint8_t>();
  p.layout = a.src.layout;
  p.rows = m;
  p.cols = k;
  p.col_tiles = ceil_div(k, kTileCols);
  p.dst = a.dst.data;
  const bool bf16 = a.dst.dtype == DType::bf16;
  if (a.src.axis == BlockAxis::row) {
    launch<false>(p, ceil_div(m, kTileRows), bf16, stream);
    return;
  }
  Workspace ws(row_tiles_workspace_bytes(a.groups, m), stream);
  const RowTiles tiles = row_tiles(a.groups, m, ws, stream);
  p.sched = tiles.sched;
  launch<true>(p, tiles.count, bf16, stream);
}

}  // namespace mxmoe::cuda
