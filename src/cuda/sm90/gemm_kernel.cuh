// The sm90 grouped GEMM kernel: persistent, warp-specialized, TMA loads into a shared-memory ring,
// wgmma (HGMMA) with fp32 accumulators in registers, one fused epilogue per instantiation.
//
//   warp group 0: producer (one thread issues TMA; registers given back with setmaxnreg)
//   warp groups 1, 2: consumers, rows 0-63 and 64-127 of a 128 x BN output tile (cooperative)
//
// m-grouped (fprop, dgrad): A = tokens [T, K] K-major through one tensor map over all tokens; the
// group schedule maps each linear 128-row m-tile to its expert; rows past the group's end are
// computed but never stored. B_e through a 3-D/4-D map over [E, ...] so K and N tails are zero
// filled per expert by TMA.
// k-grouped (wgrad): D_e [M, N] = A_e^T B_e; both operands are token-major (MN-major tiles); the K
// range is the group's own tokens; rows of the last k-block that belong to the next group are
// zeroed in shared memory before the wgmma reads them.
// Run: mxmoe_gpu_tests --gtest_filter='*cuda_sm90*'; mxmoe bench (every GEMM of the layer).
#pragma once
#include <cute/arch/mma_sm90_gmma.hpp>
#include <type_traits>
#include <utility>

#include "mxmoe/numerics.h"
#include "src/cuda/common/convert.cuh"
#include "src/cuda/sm90/kernels.h"
#include "src/cuda/sm90/params.h"
#include "src/cuda/sm90/ptx.cuh"

namespace mxmoe::cuda::sm90 {

inline constexpr int kBoxBytes = 64 * 64 * 2;  // one [64][64] bf16 box = 8 swizzle atoms
inline constexpr int kThreads = 384;
inline constexpr int kConsumerThreads = 256;
inline constexpr int kSmemLimit = 227 * 1024;
// Epilogue staging (epilogue.cuh): per consumer warp group 64 rows x 256 bytes; glu_backward: two
// such buffers per warp group (a and b of 64 features each: one pass computes in one while the
// saved C of the next pass but one arrives in the other), then the db1 column partials of the 8
// consumer warps for one pass.
inline constexpr int kOutRowBytes = 256;
inline constexpr int kOutStageBytes = 64 * kOutRowBytes;
inline constexpr int kGluFwdPass = 64;  // features per C pass of the forward (256-byte rows)
inline constexpr int kGluBwdPass = 64;  // features per pass of the backward (256-byte rows)
inline constexpr int kGluBwdRow = 4 * kGluBwdPass;
inline constexpr int kGluBwdBufs = 2;
inline constexpr int kGluBwdBufBytes = 64 * kGluBwdRow;
inline constexpr int kGluBwdStageBytes = kGluBwdBufs * kGluBwdBufBytes;
inline constexpr int kGluBwdEpiBytes = 2 * kGluBwdStageBytes + 8 * 2 * kGluBwdPass * 4;
// glu_backward_ew: 3 epilogue warps (warps 1-3 of the producer warp group); the fp32 accumulator tile
// handed to them (128 x BN), then per epilogue warp the db1 partials of the tile (a and b of BN columns).
inline constexpr int kEwWarps = 3;
template <int BN>
inline constexpr int kEwEpiBytes = kBlockM * BN * 4 + kEwWarps * 2 * BN * 4;

// Mx (m-grouped, MXFP8 A): A (e4m3 tokens [T, K], row-wise E8M0 scales, K-major) arrives by TMA
// as [128][64] bytes with 64-byte swizzle; the consumers turn it into BF16 wgmma A fragments in
// registers (value x 2^(scale - 127), exact) and run register-A wgmma (RS). Warps 1-3 of the
// producer warp group (the scale loaders) stage each stage's scales in shared memory, except with
// epilogue warps (glu_backward_ew, kScalesL2): then each consumer thread loads its two rows' scales
// from global memory a k-block ahead (a_scale_pair) and warps 1-3 run the epilogue.
//   Mx::a   B is BF16 (the exact dequantized weights: gemm_m.cu makes them from MXFP8 B), loaded
//           and read as in the BF16 kernels; any epilogue (glu_backward_ew: MXMOE_SM90_MX_GLU_BWD,
//           session 15, 192- or 128-wide; ptxas: no spill instruction between the HGMMAs).
//   Mx::ab  B is e4m3 too ([N, K] row-wise or [K, N] column-wise) and arrives in the ring as FP8
//           halves; the consumers turn it into a BF16 tile (the layout the BF16 kernels' TMA would
//           have written, 128-byte swizzle) in one of kBBufs buffers, which the wgmma reads. The
//           weights then cross HBM as FP8, but the conversion (about 30 values per clock per SM on
//           the H200, bench/cvt_bench.cu) costs more issue slots than the wgmmas leave free.
//   Mx::blk FP8 blockwise (recipe fp8_blockwise): A e4m3 [T, K] with f32 scales per 1x128 block, B
//           e4m3 [N, K] with f32 scales per 128x128 block, both K-major with 128-byte swizzle (a
//           stage is 128 values of K, the bytes of a BF16 stage). FP8 wgmma (QGMMA, m64n128k32)
//           accumulates each k-block from zero into a second register tile, which is promoted
//           into the fp32 accumulators as acc = fma(partial, s_a(row) s_b(column half), acc),
//           docs/numerics.md's block rule (the wgmma's own partial sums in their order). BN 128:
//           the two register tiles take 128 of a consumer's 224 registers. store, glu_forward and
//           (on a transposed weight copy, B_e^T [N, K]) glu_backward. Measured (H200, session 9,
//           dsv3 skew, mxmoe bench): FC1 fprop (GLU epilogue) 617 TFLOP/s, FC2 fprop (store) 882,
//           against 411 / 522 for the BF16 kernels on dequantized operands and 682 / 652 for
//           torch._grouped_mm BF16. Per k-block each consumer waits for its wgmmas (wait 0) before
//           promoting, so the tensor core idles while both warp groups promote and during the
//           epilogue (BN 128 halves the work per epilogue against the BF16 tiles): what would move
//           it is overlapping them (two partial tiles in flight; or ping-pong consumers, one in its
//           epilogue while the other runs its mainloop). ptxas: no spills for store and glu_forward;
//           glu_backward 36 bytes of spill stores (its epilogue), the L2-scale wgrad 32 bytes.
//           (A __nanosleep start offset of the second warp group, tried as a knob, made ptxas
//           spill in glu_forward, so it was taken out again.)
//   Mx::blk_staged  the same, with the scales staged per stage in shared memory by warps 1-3 of the
//           producer warp group (as the MXFP8 scale loaders; CUTLASS stages them through its producer
//           too) instead of each consumer loading its own from L2: the default since session 10
//           (gemm_m_blk.cu, gemm_k.cu; MXMOE_SM90_FP8_MAINLOOP=l2 selects Mx::blk). H200, dsv3 skew,
//           mxmoe bench: FC1 fprop 2.73 vs 3.15 ms, FC2 fprop 1.03 vs 1.13, FC2 wgrad 2.20 vs 2.72.
//           Still: ncu puts the SM at 57% of peak (tensor pipe the busiest; FC1 and FC2 fprop alike); 19-21% of
//           the warp samples wait at the k-block's wgmma_wait<0>. A variant whose two consumer warp
//           groups issued their k-blocks in turn (named barriers, so that one promotes while the
//           other's wgmmas run) measured the same (FC1 2.69 vs 2.73 ms, FC2 1.08 vs 1.03) and was
//           taken out again.
// Mx::q (session 19): BF16 operands whose GLU-backward epilogue quantizes dC itself (the fused
//           quantizing epilogue of the Mx::a kernels): the MXFP8 FC2 dgrad on BF16 operands (gemm_m.cu
//           mx_glu_backward_on_bf16), which otherwise wrote bf16 dC for the quantizer to read again.
enum class Mx : uint8_t { none, a, ab, blk, blk_staged, q };
// PP_ (pingpong, session 17, MXMOE_SM90_MX_GLU_BWD=pp; docs/kernels/sm90_pingpong_plan.md): the two
// consumer warp groups take the two 64-row halves of each 128 x BN tile one after the other instead
// of together, so that one warp group's epilogue runs while the other's mainloop keeps the tensor
// pipe busy. The ring holds a tile's k-blocks twice (half 0's, then half 1's: the same A and B
// bytes, loaded again); each stage is read and released by one warp group; an order barrier per
// warp group makes their mainloops alternate, so a warp group waits on a full barrier only once the
// other has issued its last k-block (within one phase: the parity waits cannot alias). MXFP8 A
// (Mx::a) or BF16, with the in-line GLU backward and no db1 (its column sums cross the two warp
// groups), or with the GLU forward (MXMOE_SM90_MX_GLU_FWD=pp; BF16: MXMOE_SM90_FC2_DGRAD=pp,
// MXMOE_SM90_FC1_FPROP=pp).
template <int BN_, Major AMajor_, Major BMajor_, Grouping G_, Epi E_, int Cluster_ = 1, Mx Mx_ = Mx::none,
          bool PP_ = false>
struct KernelConfig {
  static constexpr int kBlockN = BN_;
  static constexpr Major kAMajor = AMajor_, kBMajor = BMajor_;
  static constexpr Grouping kGrouping = G_;
  static constexpr Epi kEpi = E_;
  static constexpr bool kMx = Mx_ == Mx::a || Mx_ == Mx::ab;  // MXFP8 A (registers)
  static constexpr bool kMxB = Mx_ == Mx::ab;                  // MXFP8 B, converted in shared memory
  static constexpr bool kBlk = Mx_ == Mx::blk || Mx_ == Mx::blk_staged;  // FP8 blockwise: FP8 wgmma, promotion
  static constexpr bool kBlkStaged = Mx_ == Mx::blk_staged;             // its scales staged in shared memory
  static constexpr bool kQuantOut = kMx || Mx_ == Mx::q;  // the GLU epilogues may quantize (p.out_mx)
  static_assert(Mx_ != Mx::q || (E_ == Epi::glu_backward && !PP_), "Mx::q: the in-line GLU backward");
  // MXFP8 A with epilogue warps (glu_backward_ew): warps 1-3 of the producer warp group run the
  // epilogue, so the consumers load their rows' A scales from global memory (L2) themselves.
  static constexpr bool kScalesL2 = kMx && !kMxB && E_ == Epi::glu_backward_ew;
  static constexpr bool kLoaders = (kMx && !kScalesL2) || kBlkStaged;  // warps 1-3 of the producer warp group stage scales
  // The consumers read the stage with ordinary loads (FP8 A fragments, staged scales): each thread
  // releases it itself (racecheck orders only a thread's own loads before its arrival).
  static constexpr bool kThreadRelease = kMx || kBlkStaged;
  static constexpr bool kPingpong = PP_;
  static constexpr int kUnitHalves = PP_ ? 2 : 1;  // ring passes per tile
  static_assert(!PP_ || ((Mx_ == Mx::a || Mx_ == Mx::none) && (E_ == Epi::glu_backward || E_ == Epi::glu_forward) &&
                          G_ == Grouping::m),
                "pingpong: the BF16 and MXFP8-A GLU steps (FC1 fprop, FC2 dgrad) only");
  static_assert(!kBlk || (AMajor_ == Major::k && BMajor_ == Major::k && BN_ == 128 &&
                          (G_ == Grouping::m ? E_ != Epi::wgrad && E_ != Epi::glu_backward_ew : E_ == Epi::wgrad)),
                "FP8 blockwise: K-major A and B (dgrad: B transposed first; wgrad: both token-block operands "
                "transposed), BN 128");
  static_assert(!kMx || (G_ == Grouping::m && AMajor_ == Major::k), "MXFP8: m-grouped, K-major tokens");
  static_assert(!kMxB || E_ == Epi::store, "FP8 B: the store epilogue");
  static constexpr int kElemA = kMx || kBlk ? 1 : 2, kElemB = kMxB || kBlk ? 1 : 2;  // bytes per value in the ring
  static constexpr int kKBlock = kBlk ? 128 : kBlockK;  // values of K per stage (k-block)
  static constexpr int kStageA = kBlockM * kKBlock * kElemA;  // (128, 64) K-major or 2 x (64 k, 64 m)
  static constexpr int kStageB = kBlockN * kKBlock * kElemB;  // (BN, 64) K-major or BN/64 x (64 k, 64 n)
  static constexpr int kStageBytes = kStageA + kStageB;
  static constexpr int kBBufs = kMxB ? 3 : 0;                  // BF16 B tiles (converted -> wgmma)
  static constexpr int kBBufBytes = kBlockN * kBlockK * 2;
  // MXFP8: each stage's E8M0 scales, staged by the scale loaders: A [128 rows] u16 (blocks 2kb,
  // 2kb + 1), then (FP8 B) B [BN rows] u16 (row-wise) or [2 blocks][BN columns] bytes (column-wise).
  // FP8 blockwise, staged: f32 A row scales [128], then B's: [BN] column scales (wgrad) or the two
  // column halves' block scales (padded to 128 bytes, keeping the epilogue area 128-byte aligned).
  static constexpr int kScaleBytes = kScalesL2     ? 0
                                     : kMx         ? 2 * kBlockM + (kMxB ? 2 * kBlockN : 0)
                                     : kBlkStaged ? 4 * kBlockM + (G_ == Grouping::k ? 4 * BN_ : 128)
                                                  : 0;
  // The epilogue's shared memory (epilogue.cuh): a 64-row x 256-byte output stage per consumer warp
  // group; glu_backward: two such buffers per warp group and the db1 column partials;
  // glu_backward_ew: the fp32 hand-off tile (128 x BN) and the epilogue warps' db1 partials.
  static constexpr int kEpiBytes = E_ == Epi::glu_backward      ? kGluBwdEpiBytes
                                   : E_ == Epi::glu_backward_ew ? kEwEpiBytes<BN_>
                                                                : 2 * kOutStageBytes;
  static_assert(E_ != Epi::glu_backward_ew ||
                    ((Mx_ == Mx::none || Mx_ == Mx::a) && G_ == Grouping::m && BMajor_ == Major::mn),
                "epilogue warps: FC2 dgrad with a BF16 or MXFP8 A and BF16 B (MXFP8: A scales from L2)");
  static constexpr int kReserved = 1024 /*alignment slack*/ + 256 /*barriers*/;
  static constexpr int kFree = kSmemLimit - kReserved - kEpiBytes - kBBufs * kBBufBytes;
  static constexpr int kStages = kFree / (kStageBytes + kScaleBytes) > 8 ? 8 : kFree / (kStageBytes + kScaleBytes);
  static constexpr int kSmemBytes =
      kReserved + kEpiBytes + kBBufs * kBBufBytes + kStages * (kStageBytes + kScaleBytes);
  static_assert(2 * 8 * kStages + 16 + (PP_ ? 16 : 0) <= 256, "barriers");
  // CTA pairs along M can share (multicast) the B tile (2/3 of the bytes a 128 x 256 tile reads per
  // k-block). Since the release fix in ptx.cuh (mbar_arrive_cluster) the pairs run faster than single
  // CTAs in bench/sm90_kernels.cu (FC1 dsv3 720 vs 619 TFLOP/s): the layer's kernels run pairs
  // (gemm_m.cu kPair, gemm_k.cu), single CTAs stay for the kernel bench's comparison rows.
  static constexpr int kCluster = Cluster_;
  static_assert(Cluster_ == 1 || Cluster_ == 2, "clusters of 1 or 2 CTAs along M");
  static_assert(kStages >= 2, "tile too large for the shared-memory ring");
  static_assert(BN_ % 64 == 0 && BN_ <= 256, "BN must be 64, 128, 192 or 256");
  static_assert(E_ != Epi::glu_forward || BMajor_ == Major::k, "glu_forward reads B_e [2F, K]");
};

// One output tile and its K range, as producer and consumers both derive it from the pair index.
// The two CTAs of a cluster take m-tiles 2j and 2j+1 with the same n-tile. When both tiles read the
// same expert's B (or one of them is past the end: a "dummy" that only loads), each CTA loads half
// of the B tile and multicasts it; two tiles of different experts load their own B. Both CTAs walk
// the same number of k-blocks per pair, so their shared-memory rings stay in lockstep.
struct Tile {
  int32_t expert;   // this tile's expert (-1: dummy)
  int32_t b_expert; // whose B_e is loaded (the peer's for a dummy)
  int32_t m_tile;   // m-grouped: linear m-tile; k-grouped: tile along M
  int32_t n_tile;
  int64_t row0;     // m-grouped: first token row; k-grouped: first output row m0
  int64_t row_end;  // m-grouped: group end (exclusive); k-grouped: M
  int64_t k0;       // k-grouped: first token of the group
  int64_t k_end;    // k-grouped: group end
  int32_t k_blocks;
  bool live;        // this CTA computes and stores the tile
  bool multicast;   // B is split between the pair and multicast
};

template <Grouping G, int kCluster>
__device__ __forceinline__ int64_t pair_count(const KernelParams& p) {
  if constexpr (G == Grouping::k) {
    return static_cast<int64_t>(p.experts) * ((p.m_tiles + kCluster - 1) / kCluster) * p.n_tiles;
  } else {
    if (p.experts <= 0) return 0;
    return static_cast<int64_t>((*p.sched.tile_count + kCluster - 1) / kCluster) * p.n_tiles;
  }
}

// Raster: m-pairs in bands of kRasterBand, each band walked n-tile by n-tile with the m-pairs of the
// band adjacent (m fastest inside a band; k-grouped: within each expert). A wave of 132 CTAs then covers about 8 n-tiles of 16
// m-tiles: each B slice is fetched once per band rather than once per m-tile (a row-by-row walk of
// mixtral's FC1, N = 28672, streamed its 235 MB expert weight from DRAM for every m-tile), and a
// band's A rows (16 x 128 x K) stay in L2 while its n-tiles go by.
inline constexpr int32_t kRasterBand = 16;

// (m_pair, n_tile) of linear index `i` over m_pairs x n_tiles in that raster; a band is
// kRasterBand m-tiles whatever the cluster size (kRasterBand / kCluster pairs).
template <int kCluster>
__device__ __forceinline__ void raster(int64_t i, int32_t m_pairs, int32_t n_tiles, int32_t& m_pair, int32_t& n_tile) {
  constexpr int32_t kBand = kRasterBand / kCluster;
  const int64_t per_band = static_cast<int64_t>(kBand) * n_tiles;
  const int32_t band = static_cast<int32_t>(i / per_band);
  const int32_t rem = static_cast<int32_t>(i - band * per_band);
  const int32_t left = m_pairs - band * kBand;
  const int32_t size = left < kBand ? left : kBand;
  n_tile = rem / size;
  m_pair = band * kBand + (rem - n_tile * size);
}

// kTiles128 (the FP8 blockwise kernels; used by the k-grouped one, the wgrad): a group's k-blocks are its whole 128-token blocks
// in the transposed operands.
template <Grouping G, int kCluster, bool kTiles128 = false>
__device__ __forceinline__ Tile tile_at(const KernelParams& p, int64_t pidx, uint32_t rank, int32_t m_count) {
  Tile t;
  const GroupSchedule& s = p.sched;
  if constexpr (G == Grouping::k) {
    const int32_t m_pairs = (p.m_tiles + kCluster - 1) / kCluster;
    const int64_t per_expert = static_cast<int64_t>(m_pairs) * p.n_tiles;
    t.expert = static_cast<int32_t>(pidx / per_expert);
    int32_t m_pair;
    raster<kCluster>(pidx - t.expert * per_expert, m_pairs, p.n_tiles, m_pair, t.n_tile);
    t.m_tile = m_pair * kCluster + static_cast<int32_t>(rank);
    t.live = t.m_tile < p.m_tiles;
    t.b_expert = t.expert;
    t.multicast = kCluster > 1;
    t.row0 = static_cast<int64_t>(t.m_tile) * kBlockM;
    t.row_end = p.m;
    const GroupInfo g = s.groups[t.expert];
    if constexpr (kTiles128) {  // FP8 wgrad: the group's whole 128-token blocks in the transposed operands
      t.k_blocks = (g.end - g.begin + 127) / 128;
      t.k0 = static_cast<int64_t>(g.tile_start) * 128;
      t.k_end = t.k0 + static_cast<int64_t>(t.k_blocks) * 128;
    } else {
      t.k0 = g.begin;
      t.k_end = g.end;
      t.k_blocks = static_cast<int32_t>((t.k_end - t.k0 + kBlockK - 1) / kBlockK);
    }
  } else {
    int32_t m_pair;
    raster<kCluster>(pidx, (m_count + kCluster - 1) / kCluster, p.n_tiles, m_pair, t.n_tile);
    t.m_tile = m_pair * kCluster + static_cast<int32_t>(rank);
    const TileInfo mine = t.m_tile < m_count ? s.tiles[t.m_tile] : TileInfo{-1, 0};
    TileInfo other = mine;
    if constexpr (kCluster > 1) {
      const int32_t o = m_pair * kCluster + static_cast<int32_t>(rank ^ 1);
      other = o < m_count ? s.tiles[o] : TileInfo{-1, 0};
    }
    t.live = mine.expert >= 0;
    t.expert = mine.expert;
    t.b_expert = t.live ? mine.expert : other.expert;
    t.multicast = kCluster > 1 && (mine.expert == other.expert || mine.expert < 0 || other.expert < 0);
    t.row0 = t.live ? mine.row0 : other.row0;
    t.row_end = t.live ? s.groups[mine.expert].end : t.row0;
    t.k0 = 0;
    t.k_end = 0;
    t.k_blocks = t.b_expert >= 0 ? p.k_blocks : 0;
  }
  return t;
}

// ---- producer: one thread fills the ring ----
// B half `h` of the tile (rows or columns [h BN/2, (h+1) BN/2)), to this CTA or multicast to both.
template <class Cfg>
__device__ __forceinline__ void load_b_half(const KernelParams& p, const Tile& t, int32_t k, int h, uint8_t* sb,
                                            uint64_t* bar, const CUtensorMap* mb0, const CUtensorMap* mb1,
                                            bool mc) {
  constexpr int BN = Cfg::kBlockN;
  constexpr uint16_t kBoth = 0b11;
  const int32_t e = t.b_expert;
  if constexpr (Cfg::kGrouping == Grouping::k && Cfg::kBlk) {
    // B^T [N, Tp] K-major: rows n of this half, 128 token bytes.
    uint8_t* dst = sb + h * (BN / 2) * Cfg::kKBlock;
    const int32_t n = t.n_tile * BN + h * (BN / 2);
    if (mc) tma_load_2d_mc(mb0, bar, dst, k, n, kBoth);
    else tma_load_2d(mb0, bar, dst, k, n);
  } else if constexpr (Cfg::kGrouping == Grouping::k) {
    const int32_t n0 = t.n_tile * BN;
#pragma unroll
    for (int i = h * BN / 128; i < (h + 1) * BN / 128; ++i) {
      if (mc) tma_load_2d_mc(mb0, bar, sb + i * kBoxBytes, n0 + 64 * i, k, kBoth);
      else tma_load_2d(mb0, bar, sb + i * kBoxBytes, n0 + 64 * i, k);
    }
  } else {
    uint8_t* dst = sb + h * (BN / 2) * Cfg::kKBlock * Cfg::kElemB;
    switch (p.b_load) {
      case BLoad::mn_halves: {  // MXFP8 [K, N]: [64 k][BN/2 n] bytes per half
        const int32_t n = t.n_tile * BN + h * (BN / 2);
        if (mc) tma_load_3d_mc(mb0, bar, dst, n, k, e, kBoth);
        else tma_load_3d(mb0, bar, dst, n, k, e);
        break;
      }
      case BLoad::k_rows: {
        const int32_t n = t.n_tile * BN + h * (BN / 2);
        if (mc) tma_load_3d_mc(mb0, bar, dst, k, n, e, kBoth);
        else tma_load_3d(mb0, bar, dst, k, n, e);
        break;
      }
      case BLoad::glu_halves: {
        const int32_t f0 = t.n_tile * (BN / 2);
        const CUtensorMap* m = h == 0 ? mb0 : mb1;
        if (mc) tma_load_3d_mc(m, bar, dst, k, f0, e, kBoth);
        else tma_load_3d(m, bar, dst, k, f0, e);
        break;
      }
      case BLoad::glu_interleave32: {
        const int32_t c0 = t.n_tile * (BN / 2) / kGluInterleave;
        const CUtensorMap* m = h == 0 ? mb0 : mb1;
        if (mc) tma_load_4d_mc(m, bar, dst, k, 0, c0, e, kBoth);
        else tma_load_4d(m, bar, dst, k, 0, c0, e);
        break;
      }
      case BLoad::mn_boxes: {
        const int32_t n0 = t.n_tile * BN;
#pragma unroll
        for (int i = h * BN / 128; i < (h + 1) * BN / 128; ++i) {
          if (mc) tma_load_3d_mc(mb0, bar, sb + i * kBoxBytes, n0 + 64 * i, k, e, kBoth);
          else tma_load_3d(mb0, bar, sb + i * kBoxBytes, n0 + 64 * i, k, e);
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

// ---- consumers: wgmma over one stage ----
template <int N, Major A, Major B>
struct Gmma;
#define MXMOE_SM90_GMMA(N)                                                                                   \
  template <Major A, Major B>                                                                                \
  struct Gmma<N, A, B> {                                                                                     \
    using Atom = cute::SM90::GMMA::MMA_64x##N##x16_F32BF16BF16_SS<                                           \
        A == Major::k ? cute::SM90::GMMA::Major::K : cute::SM90::GMMA::Major::MN,                            \
        B == Major::k ? cute::SM90::GMMA::Major::K : cute::SM90::GMMA::Major::MN>;                           \
  };
MXMOE_SM90_GMMA(64)
MXMOE_SM90_GMMA(128)
MXMOE_SM90_GMMA(192)
MXMOE_SM90_GMMA(256)
#undef MXMOE_SM90_GMMA

template <int N, Major B>
struct GmmaRS;
#define MXMOE_SM90_GMMA_RS(N)                                                                                \
  template <Major B>                                                                                         \
  struct GmmaRS<N, B> {                                                                                      \
    using Atom = cute::SM90::GMMA::MMA_64x##N##x16_F32BF16BF16_RS<                                           \
        cute::SM90::GMMA::Major::K, B == Major::k ? cute::SM90::GMMA::Major::K : cute::SM90::GMMA::Major::MN>; \
  };
MXMOE_SM90_GMMA_RS(128)
MXMOE_SM90_GMMA_RS(192)  // the MXFP8 FC2 dgrad with epilogue warps
MXMOE_SM90_GMMA_RS(256)
#undef MXMOE_SM90_GMMA_RS

template <class Atom, int R, size_t... I>
__device__ __forceinline__ void gmma_call_rs(const uint32_t (&a)[4], uint64_t db, float (&acc)[R],
                                             std::index_sequence<I...>) {
  Atom::fma(a[0], a[1], a[2], a[3], db, acc[I]..., cute::SM90::GMMA::ScaleOut::One);
}

template <class Atom, int R, size_t... I>
__device__ __forceinline__ void gmma_call(uint64_t da, uint64_t db, float (&acc)[R], std::index_sequence<I...>) {
  Atom::fma(da, db, acc[I]..., cute::SM90::GMMA::ScaleOut::One);
}

template <class Cfg>
__device__ __forceinline__ void mma_stage(const uint8_t* sa, const uint8_t* sb, int cw, float (&acc)[Cfg::kBlockN / 2]) {
  using Atom = typename Gmma<Cfg::kBlockN, Cfg::kAMajor, Cfg::kBMajor>::Atom;
#pragma unroll
  for (int kk = 0; kk < kBlockK / 16; ++kk) {
    uint64_t da, db;
    if constexpr (Cfg::kAMajor == Major::k)
      da = smem_desc_sw128(sa + cw * 64 * 128 + kk * 32, 16, 1024);  // rows 64cw.., k 16kk..
    else
      da = smem_desc_sw128(sa + cw * kBoxBytes + kk * 16 * 128, kBoxBytes, 1024);
    if constexpr (Cfg::kBMajor == Major::k)
      db = smem_desc_sw128(sb + kk * 32, 16, 1024);
    else
      db = smem_desc_sw128(sb + kk * 16 * 128, kBoxBytes, 1024);
    gmma_call<Atom>(da, db, acc, std::make_index_sequence<Cfg::kBlockN / 2>{});
  }
}

// ---- FP8 blockwise: FP8 wgmma over a stage, then promotion ----
// The k-block's partial sums into `part` (the first wgmma overwrites it: scale-d 0). A and B are
// [rows][128] bytes with 128-byte swizzle; a k32 step advances 32 bytes, as a bf16 k16 step does.
template <class Atom, int R, size_t... I>
__device__ __forceinline__ void gmma_call_scaled(uint64_t da, uint64_t db, float (&acc)[R], bool zero,
                                                 std::index_sequence<I...>) {
  Atom::fma(da, db, acc[I]..., zero ? cute::SM90::GMMA::ScaleOut::Zero : cute::SM90::GMMA::ScaleOut::One);
}
template <class Cfg>
__device__ __forceinline__ void mma_stage_blk(const uint8_t* sa, const uint8_t* sb, int cw, float (&part)[Cfg::kBlockN / 2]) {
  using Atom = cute::SM90::GMMA::MMA_64x128x32_F32E4M3E4M3_SS_TN<>;
#pragma unroll
  for (int kk = 0; kk < Cfg::kKBlock / 32; ++kk) {
    const uint64_t da = smem_desc_sw128(sa + cw * 64 * 128 + kk * 32, 16, 1024);
    const uint64_t db = smem_desc_sw128(sb + kk * 32, 16, 1024);
    gmma_call_scaled<Atom>(da, db, part, kk == 0, std::make_index_sequence<Cfg::kBlockN / 2>{});
  }
}
// The scales of one k-block for the thread: rows r, r + 8 of A (clamped into the tensor: rows past
// T are TMA zeros, never stored) and B's 128-row blocks of the tile's column halves.
struct BlkScales {
  float a[2], b[2];
};
// One k-block of an FP8-blockwise consumer: issue its wgmmas into `part` and commit; retire them
// (wait 0); promote: acc[4j + 2h + i] += part * s_a(row half h) s_b(column half: j < BN/16 is 0).
template <class Cfg>
__device__ __forceinline__ void blk_issue(const uint8_t* sa, const uint8_t* sb, int cw, float (&part)[Cfg::kBlockN / 2]) {
#pragma unroll
  for (int i = 0; i < Cfg::kBlockN / 2; ++i) fence_operand(part[i]);
  wgmma_fence();
  mma_stage_blk<Cfg>(sa, sb, cw, part);
  wgmma_commit();
}
template <int BN>
__device__ __forceinline__ void blk_retire(float (&part)[BN / 2]) {
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) fence_operand(part[i]);
}
template <int BN>
__device__ __forceinline__ void blk_promote(float (&acc)[BN / 2], const float (&part)[BN / 2], const BlkScales& sc) {
  float s[2][2];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int c = 0; c < 2; ++c) s[h][c] = sc.a[h] * sc.b[c];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = fmaf(part[i], s[(i / 2) % 2][i / 4 < BN / 16 ? 0 : 1], acc[i]);
}
__device__ __forceinline__ int32_t blk_b_block(const KernelParams& p, const Tile& t, int half) {
  if (p.b_load == BLoad::glu_halves) return static_cast<int32_t>((half * p.ffn + static_cast<int64_t>(t.n_tile) * 64) / 128);
  return t.n_tile;  // k_rows: rows n_tile*128..; glu_interleave32: W1 rows 2 f0 .. 2 f0 + 127, f0 = 64 n_tile
}
__device__ __forceinline__ BlkScales blk_scales(const KernelParams& p, const Tile& t, int cw, int wtid, int kb) {
  BlkScales s;
  const int r = 64 * cw + 16 * (wtid / 32) + (wtid % 32) / 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    int64_t row = t.row0 + r + 8 * h;
    if (row >= p.rows) row = p.rows - 1;
    s.a[h] = __ldg(p.a_sinv + static_cast<int64_t>(kb) * p.a_sinv_pitch + row);
    const int64_t blk = static_cast<int64_t>(t.b_expert) * p.b_nbs + blk_b_block(p, t, h);
    s.b[h] = __ldg(p.b_sinv + blk * p.b_kbs + kb);
  }
  return s;
}

// k-grouped (wgrad): block row b's scales of the thread's output rows (A's features m, r and r + 8)
// and of its 32 output columns (B's features n, pairs 8j + 2(lane % 4), + 1), clamped into the
// tensors (rows/columns past M/N are TMA zeros, never stored).
template <int BN>
struct WgradScales {
  float a[2];
  float2 b[BN / 8];
};
template <int BN>
__device__ __forceinline__ void wgrad_scales(const KernelParams& p, const Tile& t, int cw, int wtid, int64_t b,
                                             WgradScales<BN>& s) {
  const int r = 64 * cw + 16 * (wtid / 32) + (wtid % 32) / 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    int64_t m = t.row0 + r + 8 * h;
    if (m >= p.m) m = p.m - 1;
    s.a[h] = __ldg(p.a_sinv + b * p.a_sinv_pitch + m);
  }
  // One base address and immediate offsets; N is a multiple of 8 (gemm_k_refusal), so a column
  // group 8j .. 8j + 7 is wholly inside or wholly past N (then its scales read as 0, never stored).
  const int64_t n0 = static_cast<int64_t>(t.n_tile) * BN;
  const float2* sb = reinterpret_cast<const float2*>(p.b_sinv + b * p.b_sinv_pitch + n0 + 2 * ((wtid % 32) % 4));
  const int64_t left = p.n - n0;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) s.b[j] = 8 * j < left ? __ldg(sb + 4 * j) : make_float2(0.0f, 0.0f);
}

// FP8 blockwise, staged: one loader warp fills a stage's scale slot (lane l: A rows l + 32 j, and B's
// columns l + 32 j (wgrad) or the two column halves' block scales), every load issued before any store.
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
    vb[0] = lane < 2 ? __ldg(p.b_sinv + (static_cast<int64_t>(t.b_expert) * p.b_nbs + blk_b_block(p, t, lane)) * p.b_kbs + kb)
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
__device__ __forceinline__ float lds_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ float2 lds_f32x2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr));
  return v;
}

// ---- FP8 A: dequantize in registers, register-A wgmma ----
// E8M0 byte -> its f32 power of two: 2^(s - 127); 0 is 2^-127 (an f32 subnormal), 255 is NaN
// (docs/numerics.md "Scale rule"), as e8m0_to_f32.
__device__ __forceinline__ float e8m0_f32(uint32_t s) {
  uint32_t bits = s == 0 ? 0x00400000u : (s << 23);
  if (s == 255) bits = 0x7FC00000u;
  return __uint_as_float(bits);
}
__device__ __forceinline__ uint32_t lds_u16(uint32_t addr) {
  uint16_t v;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(addr));
  return v;
}
// Two e4m3 values (low byte first) times the block scale -> a bf16x2 (low half first), exactly the
// CPU reference's values (src/cuda/common/convert.cuh).
__device__ __forceinline__ uint32_t dequant_pair(uint32_t two, float s) { return e4m3x2_scaled_bf16x2(two, s, s); }

// ---- the scale loaders (MXFP8): warps 1-3 stage a stage's scales in shared memory ----
// E8M0 127 (2^0) replaces the scales of blocks past K (the zero-filled tail of the last k-block: the
// padding bytes may be 255, NaN) and of rows / columns past the tensor (never stored).
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
inline constexpr int kLoaderThreads = 96;  // warps 1-3 of the producer warp group
// Items of a stage's scale area: 128 A rows (u16), then BN B rows (u16, row-wise) or 2 x BN/16
// column chunks (16 bytes, column-wise); thread lt takes items lt, lt + 96, ... : all its loads are
// issued before any store.
template <class Cfg>
__device__ __forceinline__ void load_scales(const KernelParams& p, const Tile& t, int kb, int lt, uint8_t* dst) {
  constexpr int BN = Cfg::kBlockN, kCols = BN / 16;
  constexpr bool kRows = Cfg::kBMajor == Major::k;
  constexpr int kItems = kBlockM + (!Cfg::kMxB ? 0 : kRows ? BN : 2 * kCols);
  constexpr int kPer = (kItems + kLoaderThreads - 1) / kLoaderThreads;
  const bool tail = 2 * kb + 1 >= p.a_k32;
  const uint8_t* base = p.b_scales + static_cast<int64_t>(t.b_expert) * p.b_scale_bytes;
  uint4 v[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int it = lt + i * kLoaderThreads;
    v[i] = make_uint4(0x7F7F7F7Fu, 0x7F7F7F7Fu, 0x7F7F7F7Fu, 0x7F7F7F7Fu);
    if (it >= kItems) continue;
    if (it < kBlockM) {
      v[i].x = a_scale_pair(p, t.row0 + it, kb);
    } else if constexpr (kRows) {
      int64_t ng = static_cast<int64_t>(t.n_tile) * BN + (it - kBlockM);
      if (ng >= p.n) ng = p.n - 1;
      const int64_t c = p.b_scale_cols;
      const int64_t off = p.b_scale_swizzled
                              ? ((ng / 128) * (c / 4) + kb / 2) * 512 + (ng % 32) * 16 + ((ng % 128) / 32) * 4 + (kb & 1) * 2
                              : ng * c + 2 * kb;
      v[i].x = __ldg(reinterpret_cast<const unsigned short*>(base + off));
      if (tail) v[i].x = (v[i].x & 0xFF) | (127u << 8);
    } else {
      const int j = (it - kBlockM) / kCols, m = (it - kBlockM) % kCols;
      const int64_t n0 = static_cast<int64_t>(t.n_tile) * BN + 16 * m, blk = 2 * static_cast<int64_t>(kb) + j;
      if (n0 < p.n && !(j == 1 && tail)) {
        if (!p.b_scale_swizzled) {
          v[i] = __ldg(reinterpret_cast<const uint4*>(base + blk * p.b_scale_cols + n0));
        } else {
          // n0 .. n0 + 15 share the 128 x 4 tile and the 32-column group: 16 bytes 16 apart.
          const uint8_t* q = base + ((n0 / 128) * (p.b_scale_rows / 4) + blk / 4) * 512 + (n0 % 32) * 16 +
                             ((n0 % 128) / 32) * 4 + blk % 4;
          uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
          for (int e = 0; e < 16; ++e) w[e / 4] |= static_cast<uint32_t>(__ldg(q + 16 * e)) << (8 * (e % 4));
          v[i] = make_uint4(w[0], w[1], w[2], w[3]);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int it = lt + i * kLoaderThreads;
    if (it >= kItems) continue;
    if (it < kBlockM) {
      reinterpret_cast<uint16_t*>(dst)[it] = static_cast<uint16_t>(v[i].x);
    } else if constexpr (kRows) {
      reinterpret_cast<uint16_t*>(dst + 2 * kBlockM)[it - kBlockM] = static_cast<uint16_t>(v[i].x);
    } else {
      const int j = (it - kBlockM) / kCols, m = (it - kBlockM) % kCols;
      *reinterpret_cast<uint4*>(dst + 2 * kBlockM + j * BN + 16 * m) = v[i];
    }
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

// ---- MXFP8 B: FP8 stage -> BF16 tile, by the 256 consumer threads ----
// The consumers convert the next k-block's B while the current one's wgmmas run: in each of the 4
// k16 steps every thread converts (at most) one 16-value chunk, kChunks = BN / 64 per k-block.
inline constexpr uint32_t kMxBarrier = 6;  // named barrier: the next BF16 tile is complete

// E8M0 byte -> the bf16 of 2^(s - 127) (s = 0: the subnormal 2^-127; 255: NaN).
__device__ __forceinline__ uint32_t e8m0_bf16(uint32_t s) { return s == 0 ? 0x0040u : s == 255 ? 0x7FC0u : (s << 7); }
// Two e4m3 (low byte first) times two bf16 scales -> bf16x2: e4m3 -> f16 -> f32 -> bf16 is exact, and
// the bf16 multiply by a power of two rounds like the f32 product rounded to bf16 (exact unless
// below bf16's normal range); NaN in either stays NaN.
__device__ __forceinline__ uint32_t e4m3x2_scaled(uint32_t two, uint32_t s2) {
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(static_cast<uint16_t>(two)));
  float lo, hi;
  asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(static_cast<uint16_t>(h & 0xFFFF)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(static_cast<uint16_t>(h >> 16)));
  uint32_t v, r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(v) : "f"(hi), "f"(lo));
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(v), "r"(s2));
  return r;
}
__device__ __forceinline__ uint4 lds128(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}
__device__ __forceinline__ void sts128(uint32_t a, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(a), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
// 16 e4m3 at `from` -> 16 bf16 as two 16-byte chunks at lo / hi; s2[i]: scales of values 2i, 2i + 1.
__device__ __forceinline__ void convert16(uint32_t from, const uint32_t (&s2)[8], uint32_t lo, uint32_t hi) {
  const uint4 raw = lds128(from);
  sts128(lo, make_uint4(e4m3x2_scaled(raw.x, s2[0]), e4m3x2_scaled(raw.x >> 16, s2[1]),
                        e4m3x2_scaled(raw.y, s2[2]), e4m3x2_scaled(raw.y >> 16, s2[3])));
  sts128(hi, make_uint4(e4m3x2_scaled(raw.z, s2[4]), e4m3x2_scaled(raw.z >> 16, s2[5]),
                        e4m3x2_scaled(raw.w, s2[6]), e4m3x2_scaled(raw.w >> 16, s2[7])));
}

// Row-wise B ([N, K], b_load k_rows): the FP8 stage is [BN][64] bytes with TMA's 64-byte swizzle
// (16-byte chunk j of row n at j ^ ((n / 2) % 4)), the BF16 tile [BN][64] with 128-byte swizzle
// (chunk c of row n at c ^ (n % 8)). Thread t owns row n = t / (256 / BN) and kChunks of its 4
// chunks; its scales (blocks 2kb, 2kb + 1) are one u16 of the stage's scale area.
template <class Cfg>
struct RowB {
  static constexpr int kChunks = Cfg::kBlockN / 64, kPerRow = 256 / Cfg::kBlockN;
  uint32_t raw = 0;
  __device__ void load(uint32_t scl, int ct) { raw = lds_u16(scl + 2 * kBlockM + 2 * (ct / kPerRow)); }
  __device__ void convert(int i, uint32_t src, uint32_t dst, int ct) const {
    const int n = ct / kPerRow, j = (ct % kPerRow) * kChunks + i;
    const uint32_t s = e8m0_bf16(j < 2 ? raw & 0xFF : (raw >> 8) & 0xFF);
    const uint32_t s2 = s | (s << 16);
    const uint32_t all[8] = {s2, s2, s2, s2, s2, s2, s2, s2};
    convert16(src + n * 64 + ((j ^ ((n >> 1) & 3)) << 4), all, dst + n * 128 + (((2 * j) ^ (n & 7)) << 4),
              dst + n * 128 + (((2 * j + 1) ^ (n & 7)) << 4));
  }
};

// Column-wise B ([K, N], b_load mn_halves): the FP8 stage is two [64 k][BN/2 n] halves (no swizzle),
// the BF16 tile BN/64 boxes of [64 k][64 n] with 128-byte swizzle (as the BF16 kernels' mn_boxes).
// Thread t keeps columns n0 = 16 (t % (BN/16)) .. n0 + 15 and rows k = t / (BN/16) + i 256/(BN/16)
// (i < kChunks: the first half of them in 32-block 0, the rest in block 1); the 16 scales of its
// columns per block are 16 bytes of the scale area, turned into bf16 pairs once per k-block.
template <class Cfg>
struct ColB {
  static constexpr int BN = Cfg::kBlockN, kChunks = BN / 64, kCols = BN / 16, kRowStep = 256 / kCols;
  static_assert(kRowStep * kChunks == 64 && kRowStep * kChunks / 2 <= 32, "rows of each 32-block");
  uint32_t s2[2][8];
  __device__ void load(uint32_t scl, int ct) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint4 r = lds128(scl + 2 * kBlockM + j * BN + 16 * (ct % kCols));
      const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
      for (int v = 0; v < 8; ++v) {
        const uint32_t pair = w[v / 2] >> (16 * (v % 2));
        s2[j][v] = e8m0_bf16(pair & 0xFF) | (e8m0_bf16((pair >> 8) & 0xFF) << 16);
      }
    }
  }
  __device__ void convert(int i, uint32_t src, uint32_t dst, int ct) const {
    const int n0 = 16 * (ct % kCols), k = ct / kCols + i * kRowStep;
    const int c = (n0 % 64) / 8;
    const uint32_t to = dst + (n0 / 64) * kBoxBytes + k * 128;
    convert16(src + (n0 / (BN / 2)) * 64 * (BN / 2) + k * (BN / 2) + n0 % (BN / 2), s2[i >= kChunks / 2 ? 1 : 0],
              to + ((c ^ (k & 7)) << 4), to + (((c + 1) ^ (k & 7)) << 4));
  }
};

template <class Cfg>
__device__ __forceinline__ uint64_t b_desc(const uint8_t* sb, int kk) {
  if constexpr (Cfg::kBMajor == Major::k) return smem_desc_sw128(sb + kk * 32, 16, 1024);
  else return smem_desc_sw128(sb + kk * 16 * 128, kBoxBytes, 1024);
}

}  // namespace mxmoe::cuda::sm90

#include "src/cuda/sm90/epilogue.cuh"

namespace mxmoe::cuda::sm90 {

template <class Cfg>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_gemm_kernel(const __grid_constant__ KernelParams p, const __grid_constant__ CUtensorMap tma_a,
                        const __grid_constant__ CUtensorMap tma_b0, const __grid_constant__ CUtensorMap tma_b1) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kStages = Cfg::kStages;
  constexpr int BN = Cfg::kBlockN;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint8_t* bbuf0 = smem + kStages * Cfg::kStageBytes;              // kBBufs x kBBufBytes (MXFP8)
  uint8_t* scl0 = bbuf0 + Cfg::kBBufs * Cfg::kBBufBytes;            // kStages x kScaleBytes (MXFP8)
  uint8_t* epi_smem = scl0 + kStages * Cfg::kScaleBytes;            // kEpiBytes
  uint64_t* full = reinterpret_cast<uint64_t*>(epi_smem + Cfg::kEpiBytes);  // (stages)
  uint64_t* empty = full + kStages;                                         // (stages)
  uint64_t* hand = empty + kStages;  // glu_backward_ew: [0] the hand-off tile is full, [1] it is free
  uint64_t* order = hand + 2;         // pingpong: [c] warp group c may start its next mainloop
  auto stage_a = [&](int s) { return smem + s * Cfg::kStageBytes; };
  auto stage_b = [&](int s) { return smem + s * Cfg::kStageBytes + Cfg::kStageA; };
  auto bbuf = [&](int b) { return bbuf0 + b * Cfg::kBBufBytes; };
  auto scl = [&](int s) { return scl0 + s * Cfg::kScaleBytes; };

  constexpr int kCluster = Cfg::kCluster;
  const int wg = threadIdx.x / 128;
  const uint32_t rank = kCluster > 1 ? cluster_rank() : 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      // the TMA producer, and the scale loaders: all 96 (MXFP8) or the one warp whose turn the stage
      // is (FP8 blockwise, staged: the warps take the k-blocks in turn)
      mbar_init(&full[s], Cfg::kMx && Cfg::kLoaders ? 1 + kLoaderThreads : Cfg::kBlkStaged ? 1 + 32 : 1);
      // BF16: one arrival per consumer warp group of the pair (wgmma read the stage; wgmma.wait_group
      // retired it for the whole warp group). MXFP8: every consumer thread of this CTA (each read A
      // and the scales with ordinary loads, which only its own arrival orders before the refill, as
      // racecheck sees it) and one per consumer warp of the peer.
      // Pingpong: one consumer warp group reads each stage (128 threads, 4 warps of the peer).
      constexpr int kReaders = Cfg::kPingpong ? 128 : kConsumerThreads;
      mbar_init(&empty[s], Cfg::kThreadRelease ? kReaders + kReaders / 32 * (kCluster - 1)
                                               : (Cfg::kPingpong ? 1 : 2) * kCluster);
    }
    if constexpr (Cfg::kPingpong) {
      // Every thread of the other warp group arrives once it has issued its mainloop's last k-block.
      mbar_init(&order[0], 128);
      mbar_init(&order[1], 128);
    }
    if constexpr (Cfg::kEpi == Epi::glu_backward_ew) {
      // Every thread that wrote (consumers) or read (epilogue warps) the hand-off tile arrives.
      mbar_init(&hand[0], kConsumerThreads);
      mbar_init(&hand[1], 32 * kEwWarps);
    }
    fence_barrier_init();
    tma_prefetch_desc(&tma_a);
    tma_prefetch_desc(&tma_b0);
    if (p.b_load == BLoad::glu_halves || p.b_load == BLoad::glu_interleave32) tma_prefetch_desc(&tma_b1);
  }
  __syncthreads();
  if constexpr (kCluster > 1) cluster_sync();  // the peer's barriers exist before any multicast
  const int32_t m_count = Cfg::kGrouping == Grouping::m && p.experts > 0 ? *p.sched.tile_count : 0;
  const int64_t total = pair_count<Cfg::kGrouping, kCluster>(p);
  const int64_t first = blockIdx.x / kCluster, step = gridDim.x / kCluster;

  // Registers: setmaxnreg moves registers within what the CTA got at launch, 384 x 168 (the
  // __launch_bounds__ cap), so producer and consumers must sum to that: an increase the pool cannot
  // give blocks forever (64 / 224 did: 8192 + 57344 > 64512, every kernel hung). 56 / 224: the
  // producer's pair path spilled at 40; the store kernels are spill-free, the GLU ones keep a few
  // loop-invariant spills reloaded once per tile (ptxas -v, cuobjdump: no LDL in the k-loop).
  // glu_backward_ew: the epilogue warps (producer warp group) need registers for 8-value chunks: 96 / 200.
  constexpr bool kEw = Cfg::kEpi == Epi::glu_backward_ew;
  constexpr int kProducerRegs = kEw ? 96 : 56, kConsumerRegs = kEw ? 200 : 224, kLaunchRegs = 168;
  static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * kLaunchRegs,
                "setmaxnreg must stay within the registers the CTA was launched with");
  if (wg == 0) {
    reg_dealloc<kProducerRegs>();
    if (threadIdx.x == 0) {
      int stage = 0;
      uint32_t phase = 0;
      for (int64_t idx = first; idx < total; idx += step) {
        const Tile t = tile_at<Cfg::kGrouping, kCluster, Cfg::kBlk>(p, idx, rank, m_count);
        for (int h = 0; h < Cfg::kUnitHalves; ++h)  // pingpong: the tile's k-blocks once per half
          for (int kb = 0; kb < t.k_blocks; ++kb) {
            mbar_wait(&empty[stage], phase ^ 1);
            mbar_arrive_expect_tx(&full[stage], Cfg::kStageBytes);
            load_stage<Cfg>(p, t, kb, rank, stage_a(stage), stage_b(stage), &full[stage], &tma_a, &tma_b0, &tma_b1);
            if (++stage == kStages) stage = 0, phase ^= 1;
          }
      }
    } else if constexpr (kEw) {
      if (threadIdx.x >= 32) {
        // The epilogue warps: the consumers' tiles in the same order, each from the hand-off tile.
        uint32_t hphase = 0;
        for (int64_t idx = first; idx < total; idx += step) {
          const Tile t = tile_at<Cfg::kGrouping, kCluster, Cfg::kBlk>(p, idx, rank, m_count);
          if (!t.live) continue;
          mbar_wait(&hand[0], hphase);
          epilogue_warps_glu_backward<BN>(p, t, threadIdx.x / 32 - 1, threadIdx.x % 32, epi_smem);
          mbar_arrive(&hand[1]);
          hphase ^= 1;
        }
      }
    } else if constexpr (Cfg::kLoaders) {
      if (threadIdx.x >= 32) {
        // The scale loaders: the stage's A and B scales, in the producer's order; each of the 96
        // threads arrives on the full barrier after its stores.
        const int lt = threadIdx.x - 32;
        int stage = 0;
        uint32_t phase = 0;
        int turn = 0;  // FP8 blockwise, staged: k-block count mod 3; loader warp lt / 32 takes its turns
        for (int64_t idx = first; idx < total; idx += step) {
          const Tile t = tile_at<Cfg::kGrouping, kCluster, Cfg::kBlk>(p, idx, rank, m_count);
          for (int kb = 0; kb < Cfg::kUnitHalves * t.k_blocks; ++kb) {
            if constexpr (Cfg::kBlkStaged) {
              if (turn == lt / 32) {
                mbar_wait(&empty[stage], phase ^ 1);
                if (t.live) load_blk_scales<Cfg>(p, t, kb, lt % 32, scl(stage));
                mbar_arrive(&full[stage]);
              }
              turn = turn == 2 ? 0 : turn + 1;
            } else {
              mbar_wait(&empty[stage], phase ^ 1);
              // (pingpong: the second half's pass loads the same k-blocks' scales again)
              if (t.live) load_scales<Cfg>(p, t, Cfg::kPingpong ? kb % t.k_blocks : kb, lt, scl(stage));
              mbar_arrive(&full[stage]);
            }
            if (++stage == kStages) stage = 0, phase ^= 1;
          }
        }
      }
    }
  } else {
    reg_alloc<kConsumerRegs>();
    const int cw = wg - 1;
    const int ctid = threadIdx.x - 128;  // 0..255
    int stage = 0, xbuf = 0;  // xbuf: the BF16 B tile of the current k-block (MXFP8)
    uint32_t phase = 0;
    uint32_t hphase = 0;  // glu_backward_ew: hand-offs so far, mod 2
    // One arrival per consumer warp group on each CTA of the cluster, from different lanes (lane r
    // signals CTA r, as CUTLASS spreads them), so no thread issues two.
    // `zeroed`: this CTA wrote the stage with ordinary stores (k-grouped tail), which the peer's
    // multicast must not overtake: release at cluster scope then.
    auto release = [&](int s, bool zeroed) {
      if constexpr (Cfg::kThreadRelease) {
        // Every thread arrives on this CTA's barrier (shared::cta address) after its loads of the
        // stage (FP8 A fragments, scales): racecheck flagged the scale loaders' refill against
        // lanes that had not arrived themselves, after __syncwarp and one lane's arrival too. The
        // peer's barrier gets one arrival per warp (its refill is the multicast TMA).
        mbar_arrive(&empty[s]);
        if constexpr (kCluster > 1) {
          __syncwarp();
          const int wl = ctid % 32;
          if (wl < kCluster && static_cast<uint32_t>(wl) != rank) mbar_arrive_cluster(&empty[s], static_cast<uint32_t>(wl));
        }
        return;
      }
      const int lane = ctid % 128;
      if constexpr (kCluster == 1) {
        if (lane == 0) mbar_arrive(&empty[s]);
      } else {
        if (lane < kCluster) {
          if (zeroed) mbar_arrive_cluster_release(&empty[s], static_cast<uint32_t>(lane));
          else mbar_arrive_cluster(&empty[s], static_cast<uint32_t>(lane));
        }
      }
    };
    // A tile this CTA does not compute (the dummy of a pair): its stages are waited for and released.
    // Where one thread releases for its warp group (not kThreadRelease), the warp group meets first:
    // with no wgmma to hold it back, the releasing warp could otherwise run ahead of a late warp of
    // its group, the stage be refilled twice meanwhile, and the late warp's parity wait then wait on
    // the wrong fill, out of step with its group for good. The BF16 k-loop below does the same in the
    // passes it does not compute. What this is against (session 18, H200, cuda-gdb attached to a hung
    // `mxmoe bench` with the BF16 epilogue-warp FC2 dgrad forced): in the rank-1 CTA of the last
    // cluster (the one whose tiles past an odd tile count are dummies), three warps of a consumer warp
    // group in the k-loop's wgmma and the fourth in a barrier wait, the producers waiting on empty
    // stages. Those consumers have no barrier between tiles (their epilogue is handed off), so nothing
    // else brings a late warp back in step. The drain half alone left the hang (the BF16 k-loop's
    // dummy passes do not go through drain); with the k-loop half, 25 of 25 forced runs finished
    // (H200, session 19).
    auto drain = [&](int k_blocks) {
      for (int kb = 0; kb < k_blocks; ++kb) {
        mbar_wait(&full[stage], phase);
        if constexpr (!Cfg::kThreadRelease) wg_sync(cw);
        release(stage, false);
        if (++stage == kStages) stage = 0, phase ^= 1;
      }
    };
    // Pingpong: the stages of the other warp group's pass (stage and phase arithmetic only), and
    // this warp group's passes so far (the order barriers' parity).
    [[maybe_unused]] auto skip = [&](int n) {
      const int s = stage + n;
      phase ^= static_cast<uint32_t>((s / kStages) & 1);
      stage = s % kStages;
    };
    [[maybe_unused]] uint32_t units = 0;
    for (int64_t idx = first; idx < total; idx += step) {
      const Tile t = tile_at<Cfg::kGrouping, kCluster, Cfg::kBlk>(p, idx, rank, m_count);
      if (t.live) epilogue_prefetch<Cfg>(p, t, cw, ctid, epi_smem);
      float acc[BN / 2];
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) {
        acc[i] = 0.0f;
        fence_operand(acc[i]);
      }
      int prev = -1;
      bool prev_zeroed = false, zeroed = false;
      // `mine`: this warp group computes its rows of the tile (pingpong: half cw, unless past the
      // group's end). Pingpong: half 0's pass comes first in the ring; every pass, dummy or empty
      // ones too, waits for its turn once and hands the turn over once (order).
      [[maybe_unused]] bool mine = t.live;
      if constexpr (Cfg::kPingpong) {
        if (cw == 1) skip(t.k_blocks);
        mbar_wait(&order[cw], (units & 1u) ^ (cw == 0 ? 1u : 0u));
        mine = t.live && t.row0 + 64 * cw < t.row_end;
      }
      if constexpr (Cfg::kBlk) {
        // Per k-block: wait for the stage, the 4 FP8 wgmmas into `part`, the next k-block's scales
        // loaded (global, L2) while they run, wait, release the stage, promote.
        const int wtid = ctid % 128;
        float part[BN / 2];
        if (Cfg::kGrouping == Grouping::k && t.live) {
          // wgrad: per-row and per-column scales (an outer product per k-block), loaded from L2 while
          // the k-block's wgmmas run.
          for (int kb = 0; kb < t.k_blocks; ++kb) {
            mbar_wait(&full[stage], phase);
            blk_issue<Cfg>(stage_a(stage), stage_b(stage), cw, part);
            WgradScales<BN> ws;
            if constexpr (Cfg::kBlkStaged) {  // this stage's slot: rows r, r + 8; columns 8j + 2q, + 1
              const uint32_t sc0 = smem_addr(scl(stage));
              const int r = 64 * cw + 16 * (wtid / 32) + (wtid % 32) / 4;
              ws.a[0] = lds_f32(sc0 + 4 * r);
              ws.a[1] = lds_f32(sc0 + 4 * (r + 8));
#pragma unroll
              for (int j = 0; j < BN / 8; ++j) ws.b[j] = lds_f32x2(sc0 + 4 * (kBlockM + 8 * j + 2 * ((wtid % 32) % 4)));
            } else {
              wgrad_scales<BN>(p, t, cw, wtid, t.k0 / 128 + kb, ws);
            }
            blk_retire<BN>(part);
            release(stage, false);
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) {
              const float2 sbj = ws.b[i / 4];
              acc[i] = fmaf(part[i], ws.a[(i / 2) % 2] * (i % 2 == 0 ? sbj.x : sbj.y), acc[i]);
            }
            if (++stage == kStages) stage = 0, phase ^= 1;
          }
        } else if (t.live) {
          if constexpr (Cfg::kBlkStaged) {
            // m-grouped, staged scales: read from this stage's slot before the stage is released.
            const int r = 64 * cw + 16 * (wtid / 32) + (wtid % 32) / 4;
            for (int kb = 0; kb < t.k_blocks; ++kb) {
              mbar_wait(&full[stage], phase);
              const uint32_t sc0 = smem_addr(scl(stage));
              BlkScales sc;
              sc.a[0] = lds_f32(sc0 + 4 * r);
              sc.a[1] = lds_f32(sc0 + 4 * (r + 8));
              sc.b[0] = lds_f32(sc0 + 4 * kBlockM);
              sc.b[1] = lds_f32(sc0 + 4 * (kBlockM + 1));
              blk_issue<Cfg>(stage_a(stage), stage_b(stage), cw, part);
              blk_retire<BN>(part);
              release(stage, false);
              blk_promote<BN>(acc, part, sc);
              if (++stage == kStages) stage = 0, phase ^= 1;
            }
          } else {
            BlkScales sc = blk_scales(p, t, cw, wtid, 0);
            for (int kb = 0; kb < t.k_blocks; ++kb) {
              mbar_wait(&full[stage], phase);
              blk_issue<Cfg>(stage_a(stage), stage_b(stage), cw, part);
              const BlkScales next = kb + 1 < t.k_blocks ? blk_scales(p, t, cw, wtid, kb + 1) : sc;
              blk_retire<BN>(part);
              release(stage, false);
              blk_promote<BN>(acc, part, sc);
              sc = next;
              if (++stage == kStages) stage = 0, phase ^= 1;
            }
          }
        } else {
          drain(t.k_blocks);
        }
      } else if constexpr (Cfg::kMx && !Cfg::kMxB) {
        // FP8 A, BF16 B in the stage. Per k16 step kk: issue the wgmma of kk (A fragment a[kk] in
        // registers, B from the stage), then dequantize the fragment of kk + 1, wgmma_wait<2>: the
        // fragment written next (four steps back) has been read. A k-block's first fragment is
        // made while the previous block's last two wgmmas run. The stage of kb is released at
        // step 1 of kb + 1, when its wgmmas (B read from shared memory) have retired.
        using Atom = typename GmmaRS<BN, Cfg::kBMajor>::Atom;
        const int wtid = ctid % 128;
        uint32_t a[4][4];
        float sc[2][2];
        if (mine) {
          // kScalesL2: the scales of the thread's rows r, r + 8 (fp8_fragment's), loaded a k-block
          // ahead from global memory.
          const int64_t srow = t.row0 + 64 * cw + 16 * (wtid / 32) + (wtid % 32) / 4;
          uint32_t next[2] = {0, 0};
          if constexpr (Cfg::kScalesL2) {
            if (t.k_blocks > 0) next[0] = a_scale_pair(p, srow, 0), next[1] = a_scale_pair(p, srow + 8, 0);
          }
          for (int kb = 0; kb < t.k_blocks; ++kb) {
            mbar_wait(&full[stage], phase);
            const uint32_t sa = smem_addr(stage_a(stage));
            const uint8_t* sb = stage_b(stage);
            if constexpr (Cfg::kScalesL2) {
#pragma unroll
              for (int h = 0; h < 2; ++h) sc[h][0] = e8m0_f32(next[h] & 0xFF), sc[h][1] = e8m0_f32(next[h] >> 8);
              if (kb + 1 < t.k_blocks) next[0] = a_scale_pair(p, srow, kb + 1), next[1] = a_scale_pair(p, srow + 8, kb + 1);
            } else {
              a_scales(smem_addr(scl(stage)), cw, wtid, sc);
            }
            fp8_fragment(sa, cw, wtid, 0, sc, a[0]);
#pragma unroll
            for (int kk = 0; kk < kBlockK / 16; ++kk) {
              wgmma_fence();
              gmma_call_rs<Atom>(a[kk], b_desc<Cfg>(sb, kk), acc, std::make_index_sequence<BN / 2>{});
              wgmma_commit();
              if (kk + 1 < kBlockK / 16) fp8_fragment(sa, cw, wtid, kk + 1, sc, a[kk + 1]);
              wgmma_wait<2>();
              if (kk == 1 && prev >= 0) release(prev, false);
            }
            prev = stage;
            if (++stage == kStages) stage = 0, phase ^= 1;
          }
        } else {
          drain(t.k_blocks);
        }
      } else if constexpr (Cfg::kMxB) {
        // Per k-block kb, for each k16 step kk: issue the wgmma of kk (its A fragment a[kk] is in
        // registers), convert one chunk of B(kb + 1) from the next FP8 stage into the next of the 3
        // BF16 tiles, wgmma_wait<2>, then dequantize the A fragment of the following step (the last
        // step: kb + 1's first) into a[kk + 1], whose reader (three groups back) has retired. The
        // BF16 tile written here was last read by the wgmmas of kb - 2, retired in both warp groups
        // (each has passed the barrier that ended kb - 1, after its wgmma_wait<2> at kk = 3). The
        // stage of kb is released after its A fragments are read (its B was converted, its scales
        // used, a k-block earlier). One commit group per step, up to three in flight.
        using Atom = typename GmmaRS<BN, Cfg::kBMajor>::Atom;
        using BConv = std::conditional_t<Cfg::kBMajor == Major::k, RowB<Cfg>, ColB<Cfg>>;
        const int wtid = ctid % 128;  // thread within the consumer warp group
        uint32_t a[4][4];
        float sc[2][2];
        if (t.live && t.k_blocks > 0) {
          mbar_wait(&full[stage], phase);
          BConv b0;
          b0.load(smem_addr(scl(stage)), ctid);
          const uint32_t src = smem_addr(stage_b(stage)), dst = smem_addr(bbuf(xbuf));
#pragma unroll
          for (int i = 0; i < BConv::kChunks; ++i) b0.convert(i, src, dst, ctid);
          fence_proxy_async_smem();
          named_barrier_sync(kMxBarrier, kConsumerThreads);
          a_scales(smem_addr(scl(stage)), cw, wtid, sc);
          fp8_fragment(smem_addr(stage_a(stage)), cw, wtid, 0, sc, a[0]);
        }
        // One k-block; kMore: a next one exists (its B is converted here). Two instantiations keep
        // branches out of the wgmma pipeline (ptxas serializes the wgmmas around one, C7513).
        auto k_block = [&](auto more_c) {
          constexpr bool kMore = decltype(more_c)::value;
          int nstage = stage + 1;
          uint32_t nphase = phase;
          if (nstage == kStages) nstage = 0, nphase ^= 1;
          const int nbuf = xbuf + 1 == Cfg::kBBufs ? 0 : xbuf + 1;
          BConv bn;
          if constexpr (kMore) {
            mbar_wait(&full[nstage], nphase);
            bn.load(smem_addr(scl(nstage)), ctid);
          }
          const uint32_t sa = smem_addr(stage_a(stage)), nsa = smem_addr(stage_a(nstage));
          const uint8_t* sb = bbuf(xbuf);
          const uint32_t nsrc = smem_addr(stage_b(nstage)), ndst = smem_addr(bbuf(nbuf));
#pragma unroll
          for (int kk = 0; kk < kBlockK / 16; ++kk) {
            wgmma_fence();
            gmma_call_rs<Atom>(a[kk], b_desc<Cfg>(sb, kk), acc, std::make_index_sequence<BN / 2>{});
            wgmma_commit();
            if constexpr (kMore) {
              if (kk < BConv::kChunks) bn.convert(kk, nsrc, ndst, ctid);
            }
            wgmma_wait<2>();
            if (kk + 1 < kBlockK / 16) {
              fp8_fragment(sa, cw, wtid, kk + 1, sc, a[kk + 1]);
            } else if constexpr (kMore) {
              a_scales(smem_addr(scl(nstage)), cw, wtid, sc);
              fp8_fragment(nsa, cw, wtid, 0, sc, a[0]);
            }
          }
          release(stage, false);
          if constexpr (kMore) {
            fence_proxy_async_smem();
            named_barrier_sync(kMxBarrier, kConsumerThreads);
          }
          xbuf = nbuf;
          stage = nstage, phase = nphase;
        };
        if (t.live) {
          for (int kb = 0; kb + 1 < t.k_blocks; ++kb) k_block(std::true_type{});
          if (t.k_blocks > 0) k_block(std::false_type{});
        } else {
          drain(t.k_blocks);
        }
      } else
      for (int kb = 0; kb < t.k_blocks; ++kb) {
        mbar_wait(&full[stage], phase);
        zeroed = false;
        if (mine) {
          if constexpr (Cfg::kGrouping == Grouping::k) {
            const int64_t valid = t.k_end - (t.k0 + static_cast<int64_t>(kb) * kBlockK);
            if (valid < kBlockK) {
              // Token rows [valid, 64) of every box belong to the next group: zero them (both
              // operands, so that no value of another expert, finite or not, reaches this sum).
              constexpr int kBoxes = (kBlockM + BN) / 64;
              const int from = static_cast<int>(valid) * 128 / 16;  // in 16-byte units
              constexpr int kUnits = kBoxBytes / 16;
              uint8_t* base = stage_a(stage);  // A boxes then B boxes, contiguous
              for (int u = ctid; u < kBoxes * kUnits; u += kConsumerThreads) {
                const int box = u / kUnits, off = u % kUnits;
                if (off >= from) reinterpret_cast<uint4*>(base + box * kBoxBytes)[off] = make_uint4(0, 0, 0, 0);
              }
              fence_proxy_async_smem();
              named_barrier_sync(1, kConsumerThreads);
              zeroed = true;
            }
          }
          wgmma_fence();
          mma_stage<Cfg>(stage_a(stage), stage_b(stage), cw, acc);
          wgmma_commit();
          wgmma_wait<1>();
        } else if constexpr (!Cfg::kThreadRelease) {
          wg_sync(cw);  // a pass this warp group does not compute: as in drain (above)
        }
        if (prev >= 0) release(prev, prev_zeroed);
        prev = stage;
        prev_zeroed = zeroed;
        if (++stage == kStages) stage = 0, phase ^= 1;
      }
      if constexpr (Cfg::kPingpong) {
        mbar_arrive(&order[cw ^ 1]);  // every k-block of this pass is issued: the other's turn
        ++units;
      }
      wgmma_wait<0>();
      if (prev >= 0) release(prev, prev_zeroed);
      if constexpr (Cfg::kPingpong) {
        if (cw == 0) skip(t.k_blocks);
      }
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) fence_operand(acc[i]);
      if constexpr (kEw) {
        if (t.live) {
          // Hand the accumulators over (once the epilogue warps are done with the last tile's) and
          // go on to the next tile.
          mbar_wait(&hand[1], hphase ^ 1);
          hand_off_tile<BN>(cw, ctid, acc, epi_smem);
          mbar_arrive(&hand[0]);
          hphase ^= 1;
        }
      } else if (t.live) {
        epilogue<Cfg>(p, t, cw, ctid, acc, epi_smem);
      }
    }
  }
  if constexpr (kCluster > 1) cluster_sync();  // no CTA leaves while its peer may still write to it
#endif
}

}  // namespace mxmoe::cuda::sm90
