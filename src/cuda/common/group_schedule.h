// The group schedule of every CUDA backend, built on the device from device-resident group offsets
// by one small kernel (the host never reads the offsets and never synchronises, so it can be
// captured in a CUDA graph and replayed with new splits):
//   per expert e:      clamped row range [begin, end), column-wise scale chunk row s_e, first m-tile;
//   per linear m-tile: its expert (-1 past the real count) and its first row;
//   one device int32:  the real m-tile count (persistent kernels loop up to it).
// An m-tile is block_m rows of one expert (fewer at the expert's end); expert e owns the tiles
// [tile_start_e, tile_start_e + ceil(m_e / block_m)). Grids of one CTA per m-tile are sized from
// the upper bound ceil(T / block_m) + E; CTAs past the real count find expert = -1 and exit.
// Users: the column-wise quantizer (block_m 32), the portable GEMMs (128), the Hopper GEMMs (64/128)
// and the k-grouped GEMM (block_m 0: row ranges and scale chunks only).
// Bad offsets (out of [0, T], decreasing) are clamped to [0, T] and made monotone by a prefix max:
// wrong groups, never an out-of-bounds access (docs/numerics.md "Determinism and graph safety";
// s_e: "Grouped scale placement").
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "src/cuda/common/workspace.h"

namespace mxmoe::cuda {

struct alignas(16) GroupInfo {
  int32_t begin;       // first row
  int32_t end;         // one past the last row
  int32_t col_chunk;   // s_e = sum_{h<e} colwise_group_scale_rows(m_h)
  int32_t tile_start;  // first linear m-tile of the expert (0 without tiles)
};

struct alignas(8) TileInfo {
  int32_t expert;  // -1: past the real m-tile count
  int32_t row0;    // global first row of the tile
};

// What kernels take (by value).
struct GroupSchedule {
  const GroupInfo* groups = nullptr;    // [experts]; nullptr: no schedule (no offsets or E = 0)
  const TileInfo* tiles = nullptr;      // [tiles_bound]; nullptr when built with block_m = 0
  const int32_t* tile_count = nullptr;  // device: the real number of m-tiles (<= tiles_bound; 0 without tiles)
  int32_t experts = 0;
  int32_t tiles_bound = 0;  // ceil(T / block_m) + E, 0 without tiles
  int32_t block_m = 0;
};

// Upper bound of the m-tile count over every split of `rows` rows into `experts` groups.
inline int32_t m_tiles_bound(int64_t rows, int64_t experts, int block_m) {
  return static_cast<int32_t>((rows + block_m - 1) / block_m + experts);
}

// Workspace bytes build_group_schedule takes (0 when experts <= 0).
int64_t group_schedule_bytes(int64_t experts, int64_t rows, int block_m);

// Takes group_schedule_bytes() off `ws` and enqueues the build on `stream`. offsets: device i32
// [experts + 1]; rows: T; block_m: m-tile height, or 0 for no tiles. experts <= 0: returns an empty
// schedule and enqueues nothing.
GroupSchedule build_group_schedule(const int32_t* offsets, int64_t experts, int64_t rows, int block_m, Workspace& ws,
                                   cudaStream_t stream);

}  // namespace mxmoe::cuda
