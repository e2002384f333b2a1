// The sm90 grouped GEMM kernel: persistent, warp-specialized, TMA loads into a shared-memory ring,
// wgmma with fp32 accumulators in registers, one fused epilogue per configuration. It composes the
// parts along CUTLASS's contract:
//
//   tile_scheduler.cuh   which tile (and K range) comes next: one walk for m- and k-grouped GEMMs
//   producer.cuh         the TMA thread: A and B of each k-block into the ring (B multicast in pairs)
//   pipeline.cuh         the ring: full / empty barriers, stage release, dummy-tile drain
//   mainloop_*.cuh       one per Mainloop: a tile's k-blocks into the accumulators, and the scale
//                        loaders where the operands carry scales
//   epilogue_*.cuh       one per Epi: the accumulators through shared memory to global memory
//   kernel_config.cuh    KernelSpec (the named configuration) -> KernelConfig (sizes, stages, asserts)
//
// m-grouped (fprop, dgrad): A = tokens [T, K] K-major through one tensor map over all tokens; the
// device group schedule maps each linear 128-row m-tile to its expert; rows past the group's end
// are computed but never stored. B_e through a 3-D/4-D map over [E, ...] so K and N tails are zero
// filled per expert by TMA.
// k-grouped (wgrad): D_e [M, N] = A_e^T B_e; both operands are token-major (MN-major tiles; FP8
// blockwise: transposed to token blocks); the K range is the group's own tokens.
// Run: mxmoe_gpu_tests --gtest_filter='*cuda_sm90*'; mxmoe bench (every GEMM of the layer).
#pragma once
#include <type_traits>

#include "src/cuda/sm90/kernel_config.cuh"
#include "src/cuda/sm90/mainloop_bf16.cuh"
#include "src/cuda/sm90/mainloop_fp8_block.cuh"
#include "src/cuda/sm90/mainloop_mx.cuh"
#include "src/cuda/sm90/pipeline.cuh"
#include "src/cuda/sm90/producer.cuh"
#include "src/cuda/sm90/tile_scheduler.cuh"
#include "src/cuda/sm90/warp_roles.cuh"

namespace mxmoe::cuda::sm90 {

// The mainloop of a configuration. Every mainloop has
//   TileState                           what one k-block of a tile leaves to the next
//   k_block(tile, kb, pipe, state, acc) k-block kb into acc (a live tile; kWalksDummies: a dummy too,
//                                       else the kernel drains a dummy's stages)
//   finish(pipe, state)                 after the tile's k-blocks: every wgmma retired, every stage released
//   LoaderState, load_stage_scales(p, tile, kb, lt, ring, stage, phase, ls)
//                                       (kScaleLoaders) loader thread lt of warps 1-3: the stage's scales
template <class Cfg>
using MainloopFor =
    std::conditional_t<Cfg::kMainloop == Mainloop::bf16, MainloopBf16<Cfg>,
                       std::conditional_t<Cfg::kMainloop == Mainloop::mx_a, MainloopMx<Cfg>, MainloopFp8Block<Cfg>>>;

// Registers: setmaxnreg moves registers within what the CTA got at launch, 384 x 168 (the
// __launch_bounds__ cap), so producer and consumers must sum to that.
// NOTE: an increase the pool cannot give blocks forever (64 / 224 did: 8192 + 57344 > 64512, every
// kernel hung). 56 / 224: the producer's pair path spilled at 40; the store kernels are spill-free,
// the GLU ones keep a few loop-invariant spills reloaded once per tile (no local load in the k-loop).
inline constexpr int kProducerRegs = 56, kConsumerRegs = 224, kLaunchRegs = 168;
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * kLaunchRegs,
              "setmaxnreg must stay within the registers the CTA was launched with");

template <class Cfg>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_gemm_kernel(const __grid_constant__ KernelParams p, const __grid_constant__ CUtensorMap tma_a,
                        const __grid_constant__ CUtensorMap tma_b0, const __grid_constant__ CUtensorMap tma_b1) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Mainloop = MainloopFor<Cfg>;
  using Epilogue = typename Cfg::Epilogue;
  constexpr int BN = Cfg::kBlockN;
  extern __shared__ uint8_t smem_raw[];
  // The 128-byte-swizzled TMA boxes need 1024-byte aligned stages.
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const Ring<Cfg> ring(smem);

  const auto role = static_cast<WarpGroupRole>(threadIdx.x / 128);
  const uint32_t rank = Cfg::kCluster > 1 ? cluster_rank() : 0;
  if (threadIdx.x == 0) {
    ring.init();
    tma_prefetch_desc(&tma_a);
    tma_prefetch_desc(&tma_b0);
    if (p.b_load == BLoad::glu_halves || p.b_load == BLoad::glu_interleave32) tma_prefetch_desc(&tma_b1);
  }
  __syncthreads();
  if constexpr (Cfg::kCluster > 1) cluster_sync();  // the peer's barriers exist before any multicast
  const TileScheduler<Cfg> sched(p, rank);

  // Each role walks the ring from stage 0, phase 0 (the parity of the stage's current fill), over the
  // same tiles' k-blocks in the same order.
  // NOTE: the roles' loops over tiles and k-blocks, and the ring position's update, are written here
  // rather than in the parts' functions: nvcc optimizes a function's loops (and turns the update's
  // branch into selects) before inlining it, and the kernels' SASS changed with that
  // (docs/kernels/sm90_gemm.md, Files: the split was checked to keep the SASS).
  if (role == WarpGroupRole::producer) {
    reg_dealloc<kProducerRegs>();
    if (threadIdx.x == 0) {
      int stage = 0;
      uint32_t phase = 0;
      for (int64_t idx = sched.first; idx < sched.total; idx += sched.step) {
        const Tile t = sched.at(idx);
        for (int kb = 0; kb < t.k_blocks; ++kb) {
          fill_stage<Cfg>(p, t, kb, rank, ring, stage, phase, &tma_a, &tma_b0, &tma_b1);
          if (++stage == Cfg::kStages) stage = 0, phase ^= 1;
        }
      }
    } else if constexpr (Cfg::kScaleLoaders) {
      if (threadIdx.x >= 32) {
        const int lt = threadIdx.x - 32;  // 0..95
        int stage = 0;
        uint32_t phase = 0;
        typename Mainloop::LoaderState ls;
        for (int64_t idx = sched.first; idx < sched.total; idx += sched.step) {
          const Tile t = sched.at(idx);
          for (int kb = 0; kb < t.k_blocks; ++kb) {
            Mainloop::load_stage_scales(p, t, kb, lt, ring, stage, phase, ls);
            if (++stage == Cfg::kStages) stage = 0, phase ^= 1;
          }
        }
      }
    }
  } else {
    reg_alloc<kConsumerRegs>();
    const int cw = static_cast<int>(role) - static_cast<int>(WarpGroupRole::consumer0);
    const int ctid = threadIdx.x - 128;  // 0..255
    ConsumerPipeline<Cfg> pipe{ring, rank, cw, ctid};
    for (int64_t idx = sched.first; idx < sched.total; idx += sched.step) {
      const Tile t = sched.at(idx);
      if (t.live) Epilogue::prefetch(p, t, cw, ctid, ring.epi);
      float acc[BN / 2];  // (BLK_M/2,BLK_N) per consumer warp group, in the wgmma fragment layout
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) {
        acc[i] = 0.0f;
        fence_operand(acc[i]);
      }
      typename Mainloop::TileState ms;  // default member initializers only: no zero fill of the FP8 partial tile
      if (Mainloop::kWalksDummies || t.live) {
        for (int kb = 0; kb < t.k_blocks; ++kb) Mainloop::k_block(t, kb, pipe, ms, acc);
      } else {
        pipe.drain(t.k_blocks);
      }
      Mainloop::finish(pipe, ms);
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) fence_operand(acc[i]);
      if (t.live) Epilogue::run(p, t, cw, ctid, acc, ring.epi);
    }
  }
  if constexpr (Cfg::kCluster > 1) cluster_sync();  // no CTA leaves while its peer may still write to it
#endif
}

}  // namespace mxmoe::cuda::sm90
