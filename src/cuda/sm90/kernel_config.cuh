// The named configuration of an sm90 grouped GEMM kernel (KernelSpec) and everything derived from it
// at compile time (KernelConfig): the stage's bytes, the ring depth, the shared-memory budget, the
// barrier arrival counts, the epilogue. The launch translation units name their configurations as
//   using Wgrad = KernelConfig<KernelSpec{.block_n = 256, .a_major = Major::mn, ..., .mainloop = Mainloop::bf16}>;
// (launch.cuh m_grouped fills in the fields every m-grouped configuration shares), and an invalid
// combination stops at one of the static_asserts below with its reason.
#pragma once
#include <type_traits>

#include "src/cuda/sm90/epilogue_glu_backward.cuh"
#include "src/cuda/sm90/epilogue_glu_forward.cuh"
#include "src/cuda/sm90/epilogue_store.cuh"
#include "src/cuda/sm90/epilogue_wgrad.cuh"
#include "src/cuda/sm90/kernels.h"
#include "src/cuda/sm90/warp_roles.cuh"

namespace mxmoe::cuda::sm90 {

struct KernelSpec {
  int block_n;        // BLK_N: output columns per tile (BLK_M is kBlockM = 128 rows)
  Major a_major;      // contiguous axis of A's shared-memory tile
  Major b_major;      // ... and of B's
  Grouping grouping;  // m: rows of A are tokens, a group picks B_e; k: a group is the K range (wgrad)
  Epi epi;
  int cluster;  // CTAs per cluster along M (2: the pair shares the B tile by TMA multicast)
  Mainloop mainloop;
};

inline constexpr int kSmemLimit = 227 * 1024;  // dynamic shared memory per CTA on sm_90

template <int BN, bool kQuant, Epi E>
using EpilogueFor =
    std::conditional_t<E == Epi::store, EpilogueStore<BN>,
                       std::conditional_t<E == Epi::wgrad, EpilogueWgrad<BN>,
                                          std::conditional_t<E == Epi::glu_forward, EpilogueGluForward<BN, kQuant>,
                                                             EpilogueGluBackward<BN, kQuant>>>>;

template <KernelSpec S>
struct KernelConfig {
  static constexpr KernelSpec kSpec = S;
  static constexpr int kBlockN = S.block_n;
  static constexpr Major kAMajor = S.a_major, kBMajor = S.b_major;
  static constexpr Grouping kGrouping = S.grouping;
  static constexpr Epi kEpi = S.epi;
  static constexpr int kCluster = S.cluster;
  static constexpr Mainloop kMainloop = S.mainloop;
  static constexpr bool kMx = S.mainloop == Mainloop::mx_a;        // MXFP8 A, converted in registers
  static constexpr bool kBlk = S.mainloop == Mainloop::fp8_block;  // FP8 wgmma, promotion per k-block
  static constexpr bool kQuantOut = kMx;  // the GLU epilogues may quantize their output (p.out_mx)
  // k-grouped FP8 blockwise: a group's k-blocks are its whole 128-token blocks (tile_at).
  static constexpr bool kTiles128 = kBlk;

  // Warps 1-3 of the producer warp group stage each stage's scales (MXFP8 A's E8M0, FP8 blockwise's
  // f32). The consumers then read the stage with ordinary loads too, which racecheck orders before
  // the refill only through the reading thread's own arrival: every consumer thread releases.
  static constexpr bool kScaleLoaders = kMx || kBlk;
  static constexpr bool kThreadRelease = kMx || kBlk;

  // A stage: A (BLK_M, BLK_K) then B (BLK_N, BLK_K); BLK_K = 64 bf16 or 128 e4m3 (128 bytes a row).
  static constexpr int kElemA = kMx || kBlk ? 1 : 2, kElemB = kBlk ? 1 : 2;  // bytes per value in the ring
  static constexpr int kKBlock = kBlk ? 128 : kBlockK;                       // values of K per stage (k-block)
  static constexpr int kStageA = kBlockM * kKBlock * kElemA;  // (BLK_M,BLK_K) K-major or 2 x (64 k, 64 m)
  static constexpr int kStageB = kBlockN * kKBlock * kElemB;  // (BLK_N,BLK_K) K-major or BN/64 x (64 k, 64 n)
  static constexpr int kStageBytes = kStageA + kStageB;
  // Each stage's scale slot, filled by the scale loaders: MXFP8, A's E8M0 pairs (blocks 2kb, 2kb + 1)
  // as u16 [BLK_M]; FP8 blockwise, f32 A row scales [BLK_M], then B's: [BLK_N] column scales (wgrad)
  // or the two column halves' block scales (padded to 128 bytes: the epilogue area stays 128-byte
  // aligned).
  static constexpr int kScaleBytes = kMx    ? 2 * kBlockM
                                     : kBlk ? 4 * kBlockM + (S.grouping == Grouping::k ? 4 * S.block_n : 128)
                                            : 0;

  using Epilogue = EpilogueFor<S.block_n, kQuantOut, S.epi>;
  static constexpr int kEpiBytes = Epilogue::kSmemBytes;

  // Shared memory: [ring: kStages x kStageBytes][kStages x kScaleBytes][epilogue][barriers].
  static constexpr int kReserved = 1024 /*alignment slack*/ + 256 /*barriers*/;
  static constexpr int kFree = kSmemLimit - kReserved - kEpiBytes;
  static constexpr int kStages = kFree / (kStageBytes + kScaleBytes) > 8 ? 8 : kFree / (kStageBytes + kScaleBytes);
  static constexpr int kSmemBytes = kReserved + kEpiBytes + kStages * (kStageBytes + kScaleBytes);

  // A stage is full once the TMA bytes landed and the TMA thread arrived, plus the scale loaders:
  // all 96 threads (MXFP8) or the one loader warp whose turn the stage is (FP8 blockwise).
  static constexpr int kFullArrivals = kMx ? 1 + kLoaderThreads : kBlk ? 1 + 32 : 1;
  // A stage is empty once every reader of both CTAs of the cluster released it: BF16, one arrival per
  // consumer warp group per CTA (wgmma.wait_group retired the reads of the whole warp group);
  // kThreadRelease, every consumer thread of this CTA and one per consumer warp of the peer.
  static constexpr int kEmptyArrivals =
      kThreadRelease ? kConsumerThreads + kConsumerThreads / 32 * (S.cluster - 1) : 2 * S.cluster;

  static_assert(S.cluster == 1 || S.cluster == 2, "clusters of 1 or 2 CTAs along M");
  static_assert(S.block_n == 128 || S.block_n == 256, "BLK_N: the wgmma atoms are instantiated for 128 and 256");
  static_assert((S.grouping == Grouping::k) == (S.epi == Epi::wgrad),
                "the wgrad epilogue is the k-grouped one, and the only one");
  static_assert(S.epi != Epi::glu_forward || S.b_major == Major::k, "glu_forward reads B_e [2F, K] K-major");
  static_assert(!kMx || (S.grouping == Grouping::m && S.a_major == Major::k), "MXFP8 A: m-grouped, K-major tokens");
  static_assert(!kBlk || (S.a_major == Major::k && S.b_major == Major::k && S.block_n == 128),
                "FP8 blockwise: K-major A and B (wgmma takes FP8 K-major only: dgrad reads B transposed, wgrad both "
                "operands transposed to token blocks), BLK_N 128");
  static_assert(kStages >= 2, "tile too large for the shared-memory ring");
  static_assert(2 * 8 * kStages <= 256, "full and empty barriers of every stage fit the barrier area");
};

}  // namespace mxmoe::cuda::sm90
