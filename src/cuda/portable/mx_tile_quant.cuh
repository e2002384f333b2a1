// MXFP8 quantization of a bf16 tile staged in shared memory (fused epilogues; docs/numerics.md
// "Scale rule", "E4M3 cast", "Group restarts", "Grouped scale placement"):
// row-wise 1x32 blocks along the tile's columns and column-wise 32x1 blocks along its rows. Column
// blocks restart at each group's first row; the caller's tile starts at a group-relative row that is
// a multiple of 32, so every column block of the tile lies inside it (the group's last one may be
// partial: its amax covers only existing rows). Values are already bf16 (docs/numerics.md "Quantized
// value"), scales are
// e8m0_from_amax (rounded up), data are RNE saturating E4M3 of x * 2^(127-e): bit-identical to the
// standalone quantizer for the same bf16 values.
#pragma once
#include "src/cuda/portable/params.h"
#include "src/cuda/portable/ptx.cuh"

namespace mxmoe::cuda::portable {

struct MxTileTarget {
  int64_t ld = 0;            // columns of the quantized matrix
  int64_t row0 = 0;          // global row of tile row 0
  int valid_rows = 0;        // tile rows that exist (inside the group)
  int64_t group_block0 = 0;  // group-relative column-wise block index of tile row 0
  int64_t col_chunk = 0;     // s_e
  int64_t group_rows = 0;    // m_e
};

// tile: bf16 (kRows, kPitch) with kCols used. col_of(c): global column of tile column c, or -1;
// 32-aligned runs of tile columns map to 32-aligned runs of global columns.
template <int kRows, int kCols, int kPitch, class ColOf>
__device__ __forceinline__ void quantize_staged_tile(const uint16_t* tile, const MxOut& out, const MxTileTarget& t,
                                                     ColOf col_of) {
  constexpr int kBlocksPerRow = kCols / kMxBlock;
  if (out.row_data != nullptr) {
    for (int task = threadIdx.x; task < kRows * kBlocksPerRow; task += blockDim.x) {
      const int r = task / kBlocksPerRow, b = task % kBlocksPerRow;
      const int64_t gc = col_of(b * kMxBlock);
      if (r >= t.valid_rows || gc < 0) continue;
      uint32_t v[16];  // 32 bf16 values
      const uint4* src = reinterpret_cast<const uint4*>(tile + r * kPitch + b * kMxBlock);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint4 x = src[q];
        v[4 * q] = x.x, v[4 * q + 1] = x.y, v[4 * q + 2] = x.z, v[4 * q + 3] = x.w;
      }
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fmaxf(fabsf(bf16_lo(v[i])), fabsf(bf16_hi(v[i]))));
      const uint8_t e = e8m0_from_amax(amax);
      const float mult = e8m0_encode_multiplier(e);
      uint32_t q8[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t lo = e4m3x2_from_f32(bf16_lo(v[2 * i]) * mult, bf16_hi(v[2 * i]) * mult);
        const uint32_t hi = e4m3x2_from_f32(bf16_lo(v[2 * i + 1]) * mult, bf16_hi(v[2 * i + 1]) * mult);
        q8[i] = lo | (hi << 16);
      }
      const int64_t row = t.row0 + r;
      uint4* dst = reinterpret_cast<uint4*>(out.row_data + row * t.ld + gc);
      dst[0] = make_uint4(q8[0], q8[1], q8[2], q8[3]);
      dst[1] = make_uint4(q8[4], q8[5], q8[6], q8[7]);
      out.row_scales[rowwise_scale_index(row, gc / kMxBlock, t.ld, out.row_layout)] = e;
    }
  }
  if (out.col_data != nullptr) {
    for (int task = threadIdx.x; task < (kRows / kMxBlock) * kCols; task += blockDim.x) {
      const int rb = task / kCols, c = task % kCols;
      const int64_t gc = col_of(c);
      const int r0 = rb * kMxBlock, r1 = min(r0 + kMxBlock, t.valid_rows);
      if (r0 >= r1 || gc < 0) continue;
      float amax = 0.0f;
      for (int r = r0; r < r1; ++r) amax = fmaxf(amax, fabsf(__uint_as_float(uint32_t{tile[r * kPitch + c]} << 16)));
      const uint8_t e = e8m0_from_amax(amax);
      const float mult = e8m0_encode_multiplier(e);
      for (int r = r0; r < r1; ++r) {
        const float x = __uint_as_float(uint32_t{tile[r * kPitch + c]} << 16);
        out.col_data[(t.row0 + r) * t.ld + gc] = static_cast<uint8_t>(e4m3x2_from_f32(x * mult, 0.0f));
      }
      out.col_scales[colwise_scale_index(t.col_chunk, t.group_rows, t.group_block0 + rb, gc, t.ld, out.col_layout)] = e;
    }
  }
}

}  // namespace mxmoe::cuda::portable
