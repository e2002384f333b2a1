// Builds the group schedule (schedule.h) with one CTA: offsets are clamped and made monotone by a
// max-scan, tile counts and column-wise scale chunk heights are exclusive-scanned, then every linear
// m-tile finds its expert by binary search. E and T of any size (chunked scans with carry).
#include <algorithm>

#include "mxmoe/mxfp8_layout.h"
#include "src/cuda/common/check.h"
#include "src/cuda/portable/schedule.h"

namespace mxmoe::cuda::portable {
namespace {

constexpr int kThreads = 1024;

// Inclusive scan over the CTA (kThreads threads) with `op`; returns the thread's inclusive value and
// sets `total` to the CTA aggregate. s_warp: 32 ints of shared scratch.
template <class Op>
__device__ int block_scan(int v, Op op, int* s_warp, int& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int o = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v = op(v, o);
  }
  if (lane == 31) s_warp[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int w = s_warp[lane];
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int o = __shfl_up_sync(0xffffffffu, w, d);
      if (lane >= d) w = op(w, o);
    }
    s_warp[lane] = w;
  }
  __syncthreads();
  if (warp > 0) v = op(v, s_warp[warp - 1]);
  total = s_warp[31];
  __syncthreads();  // s_warp is reused by the next call
  return v;
}

__global__ void __launch_bounds__(kThreads) build_schedule_kernel(const int32_t* __restrict__ offsets, int experts,
                                                                  int rows, int block_m, GroupInfo* groups,
                                                                  TileInfo* tiles, int tiles_bound) {
  __shared__ int s_warp[32];
  auto op_max = [](int a, int b) { return a > b ? a : b; };
  auto op_add = [](int a, int b) { return a + b; };

  // Pass 1: begin_e = max_{h<=e} clamp(offsets[h]) (monotone), stored in groups[e].begin, and
  // groups[e-1].end = begin_e. The end of the last group is the clamped offsets[E].
  int carry = 0;
  for (int base = 0; base <= experts; base += kThreads) {
    const int i = base + threadIdx.x;
    int v = i <= experts ? static_cast<int>(min(max(offsets[i], 0), rows)) : 0;
    int total;
    v = op_max(block_scan(v, op_max, s_warp, total), carry);
    if (i < experts) groups[i].begin = v;
    if (i >= 1 && i <= experts) groups[i - 1].end = v;
    carry = op_max(carry, total);
  }
  __syncthreads();
  __threadfence_block();

  // Pass 2: exclusive scans of tile counts and column-wise scale chunk heights.
  int tile_carry = 0, chunk_carry = 0;
  for (int base = 0; base < experts; base += kThreads) {
    const int e = base + threadIdx.x;
    int m = 0;
    if (e < experts) m = groups[e].end - groups[e].begin;
    const int nt = block_m > 0 ? (m + block_m - 1) / block_m : 0;
    const int ch = static_cast<int>(colwise_group_scale_rows(m));
    int t_total, c_total;
    const int t_incl = block_scan(nt, op_add, s_warp, t_total);
    const int c_incl = block_scan(ch, op_add, s_warp, c_total);
    if (e < experts) {
      groups[e].tile_start = tile_carry + t_incl - nt;
      groups[e].col_chunk = chunk_carry + c_incl - ch;
    }
    tile_carry += t_total;
    chunk_carry += c_total;
  }
  if (tiles == nullptr) return;
  __syncthreads();
  __threadfence_block();

  // Pass 3: tile -> expert (the last expert whose tile_start <= tile; empty experts are skipped
  // because the next one has the same tile_start).
  const int real_tiles = tile_carry;
  for (int l = threadIdx.x; l < tiles_bound; l += kThreads) {
    TileInfo ti{-1, 0};
    if (l < real_tiles) {
      int lo = 0, hi = experts - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (groups[mid].tile_start <= l) lo = mid; else hi = mid - 1;
      }
      ti.expert = lo;
      ti.row0 = groups[lo].begin + (l - groups[lo].tile_start) * block_m;
    }
    tiles[l] = ti;
  }
}

}  // namespace

void launch_build_schedule(const int32_t* offsets, int64_t experts, int64_t rows, int block_m,
                           GroupInfo* groups, TileInfo* tiles, int32_t tiles_bound, cudaStream_t stream) {
  if (experts <= 0) return;
  build_schedule_kernel<<<1, kThreads, 0, stream>>>(offsets, static_cast<int>(experts), static_cast<int>(rows),
                                                    block_m, groups, tiles, tiles_bound);
  MXMOE_CUDA_CHECK_LAUNCH();
}

Workspace::Workspace(int64_t bytes, cudaStream_t stream) : stream_(stream) {
  if (bytes > 0) MXMOE_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&base_), static_cast<size_t>(bytes), stream));
}
Workspace::~Workspace() {
  if (base_) cudaFreeAsync(base_, stream_);
}

}  // namespace mxmoe::cuda::portable
