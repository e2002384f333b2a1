// Fixed-order reductions (reductions.h). Every output element is summed by one thread (or one warp
// with a fixed shuffle tree) over its partials in index order, so results are bit-identical from
// run to run.
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuGluBackward*:*GpuFc2BiasGrads*'
//      (CPU reference and bit-identical repeats).
#include "mxmoe/numerics.h"
#include "src/cuda/common/check.h"
#include "src/cuda/common/reductions.h"

namespace mxmoe::cuda {
namespace {

constexpr int kBlock = 256;

__global__ void reduce_dprob_kernel(const float* __restrict__ ws, int parts, int64_t rows,
                                    const float* __restrict__ add, float* __restrict__ out) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (t >= rows) return;
  float v = 0.0f;
  for (int j = 0; j < parts; ++j) v += ws[j * rows + t];
  if (add != nullptr) v += add[t];
  out[t] = v;
}

__global__ void reduce_expert_tiles_kernel(const float* __restrict__ ws, int64_t cols,
                                           const GroupInfo* __restrict__ groups, int block_m, GradDst dst) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  const int e = blockIdx.y;
  if (c >= cols) return;
  const GroupInfo g = groups[e];
  const int tiles = (g.end - g.begin + block_m - 1) / block_m;
  float v = 0.0f;
  for (int i = 0; i < tiles; ++i) v += ws[static_cast<int64_t>(g.tile_start + i) * cols + c];
  const int64_t at = static_cast<int64_t>(e) * cols + c;
  if (dst.f32) {
    float* d = static_cast<float*>(dst.data);
    if (dst.accumulate) {
      if (tiles > 0) d[at] += v;
    } else {
      d[at] = v;
    }
  } else {
    static_cast<uint16_t*>(dst.data)[at] = bf16_from_f32(v);
  }
}

// One CTA per (tile, 512 columns); each thread sums two adjacent columns down the tile's rows.
__global__ void tile_column_sums_kernel(const uint16_t* __restrict__ x, int64_t cols, GroupSchedule sched,
                                        const float* __restrict__ probs, float* __restrict__ ws) {
  const int block_m = sched.block_m;
  const int tile = blockIdx.x;
  const int64_t c = (static_cast<int64_t>(blockIdx.y) * kBlock + threadIdx.x) * 2;
  const TileInfo ti = sched.tiles[tile];
  if (ti.expert < 0 || c >= cols) return;
  const int64_t end = min(static_cast<int64_t>(ti.row0) + block_m, static_cast<int64_t>(sched.groups[ti.expert].end));
  float s0 = 0.0f, s1 = 0.0f;
  for (int64_t t = ti.row0; t < end; ++t) {
    const uint32_t v = *reinterpret_cast<const uint32_t*>(x + t * cols + c);
    const float w = probs != nullptr ? probs[t] : 1.0f;
    s0 += w * f32_from_bits(v << 16);
    s1 += w * f32_from_bits(v & 0xffff0000u);
  }
  ws[tile * cols + c] = s0;
  ws[tile * cols + c + 1] = s1;
}

// One warp per row; lanes take 8 columns at a time, then a fixed xor-shuffle tree.
__global__ void row_bias_dot_kernel(const uint16_t* __restrict__ x, int64_t rows, int64_t cols,
                                    const GroupInfo* __restrict__ groups, int experts,
                                    const uint16_t* __restrict__ bias, float* __restrict__ out) {
  const int lane = threadIdx.x & 31;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (kBlock / 32) + (threadIdx.x >> 5);
  if (t >= rows) return;
  int lo = 0, hi = experts - 1;  // last expert whose first row is <= t
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (groups[mid].begin <= t) lo = mid; else hi = mid - 1;
  }
  const GroupInfo g = groups[lo];
  float v = 0.0f;
  if (t >= g.begin && t < g.end) {
    const uint16_t* xr = x + t * cols;
    const uint16_t* br = bias + static_cast<int64_t>(lo) * cols;
    for (int64_t c = lane * 8; c < cols; c += 32 * 8) {
      const uint4 xv = *reinterpret_cast<const uint4*>(xr + c);
      const uint4 bv = *reinterpret_cast<const uint4*>(br + c);
      const uint32_t xs[4] = {xv.x, xv.y, xv.z, xv.w}, bs[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        v += f32_from_bits(xs[i] << 16) * f32_from_bits(bs[i] << 16);
        v += f32_from_bits(xs[i] & 0xffff0000u) * f32_from_bits(bs[i] & 0xffff0000u);
      }
    }
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  if (lane == 0) out[t] = v;
}

unsigned blocks(int64_t n, int64_t per) { return static_cast<unsigned>((n + per - 1) / per); }

}  // namespace

void launch_reduce_dprob(const float* ws, int parts, int64_t rows, const float* add, float* dprobs,
                         cudaStream_t stream) {
  if (rows == 0) return;
  reduce_dprob_kernel<<<blocks(rows, kBlock), kBlock, 0, stream>>>(ws, parts, rows, add, dprobs);
  MXMOE_CUDA_CHECK_LAUNCH();
}

void launch_reduce_expert_tiles(const float* ws, int64_t cols, const GroupSchedule& sched, GradDst dst,
                                cudaStream_t stream) {
  if (cols == 0 || sched.experts == 0 || dst.data == nullptr) return;
  const dim3 grid(blocks(cols, kBlock), static_cast<unsigned>(sched.experts));
  reduce_expert_tiles_kernel<<<grid, kBlock, 0, stream>>>(ws, cols, sched.groups, sched.block_m, dst);
  MXMOE_CUDA_CHECK_LAUNCH();
}

void launch_tile_column_sums(const uint16_t* x, int64_t cols, const GroupSchedule& sched, const float* probs,
                             float* ws, cudaStream_t stream) {
  if (cols == 0 || sched.tiles_bound == 0) return;
  const dim3 grid(static_cast<unsigned>(sched.tiles_bound), blocks(cols, 2 * kBlock));
  tile_column_sums_kernel<<<grid, kBlock, 0, stream>>>(x, cols, sched, probs, ws);
  MXMOE_CUDA_CHECK_LAUNCH();
}

void launch_row_bias_dot(const uint16_t* x, int64_t rows, int64_t cols, const GroupSchedule& sched,
                         const uint16_t* bias, float* out, cudaStream_t stream) {
  if (rows == 0 || sched.experts == 0) return;
  row_bias_dot_kernel<<<blocks(rows, kBlock / 32), kBlock, 0, stream>>>(x, rows, cols, sched.groups, sched.experts,
                                                                         bias, out);
  MXMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace mxmoe::cuda
