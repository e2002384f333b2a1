// Shared pieces of the MXFP8 quantize / dequantize kernels: the CTA tile, the mapping of a CTA to
// (group, local 32-row block) through the device-built group schedule (block_m = 32,
// src/cuda/common/group_schedule.h), and the 8-wide load/convert/store helpers.
//
// Tile: one CTA of kThreads = 128 threads owns kTileRows = 32 rows x kTileCols = 128 columns of an
// [M, K] matrix. Thread t owns 8 consecutive columns (c8 = t % 16) of the rows rg, rg+8, rg+16,
// rg+24 (rg = t / 16), so a warp touches 2 rows x 256 contiguous bf16 bytes per 16-byte load, the
// four lanes 4q..4q+3 hold one 32-column row block, and all 32 rows of a column sit in one CTA.
// The 32 rows are relative to the group's first row, so column-wise blocks restart per group.
#pragma once
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "mxmoe/groups.h"
#include "mxmoe/numerics.h"
#include "src/cuda/common/group_schedule.h"

namespace mxmoe::cuda::quant {

inline constexpr int kTileRows = kMxBlock;                      // one column-wise block
inline constexpr int kTileCols = 128;
inline constexpr int kVec = 8;                                  // columns per thread (16 B of bf16)
inline constexpr int kColThreads = kTileCols / kVec;            // 16 threads across a tile row
inline constexpr int kThreads = 128;
inline constexpr int kRowGroups = kThreads / kColThreads;       // 8
inline constexpr int kRowsPerThread = kTileRows / kRowGroups;   // 4
inline constexpr int kLanesPerRowBlock = kMxBlock / kVec;       // 4 lanes share one row-wise scale
static_assert(kRowGroups * kRowsPerThread == kTileRows, "thread rows must cover the tile");
static_assert(kColThreads * kRowGroups == kThreads, "threads must cover the tile");
static_assert(kLanesPerRowBlock == 4, "row-wise amax reduction uses shfl_xor 1 and 2");

// One 32-row block of one group, as a CTA sees it. group_rows 0 marks a CTA past the last block of
// the last group (the grid is sized from the upper bound ceil(M/32) + E).
struct RowTile {
  int32_t row_begin;   // first row of the tile (global row index within the matrix)
  int32_t group_rows;  // m_e of the tile's group
  int32_t block;       // j: block index inside the group
  int32_t chunk_row;   // s_e: first column-wise scale row of the group
};

// Rows of the tile that exist (0 for an unused tile).
__device__ __forceinline__ int tile_rows(const RowTile& t) {
  const int rest = t.group_rows - t.block * kTileRows;
  return rest < 0 ? 0 : (rest > kTileRows ? kTileRows : rest);
}

// Tile `y` of a matrix: from the schedule's m-tiles when the rows are grouped, else block y of one
// group of `rows` rows (also used for row-wise-only work, which does not care about groups).
__device__ __forceinline__ RowTile resolve_tile(const GroupSchedule& sched, int64_t y, int64_t rows) {
  RowTile t{0, 0, 0, 0};
  if (sched.tiles == nullptr) {
    t.row_begin = static_cast<int32_t>(y * kTileRows);
    t.group_rows = static_cast<int32_t>(rows);
    t.block = static_cast<int32_t>(y);
    return t;
  }
  const TileInfo m_tile = sched.tiles[y];
  if (m_tile.expert < 0) return t;
  const GroupInfo g = sched.groups[m_tile.expert];
  t.row_begin = m_tile.row0;
  t.group_rows = g.end - g.begin;
  t.block = (m_tile.row0 - g.begin) / kTileRows;
  t.chunk_row = g.col_chunk;
  return t;
}

// The schedule of a matrix of `rows` rows split by `groups` (no offsets or E = 0: no schedule,
// one group of `rows` rows), with the row tiles to launch (an upper bound when grouped).
struct RowTiles {
  GroupSchedule sched;
  int64_t count = 0;
};
inline int64_t row_tiles_workspace_bytes(const GroupOffsets& groups, int64_t rows) {
  return groups.offsets.data != nullptr ? group_schedule_bytes(groups.experts(), rows, kTileRows) : 0;
}
inline RowTiles row_tiles(const GroupOffsets& groups, int64_t rows, Workspace& ws, cudaStream_t stream) {
  RowTiles t;
  if (groups.offsets.data != nullptr) {
    t.sched = build_group_schedule(groups.data(), groups.experts(), rows, kTileRows, ws, stream);
  }
  t.count = t.sched.tiles != nullptr ? t.sched.tiles_bound : ceil_div(rows, kTileRows);
  return t;
}

// ---- 8-wide helpers; `vec` selects 16/8-byte accesses (aligned, K % 8 == 0) over scalar ones ----

__device__ __forceinline__ bool aligned(const void* p, int bytes) {
  return (reinterpret_cast<uintptr_t>(p) & static_cast<uintptr_t>(bytes - 1)) == 0;
}

// Eight bf16 values at p[0..7] (columns col..col+7 of a row with k columns) as 4 packed words;
// columns >= k read as 0, which is neutral for amax.
__device__ __forceinline__ void load_bf16x8(const uint16_t* p, int64_t col, int64_t k, bool vec,
                                            uint32_t (&w)[4]) {
  if (vec) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    return;
  }
  for (int i = 0; i < 4; ++i) {
    const uint32_t lo = col + 2 * i < k ? p[2 * i] : 0u;
    const uint32_t hi = col + 2 * i + 1 < k ? p[2 * i + 1] : 0u;
    w[i] = lo | (hi << 16);
  }
}

// The 4 packed words of load_bf16x8 back to p[0..7] (columns >= k are not written).
__device__ __forceinline__ void store_bf16x8(uint16_t* p, int64_t col, int64_t k, bool vec, const uint32_t (&w)[4]) {
  if (vec) {
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
    return;
  }
  for (int i = 0; i < kVec; ++i) {
    if (col + i < k) p[i] = static_cast<uint16_t>(i % 2 == 0 ? w[i / 2] & 0xffffu : w[i / 2] >> 16);
  }
}

__device__ __forceinline__ void store_u8x8(uint8_t* p, int64_t col, int64_t k, bool vec, uint2 q) {
  if (vec) {
    *reinterpret_cast<uint2*>(p) = q;
    return;
  }
  for (int i = 0; i < kVec; ++i) {
    if (col + i < k) p[i] = static_cast<uint8_t>((i < 4 ? q.x >> (8 * i) : q.y >> (8 * (i - 4))) & 0xffu);
  }
}

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// Four fp32 values (already multiplied by the scale's encode multiplier) -> 4 E4M3 bytes, byte i =
// value i. The x * 2^(127-e) products are exact or rounded identically on host and device (IEEE fp32,
// no flush to zero).
__device__ __forceinline__ uint32_t e4m3x4(float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // cvt.rn.satfinite.e4m3x2.f32: RNE, saturating, +-Inf -> +-448, same as e4m3_from_f32 except the
  // sign of NaN, which patch_nan() restores.
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
#else
  return static_cast<uint32_t>(e4m3_from_f32(a)) | (static_cast<uint32_t>(e4m3_from_f32(b)) << 8) |
         (static_cast<uint32_t>(e4m3_from_f32(c)) << 16) | (static_cast<uint32_t>(e4m3_from_f32(d)) << 24);
#endif
}

// NaN inputs: the CPU reference multiplies on the host, where x * r keeps x's NaN (sign included),
// so it stores sign | 0x7F. The GPU product is the canonical (positive) NaN; restore the sign from
// the bf16 input. A finite or infinite value never maps to the low-7-bit pattern 0x7F (satfinite),
// so the check is exact. w0/w1 are the packed bf16 words holding the 4 source values.
__device__ __forceinline__ uint32_t patch_nan(uint32_t q, uint32_t w0, uint32_t w1) {
  const uint32_t nan_bytes = ((q & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
  if (nan_bytes == 0) return q;
  const uint32_t signs[4] = {(w0 >> 15) & 1u, (w0 >> 31) & 1u, (w1 >> 15) & 1u, (w1 >> 31) & 1u};
  for (int i = 0; i < 4; ++i) {
    if (nan_bytes & (0x80u << (8 * i))) {
      q = (q & ~(0xffu << (8 * i))) | ((0x7fu | (signs[i] << 7)) << (8 * i));
    }
  }
  return q;
}

// Eight bf16 values (4 packed words) times `mult` -> 8 E4M3 bytes.
__device__ __forceinline__ uint2 quantize8(const uint32_t (&w)[4], float mult) {
  uint2 q;
  q.x = e4m3x4(bf16_lo(w[0]) * mult, bf16_hi(w[0]) * mult, bf16_lo(w[1]) * mult, bf16_hi(w[1]) * mult);
  q.y = e4m3x4(bf16_lo(w[2]) * mult, bf16_hi(w[2]) * mult, bf16_lo(w[3]) * mult, bf16_hi(w[3]) * mult);
  q.x = patch_nan(q.x, w[0], w[1]);
  q.y = patch_nan(q.y, w[2], w[3]);
  return q;
}

// Eight multipliers (one per column) variant used by the column-wise output.
__device__ __forceinline__ uint2 quantize8(const uint32_t (&w)[4], const float (&mult)[kVec]) {
  uint2 q;
  q.x = e4m3x4(bf16_lo(w[0]) * mult[0], bf16_hi(w[0]) * mult[1], bf16_lo(w[1]) * mult[2],
               bf16_hi(w[1]) * mult[3]);
  q.y = e4m3x4(bf16_lo(w[2]) * mult[4], bf16_hi(w[2]) * mult[5], bf16_lo(w[3]) * mult[6],
               bf16_hi(w[3]) * mult[7]);
  q.x = patch_nan(q.x, w[0], w[1]);
  q.y = patch_nan(q.y, w[2], w[3]);
  return q;
}

}  // namespace mxmoe::cuda::quant
