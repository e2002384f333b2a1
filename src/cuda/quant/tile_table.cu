// Row-tile table for grouped column-wise MXFP8 work, built on the device from device offsets.
//
// In:  offsets i32 [E+1] (device; possibly invalid: clamped to [0, M] and made monotone by a prefix
//      max, so a bad offset gives wrong groups but never an out-of-bounds access).
// Out: TileInfo [ceil(M/32) + E]: entry y is the y-th 32-row block over all groups in order
//      (group e has ceil(m_e/32) blocks), with the group's first scale row
//      s_e = sum_{h<e} colwise_group_scale_rows(m_h); entries past the last block have group_rows 0.
// One CTA of 1024 threads: block scans over the groups (E is at most a few thousand), then every
// table entry finds its group by binary search over the block starts. Nothing is read on the host.
#include <algorithm>

#include "src/cuda/common/check.h"
#include "src/cuda/quant/quant_tile.cuh"

namespace mxmoe::cuda::quant {
namespace {

constexpr int kScanThreads = 1024;
constexpr int kScanWarps = kScanThreads / 32;

struct Max {
  __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};
struct Sum {
  __device__ int operator()(int a, int b) const { return a + b; }
};

// Inclusive scan of one value per thread over the CTA; `total` receives the CTA-wide result.
template <class Op>
__device__ int block_inclusive_scan(int v, Op op, int identity, int* warp_totals, int& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int d = 1; d < 32; d *= 2) {
    const int n = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v = op(v, n);
  }
  if (lane == 31) warp_totals[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int w = lane < kScanWarps ? warp_totals[lane] : identity;
    for (int d = 1; d < 32; d *= 2) {
      const int n = __shfl_up_sync(0xffffffffu, w, d);
      if (lane >= d) w = op(w, n);
    }
    warp_totals[lane] = w;
  }
  __syncthreads();
  if (warp > 0) v = op(v, warp_totals[warp - 1]);
  total = warp_totals[kScanWarps - 1];
  __syncthreads();  // warp_totals is reused by the next scan
  return v;
}

// scratch: mono [E+1] (clamped monotone offsets), tile_start [E+1], chunk_start [E]. Written by
// some threads and read by others after __syncthreads. NOTE: scratch must not be __restrict__: with
// it nvcc hoisted the load of tile_start[E] above the barrier (seen on H200: table entries past the
// first warp came out empty). The reads go through L2 (__ldcg) as a second guard.
__global__ void __launch_bounds__(kScanThreads)
    build_tile_table_kernel(const int32_t* __restrict__ offsets, int experts, int rows, int capacity,
                            TileInfo* __restrict__ table, int* scratch) {
  __shared__ int warp_totals[32];
  int* mono = scratch;
  int* tile_start = scratch + experts + 1;
  int* chunk_start = tile_start + experts + 1;

  // 1. mono[i] = max_{h <= i} clamp(offsets[h], 0, rows)
  int carry = 0;
  for (int base = 0; base <= experts; base += kScanThreads) {
    const int i = base + static_cast<int>(threadIdx.x);
    int v = 0;
    if (i <= experts) {
      const int o = offsets[i];
      v = o < 0 ? 0 : (o > rows ? rows : o);
    }
    int total = 0;
    v = Max{}(block_inclusive_scan(v, Max{}, 0, warp_totals, total), carry);
    if (i <= experts) mono[i] = v;
    carry = Max{}(carry, total);
  }
  __syncthreads();

  // 2. exclusive prefix sums of the groups' 32-row blocks and of their scale-chunk heights
  int tile_carry = 0, chunk_carry = 0;
  for (int base = 0; base < experts; base += kScanThreads) {
    const int e = base + static_cast<int>(threadIdx.x);
    int tiles = 0, chunk = 0;
    if (e < experts) {
      const int m = __ldcg(mono + e + 1) - __ldcg(mono + e);
      tiles = (m + kTileRows - 1) / kTileRows;
      chunk = static_cast<int>(colwise_group_scale_rows(m));
    }
    int tile_total = 0, chunk_total = 0;
    const int tile_incl = block_inclusive_scan(tiles, Sum{}, 0, warp_totals, tile_total);
    const int chunk_incl = block_inclusive_scan(chunk, Sum{}, 0, warp_totals, chunk_total);
    if (e < experts) {
      tile_start[e] = tile_carry + tile_incl - tiles;
      chunk_start[e] = chunk_carry + chunk_incl - chunk;
    }
    tile_carry += tile_total;
    chunk_carry += chunk_total;
  }
  if (threadIdx.x == 0) tile_start[experts] = tile_carry;
  __syncthreads();

  // 3. table entries: the group of tile y is the last e with tile_start[e] <= y (empty groups share
  //    their start with the next group, so the last one is the non-empty group holding y).
  const int used = __ldcg(tile_start + experts);
  for (int y = static_cast<int>(threadIdx.x); y < capacity; y += kScanThreads) {
    TileInfo t{0, 0, 0, 0};
    if (y < used) {
      int lo = 0, hi = experts;  // first e in [0, E) with tile_start[e] > y is hi after the search
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (__ldcg(tile_start + mid) <= y) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      const int e = lo - 1;
      const int j = y - __ldcg(tile_start + e);
      const int begin = __ldcg(mono + e);
      t.row_begin = begin + j * kTileRows;
      t.group_rows = __ldcg(mono + e + 1) - begin;
      t.block = j;
      t.chunk_row = __ldcg(chunk_start + e);
    }
    table[y] = t;
  }
}

}  // namespace

TileTable::TileTable(const GroupOffsets& groups, int64_t rows, cudaStream_t stream) : stream_(stream) {
  const int64_t experts = groups.offsets.data != nullptr ? groups.experts() : 0;
  if (experts <= 0 || rows <= 0) {
    count_ = ceil_div(rows, kTileRows);
    return;
  }
  count_ = ceil_div(rows, kTileRows) + experts;
  const int64_t table_bytes = count_ * static_cast<int64_t>(sizeof(TileInfo));
  const int64_t scratch_bytes = (3 * experts + 2) * static_cast<int64_t>(sizeof(int));
  MXMOE_CUDA_CHECK(cudaMallocAsync(&workspace_, static_cast<size_t>(table_bytes + scratch_bytes), stream));
  auto* table = static_cast<TileInfo*>(workspace_);
  auto* scratch = reinterpret_cast<int*>(static_cast<char*>(workspace_) + table_bytes);
  build_tile_table_kernel<<<1, kScanThreads, 0, stream>>>(groups.data(), static_cast<int>(experts),
                                                         static_cast<int>(rows), static_cast<int>(count_),
                                                         table, scratch);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) {
    cudaFreeAsync(workspace_, stream);  // the destructor does not run when the constructor throws
    check(err, "build_tile_table_kernel launch");
  }
  tiles_ = table;
}

TileTable::~TileTable() {
  if (workspace_ != nullptr) cudaFreeAsync(workspace_, stream_);  // errors surface at the next check
}

}  // namespace mxmoe::cuda::quant
