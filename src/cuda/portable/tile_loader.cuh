// Global -> shared loads of one 128 x 32 operand tile (MN x K) per pipeline stage, with cp.async,
// plus the per-tile E8M0 scale loads of MXFP8 operands and their decode to BF16.
//
// An operand is K-major (rows = MN index, K contiguous: A of gemm_m, B_e [N, K]) or MN-major
// (rows = K index, MN contiguous: B_e [K, N], and both operands of gemm_k). Shared layouts:
//   bf16 K-major   (128, 32)  byte r*64  + ((c ^ ((r>>1)&3)) << 4), c = 16-byte chunk 0..3
//   bf16 MN-major  (32, 128)  byte k*256 + ((c ^ (k&7)) << 4),      c = 0..15
//   e4m3 staging   (128, 32) K-major r*32 + c*16 / (32, 128) MN-major k*128 + c*16 (no swizzle:
//                  only the decode pass reads it, row by row)
// The XOR swizzles make every ldmatrix phase (8 rows x 16 bytes) hit 8 distinct bank groups.
#pragma once
#include <cstdint>

#include "mxmoe/mxfp8_layout.h"
#include "src/cuda/portable/params.h"
#include "src/cuda/portable/ptx.cuh"

namespace mxmoe::cuda::portable {

inline constexpr int kTileMN = 128;  // MN extent of an operand tile
inline constexpr int kTileK = 32;    // K extent (one MXFP8 block)
inline constexpr int kThreads = 256;

__device__ __forceinline__ uint32_t kmajor_offset(int r, int c) { return r * 64 + ((c ^ ((r >> 1) & 3)) << 4); }
__device__ __forceinline__ uint32_t mnmajor_offset(int k, int c) { return k * 256 + ((c ^ (k & 7)) << 4); }

// Where the E8M0 scale of (MN index mn, K block kb) lives for one operand.
struct ScaleAddr {
  const uint8_t* base = nullptr;
  int64_t cols = 0;        // row-wise: K (the matrix's columns); column-wise: the MN extent
  int64_t chunk_row = 0;   // column-wise: first scale row of the group (s_e)
  int64_t group_rows = 0;  // column-wise: rows of the group (m_e, or K for a weight)
  BlockAxis axis = BlockAxis::row;
  ScaleLayout layout = ScaleLayout::compact;

  __device__ __forceinline__ float load(int64_t mn, int64_t kb) const {
    const int64_t i = axis == BlockAxis::row ? rowwise_scale_index(mn, kb, cols, layout)
                                             : colwise_scale_index(chunk_row, group_rows, kb, mn, cols, layout);
    return e8m0_to_f32(__ldg(base + i));
  }
};

// One operand as a CTA sees it: `mn_index(local)` maps a tile-local MN index to the global one
// (-1: outside the matrix), `base` addresses element (mn = 0, k = 0), K-major rows are `pitch`
// bytes apart (MN-major: K rows are). K indices at or past `k_end` read as zero.
template <Major kMajor, bool kFp8>
struct TileLoader {
  static constexpr int kElemBytes = kFp8 ? 1 : 2;
  static constexpr int kChunkElems = 16 / kElemBytes;          // elements per 16-byte chunk
  static constexpr int kTileBytes = kTileMN * kTileK * kElemBytes;
  static constexpr int kPerThread = kTileBytes / 16 / kThreads;  // chunks per thread: 2 (bf16), 1 (e4m3)
  static constexpr int kChunksPerRow = (kMajor == Major::k ? kTileK : kTileMN) / kChunkElems;

  const char* src[kPerThread];  // address at k = 0 of this thread's chunk, nullptr if outside
  uint32_t soff[kPerThread];    // byte offset inside the stage tile
  int kpos[kPerThread];         // K-major: first k of the chunk; MN-major: k row
  const char* fallback;         // mapped address for zero-filling copies
  int64_t pitch;
  int k_end;

  template <class MnIndex>
  __device__ __forceinline__ void init(const void* base, int64_t pitch_bytes, int k_end_, MnIndex mn_index) {
    fallback = static_cast<const char*>(base);
    pitch = pitch_bytes;
    k_end = k_end_;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int q = threadIdx.x + i * kThreads;
      const int row = q / kChunksPerRow, c = q % kChunksPerRow;
      if constexpr (kMajor == Major::k) {
        const int64_t mn = mn_index(row);
        src[i] = mn < 0 ? nullptr : fallback + mn * pitch;
        kpos[i] = c * kChunkElems;
        soff[i] = kFp8 ? row * kTileK + c * 16 : kmajor_offset(row, c);
      } else {
        const int64_t mn = mn_index(c * kChunkElems);
        src[i] = mn < 0 ? nullptr : fallback + mn * kElemBytes;
        kpos[i] = row;
        soff[i] = kFp8 ? row * kTileMN + c * 16 : mnmajor_offset(row, c);
      }
    }
  }

  // Issues the copies of the tile starting at k0 into the stage tile at shared address `tile`.
  __device__ __forceinline__ void issue(uint32_t tile, int k0) const {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int k = k0 + kpos[i];
      const bool ok = src[i] != nullptr && k < k_end;
      const char* p = fallback;
      if (ok) p = kMajor == Major::k ? src[i] + static_cast<int64_t>(k) * kElemBytes : src[i] + k * pitch;
      cp_async_16(tile + soff[i], p, ok);
    }
  }
};

// Decodes this thread's share of a staged e4m3 tile (one 16-byte chunk) into the bf16 tile, each
// value times its block scale. `scales` holds the tile's 128 decoded scales by tile-local MN index.
template <Major kMajor>
__device__ __forceinline__ void decode_e4m3_chunk(const uint8_t* staged, const float* scales, uint8_t* bf16_tile) {
  const int t = threadIdx.x;
  int row, c;
  if constexpr (kMajor == Major::k) {
    row = t >> 1, c = t & 1;  // (128 rows, 2 chunks of 16 k)
  } else {
    row = t >> 3, c = t & 7;  // (32 k rows, 8 chunks of 16 mn)
  }
  const uint4 raw = *reinterpret_cast<const uint4*>(staged + (kMajor == Major::k ? row * 32 : row * 128) + c * 16);
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t out[8];
  if constexpr (kMajor == Major::k) {
    const float s = scales[row];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 v = e4m3x2_to_f32(w[j >> 1] >> ((j & 1) * 16));
      out[j] = pack_bf16x2(v.x * s, v.y * s);
    }
  } else {
    const float4* s4 = reinterpret_cast<const float4*>(scales + c * 16);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float4 s = s4[q];
      const float2 v0 = e4m3x2_to_f32(w[q]);
      const float2 v1 = e4m3x2_to_f32(w[q] >> 16);
      out[2 * q] = pack_bf16x2(v0.x * s.x, v0.y * s.y);
      out[2 * q + 1] = pack_bf16x2(v1.x * s.z, v1.y * s.w);
    }
  }
  const uint32_t o0 = kMajor == Major::k ? kmajor_offset(row, 2 * c) : mnmajor_offset(row, 2 * c);
  const uint32_t o1 = kMajor == Major::k ? kmajor_offset(row, 2 * c + 1) : mnmajor_offset(row, 2 * c + 1);
  *reinterpret_cast<uint4*>(bf16_tile + o0) = make_uint4(out[0], out[1], out[2], out[3]);
  *reinterpret_cast<uint4*>(bf16_tile + o1) = make_uint4(out[4], out[5], out[6], out[7]);
}

}  // namespace mxmoe::cuda::portable
