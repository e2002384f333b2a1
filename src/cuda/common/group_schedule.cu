// Builds the group schedule (group_schedule.h) with one CTA of 1024 threads: a max-scan clamps the
// offsets and makes them monotone, exclusive sum-scans give each expert its first m-tile and its
// column-wise scale chunk row, then every linear m-tile finds its expert by binary search. E and T
// of any size (chunked scans with a carry).
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuQuant*:*GpuGemm*:*GpuGraph*' (every
//      grouped step builds one; the graph tests replay one capture with new splits).
#include "mxmoe/mxfp8_layout.h"
#include "src/cuda/common/block_scan.cuh"
#include "src/cuda/common/check.h"
#include "src/cuda/common/group_schedule.h"

namespace mxmoe::cuda {
namespace {

constexpr int kBuildThreads = 1024;

// NOTE: groups is written by some threads and read by others after __syncthreads, so it must not
// be __restrict__: with it nvcc hoisted such a load above the barrier (seen on H200: schedule
// entries past the first warp came out empty). Those reads also go through L2 (__ldcg) as a
// second guard.
__global__ void __launch_bounds__(kBuildThreads)
    build_group_schedule_kernel(const int32_t* __restrict__ offsets, int experts, int rows, int block_m,
                                GroupInfo* groups, TileInfo* tiles, int tiles_bound, int32_t* tile_count) {
  __shared__ int warp_totals[32];

  // 1. begin_e = max_{h <= e} clamp(offsets[h], 0, T) -> groups[e].begin and groups[e - 1].end
  //    (the end of the last group is the clamped, monotone offsets[E]).
  int carry = 0;
  for (int base = 0; base <= experts; base += kBuildThreads) {
    const int i = base + static_cast<int>(threadIdx.x);
    int v = 0;
    if (i <= experts) {
      const int o = offsets[i];
      v = o < 0 ? 0 : (o > rows ? rows : o);
    }
    int total = 0;
    v = ScanMax{}(block_inclusive_scan<kBuildThreads>(v, ScanMax{}, 0, warp_totals, total), carry);
    if (i < experts) groups[i].begin = v;
    if (i >= 1 && i <= experts) groups[i - 1].end = v;
    carry = ScanMax{}(carry, total);
  }
  __syncthreads();

  // 2. Exclusive prefix sums of the experts' m-tile counts and column-wise scale chunk heights.
  int tile_carry = 0, chunk_carry = 0;
  for (int base = 0; base < experts; base += kBuildThreads) {
    const int e = base + static_cast<int>(threadIdx.x);
    int m_tiles = 0, chunk = 0;
    if (e < experts) {
      const int m = __ldcg(&groups[e].end) - __ldcg(&groups[e].begin);
      m_tiles = block_m > 0 ? (m + block_m - 1) / block_m : 0;
      chunk = static_cast<int>(colwise_group_scale_rows(m));
    }
    int tile_total = 0, chunk_total = 0;
    const int tile_incl = block_inclusive_scan<kBuildThreads>(m_tiles, ScanSum{}, 0, warp_totals, tile_total);
    const int chunk_incl = block_inclusive_scan<kBuildThreads>(chunk, ScanSum{}, 0, warp_totals, chunk_total);
    if (e < experts) {
      groups[e].tile_start = tile_carry + tile_incl - m_tiles;
      groups[e].col_chunk = chunk_carry + chunk_incl - chunk;
    }
    tile_carry += tile_total;
    chunk_carry += chunk_total;
  }
  if (threadIdx.x == 0) *tile_count = tile_carry;
  if (tiles == nullptr) return;  // uniform over the CTA
  __syncthreads();

  // 3. m-tile l belongs to the last expert whose tile_start <= l (an empty expert shares its
  //    tile_start with the next one, so the last is the non-empty expert holding l).
  for (int l = static_cast<int>(threadIdx.x); l < tiles_bound; l += kBuildThreads) {
    TileInfo t{-1, 0};
    if (l < tile_carry) {
      int lo = 0, hi = experts - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (__ldcg(&groups[mid].tile_start) <= l) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
      t.expert = lo;
      t.row0 = __ldcg(&groups[lo].begin) + (l - __ldcg(&groups[lo].tile_start)) * block_m;
    }
    tiles[l] = t;
  }
}

}  // namespace

int64_t group_schedule_bytes(int64_t experts, int64_t rows, int block_m) {
  if (experts <= 0) return 0;
  int64_t bytes = Workspace::aligned(experts * static_cast<int64_t>(sizeof(GroupInfo))) +
                  Workspace::aligned(static_cast<int64_t>(sizeof(int32_t)));
  if (block_m > 0)
    bytes += Workspace::aligned(m_tiles_bound(rows, experts, block_m) * static_cast<int64_t>(sizeof(TileInfo)));
  return bytes;
}

GroupSchedule build_group_schedule(const int32_t* offsets, int64_t experts, int64_t rows, int block_m, Workspace& ws,
                                   cudaStream_t stream) {
  GroupSchedule s;
  if (experts <= 0) return s;
  GroupInfo* groups = ws.take<GroupInfo>(experts);
  int32_t* tile_count = ws.take<int32_t>(1);
  TileInfo* tiles = nullptr;
  if (block_m > 0) {
    s.tiles_bound = m_tiles_bound(rows, experts, block_m);
    tiles = ws.take<TileInfo>(s.tiles_bound);
  }
  build_group_schedule_kernel<<<1, kBuildThreads, 0, stream>>>(
      offsets, static_cast<int>(experts), static_cast<int>(rows), block_m, groups, tiles, s.tiles_bound, tile_count);
  MXMOE_CUDA_CHECK_LAUNCH();
  s.groups = groups;
  s.tiles = tiles;
  s.tile_count = tile_count;
  s.experts = static_cast<int32_t>(experts);
  s.block_m = block_m > 0 ? block_m : 0;
  return s;
}

}  // namespace mxmoe::cuda
