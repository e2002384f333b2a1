// FP8 blockwise on the GPU (docs/numerics.md "FP8 blockwise"): the quantizers of the recipe
// fp8_blockwise (bit-exact with src/cpu/fp8_block.cpp: the scale rule, encoding and scale placement
// of src/common/fp8_block.h), their dequantizers to bf16, and the GEMM steps on FP8-blockwise
// operands through the BF16 GEMMs of a backend.
//
//   rows          1x128 blocks along K, one warp per block, f32 inverse scales MN-major
//                 [ceil(K/128)][roundup(T, 4)];
//   token blocks  128x1 blocks along the rows restarting at every group (the group schedule with
//                 128-row m-tiles: m-tile i is scale row i), one thread per column;
//   weights       128x128 blocks of each expert's [rows, cols], one CTA per block.
//
// The GEMMs: with power-of-two scales, e4m3 x s_inv is exact in bf16, so the GEMM of the bf16
// dequantized operands is the recipe's GEMM rule up to accumulation order (numerics "GEMMs"); the
// operands are dequantized into a stream-ordered workspace, the backend's BF16 kernel runs with the
// same epilogue, and an FP8-blockwise activation output is quantized from the bf16 it wrote
// ("Quantized value"). Non-power-of-two scales are refused by the probes (they need FP8 MMAs with
// promotion every 128, not yet written). No host synchronisation: the steps capture in a CUDA graph.
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuFp8Block*:*GpuLayer*'
#include <string>

#include "mxmoe/numerics.h"
#include "src/common/experts.h"
#include "src/common/fp8_block.h"
#include "src/cuda/common/check.h"
#include "src/cuda/common/group_schedule.h"
#include "src/cuda/cuda_ops.h"

namespace mxmoe::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int s = 16; s >= 1; s /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, s));
  return v;
}

// One 128-value block per warp: lane l holds values 4l..4l+3 of the block.
__global__ void __launch_bounds__(kThreads) rows_kernel(const uint16_t* __restrict__ x, int64_t rows, int64_t k,
                                                         bool pow2, uint8_t* __restrict__ q, float* __restrict__ sinv) {
  const int64_t kbs = ceil_div(k, kFp8Block);
  const int64_t w = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (w >= rows * kbs) return;
  const int64_t r = w / kbs, kb = w % kbs;
  const int lane = threadIdx.x % 32;
  float v[4];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t c = kb * kFp8Block + 4 * lane + i;
    v[i] = c < k ? f32_from_bf16(x[r * k + c]) : 0.0f;
    if (c < k) amax = amax_update(amax, v[i]);
  }
  amax = warp_max(amax);  // amaxes are never NaN (amax_update skips it): fmaxf is exact here
  const float s = fp8_block_scale(amax, pow2);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t c = kb * kFp8Block + 4 * lane + i;
    if (c < k) q[r * k + c] = fp8_block_encode(v[i], s);
  }
  if (lane == 0) sinv[fp8_rowwise_scale_index(r, kb, rows)] = fp8_block_scale_inv(s);
}

__global__ void __launch_bounds__(kThreads) rows_to_bf16_kernel(const uint8_t* __restrict__ q,
                                                                 const float* __restrict__ sinv, int64_t rows,
                                                                 int64_t k, uint16_t* __restrict__ out) {
  const int64_t n = rows * k;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t r = i / k, c = i % k;
    out[i] = bf16_from_f32(fp8_block_decode(q[i], sinv[fp8_rowwise_scale_index(r, c / kFp8Block, rows)]));
  }
}

// The rows [row0, row0 + n) and scale row of 128-row tile `tile`, or n = 0 past the real tiles.
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

// blockIdx.x: the 128-row tile (= scale row); blockIdx.y: 256 columns; one thread per column.
__global__ void __launch_bounds__(kThreads) token_blocks_kernel(const uint16_t* __restrict__ x, int64_t rows,
                                                                 int64_t k, GroupSchedule sched, bool pow2,
                                                                 uint8_t* __restrict__ q, float* __restrict__ sinv) {
  const TokenTile t = token_tile(sched, blockIdx.x, rows);
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (t.n <= 0 || c >= k) return;
  float amax = 0.0f;
  for (int64_t r = 0; r < t.n; ++r) amax = amax_update(amax, f32_from_bf16(x[(t.row0 + r) * k + c]));
  const float s = fp8_block_scale(amax, pow2);
  for (int64_t r = 0; r < t.n; ++r) {
    const int64_t i = (t.row0 + r) * k + c;
    q[i] = fp8_block_encode(f32_from_bf16(x[i]), s);
  }
  sinv[static_cast<int64_t>(blockIdx.x) * k + c] = fp8_block_scale_inv(s);
}

__global__ void __launch_bounds__(kThreads) token_blocks_to_bf16_kernel(const uint8_t* __restrict__ q,
                                                                         const float* __restrict__ sinv, int64_t rows,
                                                                         int64_t k, GroupSchedule sched,
                                                                         uint16_t* __restrict__ out) {
  const TokenTile t = token_tile(sched, blockIdx.x, rows);
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (t.n <= 0 || c >= k) return;
  const float s = sinv[static_cast<int64_t>(blockIdx.x) * k + c];
  for (int64_t r = 0; r < t.n; ++r) {
    const int64_t i = (t.row0 + r) * k + c;
    out[i] = bf16_from_f32(fp8_block_decode(q[i], s));
  }
}

// One CTA per 128x128 block (blockIdx.x = (e * nbs + nb) * kbs + kb): thread t takes column t % 128
// of rows t / 128, t / 128 + 2, ...
__global__ void __launch_bounds__(kThreads) weights_kernel(ExpertPtrs src, int64_t rows, int64_t cols, bool pow2,
                                                            uint8_t* __restrict__ q, float* __restrict__ sinv) {
  __shared__ float warp_amax[kThreads / 32];
  const int64_t nbs = ceil_div(rows, kFp8Block), kbs = ceil_div(cols, kFp8Block);
  const int64_t b = blockIdx.x, e = b / (nbs * kbs), nb = (b / kbs) % nbs, kb = b % kbs;
  const auto* w = src.at<const uint16_t>(e);
  uint8_t* qe = q + e * rows * cols;
  const int64_t c = kb * kFp8Block + threadIdx.x % kFp8Block;
  const int64_t r0 = nb * kFp8Block + threadIdx.x / kFp8Block;
  const int64_t r1 = min(nb * kFp8Block + kFp8Block, rows);
  float amax = 0.0f;
  if (c < cols)
    for (int64_t r = r0; r < r1; r += kThreads / kFp8Block) amax = amax_update(amax, f32_from_bf16(w[r * cols + c]));
  amax = warp_max(amax);
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
  __syncthreads();
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < kThreads / 32; ++i) m = fmaxf(m, warp_amax[i]);
  const float s = fp8_block_scale(m, pow2);
  if (c < cols)
    for (int64_t r = r0; r < r1; r += kThreads / kFp8Block) qe[r * cols + c] = fp8_block_encode(f32_from_bf16(w[r * cols + c]), s);
  if (threadIdx.x == 0) sinv[b] = fp8_block_scale_inv(s);
}

__global__ void __launch_bounds__(kThreads) weights_to_bf16_kernel(const uint8_t* __restrict__ q,
                                                                    const float* __restrict__ sinv, int64_t experts,
                                                                    int64_t rows, int64_t cols,
                                                                    uint16_t* __restrict__ out) {
  const int64_t per = rows * cols, n = experts * per;
  const int64_t nbs = ceil_div(rows, kFp8Block), kbs = ceil_div(cols, kFp8Block);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t e = i / per, r = (i % per) / cols, c = i % cols;
    out[i] = bf16_from_f32(fp8_block_decode(q[i], sinv[(e * nbs + r / kFp8Block) * kbs + c / kFp8Block]));
  }
}

// E e4m3 matrices [rows, cols] -> [cols, rows] (32 x 32 tiles through shared memory, a CTA of 32 x 8
// threads per tile), and their 128x128-block scales [E][rb][cb] -> [E][cb][rb].
constexpr int kTile = 32;
__global__ void __launch_bounds__(kTile * 8) transpose_u8_kernel(const uint8_t* __restrict__ q, int64_t rows,
                                                                 int64_t cols, uint8_t* __restrict__ qt) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const int64_t e = blockIdx.z, r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const uint8_t* src = q + e * rows * cols;
  uint8_t* dst = qt + e * rows * cols;
  for (int i = threadIdx.y; i < kTile; i += 8) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = src[r * cols + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += 8) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < rows && c < cols) dst[c * rows + r] = tile[threadIdx.x][i];
  }
}
__global__ void transpose_scales_kernel(const float* __restrict__ s, int64_t experts, int64_t rb, int64_t cb,
                                        float* __restrict__ st) {
  const int64_t n = experts * rb * cb;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = i / (rb * cb), r = (i / cb) % rb, c = i % cb;
    st[(e * cb + c) * rb + r] = s[i];
  }
}

unsigned grid_1d(int64_t work) {
  const int64_t blocks = ceil_div(work, kThreads);
  return static_cast<unsigned>(blocks < 65536 * 8 ? blocks : 65536 * 8);
}

void zero(const TensorView& t, cudaStream_t stream) {
  if (t.data != nullptr && t.bytes() > 0) MXMOE_CUDA_CHECK(cudaMemsetAsync(t.data, 0, static_cast<size_t>(t.bytes()), stream));
}

// The group schedule of the token blocks (128-row tiles per group), or none for one group.
GroupSchedule token_schedule(const GroupOffsets& g, int64_t rows, Workspace& ws, cudaStream_t stream) {
  if (g.offsets.data == nullptr) return {};
  return build_group_schedule(g.data(), g.experts(), rows, kFp8Block, ws, stream);
}
int64_t token_schedule_bytes(const GroupOffsets& g, int64_t rows) {
  return g.offsets.data == nullptr ? 0 : group_schedule_bytes(g.experts(), rows, kFp8Block);
}
int64_t token_tiles(const GroupOffsets& g, int64_t rows) {
  return g.offsets.data == nullptr ? ceil_div(rows, kFp8Block) : m_tiles_bound(rows, g.experts(), kFp8Block);
}

void token_blocks_to_bf16(const Mxfp8View& v, const GroupOffsets& g, uint16_t* out, Workspace& ws, cudaStream_t stream) {
  const int64_t rows = v.data.shape[0], k = v.data.shape[1];
  if (rows == 0 || k == 0) return;
  const GroupSchedule sched = token_schedule(g, rows, ws, stream);
  const dim3 grid(static_cast<unsigned>(token_tiles(g, rows)), static_cast<unsigned>(ceil_div(k, kThreads)));
  token_blocks_to_bf16_kernel<<<grid, kThreads, 0, stream>>>(v.data.ptr<uint8_t>(), v.scales.ptr<float>(), rows, k,
                                                             sched, out);
  MXMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void quantize_fp8_block(const QuantizeArgs& a, void* stream_ptr) {
  const cudaStream_t stream = as_stream(stream_ptr);
  const int64_t m = a.src.size(0), k = a.src.size(1);
  const bool row = a.rowwise.data.data != nullptr, col = a.colwise.data.data != nullptr;
  if (row) zero(a.rowwise.scales, stream);  // padding rows, and block rows no group reaches, are 0
  if (col) zero(a.colwise.scales, stream);
  if (m == 0 || k == 0) return;
  const auto* src = a.src.ptr<uint16_t>();
  if (row) {
    const int64_t blocks = ceil_div(m * ceil_div(k, kFp8Block), kThreads / 32);  // a warp per 128-value block
    if (blocks > 0x7fffffff) throw Error("src", "too many 1x128 blocks for one grid: " + std::to_string(blocks));
    rows_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        src, m, k, a.pow2_scales, a.rowwise.data.ptr<uint8_t>(), a.rowwise.scales.ptr<float>());
    MXMOE_CUDA_CHECK_LAUNCH();
  }
  if (col) {
    Workspace ws(token_schedule_bytes(a.groups, m), stream);
    const GroupSchedule sched = token_schedule(a.groups, m, ws, stream);
    const dim3 grid(static_cast<unsigned>(token_tiles(a.groups, m)), static_cast<unsigned>(ceil_div(k, kThreads)));
    token_blocks_kernel<<<grid, kThreads, 0, stream>>>(src, m, k, sched, a.pow2_scales, a.colwise.data.ptr<uint8_t>(),
                                                       a.colwise.scales.ptr<float>());
    MXMOE_CUDA_CHECK_LAUNCH();
  }
}

namespace {
// Token blocks [T, K] -> [K, Tp]: 128-row token tile i (the group schedule's; scale row i) to
// columns [128 i, 128 i + 128), the rows past its group's end as 0. One CTA of 32 x 8 threads per
// (tile, 32 columns); tiles past the real count are skipped (no k-block reads them).
__global__ void __launch_bounds__(kTile * 8) transpose_token_blocks_kernel(const uint8_t* __restrict__ q, int64_t rows,
                                                                           int64_t k, GroupSchedule sched, int64_t tp,
                                                                           uint8_t* __restrict__ qt) {
  __shared__ uint8_t tile[kFp8Block][kTile + 4];
  const TokenTile t = token_tile(sched, blockIdx.x, rows);
  if (t.n <= 0) return;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * kTile;
  for (int r = threadIdx.y; r < kFp8Block; r += 8) {
    const int64_t c = c0 + threadIdx.x;
    tile[r][threadIdx.x] = r < t.n && c < k ? q[(t.row0 + r) * k + c] : 0;
  }
  __syncthreads();
  for (int c = threadIdx.y; c < kTile; c += 8) {
    if (c0 + c >= k) break;
    const int r = 4 * threadIdx.x;  // 32 lanes x 4 bytes: the tile's 128 columns of row c0 + c
    const uint32_t w = static_cast<uint32_t>(tile[r][c]) | (static_cast<uint32_t>(tile[r + 1][c]) << 8) |
                       (static_cast<uint32_t>(tile[r + 2][c]) << 16) | (static_cast<uint32_t>(tile[r + 3][c]) << 24);
    *reinterpret_cast<uint32_t*>(qt + (c0 + c) * tp + static_cast<int64_t>(blockIdx.x) * kFp8Block + r) = w;
  }
}
}  // namespace

int64_t fp8_token_block_tiles(const GroupOffsets& g, int64_t rows) { return token_tiles(g, rows); }

void transpose_token_blocks(const Mxfp8View& v, const GroupOffsets& g, uint8_t* qt, int64_t tp, void* stream_ptr) {
  const cudaStream_t stream = as_stream(stream_ptr);
  const int64_t rows = v.data.shape[0], k = v.data.shape[1];
  if (rows == 0 || k == 0) return;
  if (tp % 16 != 0 || tp < token_tiles(g, rows) * kFp8Block) throw Error("tp", "internal: transposed pitch too small or unaligned");
  Workspace ws(token_schedule_bytes(g, rows), stream);
  const GroupSchedule sched = token_schedule(g, rows, ws, stream);
  const dim3 grid(static_cast<unsigned>(token_tiles(g, rows)), static_cast<unsigned>(ceil_div(k, kTile)));
  transpose_token_blocks_kernel<<<grid, dim3(kTile, 8), 0, stream>>>(v.data.ptr<uint8_t>(), rows, k, sched, tp, qt);
  MXMOE_CUDA_CHECK_LAUNCH();
}

void transpose_fp8_block_weights(const uint8_t* q, const float* sinv, int64_t experts, int64_t rows, int64_t cols,
                                 uint8_t* qt, float* sinv_t, void* stream_ptr) {
  const cudaStream_t stream = as_stream(stream_ptr);
  if (experts == 0 || rows == 0 || cols == 0) return;
  if (experts > 65535) throw Error("experts", "more than 65535 experts for one transpose grid");
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, kTile)), static_cast<unsigned>(ceil_div(rows, kTile)),
                  static_cast<unsigned>(experts));
  transpose_u8_kernel<<<grid, dim3(kTile, 8), 0, stream>>>(q, rows, cols, qt);
  MXMOE_CUDA_CHECK_LAUNCH();
  const int64_t rb = ceil_div(rows, kFp8Block), cb = ceil_div(cols, kFp8Block);
  transpose_scales_kernel<<<grid_1d(experts * rb * cb), kThreads, 0, stream>>>(sinv, experts, rb, cb, sinv_t);
  MXMOE_CUDA_CHECK_LAUNCH();
}

void quantize_experts_fp8_block(const detail::QuantizeExpertsStep& s, void* stream_ptr) {
  const cudaStream_t stream = as_stream(stream_ptr);
  if (s.experts == 0 || s.rows == 0 || s.cols == 0) return;
  const int64_t blocks = s.experts * fp8_weight_scale_count(s.rows, s.cols);
  if (blocks > 0x7fffffff) throw Error("src", "too many 128x128 blocks for one grid: " + std::to_string(blocks));
  weights_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      expert_ptrs(s.src, s.rows * s.cols, sizeof(uint16_t)), s.rows, s.cols, s.pow2_scales, s.data.ptr<uint8_t>(),
      s.scales.ptr<float>());
  MXMOE_CUDA_CHECK_LAUNCH();
  if (s.dequantized.data != nullptr) {  // the bf16 copy the sm90 GEMMs read (prepare_weights)
    weights_to_bf16_kernel<<<grid_1d(s.experts * s.rows * s.cols), kThreads, 0, stream>>>(
        s.data.ptr<uint8_t>(), s.scales.ptr<float>(), s.experts, s.rows, s.cols, s.dequantized.ptr<uint16_t>());
    MXMOE_CUDA_CHECK_LAUNCH();
  }
}

void gemm_m_fp8_block(const detail::MGemmStep& s, void* stream_ptr, void (*bf16_gemm)(const detail::MGemmStep&, void*)) {
  const cudaStream_t stream = as_stream(stream_ptr);
  const MGroupedGemmArgs& g = s.gemm;
  if (!g.b.is_fp8_block() || g.b.data.per_expert())
    throw Error("b", "an fp8_block A needs dense fp8_block weights (128x128 blocks)");
  const int64_t T = g.a.mx.data.shape[0], K = g.a.mx.data.shape[1];
  const TensorView& bd = g.b.data.dense;
  const int64_t E = bd.shape[0], br = bd.shape[1], bc = bd.shape[2];
  // prepare_weights' bf16 copy of the dequantized weights, where it made one.
  const TensorView& copy = g.b.dequantized.dense;
  const bool have_copy = copy.data != nullptr && !g.b.dequantized.per_expert();
  if (have_copy && (copy.dtype != DType::bf16 || copy.rank != 3 || copy.shape != bd.shape))
    throw Error("b.dequantized", "must be a dense bf16 tensor of B's shape [E, rows, cols]");
  Workspace ws(Workspace::aligned(T * K * 2) + (have_copy ? 0 : Workspace::aligned(E * br * bc * 2)) +
                   staged_output_bytes(s),
               stream);
  uint16_t* a16 = ws.take<uint16_t>(T * K);
  uint16_t* b16 = have_copy ? static_cast<uint16_t*>(copy.data) : ws.take<uint16_t>(E * br * bc);
  if (T * K > 0) {
    rows_to_bf16_kernel<<<grid_1d(T * K), kThreads, 0, stream>>>(g.a.mx.data.ptr<uint8_t>(), g.a.mx.scales.ptr<float>(),
                                                                  T, K, a16);
    MXMOE_CUDA_CHECK_LAUNCH();
  }
  if (E * br * bc > 0 && !have_copy) {
    weights_to_bf16_kernel<<<grid_1d(E * br * bc), kThreads, 0, stream>>>(bd.ptr<uint8_t>(), g.b.scales.dense.ptr<float>(),
                                                                          E, br, bc, b16);
    MXMOE_CUDA_CHECK_LAUNCH();
  }
  detail::MGemmStep b = s;
  b.gemm.a = Operand{TensorView::of(a16, DType::bf16, {T, K}, g.a.mx.data.device), {}};
  b.gemm.b = ExpertOperand{};
  b.gemm.b.data.dense = TensorView::of(b16, DType::bf16, {E, br, bc}, bd.device);
  b.gemm.b.data.dtype = DType::bf16;
  b = with_bf16_output(b, ws);
  bf16_gemm(b, stream_ptr);
  if (has_quantized_outputs(s)) quantize_outputs(s, b.out_bf16, stream_ptr);
}

void gemm_k_fp8_block(const KGroupedGemmArgs& a, void* stream_ptr, void (*bf16_gemm)(const KGroupedGemmArgs&, void*)) {
  const cudaStream_t stream = as_stream(stream_ptr);
  if (!a.b.is_fp8_block()) throw Error("b", "a and b must both be fp8_block");
  const int64_t T = a.a.mx.data.shape[0], M = a.a.mx.data.shape[1], N = a.b.mx.data.shape[1];
  Workspace ws(Workspace::aligned(T * M * 2) + Workspace::aligned(T * N * 2) + 2 * token_schedule_bytes(a.offsets, T),
               stream);
  uint16_t* a16 = ws.take<uint16_t>(T * M);
  uint16_t* b16 = ws.take<uint16_t>(T * N);
  token_blocks_to_bf16(a.a.mx, a.offsets, a16, ws, stream);
  token_blocks_to_bf16(a.b.mx, a.offsets, b16, ws, stream);
  KGroupedGemmArgs b = a;
  b.a = Operand{TensorView::of(a16, DType::bf16, {T, M}, a.a.mx.data.device), {}};
  b.b = Operand{TensorView::of(b16, DType::bf16, {T, N}, a.b.mx.data.device), {}};
  bf16_gemm(b, stream_ptr);
}

}  // namespace mxmoe::cuda
