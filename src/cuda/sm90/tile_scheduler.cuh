// The persistent tile scheduler of the sm90 grouped GEMMs: which output tile (and K range) the CTA
// works on at each step of its walk. Producer, scale loaders and consumers each derive the same
// sequence from the pair index, so no role hands tiles to another.
//
// Clusters of kCluster CTAs along M walk "pairs": pair j of n-tile n is the m-tiles
// kCluster j .. kCluster j + kCluster - 1 with n-tile n, one per CTA (rank). Cluster j of the grid
// takes pairs j, j + clusters, ...
//   m-grouped: a linear index over the device group schedule's 128-row m-tiles (their expert and first
//              token row: src/cuda/common/group_schedule.h) times the n-tiles; every tile runs all of K.
//   k-grouped: expert e's D_e [M, N] tiles; the K range is the expert's own tokens.
#pragma once
#include <cstdint>

#include "src/cuda/sm90/kernels.h"
#include "src/cuda/sm90/params.h"

namespace mxmoe::cuda::sm90 {

// One output tile and its K range. When both tiles of a pair read the same expert's B (or one of
// them is past the end: a "dummy" that only loads), each CTA loads half of the B tile and multicasts
// it; two tiles of different experts load their own B. Both CTAs walk the same number of k-blocks
// per pair, so their shared-memory rings stay in lockstep.
struct Tile {
  int32_t expert;    // this tile's expert (-1: dummy)
  int32_t b_expert;  // whose B_e is loaded (the peer's for a dummy)
  int32_t m_tile;    // m-grouped: linear m-tile; k-grouped: tile along M
  int32_t n_tile;
  int64_t row0;     // m-grouped: first token row; k-grouped: first output row m0
  int64_t row_end;  // m-grouped: group end (exclusive); k-grouped: M
  int64_t k0;       // k-grouped: first token of the group
  int64_t k_end;    // k-grouped: group end
  int32_t k_blocks;
  bool live;       // this CTA computes and stores the tile
  bool multicast;  // B is split between the pair and multicast
};

// Pairs in the walk (m-grouped: read from the device schedule's tile count).
template <Grouping G, int kCluster>
__device__ __forceinline__ int64_t pair_count(const KernelParams& p) {
  if constexpr (G == Grouping::k) {
    return static_cast<int64_t>(p.experts) * ((p.m_tiles + kCluster - 1) / kCluster) * p.n_tiles;
  } else {
    if (p.experts <= 0) return 0;
    return static_cast<int64_t>((*p.sched.tile_count + kCluster - 1) / kCluster) * p.n_tiles;
  }
}

// Raster: m-pairs in bands of kRasterBand m-tiles, each band walked n-tile by n-tile with the m-pairs
// of the band adjacent (m fastest inside a band; k-grouped: within each expert).
// NOTE: a wave of 132 CTAs then covers about 8 n-tiles of 16 m-tiles: each B slice is fetched once
// per band rather than once per m-tile (a row-by-row walk streams the whole expert weight from DRAM
// for every m-tile), and a band's A rows (16 x 128 x K) stay in L2 while its n-tiles go by.
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

// The tile of pair `pidx` for cluster rank `rank`; m_count: the m-grouped schedule's tile count.
// kTiles128 (the k-grouped FP8-blockwise wgrad): a group's k-blocks are its whole 128-token blocks in
// the operands transposed to token blocks (group e's first block: tile_start_e).
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
    if constexpr (kTiles128) {
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

// The walk of one CTA: its pairs first, first + step, ... below total.
template <class Cfg>
struct TileScheduler {
  const KernelParams& p;
  uint32_t rank;
  int32_t m_count;
  int64_t total, first, step;
  __device__ __forceinline__ TileScheduler(const KernelParams& params, uint32_t cluster_rank)
      : p(params),
        rank(cluster_rank),
        m_count(Cfg::kGrouping == Grouping::m && params.experts > 0 ? *params.sched.tile_count : 0),
        total(pair_count<Cfg::kGrouping, Cfg::kCluster>(params)),
        first(blockIdx.x / Cfg::kCluster),
        step(gridDim.x / Cfg::kCluster) {}
  __device__ __forceinline__ Tile at(int64_t idx) const {
    return tile_at<Cfg::kGrouping, Cfg::kCluster, Cfg::kTiles128>(p, idx, rank, m_count);
  }
};

}  // namespace mxmoe::cuda::sm90
