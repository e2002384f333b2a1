// The MXFP8 mainloop of the sm90 grouped GEMMs (Mainloop::mx_a): A is MXFP8 tokens (e4m3 [T, K],
// row-wise E8M0 scales per 32 values of K, K-major), B the exact bf16 copy of the weights; m-grouped.
//
// A arrives by TMA as [BLK_M][64] bytes with 64-byte swizzle. The consumers turn it into BF16 wgmma A
// fragments in registers (value x 2^(scale - 127): exact, docs/numerics.md) and run register-A wgmma
// (RS) against B from the ring, as the BF16 kernels read it. Warps 1-3 of the producer warp group
// (the scale loaders) stage each stage's A scales in shared memory.
// NOTE: B is not converted in shared memory: that would need about 148 bytes per clock of shared
// memory against 128 (docs/kernels/sm90_mxfp8.md).
#pragma once
#include "src/cuda/common/convert.cuh"
#include "src/cuda/sm90/pipeline.cuh"
#include "src/cuda/sm90/tile_scheduler.cuh"
#include "src/cuda/sm90/wgmma.cuh"

namespace mxmoe::cuda::sm90 {

// E8M0 byte -> its f32 power of two: 2^(s - 127); 0 is 2^-127 (an f32 subnormal), 255 is NaN
// (docs/numerics.md "Scale rule"), as e8m0_to_f32.
__device__ __forceinline__ float e8m0_f32(uint32_t s) {
  uint32_t bits = s == 0 ? 0x00400000u : (s << 23);
  if (s == 255) bits = 0x7FC00000u;
  return __uint_as_float(bits);
}
// Two e4m3 values (low byte first) times the block scale -> a bf16x2 (low half first), exactly the
// CPU reference's values (src/cuda/common/convert.cuh).
__device__ __forceinline__ uint32_t dequant_pair(uint32_t two, float s) { return e4m3x2_scaled_bf16x2(two, s, s); }

// ---- the scale loaders: warps 1-3 stage a stage's A scales in shared memory ----
// E8M0 127 (2^0) replaces the scales of blocks past K (the zero-filled tail of the last k-block: the
// padding bytes may be 255, NaN); rows past the tensor read the last row's (never stored).
__device__ __forceinline__ uint32_t a_scale_pair(const KernelParams& p, int64_t r, int kb) {
  if (r >= p.rows) r = p.rows - 1;  // mxfp8_layout.h pads scales to 128 rows only
  const int64_t c = p.a_scale_cols;
  const int64_t off = p.a_scale_swizzled
                          ? ((r / 128) * (c / 4) + kb / 2) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (kb & 1) * 2
                          : r * c + 2 * kb;
  uint32_t v = __ldg(reinterpret_cast<const unsigned short*>(p.a_scales + off));
  if (2 * kb + 1 >= p.a_k32) v = (v & 0xFF) | (127u << 8);
  return v;
}

// The stage's scale slot: the u16 pair (blocks 2kb, 2kb + 1) of each of the tile's BLK_M rows. Loader
// thread lt (0..95) takes rows lt, lt + 96: both loads are issued before either store.
__device__ __forceinline__ void load_a_scales(const KernelParams& p, const Tile& t, int kb, int lt, uint8_t* dst) {
  constexpr int kPer = (kBlockM + kLoaderThreads - 1) / kLoaderThreads;
  uint32_t v[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int it = lt + i * kLoaderThreads;
    v[i] = 0x7F7Fu;  // E8M0 1.0 pair; a row past BLK_M is never stored
    if (it < kBlockM) v[i] = a_scale_pair(p, t.row0 + it, kb);
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int it = lt + i * kLoaderThreads;
    if (it < kBlockM) reinterpret_cast<uint16_t*>(dst)[it] = static_cast<uint16_t>(v[i]);
  }
}
// The A scales of the thread's rows r, r + 8 from the stage's scale area -> f32 [row][block].
__device__ __forceinline__ void a_scales(uint32_t scl, int cw, int wtid, float (&sc)[2][2]) {
  const int r = 64 * cw + 16 * (wtid / 32) + (wtid % 32) / 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t v = lds_u16(scl + 2 * (r + 8 * h));
    sc[h][0] = e8m0_f32(v & 0xFF);
    sc[h][1] = e8m0_f32(v >> 8);
  }
}

// The A fragment of k16 step kk for the thread (wgmma m64k16 register layout, per warp 16 rows:
// regs {row g, k 2q..2q+1}, {row g+8, same k}, {row g, k 2q+8..2q+9}, {row g+8, same k}; g = lane/4,
// q = lane%4) from the [128][64]-byte stage with TMA's 64-byte swizzle (16-byte chunk c of row r
// at chunk c ^ ((r / 2) % 4)). `sc[h][j]`: scale of row h, 32-block j of the k-block.
__device__ __forceinline__ void fp8_fragment(uint32_t sa, int cw, int wtid, int kk, const float (&sc)[2][2],
                                             uint32_t (&a)[4]) {
  const int lane = wtid % 32;
  const int r = 64 * cw + 16 * (wtid / 32) + lane / 4;  // r and r + 8 share the swizzle phase
  const uint32_t chunk = static_cast<uint32_t>((kk ^ ((r >> 1) & 3)) << 4);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t at = sa + static_cast<uint32_t>((r + 8 * h) * 64) + chunk + 2 * (lane % 4);
    a[h] = dequant_pair(lds_u16(at), sc[h][kk / 2]);
    a[2 + h] = dequant_pair(lds_u16(at + 8), sc[h][kk / 2]);
  }
}

template <class Cfg>
struct MainloopMx {
  static constexpr int BN = Cfg::kBlockN;
  static_assert(Cfg::kThreadRelease, "the consumers read the stage with ordinary loads: each thread releases");

  struct TileState {
    int prev = -1;  // the stage whose wgmmas may still read B
  };
  static constexpr bool kWalksDummies = false;  // a dummy tile is drained

  // k-block kb of a live tile. Per k16 step kk: issue the wgmma of kk (A fragment a[kk] in
  // registers, B from the stage), then dequantize the fragment of kk + 1, wgmma_wait<2>: the fragment
  // written next (four steps back) has been read. A k-block's first fragment is made while the
  // previous block's last two wgmmas run. The stage of kb is released at step 1 of kb + 1, when its
  // wgmmas (B read from shared memory) have retired.
  __device__ __forceinline__ static void k_block(const Tile& t, int kb, ConsumerPipeline<Cfg>& pipe, TileState& s,
                                                 float (&acc)[BN / 2]) {
    using Atom = typename GmmaRS<BN, Cfg::kBMajor>::Atom;
    const int cw = pipe.cw, wtid = pipe.ctid % 128;
    uint32_t a[4][4];  // (k16 step) x the thread's A fragment
    float sc[2][2];    // (row r / r + 8, 32-block of the k-block)
    const int stage = pipe.stage;
    pipe.wait();
    const uint32_t sa = smem_addr(pipe.ring.a(stage));
    const uint8_t* sb = pipe.ring.b(stage);
    a_scales(smem_addr(pipe.ring.scl(stage)), cw, wtid, sc);
    fp8_fragment(sa, cw, wtid, 0, sc, a[0]);
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk) {
      wgmma_fence();
      gmma_call_rs<Atom>(a[kk], operand_desc<Cfg::kBMajor>(sb, kk), acc, std::make_index_sequence<BN / 2>{});
      wgmma_commit();
      if (kk + 1 < kBlockK / 16) fp8_fragment(sa, cw, wtid, kk + 1, sc, a[kk + 1]);
      wgmma_wait<2>();
      if (kk == 1 && s.prev >= 0) pipe.release(s.prev, false);
    }
    s.prev = stage;
    pipe.advance();
  }

  // After the tile's last k-block: every wgmma retired, every stage released.
  __device__ __forceinline__ static void finish(ConsumerPipeline<Cfg>& pipe, TileState& s) {
    wgmma_wait<0>();
    if (s.prev >= 0) pipe.release(s.prev, false);
  }

  // The scale loaders: all 96 threads fill every stage's slot, each arriving on the full barrier
  // after its stores.
  struct LoaderState {};
  __device__ __forceinline__ static void load_stage_scales(const KernelParams& p, const Tile& t, int kb, int lt,
                                                           const Ring<Cfg>& ring, int stage, uint32_t phase,
                                                           LoaderState&) {
    mbar_wait(&ring.empty[stage], phase ^ 1);
    if (t.live) load_a_scales(p, t, kb, lt, ring.scl(stage));
    mbar_arrive(&ring.full[stage]);
  }
};

}  // namespace mxmoe::cuda::sm90
