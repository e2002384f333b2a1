// The FP8-blockwise mainloop of the sm90 grouped GEMMs (Mainloop::fp8_block, recipe fp8_blockwise).
//   m-grouped: A e4m3 [T, K] with f32 scales per 1x128 block, B e4m3 [N, K] with f32 scales per
//              128x128 block (dgrad: B_e^T, transposed first), both K-major;
//   k-grouped (wgrad): both operands transposed to token blocks ([M or N, Tp], K-major), f32 scales per
//              row and 128-token block.
// A stage holds 128 values of K (128-byte rows, 128-byte swizzle: the bytes of a BF16 stage). FP8
// wgmma (QGMMA, m64n128k32) accumulates each k-block from zero into a second register tile `part`,
// which is promoted into the fp32 accumulators as acc = fma(part, s_a(row) s_b(column), acc):
// docs/numerics.md's block rule (the wgmma's own partial sums in their order). Warps 1-3 of the
// producer warp group stage each stage's scales in shared memory (as CUTLASS stages them through its
// producer), taking the k-blocks in turn.
// NOTE: BLK_N is 128: the two register tiles (acc, part) take 128 of a consumer's 224 registers.
// Per k-block each consumer waits for its wgmmas (wait 0) before promoting, so the tensor core idles
// while both warp groups promote (docs/kernels/sm90_fp8_block.md: what was tried against it).
#pragma once
#include "src/cuda/sm90/pipeline.cuh"
#include "src/cuda/sm90/tile_scheduler.cuh"
#include "src/cuda/sm90/wgmma.cuh"

namespace mxmoe::cuda::sm90 {

// The scales of one k-block for the thread (m-grouped): rows r, r + 8 of A and B's 128-row blocks of
// the tile's two column halves.
struct BlkScales {
  float a[2], b[2];
};
// k-grouped: the scales of the thread's output rows (A's features r and r + 8) and of its 32 output
// columns (B's features, pairs 8j + 2(lane % 4), + 1).
template <int BN>
struct WgradScales {
  float a[2];
  float2 b[BN / 8];
};

// The 128-row block of B_e holding column half `half` of the tile: glu_halves, the a and b rows of W1
// are F rows apart.
__device__ __forceinline__ int32_t blk_b_block(const KernelParams& p, const Tile& t, int half) {
  if (p.b_load == BLoad::glu_halves)
    return static_cast<int32_t>((half * p.ffn + static_cast<int64_t>(t.n_tile) * 64) / 128);
  return t.n_tile;  // k_rows: rows n_tile*128..; glu_interleave32: W1 rows 2 f0 .. 2 f0 + 127, f0 = 64 n_tile
}

// A loader warp fills a stage's scale slot (lane l: A rows l + 32 j, and B's columns l + 32 j (wgrad)
// or the two column halves' block scales), every load issued before any store. Rows past the tensor
// read the last row's scale and columns past N read 0 (their outputs are never stored).
template <class Cfg>
__device__ __forceinline__ void load_blk_scales(const KernelParams& p, const Tile& t, int kb, int lane, uint8_t* dst) {
  constexpr int BN = Cfg::kBlockN;
  float* f = reinterpret_cast<float*>(dst);
  float va[kBlockM / 32], vb[BN / 32];
  if constexpr (Cfg::kGrouping == Grouping::k) {
    const int64_t b = t.k0 / 128 + kb, n0 = static_cast<int64_t>(t.n_tile) * BN;
#pragma unroll
    for (int j = 0; j < kBlockM / 32; ++j) {
      int64_t m = t.row0 + lane + 32 * j;
      if (m >= p.m) m = p.m - 1;
      va[j] = __ldg(p.a_sinv + b * p.a_sinv_pitch + m);
    }
#pragma unroll
    for (int j = 0; j < BN / 32; ++j) {
      const int64_t n = n0 + lane + 32 * j;
      vb[j] = n < p.n ? __ldg(p.b_sinv + b * p.b_sinv_pitch + n) : 0.0f;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kBlockM / 32; ++j) {
      int64_t row = t.row0 + lane + 32 * j;
      if (row >= p.rows) row = p.rows - 1;
      va[j] = __ldg(p.a_sinv + static_cast<int64_t>(kb) * p.a_sinv_pitch + row);
    }
    vb[0] =
        lane < 2
            ? __ldg(p.b_sinv + (static_cast<int64_t>(t.b_expert) * p.b_nbs + blk_b_block(p, t, lane)) * p.b_kbs + kb)
            : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kBlockM / 32; ++j) f[lane + 32 * j] = va[j];
  if constexpr (Cfg::kGrouping == Grouping::k) {
#pragma unroll
    for (int j = 0; j < BN / 32; ++j) f[kBlockM + lane + 32 * j] = vb[j];
  } else {
    if (lane < 2) f[kBlockM + lane] = vb[0];
  }
}

template <class Cfg>
struct MainloopFp8Block {
  static constexpr int BN = Cfg::kBlockN;
  static_assert(BN == 128, "the m64n128k32 FP8 atom covers the tile's width");
  static_assert(Cfg::kThreadRelease, "the consumers read the staged scales with ordinary loads: each thread releases");

  // The k-block's partial sums into `part` (the first wgmma overwrites it: scale-d 0); a k32 step
  // advances 32 bytes, as a bf16 k16 step does.
  __device__ __forceinline__ static void issue(const uint8_t* sa, const uint8_t* sb, int cw, float (&part)[BN / 2]) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) fence_operand(part[i]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::kKBlock / 32; ++kk) {
      const uint64_t da = operand_desc<Major::k>(sa + cw * kBoxBytes, kk);  // (64,32) of (BLK_M,BLK_K)
      const uint64_t db = operand_desc<Major::k>(sb, kk);                   // (BLK_N,32)
      gmma_call_scaled<GmmaFp8>(da, db, part, kk == 0, std::make_index_sequence<BN / 2>{});
    }
    wgmma_commit();
  }
  __device__ __forceinline__ static void retire(float (&part)[BN / 2]) {
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) fence_operand(part[i]);
  }
  // acc[4j + 2h + i] += part * s_a(row half h) s_b(column half: j < BN/16 is 0).
  __device__ __forceinline__ static void promote(float (&acc)[BN / 2], const float (&part)[BN / 2],
                                                 const BlkScales& sc) {
    float s[2][2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int c = 0; c < 2; ++c) s[h][c] = sc.a[h] * sc.b[c];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = fmaf(part[i], s[(i / 2) % 2][i / 4 < BN / 16 ? 0 : 1], acc[i]);
  }

  struct TileState {
    // The k-block's partial sums, (BLK_M/2,BLK_N) per consumer warp group. Left uninitialized (the
    // kernel default-initializes TileState): each k-block's first wgmma overwrites it (scale-d 0).
    float part[BN / 2];
  };
  static constexpr bool kWalksDummies = false;  // a dummy tile is drained

  // k-block kb of a live tile: wait for the stage, read its scales, the FP8 wgmmas into `part`, wait,
  // release the stage, promote.
  __device__ __forceinline__ static void k_block(const Tile& t, int kb, ConsumerPipeline<Cfg>& pipe, TileState& s,
                                                 float (&acc)[BN / 2]) {
    const int cw = pipe.cw, wtid = pipe.ctid % 128;
    const int stage = pipe.stage;
    pipe.wait();
    if constexpr (Cfg::kGrouping == Grouping::k) {
      // wgrad: per-row and per-column scales, an outer product per k-block, read from the stage's
      // slot while the wgmmas run.
      issue(pipe.ring.a(stage), pipe.ring.b(stage), cw, s.part);
      const uint32_t sc0 = smem_addr(pipe.ring.scl(stage));
      const int r = 64 * cw + 16 * (wtid / 32) + (wtid % 32) / 4;  // the thread's rows r, r + 8 of the tile
      WgradScales<BN> ws;                                          // rows r, r + 8; columns 8j + 2q, + 1
      ws.a[0] = lds_f32(sc0 + 4 * r);
      ws.a[1] = lds_f32(sc0 + 4 * (r + 8));
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) ws.b[j] = lds_f32x2(sc0 + 4 * (kBlockM + 8 * j + 2 * ((wtid % 32) % 4)));
      retire(s.part);
      pipe.release(stage, false);
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) {
        const float2 sbj = ws.b[i / 4];
        acc[i] = fmaf(s.part[i], ws.a[(i / 2) % 2] * (i % 2 == 0 ? sbj.x : sbj.y), acc[i]);
      }
    } else {
      // The scales are read before the stage is released.
      const uint32_t sc0 = smem_addr(pipe.ring.scl(stage));
      const int r = 64 * cw + 16 * (wtid / 32) + (wtid % 32) / 4;
      BlkScales sc;
      sc.a[0] = lds_f32(sc0 + 4 * r);
      sc.a[1] = lds_f32(sc0 + 4 * (r + 8));
      sc.b[0] = lds_f32(sc0 + 4 * kBlockM);
      sc.b[1] = lds_f32(sc0 + 4 * (kBlockM + 1));
      issue(pipe.ring.a(stage), pipe.ring.b(stage), cw, s.part);
      retire(s.part);
      pipe.release(stage, false);
      promote(acc, s.part, sc);
    }
    pipe.advance();
  }

  // After the tile's last k-block: every wgmma retired (each k-block already waited for its own).
  __device__ __forceinline__ static void finish(ConsumerPipeline<Cfg>&, TileState&) { wgmma_wait<0>(); }

  // The scale loaders: loader warp lt / 32 (of 3) fills the slot of every third stage, its 32 lanes
  // arriving on the full barrier after their stores.
  struct LoaderState {
    int turn = 0;  // k-blocks so far mod 3
  };
  __device__ __forceinline__ static void load_stage_scales(const KernelParams& p, const Tile& t, int kb, int lt,
                                                           const Ring<Cfg>& ring, int stage, uint32_t phase,
                                                           LoaderState& ls) {
    if (ls.turn == lt / 32) {
      mbar_wait(&ring.empty[stage], phase ^ 1);
      if (t.live) load_blk_scales<Cfg>(p, t, kb, lt % 32, ring.scl(stage));
      mbar_arrive(&ring.full[stage]);
    }
    ls.turn = ls.turn == 2 ? 0 : ls.turn + 1;
  }
};

}  // namespace mxmoe::cuda::sm90
