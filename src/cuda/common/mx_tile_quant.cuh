// MXFP8 quantization of a bf16 tile staged in shared memory: the fused quantizing epilogues of the
// GLU steps on every CUDA backend (docs/numerics.md "Scale rule", "E4M3 cast", "Group restarts",
// "Grouped scale placement", "Quantized value"): row-wise 1x32 blocks along the tile's columns and
// column-wise 32x1 blocks along its rows. Column blocks restart at each group's first row; the
// caller's tile starts at a group-relative row that is a multiple of 32, so every column block of
// the tile lies inside it (the group's last one may be partial: its amax covers only existing rows).
// Values are already bf16, scales are e8m0_from_amax (rounded up), data are RNE saturating E4M3 of
// x * 2^(127-e): bit-identical to the standalone quantizer for the same bf16 values. Scale padding
// is not written here (the host clears it before the launch).
#pragma once
#include "mxmoe/mxfp8_layout.h"
#include "mxmoe/numerics.h"
#include "src/cuda/common/mx_out.h"
#include "src/cuda/common/convert.cuh"

namespace mxmoe::cuda {


struct MxTileTarget {
  int64_t ld = 0;            // columns of the quantized matrix
  int64_t row0 = 0;          // global row of tile row 0
  int valid_rows = 0;        // tile rows that exist (inside the group)
  int64_t group_block0 = 0;  // group-relative column-wise block index of tile row 0
  int64_t col_chunk = 0;     // s_e
  int64_t group_rows = 0;    // m_e
};

// The target of a tile whose row 0 is global row row0 of a group [begin, end) with scale chunk s_e.
__device__ __forceinline__ MxTileTarget mx_tile_target(int64_t ld, int64_t row0, int64_t row_end, int64_t begin,
                                                       int64_t end, int64_t col_chunk) {
  MxTileTarget t;
  t.ld = ld;
  t.row0 = row0;
  t.valid_rows = static_cast<int>(row_end - row0);
  t.group_block0 = (row0 - begin) / kMxBlock;
  t.col_chunk = col_chunk;
  t.group_rows = end - begin;
  return t;
}

// A bf16 tile at a plain row pitch (kPitch elements, rows 16-byte aligned).
template <int kPitch>
struct PitchedTile {
  const uint16_t* p;
  __device__ uint4 chunk(int r, int c) const { return *reinterpret_cast<const uint4*>(p + r * kPitch + c); }
  __device__ uint32_t pair(int r, int c) const { return *reinterpret_cast<const uint32_t*>(p + r * kPitch + c); }
};

// tile: a staged bf16 tile of kRows rows and kCols columns, read through
//   tile.chunk(r, c) -> uint4   the 8 values of columns c..c+7 of row r (c a multiple of 8)
//   tile.pair(r, c)  -> uint32  the 2 values of columns c, c+1 (c even)
// col_of(c): global column of tile column c, or -1; 32-aligned runs of tile columns map to 32-aligned
// runs of global columns. Threads tid = 0..threads-1 share the work (no barrier inside: the caller
// makes the stage complete before and keeps it until every thread has returned).
template <int kRows, int kCols, class Tile, class ColOf>
__device__ __forceinline__ void quantize_staged_tile(const Tile& tile, const MxOut& out, const MxTileTarget& t,
                                                     ColOf col_of, int tid, int threads) {
  constexpr int kBlocksPerRow = kCols / kMxBlock;
  if (out.row_data != nullptr) {
    for (int task = tid; task < kRows * kBlocksPerRow; task += threads) {
      const int r = task / kBlocksPerRow, b = task % kBlocksPerRow;
      const int64_t gc = col_of(b * kMxBlock);
      if (r >= t.valid_rows || gc < 0) continue;
      uint32_t v[16];  // 32 bf16 values
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint4 x = tile.chunk(r, b * kMxBlock + 8 * q);
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
    // A task is a column pair of one 32-row block: 2-byte stores, a warp writing 64 contiguous bytes
    // of a row per instruction.
    for (int task = tid; task < (kRows / kMxBlock) * (kCols / 2); task += threads) {
      const int rb = task / (kCols / 2), c = 2 * (task % (kCols / 2));
      const int64_t gc = col_of(c);
      const int r0 = rb * kMxBlock, r1 = min(r0 + kMxBlock, t.valid_rows);
      if (r0 >= r1 || gc < 0) continue;
      float amax0 = 0.0f, amax1 = 0.0f;
      for (int r = r0; r < r1; ++r) {
        const uint32_t w = tile.pair(r, c);
        amax0 = fmaxf(amax0, fabsf(bf16_lo(w))), amax1 = fmaxf(amax1, fabsf(bf16_hi(w)));
      }
      const uint8_t e0 = e8m0_from_amax(amax0), e1 = e8m0_from_amax(amax1);
      const float m0 = e8m0_encode_multiplier(e0), m1 = e8m0_encode_multiplier(e1);
      for (int r = r0; r < r1; ++r) {
        const uint32_t w = tile.pair(r, c);
        *reinterpret_cast<uint16_t*>(out.col_data + (t.row0 + r) * t.ld + gc) =
            static_cast<uint16_t>(e4m3x2_from_f32(bf16_lo(w) * m0, bf16_hi(w) * m1));
      }
      const int64_t j = t.group_block0 + rb;
      out.col_scales[colwise_scale_index(t.col_chunk, t.group_rows, j, gc, t.ld, out.col_layout)] = e0;
      out.col_scales[colwise_scale_index(t.col_chunk, t.group_rows, j, gc + 1, t.ld, out.col_layout)] = e1;
    }
  }
}

}  // namespace mxmoe::cuda
