// The one-pass MXFP8 quantize kernel shared by cuda::quantize (activations, grouped rows) and
// cuda::quantize_experts (E weight matrices).
//
// Computes, for bf16 src [rows, cols] (row-major, one matrix per blockIdx.y):
//   row-wise    e4m3 [rows, cols] + E8M0 per 1x32 block along cols (rowwise_scale_index), and/or
//   column-wise e4m3 [rows, cols] + E8M0 per 32x1 block along rows, blocks restarting at each group's
//               first row (colwise_scale_index with the tile's s_e, m_e, j),
// reading every input element once: a CTA holds a 32-row x 128-column tile in registers (4 rows x
// 8 columns per thread), reduces row-block amaxes across 4 lanes with shuffles and column amaxes
// across the 8 row groups through 4 KiB of shared memory, then writes both outputs.
// Numerics are those of mxmoe/numerics.h (bit-exact with src/cpu/quant.cpp). Scale padding is
// zeroed by the host wrapper (cudaMemsetAsync) before the launch.
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuQuant*'
#pragma once
#include "src/common/experts.h"
#include "src/cuda/quant/quant_tile.cuh"

namespace mxmoe::cuda::quant {

struct QuantizeParams {
  ExpertPtrs src;                // bf16 matrices (one for cuda::quantize)
  int64_t rows = 0, cols = 0;    // of one matrix
  int64_t col_tiles = 0;         // ceil(cols / kTileCols); blockIdx.x = row_tile * col_tiles + col_tile
  GroupSchedule sched;           // grouped column-wise tiles (block_m 32); none = one group of `rows`
  uint8_t* row_data = nullptr;   // e4m3 [E, rows, cols]
  uint8_t* row_scales = nullptr;
  ScaleLayout row_layout = ScaleLayout::compact;
  uint8_t* col_data = nullptr;
  uint8_t* col_scales = nullptr;
  ScaleLayout col_layout = ScaleLayout::compact;
  int64_t data_stride = 0;       // elements between matrices in the outputs
  int64_t row_scale_stride = 0;  // scale bytes between matrices
  int64_t col_scale_stride = 0;
  // Optional gather (the fused permute, permute_quantize.cu; one matrix): row r of the matrix is
  // row src_rows[r] of src, a negative entry reading as zeros; `copy` (bf16 [rows, cols]) receives
  // the rows as read.
  const int32_t* src_rows = nullptr;
  uint16_t* copy = nullptr;
};

template <bool kRow, bool kCol>
__global__ void __launch_bounds__(kThreads) quantize_kernel(const QuantizeParams p) {
  static_assert(kRow || kCol, "at least one output");
  __shared__ float col_amax[kRowGroups][kTileCols];  // (row group, tile column)
  __shared__ float col_mult[kTileCols];              // encode multiplier per tile column

  const int64_t row_tile = blockIdx.x / p.col_tiles;
  const int64_t col_tile = blockIdx.x % p.col_tiles;
  const int64_t matrix = blockIdx.y;
  const RowTile tile = resolve_tile(p.sched, row_tile, p.rows);
  const int n_rows = tile_rows(tile);
  if (n_rows == 0) return;  // past the last block of the last group (uniform over the CTA)

  const int c8 = threadIdx.x % kColThreads, rg = threadIdx.x / kColThreads;
  const int64_t k = p.cols;
  const int64_t col = col_tile * kTileCols + c8 * kVec;
  const bool col_ok = col < k;
  const auto* src = p.src.at<const uint16_t>(matrix);
  const int64_t out_base = matrix * p.data_stride;
  // 16-byte loads / 8-byte stores need K % 8 == 0 and aligned bases (per-expert pointers are only
  // known here, on the device).
  bool vec = k % kVec == 0 && aligned(src, 16);
  if constexpr (kRow) vec = vec && aligned(p.row_data, 8);
  if constexpr (kCol) vec = vec && aligned(p.col_data, 8);
  if (p.copy != nullptr) vec = vec && aligned(p.copy, 16);

  uint32_t w[kRowsPerThread][4];  // (thread row, packed bf16 pair)
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int r = rg + i * kRowGroups;
    const int64_t row = tile.row_begin + r;
    const int64_t from = r < n_rows && p.src_rows != nullptr ? p.src_rows[row] : row;
    if (r < n_rows && col_ok && from >= 0) {
      load_bf16x8(src + from * k + col, col, k, vec, w[i]);
    } else {
      w[i][0] = w[i][1] = w[i][2] = w[i][3] = 0u;  // absent rows/columns are neutral for amax
    }
    if (p.copy != nullptr && r < n_rows && col_ok) store_bf16x8(p.copy + row * k + col, col, k, vec, w[i]);
  }

  if constexpr (kRow) {
    const int64_t kblock = col / kMxBlock;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      float amax = 0.0f;  // fmaxf returns the non-NaN operand: NaN inputs are skipped
#pragma unroll
      for (int j = 0; j < 4; ++j) amax = fmaxf(fmaxf(amax, fabsf(bf16_lo(w[i][j]))), fabsf(bf16_hi(w[i][j])));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
      const int r = rg + i * kRowGroups;
      if (r < n_rows && col_ok) {
        const uint8_t e = e8m0_from_amax(amax);
        const int64_t row = tile.row_begin + r;
        store_u8x8(p.row_data + out_base + row * k + col, col, k, vec, quantize8(w[i], e8m0_encode_multiplier(e)));
        if (c8 % kLanesPerRowBlock == 0) {
          p.row_scales[matrix * p.row_scale_stride + rowwise_scale_index(row, kblock, k, p.row_layout)] = e;
        }
      }
    }
  }

  if constexpr (kCol) {
    float amax[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) amax[j] = 0.0f;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        amax[2 * j] = fmaxf(amax[2 * j], fabsf(bf16_lo(w[i][j])));
        amax[2 * j + 1] = fmaxf(amax[2 * j + 1], fabsf(bf16_hi(w[i][j])));
      }
    }
    auto* mine = reinterpret_cast<float4*>(&col_amax[rg][c8 * kVec]);
    mine[0] = make_float4(amax[0], amax[1], amax[2], amax[3]);
    mine[1] = make_float4(amax[4], amax[5], amax[6], amax[7]);
    __syncthreads();

    // One thread per tile column: the block's scale and its multiplier.
    {
      const int c = threadIdx.x;
      float a = 0.0f;
#pragma unroll
      for (int g = 0; g < kRowGroups; ++g) a = fmaxf(a, col_amax[g][c]);
      const uint8_t e = e8m0_from_amax(a);
      col_mult[c] = e8m0_encode_multiplier(e);
      const int64_t i_col = col_tile * kTileCols + c;
      if (i_col < k) {
        p.col_scales[matrix * p.col_scale_stride +
                     colwise_scale_index(tile.chunk_row, tile.group_rows, tile.block, i_col, k, p.col_layout)] = e;
      }
    }
    __syncthreads();

    float mult[kVec];
    const auto* m4 = reinterpret_cast<const float4*>(&col_mult[c8 * kVec]);
    const float4 m0 = m4[0], m1 = m4[1];
    mult[0] = m0.x, mult[1] = m0.y, mult[2] = m0.z, mult[3] = m0.w;
    mult[4] = m1.x, mult[5] = m1.y, mult[6] = m1.z, mult[7] = m1.w;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int r = rg + i * kRowGroups;
      if (r < n_rows && col_ok) {
        const int64_t row = tile.row_begin + r;
        store_u8x8(p.col_data + out_base + row * k + col, col, k, vec, quantize8(w[i], mult));
      }
    }
  }
}

static_assert(kThreads == kTileCols, "column finalisation uses one thread per tile column");

// Launches the instantiation matching the requested outputs; grid = (row_tiles * col_tiles, matrices).
void launch_quantize(const QuantizeParams& p, int64_t row_tiles, int64_t matrices, cudaStream_t stream);

}  // namespace mxmoe::cuda::quant
