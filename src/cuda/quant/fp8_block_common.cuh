// What the FP8-blockwise files (fp8_block_quantize.cu, fp8_block_transpose.cu, fp8_block_gemm.cu;
// docs/numerics.md "FP8 blockwise") share: the CTA size, the 128-row token tiles of the group
// schedule, and the host's width and grid choices. The layouts (src/common/fp8_block.h):
//   rows          1x128 blocks along K, f32 inverse scales MN-major [ceil(K/128)][roundup(T, 4)];
//   token blocks  128x1 blocks along the rows restarting at every group (the group schedule with
//                 128-row m-tiles: m-tile i is scale row i);
//   weights       128x128 blocks of each expert's [rows, cols], one CTA per block.
#pragma once
#include <cstdint>
#include <type_traits>

#include "src/common/fp8_block.h"
#include "src/cuda/common/group_schedule.h"
#include "src/cuda/common/workspace.h"
#include "src/cuda/cuda_ops.h"

namespace mxmoe::cuda::fp8_block_detail {

constexpr int kThreads = 256;

// The rows [row0, row0 + n) of 128-row tile `tile` (scale row `tile` of the token blocks), or
// n = 0 past the real tiles. Without a schedule (one group, or the row-wise layouts): rows
// [128 tile, 128 tile + 128).
struct TokenTile {
  int64_t row0 = 0, n = 0;
};
__device__ __forceinline__ TokenTile token_tile(const GroupSchedule& sched, int64_t tile, int64_t rows) {
  TokenTile t;
  if (sched.tiles == nullptr) {  // one group
    t.row0 = tile * kFp8Block;
    t.n = t.row0 < rows ? min(static_cast<int64_t>(kFp8Block), rows - t.row0) : 0;
    return t;
  }
  if (tile >= *sched.tile_count) return t;
  const TileInfo ti = sched.tiles[tile];
  if (ti.expert < 0) return t;
  t.row0 = ti.row0;
  t.n = min(static_cast<int64_t>(kFp8Block), static_cast<int64_t>(sched.groups[ti.expert].end) - ti.row0);
  return t;
}

inline unsigned grid_1d(int64_t work) {
  const int64_t blocks = ceil_div(work, kThreads);
  return static_cast<unsigned>(blocks < 65536 * 8 ? blocks : 65536 * 8);
}

// The group schedule of the token blocks (128-row tiles per group), or none for one group.
inline GroupSchedule token_schedule(const GroupOffsets& g, int64_t rows, Workspace& ws, cudaStream_t stream) {
  if (g.offsets.data == nullptr) return {};
  return build_group_schedule(g.data(), g.experts(), rows, kFp8Block, ws, stream);
}
inline int64_t token_schedule_bytes(const GroupOffsets& g, int64_t rows) {
  return g.offsets.data == nullptr ? 0 : group_schedule_bytes(g.experts(), rows, kFp8Block);
}
inline int64_t token_tiles(const GroupOffsets& g, int64_t rows) {
  return g.offsets.data == nullptr ? ceil_div(rows, kFp8Block) : m_tiles_bound(rows, g.experts(), kFp8Block);
}

// Width selection: the widest access the row length and the pointers allow (null pointers allow any).
inline bool aligned(const void* p, int bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

template <class F>
void with_width(int w, F&& f) {
  if (w == 16) {
    f(std::integral_constant<int, 16>{});
  } else if (w == 4) {
    f(std::integral_constant<int, 4>{});
  } else {
    f(std::integral_constant<int, 1>{});
  }
}

// E fp8_block weights [rows, cols] (e4m3, 128x128-block scales) -> bf16 [E, rows, cols], one
// thread per element (fp8_block_gemm.cu): the GEMM routes' B, and quantize_experts' bf16 copy.
void weights_to_bf16(const uint8_t* q, const float* sinv, int64_t experts, int64_t rows, int64_t cols, uint16_t* out,
                     cudaStream_t stream);

}  // namespace mxmoe::cuda::fp8_block_detail
