// The shared-memory ring between the producer warp group and the consumers of the sm90 grouped
// GEMM kernels, as CUTLASS's PipelineTmaAsync: kStages stages, each with a full barrier (the TMA bytes
// landed and the scale loaders stored the stage's scales) and an empty barrier (every reader of both
// CTAs of the cluster is done with it: the next fill may overwrite it, by TMA multicast from the peer
// too).
//
// Shared memory of the kernel (1024-byte aligned, KernelConfig's sizes):
//   (kStageBytes, PIPE)   the ring: A (BLK_M,BLK_K) then B (BLK_N,BLK_K) per stage
//   (kScaleBytes, PIPE)   each stage's scale slot (MXFP8, FP8 blockwise)
//   (kEpiBytes)           the epilogue's stages
//   (PIPE) x 2            full, empty mbarriers
#pragma once
#include <cstdint>

#include "src/cuda/sm90/ptx.cuh"
#include "src/cuda/sm90/warp_roles.cuh"

namespace mxmoe::cuda::sm90 {

template <class Cfg>
struct Ring {
  uint8_t* tiles;   // (kStageBytes, PIPE)
  uint8_t* scales;  // (kScaleBytes, PIPE)
  uint8_t* epi;     // (kEpiBytes)
  uint64_t* full;   // (PIPE)
  uint64_t* empty;  // (PIPE)

  __device__ __forceinline__ explicit Ring(uint8_t* smem)
      : tiles(smem),
        scales(smem + Cfg::kStages * Cfg::kStageBytes),
        epi(scales + Cfg::kStages * Cfg::kScaleBytes),
        full(reinterpret_cast<uint64_t*>(epi + Cfg::kEpiBytes)),
        empty(full + Cfg::kStages) {}
  __device__ __forceinline__ uint8_t* a(int s) const { return tiles + s * Cfg::kStageBytes; }
  __device__ __forceinline__ uint8_t* b(int s) const { return tiles + s * Cfg::kStageBytes + Cfg::kStageA; }
  __device__ __forceinline__ uint8_t* scl(int s) const { return scales + s * Cfg::kScaleBytes; }

  // One thread, before the CTA's (and the cluster's) first barrier wait.
  __device__ __forceinline__ void init() const {
    for (int s = 0; s < Cfg::kStages; ++s) {
      mbar_init(&full[s], Cfg::kFullArrivals);
      mbar_init(&empty[s], Cfg::kEmptyArrivals);
    }
    fence_barrier_init();
  }
};

// The consumer side: a consumer warp group (cw) of this CTA, thread ctid of the 256.
template <class Cfg>
struct ConsumerPipeline {
  Ring<Cfg> ring;
  uint32_t rank;  // cluster rank of this CTA
  int cw, ctid;
  // The position in the ring: the stage and the parity of its current fill. Every role walks the
  // same tiles' k-blocks in the same order, so the positions agree without being exchanged.
  int stage = 0;
  uint32_t phase = 0;

  __device__ __forceinline__ void wait() { mbar_wait(&ring.full[stage], phase); }
  __device__ __forceinline__ void advance() {
    if (++stage == Cfg::kStages) stage = 0, phase ^= 1;
  }

  // Stage s is read. One arrival per consumer warp group on each CTA of the cluster, from different
  // lanes (lane r signals CTA r, as CUTLASS spreads them), so no thread issues two. `zeroed`: this
  // CTA wrote the stage with ordinary stores (the k-grouped tail), which the peer's multicast must
  // not overtake: release at cluster scope then.
  __device__ __forceinline__ void release(int s, bool zeroed) {
    if constexpr (Cfg::kThreadRelease) {
      // Every thread arrives on this CTA's barrier after its own loads of the stage (FP8 A fragments,
      // scales). NOTE: racecheck flagged the scale loaders' refill against lanes that had not arrived
      // themselves, after __syncwarp and one lane's arrival too. The peer's barrier gets one arrival
      // per warp (its refill is the multicast TMA).
      mbar_arrive(&ring.empty[s]);
      if constexpr (Cfg::kCluster > 1) {
        __syncwarp();
        const int wl = ctid % 32;
        if (wl < Cfg::kCluster && static_cast<uint32_t>(wl) != rank)
          mbar_arrive_cluster(&ring.empty[s], static_cast<uint32_t>(wl));
      }
      return;
    }
    const int lane = ctid % 128;
    if constexpr (Cfg::kCluster == 1) {
      if (lane == 0) mbar_arrive(&ring.empty[s]);
    } else {
      if (lane < Cfg::kCluster) {
        if (zeroed)
          mbar_arrive_cluster_release(&ring.empty[s], static_cast<uint32_t>(lane));
        else
          mbar_arrive_cluster(&ring.empty[s], static_cast<uint32_t>(lane));
      }
    }
  }

  // A tile this CTA does not compute (the dummy of a pair): its stages are waited for and released.
  // NOTE: where one thread releases for its warp group (not kThreadRelease) the warp group meets
  // first. With no wgmma to hold it back, the releasing warp could otherwise run ahead of a late warp
  // of its group, the stage be refilled twice meanwhile, and the late warp's parity wait then wait on
  // the wrong fill, out of step with its group for good (seen as a hang in the rank-1 CTA of the last
  // cluster, whose tiles past an odd tile count are dummies). The BF16 mainloop meets the same way
  // in the passes it does not compute.
  __device__ __forceinline__ void drain(int k_blocks) {
    for (int kb = 0; kb < k_blocks; ++kb) {
      wait();
      if constexpr (!Cfg::kThreadRelease) wg_sync(cw);
      release(stage, false);
      advance();
    }
  }
};

}  // namespace mxmoe::cuda::sm90
