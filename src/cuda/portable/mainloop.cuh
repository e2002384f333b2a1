// Mainloop of the portable GEMMs: a 128 x 128 x 32 CTA tile, 8 warps as 2 (M) x 4 (N), each warp
// 64 x 32 with m16n8k16 bf16 mma.sync and fp32 accumulators acc[mi][ni][4] (4 x 4 fragments).
//
// BF16: a kStages-deep cp.async pipeline; ldmatrix reads the stage tiles directly.
// MXFP8: the e4m3 tiles go through the same cp.async pipeline into staging buffers; one tile ahead
// of the MMAs every thread decodes one 16-byte chunk per operand (value * 2^(e-127), exact in BF16
// for normal ranges) into a double-buffered bf16 tile, which ldmatrix then reads. The block scales
// of tile j are loaded into registers when tile j's copies are issued and stored to shared memory
// after the next iteration's MMAs, which hides their latency behind the tensor-core work.
// One __syncthreads per K tile in both cases.
//
// Accumulator fragment element v of acc[mi][ni]: tile row wm*64 + mi*16 + lane/4 + 8*(v/2),
// tile column wn*32 + ni*8 + 2*(lane%4) + v%2.
#pragma once
#include "src/cuda/portable/tile_loader.cuh"

namespace mxmoe::cuda::portable {

inline constexpr int kWarpTileM = 64, kWarpTileN = 32;

struct FragCoord {
  int wm, wn, lane;
  __device__ __forceinline__ FragCoord() : wm((threadIdx.x >> 5) >> 2), wn((threadIdx.x >> 5) & 3), lane(threadIdx.x & 31) {}
  __device__ __forceinline__ int row(int mi, int v) const { return wm * kWarpTileM + mi * 16 + (lane >> 2) + ((v >> 1) << 3); }
  __device__ __forceinline__ int col(int ni, int v) const { return wn * kWarpTileN + ni * 8 + ((lane & 3) << 1) + (v & 1); }
};

using Accum = float[4][4][4];  // (mi, ni, fragment element)

template <bool kFp8, Major kAMajor, Major kBMajor, int kStages>
struct Mainloop {
  using LoadA = TileLoader<kAMajor, kFp8>;
  using LoadB = TileLoader<kBMajor, kFp8>;
  static_assert(!kFp8 || kStages >= 4, "MXFP8 decodes one tile ahead and stores scales two behind: >= 4 stages");
  static constexpr int kBf16Tile = kTileMN * kTileK * 2;                           // bytes of one bf16 tile
  static constexpr int kStageBytes = LoadA::kTileBytes + LoadB::kTileBytes;         // (A, B) raw tiles
  static constexpr int kDecodedBytes = kFp8 ? 2 * 2 * kBf16Tile : 0;                // (buffer, operand) bf16
  static constexpr int kScaleBytes = kFp8 ? kStages * 2 * kTileMN * 4 : 0;          // (stage, operand, mn) f32
  static constexpr int kSmemBytes = kStages * kStageBytes + kDecodedBytes + kScaleBytes;

  // One 16-wide K step on bf16 tiles at shared addresses a_tile, b_tile.
  static __device__ __forceinline__ void mma_k16(Accum& acc, uint32_t a_tile, uint32_t b_tile, int kk,
                                                 const FragCoord& f) {
    const int l = f.lane;
    uint32_t af[4][4], bfrag[4][2];
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
      const int m0 = f.wm * kWarpTileM + mi * 16;
      if constexpr (kAMajor == Major::k) {
        const int r = m0 + (l & 15);
        ldmatrix_x4(af[mi], a_tile + kmajor_offset(r, kk * 2 + (l >> 4)));
      } else {
        const int k = kk * 16 + (l & 7) + ((l >> 4) << 3);
        ldmatrix_x4_trans(af[mi], a_tile + mnmajor_offset(k, (m0 >> 3) + ((l >> 3) & 1)));
      }
    }
#pragma unroll
    for (int nj = 0; nj < 2; ++nj) {
      const int n0 = f.wn * kWarpTileN + nj * 16;
      uint32_t r[4];
      if constexpr (kBMajor == Major::k) {
        const int row = n0 + (l & 7) + ((l >> 4) << 3);
        ldmatrix_x4(r, b_tile + kmajor_offset(row, kk * 2 + ((l >> 3) & 1)));
      } else {
        const int k = kk * 16 + (l & 7) + (((l >> 3) & 1) << 3);
        ldmatrix_x4_trans(r, b_tile + mnmajor_offset(k, (n0 >> 3) + (l >> 4)));
      }
      bfrag[2 * nj][0] = r[0];
      bfrag[2 * nj][1] = r[1];
      bfrag[2 * nj + 1][0] = r[2];
      bfrag[2 * nj + 1][1] = r[3];
    }
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) mma_bf16_16816(acc[mi][ni], af[mi], bfrag[ni]);
  }

  // acc += A_tile . B_tile^T over num_k_tiles K tiles. scale_addr: MXFP8 scale addressing of the
  // operand whose scale this thread loads; scale_mn: this thread's global MN index for the scale it loads (thread t loads operand t/128's
  // scale of tile-local MN index t%128), -1 outside. Leaves shared memory free for the epilogue.
  static __device__ __forceinline__ void run(Accum& acc, uint8_t* smem, const LoadA& la, const LoadB& lb,
                                             int num_k_tiles, const ScaleAddr& scale_addr, int64_t scale_mn) {
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
      for (int ni = 0; ni < 4; ++ni)
#pragma unroll
        for (int v = 0; v < 4; ++v) acc[mi][ni][v] = 0.0f;

    const FragCoord f;
    const uint32_t s0 = smem_u32(smem);
    auto stage_a = [&](int s) { return s0 + s * kStageBytes; };
    auto stage_b = [&](int s) { return s0 + s * kStageBytes + LoadA::kTileBytes; };
    uint8_t* decoded = smem + kStages * kStageBytes;                                  // (2, 2, kBf16Tile)
    float* scales = reinterpret_cast<float*>(smem + kStages * kStageBytes + kDecodedBytes);  // (S, 2, 128)
    const int scale_slot = threadIdx.x;  // operand * 128 + mn
    ScaleStream scale;
    if constexpr (kFp8) scale.init(scale_addr, scale_mn);
    auto decode = [&](int kt) {
      const int s = kt % kStages;
      const uint8_t* raw = smem + s * kStageBytes;
      const float* sc = scales + s * 2 * kTileMN;
      uint8_t* out = decoded + (kt & 1) * 2 * kBf16Tile;
      decode_e4m3_chunk<kAMajor>(raw, sc, out);
      decode_e4m3_chunk<kBMajor>(raw + LoadA::kTileBytes, sc + kTileMN, out + kBf16Tile);
    };

#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < num_k_tiles) {
        la.issue(stage_a(s), s * kTileK);
        lb.issue(stage_b(s), s * kTileK);
        if constexpr (kFp8) scales[s * 2 * kTileMN + scale_slot] = ScaleStream::decode(scale.fetch(s));
      }
      cp_async_commit();
    }
    if constexpr (kFp8) {
      cp_async_wait<kStages - 2>();
      __syncthreads();
      if (num_k_tiles > 0) decode(0);
    }

    // MXFP8 scales of tile kt + kStages - 1 are loaded at iteration kt and stored one iteration
    // later (end of kt + 1): two K tiles of MMAs hide an L2 miss. Needs kStages >= 4 so the slot
    // written then is not the one the decode of that iteration reads.
    ScaleStream::Raw held_scale{127u, 0u};
    int held_tile = -1;
    for (int kt = 0; kt < num_k_tiles; ++kt) {
      cp_async_wait<kFp8 ? kStages - 3 : kStages - 2>();  // bf16: tile kt landed; e4m3: tile kt+1
      __syncthreads();
      const int next = kt + kStages - 1;
      ScaleStream::Raw next_scale{127u, 0u};
      if (next < num_k_tiles) {
        la.issue(stage_a(next % kStages), next * kTileK);
        lb.issue(stage_b(next % kStages), next * kTileK);
        if constexpr (kFp8) next_scale = scale.fetch(next);
      }
      cp_async_commit();
      uint32_t a_tile, b_tile;
      if constexpr (kFp8) {
        a_tile = smem_u32(decoded + (kt & 1) * 2 * kBf16Tile);
        b_tile = a_tile + kBf16Tile;
      } else {
        a_tile = stage_a(kt % kStages);
        b_tile = stage_b(kt % kStages);
      }
#pragma unroll
      for (int kk = 0; kk < kTileK / 16; ++kk) mma_k16(acc, a_tile, b_tile, kk, f);
      if constexpr (kFp8) {
        // Decoding the next tile after issuing this tile's MMAs lets the ALU work overlap them.
        if (kt + 1 < num_k_tiles) decode(kt + 1);
        if (held_tile >= 0) {
          scales[(held_tile % kStages) * 2 * kTileMN + scale_slot] = ScaleStream::decode(held_scale);
        }
        held_scale = next_scale;
        held_tile = next < num_k_tiles ? next : -1;
      }
    }
    cp_async_wait<0>();
    __syncthreads();
  }
};

}  // namespace mxmoe::cuda::portable
