// The BF16 mainloop of the sm90 grouped GEMMs (Mainloop::bf16): both operands BF16 from the ring,
// wgmma with both operands in shared memory (SS), fp32 accumulators in registers.
//
// Per k-block: wait for the stage, 4 wgmmas (k16 steps) into acc, commit, wgmma_wait<1>: the previous
// k-block's group has retired, so its stage is released while this one's wgmmas run.
// k-grouped (wgrad): both operands are token-major (MN-major tiles) and the tile's K range is its
// group's tokens; in the group's last k-block the token rows of the next group are zeroed in shared
// memory before the wgmma reads them.
#pragma once
#include "src/cuda/sm90/pipeline.cuh"
#include "src/cuda/sm90/tile_scheduler.cuh"
#include "src/cuda/sm90/wgmma.cuh"

namespace mxmoe::cuda::sm90 {

template <class Cfg>
struct MainloopBf16 {
  static constexpr int BN = Cfg::kBlockN;

  // acc += the stage's A (this warp group's 64 rows) times B, 4 k16 steps.
  __device__ __forceinline__ static void mma_stage(const uint8_t* sa, const uint8_t* sb, int cw, float (&acc)[BN / 2]) {
    using Atom = typename Gmma<BN, Cfg::kAMajor, Cfg::kBMajor>::Atom;
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk) {
      const uint64_t da = operand_desc<Cfg::kAMajor>(sa + cw * kBoxBytes, kk);  // (64,16) of (BLK_M,BLK_K)
      const uint64_t db = operand_desc<Cfg::kBMajor>(sb, kk);                   // (BLK_N,16)
      gmma_call<Atom>(da, db, acc, std::make_index_sequence<BN / 2>{});
    }
  }

  // k-grouped: token rows [valid, 64) of every box of the stage belong to the next group: zero them
  // in both operands, so that no value of another expert, finite or not, reaches this sum.
  __device__ __forceinline__ static void zero_tail(uint8_t* stage, int64_t valid, int ctid) {
    constexpr int kBoxes = (kBlockM + BN) / 64;  // A boxes then B boxes, contiguous
    constexpr int kUnits = kBoxBytes / 16;
    const int from = static_cast<int>(valid) * 128 / 16;  // in 16-byte units
    for (int u = ctid; u < kBoxes * kUnits; u += kConsumerThreads) {
      const int box = u / kUnits, off = u % kUnits;
      if (off >= from) reinterpret_cast<uint4*>(stage + box * kBoxBytes)[off] = make_uint4(0, 0, 0, 0);
    }
    fence_proxy_async_smem();  // the generic-proxy stores before the wgmma's (async proxy) reads
    named_barrier_sync(NamedBarrier::tail_zeroed, kConsumerThreads);
  }

  // What one k-block leaves to the next: the stage its wgmmas may still read, and whether this CTA
  // wrote it (k-grouped tail).
  struct TileState {
    int prev = -1;
    bool prev_zeroed = false;
  };
  // A dummy tile (not live) walks its k-blocks here too: the warp group meets at each instead of
  // computing (ConsumerPipeline::drain says why).
  static constexpr bool kWalksDummies = true;

  // k-block kb of the tile: wait for the stage, issue its wgmmas, wgmma_wait<1> (the previous
  // k-block's group has retired), release the previous stage.
  __device__ __forceinline__ static void k_block(const Tile& t, int kb, ConsumerPipeline<Cfg>& pipe, TileState& s,
                                                 float (&acc)[BN / 2]) {
    const int stage = pipe.stage;
    pipe.wait();
    bool zeroed = false;
    if (t.live) {
      if constexpr (Cfg::kGrouping == Grouping::k) {
        const int64_t valid = t.k_end - (t.k0 + static_cast<int64_t>(kb) * kBlockK);
        if (valid < kBlockK) {
          zero_tail(pipe.ring.a(stage), valid, pipe.ctid);
          zeroed = true;
        }
      }
      wgmma_fence();
      mma_stage(pipe.ring.a(stage), pipe.ring.b(stage), pipe.cw, acc);
      wgmma_commit();
      wgmma_wait<1>();
    } else {
      wg_sync(pipe.cw);
    }
    if (s.prev >= 0) pipe.release(s.prev, s.prev_zeroed);
    s.prev = stage;
    s.prev_zeroed = zeroed;
    pipe.advance();
  }

  // After the tile's last k-block: every wgmma retired, every stage released.
  __device__ __forceinline__ static void finish(ConsumerPipeline<Cfg>& pipe, TileState& s) {
    wgmma_wait<0>();
    if (s.prev >= 0) pipe.release(s.prev, s.prev_zeroed);
  }
};

}  // namespace mxmoe::cuda::sm90
