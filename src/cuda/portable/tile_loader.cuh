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

  __device__ __forceinline__ int64_t index(int64_t mn, int64_t kb) const {
    return axis == BlockAxis::row ? rowwise_scale_index(mn, kb, cols, layout)
                                  : colwise_scale_index(chunk_row, group_rows, kb, mn, cols, layout);
  }
};

// The scales of one MN index over successive K blocks. In every layout of mxfp8_layout.h the index
// is index(mn, 0) + (kb / 4) * s4 + (kb % 4) * s1; where s1 == 1 (row-wise, and swizzled column-wise)
// the 4 scales of kb = 4q..4q+3 are one aligned 32-bit word, fetched once per 4 K tiles.
// NOTE: a warp's 32 row-wise byte loads touch 32 different sectors; the word loads cut that L1
// traffic by 4, which matters because the MXFP8 mainloop is L1/shared-memory bound.
struct ScaleStream {
  const uint8_t* p0 = nullptr;  // scale of (mn, kb = 0); nullptr: outside the matrix (reads 1.0)
  int64_t s4 = 0, s1 = 0;
  bool words = false;
  uint32_t word = 0;
  int word_q = -1;

  __device__ __forceinline__ void init(const ScaleAddr& a, int64_t mn) {
    if (mn < 0) return;
    p0 = a.base + a.index(mn, 0);
    const bool compact_col = a.axis == BlockAxis::col && a.layout == ScaleLayout::compact;
    s1 = compact_col ? colwise_scale_row_bytes(a.cols) : 1;
    s4 = compact_col ? 4 * s1 : (a.layout == ScaleLayout::compact ? 4 : 512);
    words = s1 == 1 && (reinterpret_cast<uintptr_t>(p0) & 3) == 0;
  }
  // Raw scale of block kb as (word, shift); its consumer, decode(), runs an iteration later in the
  // mainloop, so the load latency stays hidden.
  struct Raw {
    uint32_t word;
    uint32_t shift;
  };
  __device__ __forceinline__ Raw fetch(int kb) {
    if (p0 == nullptr) return {127u, 0u};
    if (words) {
      if ((kb >> 2) != word_q) {
        word_q = kb >> 2;
        word = __ldg(reinterpret_cast<const uint32_t*>(p0 + word_q * s4));
      }
      return {word, static_cast<uint32_t>(kb & 3) * 8u};
    }
    return {__ldg(p0 + (kb >> 2) * s4 + (kb & 3) * s1), 0u};
  }
  static __device__ __forceinline__ float decode(Raw r) {
    return e8m0_to_f32(static_cast<uint8_t>(r.word >> r.shift));
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

// Decodes this thread's share of a staged e4m3 tile into the bf16 tile, each value times its block
// scale. `scales` holds the tile's 128 decoded scales by tile-local MN index.
//   K-major  (128 rows, 32 k): thread = (row t/2, 16 k): one scale, one 16-byte read, two 16-byte
//   writes.
//   MN-major (32 k, 128 mn): thread = (4 k rows from 4*(t/32), 4 mn from 4*(t%32)): one float4 of
//   scales, four conflict-free 4-byte row reads, four 8-byte writes (a warp writes whole rows).
template <Major kMajor>
__device__ __forceinline__ void decode_e4m3_chunk(const uint8_t* staged, const float* scales, uint8_t* bf16_tile) {
  const int t = threadIdx.x;
  if constexpr (kMajor == Major::k) {
    const int row = t >> 1, c = t & 1;
    const uint4 raw = *reinterpret_cast<const uint4*>(staged + row * kTileK + c * 16);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    const float s = scales[row];
    uint32_t out[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 v = e4m3x2_to_f32(w[j >> 1] >> ((j & 1) * 16));
      out[j] = pack_bf16x2(v.x * s, v.y * s);
    }
    *reinterpret_cast<uint4*>(bf16_tile + kmajor_offset(row, 2 * c)) = make_uint4(out[0], out[1], out[2], out[3]);
    *reinterpret_cast<uint4*>(bf16_tile + kmajor_offset(row, 2 * c + 1)) = make_uint4(out[4], out[5], out[6], out[7]);
  } else {
    const int rg = t >> 5, cg = t & 31;
    const float4 s = *reinterpret_cast<const float4*>(scales + 4 * cg);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int k = 4 * rg + i;
      const uint32_t w = *reinterpret_cast<const uint32_t*>(staged + k * kTileMN + 4 * cg);
      const float2 v0 = e4m3x2_to_f32(w);
      const float2 v1 = e4m3x2_to_f32(w >> 16);
      *reinterpret_cast<uint2*>(bf16_tile + mnmajor_offset(k, cg >> 1) + (cg & 1) * 8) =
          make_uint2(pack_bf16x2(v0.x * s.x, v0.y * s.y), pack_bf16x2(v1.x * s.z, v1.y * s.w));
    }
  }
}

}  // namespace mxmoe::cuda::portable
