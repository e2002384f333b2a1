// cuda_sm100's light kernels (no CUTLASS): the per-call repack of every scale operand into the
// per-group layout CUTLASS's block-scaled kernels read (scale_repack.h says which byte goes where),
// and the zeros of D_e for empty groups of the k-grouped GEMM. Driven by the device-side group
// schedule (src/cuda/common/group_schedule.h): no host read of the offsets, graph-capturable.
// One thread per 4-byte word of the destination (4 consecutive K-blocks of one MN row).
// Run (Blackwell only): <build>/tests/mxmoe_gpu_tests --gtest_filter='*cuda_sm100*'
#include <algorithm>

#include "src/cuda/common/check.h"
#include "src/cuda/sm100/kernels.h"
#include "src/cuda/sm100/scale_repack.h"
#include "src/cuda/sm100/sm100_ops.h"

namespace mxmoe::cuda::sm100 {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;  // grid-stride beyond this

int blocks_for(int64_t work) { return static_cast<int>(std::clamp<int64_t>(ceil_div(work, kThreads), 1, kMaxBlocks)); }

// Padded row r of the repacked buffer lies in m-tile r / 128 of the schedule: that tile's group and
// first row give the group's local row; tiles past the real count are never read and stay as they are.
__global__ void repack_token_rows_kernel(const uint8_t* __restrict__ src, ScaleLayout layout, GroupSchedule s,
                                         int64_t k, uint32_t* __restrict__ dst) {
  const int64_t c_pad = rowwise_scale_cols(k), quads = c_pad / kSwizzleCols;
  const int64_t words = static_cast<int64_t>(s.tiles_bound) * kSwizzleRows * quads;
  const int32_t tiles = *s.tile_count;
  for (int64_t w = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; w < words;
       w += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = w / quads, q = w % quads, tile = r / kSwizzleRows;
    if (tile >= tiles) continue;
    const TileInfo t = s.tiles[tile];
    const GroupInfo g = s.groups[t.expert];
    const int64_t local = t.row0 - g.begin + r % kSwizzleRows, m = g.end - g.begin;
    const uint32_t v = pack_word(
        src, [&](int64_t j) { return token_rows_source(g.begin, m, local, j, k, layout); }, q);
    dst[word_offset(r, q, c_pad) / 4] = v;
  }
}

// Expert e's matrix is padded rows [e * round_up(n, 128), (e + 1) * round_up(n, 128)).
__global__ void repack_expert_kernel(ExpertPtrs src, BlockAxis axis, ScaleLayout layout, int64_t experts, int64_t n,
                                     int64_t k, uint32_t* __restrict__ dst) {
  const int64_t c_pad = rowwise_scale_cols(k), quads = c_pad / kSwizzleCols, n_pad = round_up(n, kSwizzleRows);
  const int64_t words = experts * n_pad * quads;
  for (int64_t w = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; w < words;
       w += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = w / quads, q = w % quads, e = r / n_pad, i = r % n_pad;
    const uint8_t* m = src.at<const uint8_t>(e);
    const uint32_t v = pack_word(
        m,
        [&](int64_t j) {
          return axis == BlockAxis::row ? expert_rows_source(i, j, n, k, layout)
                                        : expert_cols_source(i, j, n, k, layout);
        },
        q);
    dst[word_offset(r, q, c_pad) / 4] = v;
  }
}

// Scale-row quad Q (rows 4Q .. 4Q+3 of the column-wise buffer) belongs to the group chunk_group()
// finds for row 4Q (chunks are whole quads); quads past the last chunk are never read.
__global__ void repack_token_cols_kernel(const uint8_t* __restrict__ src, ScaleLayout layout, GroupSchedule s,
                                         int64_t t, int64_t mn, uint32_t* __restrict__ dst) {
  const int64_t row_bytes = colwise_scale_row_bytes(mn);
  const int64_t words = ceil_div(colwise_scale_rows_capacity(t, s.experts), kSwizzleCols) * row_bytes;
  for (int64_t w = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; w < words;
       w += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t quad = w / row_bytes, i = w % row_bytes, row = quad * kSwizzleCols;
    const GroupInfo g = s.groups[chunk_group(s.groups, s.experts, row)];
    const int64_t m = g.end - g.begin, c_pad = colwise_group_scale_rows(m);
    if (row < g.col_chunk || row >= g.col_chunk + c_pad) continue;
    const int64_t q = (row - g.col_chunk) / kSwizzleCols;
    const uint32_t v = pack_word(
        src, [&](int64_t j) { return token_cols_source(g.col_chunk, m, i, j, mn, layout); }, q);
    dst[(token_cols_offset(g.col_chunk, mn) + word_offset(i, q, c_pad)) / 4] = v;
  }
}

__global__ void zero_empty_groups_kernel(const GroupInfo* __restrict__ groups, int64_t experts, int64_t elems,
                                         float* __restrict__ d) {
  for (int64_t e = blockIdx.y; e < experts; e += gridDim.y) {
    if (groups[e].end != groups[e].begin) continue;  // uniform over the block
    float* de = d + e * elems;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < elems;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
      de[i] = 0.0f;
  }
}

__global__ void probe_kernel() {}

}  // namespace

void repack_token_row_scales(const uint8_t* src, ScaleLayout layout, const GroupSchedule& s, int64_t k, uint8_t* dst,
                             cudaStream_t stream) {
  if (s.experts <= 0 || s.block_m != kSwizzleRows) return;
  const int64_t words = static_cast<int64_t>(s.tiles_bound) * kSwizzleRows * (rowwise_scale_cols(k) / kSwizzleCols);
  repack_token_rows_kernel<<<blocks_for(words), kThreads, 0, stream>>>(src, layout, s, k,
                                                                       reinterpret_cast<uint32_t*>(dst));
  MXMOE_CUDA_CHECK_LAUNCH();
}

void repack_expert_scales(ExpertPtrs src, BlockAxis axis, ScaleLayout layout, int64_t experts, int64_t n, int64_t k,
                          uint8_t* dst, cudaStream_t stream) {
  if (experts <= 0) return;
  const int64_t words = experts * round_up(n, kSwizzleRows) * (rowwise_scale_cols(k) / kSwizzleCols);
  repack_expert_kernel<<<blocks_for(words), kThreads, 0, stream>>>(src, axis, layout, experts, n, k,
                                                                   reinterpret_cast<uint32_t*>(dst));
  MXMOE_CUDA_CHECK_LAUNCH();
}

void repack_token_col_scales(const uint8_t* src, ScaleLayout layout, const GroupSchedule& s, int64_t t, int64_t mn,
                             uint8_t* dst, cudaStream_t stream) {
  if (s.experts <= 0) return;
  const int64_t words = ceil_div(colwise_scale_rows_capacity(t, s.experts), kSwizzleCols) * colwise_scale_row_bytes(mn);
  repack_token_cols_kernel<<<blocks_for(words), kThreads, 0, stream>>>(src, layout, s, t, mn,
                                                                       reinterpret_cast<uint32_t*>(dst));
  MXMOE_CUDA_CHECK_LAUNCH();
}

void zero_empty_groups(const GroupInfo* groups, int64_t experts, int64_t elems_per_group, float* d,
                       cudaStream_t stream) {
  if (experts <= 0 || elems_per_group <= 0) return;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(ceil_div(elems_per_group, kThreads), 64)),
                  static_cast<unsigned>(std::min<int64_t>(experts, 65535)));
  zero_empty_groups_kernel<<<grid, kThreads, 0, stream>>>(groups, experts, elems_per_group, d);
  MXMOE_CUDA_CHECK_LAUNCH();
}

std::string kernel_image_problem(int device) {
  int old = 0;
  cudaGetDevice(&old);
  if (cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    return "cannot select device " + std::to_string(device);
  }
  cudaFuncAttributes attr{};
  const cudaError_t err = cudaFuncGetAttributes(&attr, probe_kernel);
  cudaSetDevice(old);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return std::string("the sm_100a kernels of this build cannot load: ") + cudaGetErrorString(err);
  }
  return "";
}

}  // namespace mxmoe::cuda::sm100
