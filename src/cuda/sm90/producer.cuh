// The producer of the sm90 grouped GEMM kernels: one thread of the producer warp group fills the
// ring by TMA, the tiles' k-blocks in the scheduler's order (CUTLASS's CollectiveMma::load).
//
// A: m-grouped, one [BLK_M, BLK_K] box of the tokens [T, K] (one tensor map over all tokens; rows past
//    the group's end belong to the next group, computed and never stored); k-grouped, BLK_M/64 boxes of
//    [64 k, 64 m] from A [T, M] (FP8 blockwise: one [BLK_M, 128] box of A^T [M, Tp]).
// B: in two halves (rows or columns [h BN/2, (h+1) BN/2) of the tile), each loaded by one CTA of the
//    pair and multicast to both, or both by this CTA (BLoad: how the tile's B is laid out in B_e).
#pragma once
#include "src/cuda/sm90/pipeline.cuh"
#include "src/cuda/sm90/ptx.cuh"
#include "src/cuda/sm90/tile_scheduler.cuh"

namespace mxmoe::cuda::sm90 {

// B half `h` of the tile (rows or columns [h BN/2, (h+1) BN/2)), to this CTA or multicast to both.
template <class Cfg>
__device__ __forceinline__ void load_b_half(const KernelParams& p, const Tile& t, int32_t k, int h, uint8_t* sb,
                                            uint64_t* bar, const CUtensorMap* mb0, const CUtensorMap* mb1, bool mc) {
  constexpr int BN = Cfg::kBlockN;
  constexpr uint16_t kBoth = 0b11;
  const int32_t e = t.b_expert;
  if constexpr (Cfg::kGrouping == Grouping::k && Cfg::kBlk) {
    // B^T [N, Tp] K-major: rows n of this half, 128 token bytes.
    uint8_t* dst = sb + h * (BN / 2) * Cfg::kKBlock;
    const int32_t n = t.n_tile * BN + h * (BN / 2);
    if (mc)
      tma_load_2d_mc(mb0, bar, dst, k, n, kBoth);
    else
      tma_load_2d(mb0, bar, dst, k, n);
  } else if constexpr (Cfg::kGrouping == Grouping::k) {
    const int32_t n0 = t.n_tile * BN;
#pragma unroll
    for (int i = h * BN / 128; i < (h + 1) * BN / 128; ++i) {
      if (mc)
        tma_load_2d_mc(mb0, bar, sb + i * kBoxBytes, n0 + 64 * i, k, kBoth);
      else
        tma_load_2d(mb0, bar, sb + i * kBoxBytes, n0 + 64 * i, k);
    }
  } else {
    uint8_t* dst = sb + h * (BN / 2) * Cfg::kKBlock * Cfg::kElemB;
    switch (p.b_load) {
      case BLoad::k_rows: {
        const int32_t n = t.n_tile * BN + h * (BN / 2);
        if (mc)
          tma_load_3d_mc(mb0, bar, dst, k, n, e, kBoth);
        else
          tma_load_3d(mb0, bar, dst, k, n, e);
        break;
      }
      case BLoad::glu_halves: {
        const int32_t f0 = t.n_tile * (BN / 2);
        const CUtensorMap* m = h == 0 ? mb0 : mb1;
        if (mc)
          tma_load_3d_mc(m, bar, dst, k, f0, e, kBoth);
        else
          tma_load_3d(m, bar, dst, k, f0, e);
        break;
      }
      case BLoad::glu_interleave32: {
        const int32_t c0 = t.n_tile * (BN / 2) / kGluInterleave;
        const CUtensorMap* m = h == 0 ? mb0 : mb1;
        if (mc)
          tma_load_4d_mc(m, bar, dst, k, 0, c0, e, kBoth);
        else
          tma_load_4d(m, bar, dst, k, 0, c0, e);
        break;
      }
      case BLoad::mn_boxes: {
        const int32_t n0 = t.n_tile * BN;
#pragma unroll
        for (int i = h * BN / 128; i < (h + 1) * BN / 128; ++i) {
          if (mc)
            tma_load_3d_mc(mb0, bar, sb + i * kBoxBytes, n0 + 64 * i, k, e, kBoth);
          else
            tma_load_3d(mb0, bar, sb + i * kBoxBytes, n0 + 64 * i, k, e);
        }
        break;
      }
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void load_stage(const KernelParams& p, const Tile& t, int kb, uint32_t rank, uint8_t* sa,
                                           uint8_t* sb, uint64_t* bar, const CUtensorMap* ma, const CUtensorMap* mb0,
                                           const CUtensorMap* mb1) {
  int32_t k;
  if constexpr (Cfg::kGrouping == Grouping::k && Cfg::kBlk) {
    k = static_cast<int32_t>(t.k0) + kb * Cfg::kKBlock;  // A^T [M, Tp] K-major: one [128 m][128 token] box
    tma_load_2d(ma, bar, sa, k, t.m_tile * kBlockM);
  } else if constexpr (Cfg::kGrouping == Grouping::k) {
    k = static_cast<int32_t>(t.k0) + kb * kBlockK;
    const int32_t m0 = t.m_tile * kBlockM;
#pragma unroll
    for (int i = 0; i < kBlockM / 64; ++i) tma_load_2d(ma, bar, sa + i * kBoxBytes, m0 + 64 * i, k);
  } else {
    k = kb * Cfg::kKBlock;
    tma_load_2d(ma, bar, sa, k, static_cast<int32_t>(t.row0));
  }
  if (t.multicast) {
    load_b_half<Cfg>(p, t, k, static_cast<int>(rank), sb, bar, mb0, mb1, true);
  } else {
    load_b_half<Cfg>(p, t, k, 0, sb, bar, mb0, mb1, false);
    load_b_half<Cfg>(p, t, k, 1, sb, bar, mb0, mb1, false);
  }
}

// The TMA thread's k-block kb of tile t into ring stage `stage`: once the stage is empty (its
// previous fill, parity phase ^ 1, is released), expect its bytes on the full barrier and issue the loads.
template <class Cfg>
__device__ __forceinline__ void fill_stage(const KernelParams& p, const Tile& t, int kb, uint32_t rank,
                                           const Ring<Cfg>& ring, int stage, uint32_t phase, const CUtensorMap* ma,
                                           const CUtensorMap* mb0, const CUtensorMap* mb1) {
  mbar_wait(&ring.empty[stage], phase ^ 1);
  mbar_arrive_expect_tx(&ring.full[stage], Cfg::kStageBytes);
  load_stage<Cfg>(p, t, kb, rank, ring.a(stage), ring.b(stage), &ring.full[stage], ma, mb0, mb1);
}

}  // namespace mxmoe::cuda::sm90
