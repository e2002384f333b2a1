// FP8-blockwise quantizers of the recipe fp8_blockwise (cuda_ops.h; docs/numerics.md "FP8
// blockwise"), bit-exact with src/cpu/fp8_block.cpp (the scale rule, encoding and scale placement of
// src/common/fp8_block.h; layouts in fp8_block_common.cuh):
//   quantize_fp8_block          activations [T, K] -> row-wise 1x128 blocks and/or token blocks:
//                               one CTA per (128-row tile, 128-column block) reading X once with
//                               16-byte loads and writing both outputs (their blocks share the
//                               tile's 128 columns / rows) with 16-byte stores;
//   quantize_experts_fp8_block  weights -> 128x128 blocks, one CTA per block (and the bf16 copy
//                               the GEMM routes read, where asked).
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*Fp8Block*'
#include <algorithm>
#include <string>

#include "mxmoe/numerics.h"
#include "src/common/experts.h"
#include "src/common/fp8_block.h"
#include "src/cuda/common/check.h"
#include "src/cuda/common/convert.cuh"
#include "src/cuda/common/group_schedule.h"
#include "src/cuda/cuda_ops.h"
#include "src/cuda/quant/fp8_block_common.cuh"

namespace mxmoe::cuda {
using namespace fp8_block_detail;
namespace {

constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int s = 16; s >= 1; s /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, s));
  return v;
}

// fp8_block_encode of four bf16 values (packed in w0, w1, value i in bits 16 i of the pair) with
// their multipliers -> 4 e4m3 bytes, byte i = value i. From sm_89 cvt.rn.satfinite.e4m3x2.f32
// (RNE, |x| > 448 and +-Inf saturate, what e4m3_from_f32 computes) on the product; a NaN input
// bypasses the multiply in fp8_block_encode and keeps its sign there (sign | 0x7F), while the
// device product is the canonical NaN: such bytes (the only ones with low bits 0x7F, satfinite
// never gives it for a number) take the sign of their bf16 input back. An Inf input, which
// satfinite makes +-448, becomes sign | 0x7F too, as fp8_block_encode writes it.
__device__ __forceinline__ uint32_t encode4(uint32_t w0, uint32_t w1, float s0, float s1, float s2, float s3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(bf16_hi(w0) * s1), "f"(bf16_lo(w0) * s0));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(bf16_hi(w1) * s3), "f"(bf16_lo(w1) * s2));
  uint32_t q = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  // Bytes of an Inf input (bf16 exponent all ones, mantissa 0): NaN's low bits, the sign set below.
  auto inf = [](uint32_t bits, uint32_t byte) { return (bits & 0x7fffu) == 0x7f80u ? byte : 0u; };
  const uint32_t inf_bytes = inf(w0, 0xffu) | inf(w0 >> 16, 0xff00u) | inf(w1, 0xff0000u) | inf(w1 >> 16, 0xff000000u);
  q |= inf_bytes & 0x7f7f7f7fu;
  const uint32_t nan_bytes = ((q & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
  if (nan_bytes != 0) {
    // bf16 sign bits 15 and 31 of w0, w1 -> bits 7, 15, 23, 31 of the four bytes.
    const uint32_t signs = ((w0 >> 8) & 0x80u) | ((w0 >> 16) & 0x8000u) | ((w1 << 8) & 0x800000u) | (w1 & 0x80000000u);
    q = (q & ~nan_bytes) | (signs & nan_bytes);
  }
  return q;
#else
  return static_cast<uint32_t>(fp8_block_encode(bf16_lo(w0), s0)) |
         (static_cast<uint32_t>(fp8_block_encode(bf16_hi(w0), s1)) << 8) |
         (static_cast<uint32_t>(fp8_block_encode(bf16_lo(w1), s2)) << 16) |
         (static_cast<uint32_t>(fp8_block_encode(bf16_hi(w1), s3)) << 24);
#endif
}

// ---- quantize: one CTA per (128-row tile, 128-column block) ----
// A tile of up to 128 rows x 128 columns of X is read once, straight into registers: thread t holds
// VW consecutive columns (chunk t % (128 / VW)) of rows t / (128 / VW) + i 256 VW / 128, i.e. the
// 128 / VW threads of a row are adjacent lanes and a warp reads whole 256-byte row pieces. Both
// outputs have X's [T, K] layout, so nothing is transposed:
//   row-wise     the 1x128 block of a row is exactly the tile's 128 columns (blocks start at
//                multiples of 128 of K): amax over the row's lanes by shuffles;
//   token blocks the column amax over the tile's rows: the thread's rows, then the lanes of the
//                same chunk (shuffles), then the 8 warps (shared memory).
// VW = 16 (two 16-byte loads, 16-byte stores), 8 (16 / 8) or 4 (8 / 4) where K and the pointers
// allow; Vec = false: the VW = 4 layout with element accesses guarded by K. Padding values (rows
// past n, columns past K) are 0, which leaves an amax unchanged; they are not stored.
template <int VW>
struct QLayout {
  static constexpr int kTpr = kFp8Block / VW;        // threads per row
  static constexpr int kSlices = kThreads / kTpr;    // rows read at once
  static constexpr int kRows = kFp8Block / kSlices;  // rows per thread
};

template <int VW, bool Vec>
__device__ __forceinline__ void load_bf16(const uint16_t* p, int64_t valid, uint32_t (&w)[VW / 2]) {
#pragma unroll
  for (int i = 0; i < VW / 2; ++i) w[i] = 0u;
  if constexpr (Vec) {  // valid: VW or <= 0 (K % VW == 0)
    if (valid <= 0) return;
    if constexpr (VW == 4) {
      const uint2 v = *reinterpret_cast<const uint2*>(p);
      w[0] = v.x, w[1] = v.y;
    } else {
#pragma unroll
      for (int i = 0; i < VW / 8; ++i) {
        const uint4 v = reinterpret_cast<const uint4*>(p)[i];
        w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < VW; ++i)
      if (i < valid) w[i / 2] |= static_cast<uint32_t>(p[i]) << (16 * (i % 2));
  }
}

template <int VW, bool Vec>
__device__ __forceinline__ void store_u8(uint8_t* p, int64_t valid, const uint32_t (&q)[VW / 4]) {
  if constexpr (Vec) {
    if (valid <= 0) return;
    if constexpr (VW == 16) {
      *reinterpret_cast<uint4*>(p) = make_uint4(q[0], q[1], q[2], q[3]);
    } else if constexpr (VW == 8) {
      *reinterpret_cast<uint2*>(p) = make_uint2(q[0], q[1]);
    } else {
      *reinterpret_cast<uint32_t*>(p) = q[0];
    }
  } else {
#pragma unroll
    for (int i = 0; i < VW; ++i)
      if (i < valid) p[i] = static_cast<uint8_t>(q[i / 4] >> (8 * (i % 4)));
  }
}

// The tile [row0, row0 + n) x [128 kb, 128 kb + 128) of X: row-wise blocks into qr / sr (when qr is
// set), token blocks into qc / sc (when qc is set; sc: the tile's scale row). qc is uniform over the
// CTA (it holds the barriers).
template <int VW, bool Vec>
__device__ __forceinline__ void quantize_tile(const uint16_t* __restrict__ x, int64_t rows, int64_t k, int64_t row0,
                                              int64_t n, int64_t kb, bool pow2, uint8_t* __restrict__ qr,
                                              float* __restrict__ sr, uint8_t* __restrict__ qc, float* __restrict__ sc,
                                              float (*col_amax)[kFp8Block], float* col_scale) {
  using L = QLayout<VW>;
  const int chunk = threadIdx.x % L::kTpr, slice = threadIdx.x / L::kTpr;
  const int64_t c = kb * kFp8Block + chunk * VW;  // the thread's first column
  const int64_t valid = min(static_cast<int64_t>(VW), k - c);
  uint32_t w[L::kRows][VW / 2];
#pragma unroll
  for (int j = 0; j < L::kRows; ++j) {
    const int r = slice + j * L::kSlices;
    load_bf16<VW, Vec>(x + (row0 + r) * k + c, r < n ? valid : 0, w[j]);
  }
  if (qr != nullptr) {
#pragma unroll
    for (int j = 0; j < L::kRows; ++j) {
      // amax_update == fmaxf(amax, |x|): fmaxf returns the non-NaN operand, so NaN is skipped.
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < VW / 2; ++i) amax = fmaxf(amax, fmaxf(fabsf(bf16_lo(w[j][i])), fabsf(bf16_hi(w[j][i]))));
#pragma unroll
      for (int s = L::kTpr / 2; s >= 1; s /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, s));
      const float s = fp8_block_scale(amax, pow2);
      const int r = slice + j * L::kSlices;
      if (r < n) {
        uint32_t q[VW / 4];
#pragma unroll
        for (int i = 0; i < VW / 4; ++i) q[i] = encode4(w[j][2 * i], w[j][2 * i + 1], s, s, s, s);
        store_u8<VW, Vec>(qr + (row0 + r) * k + c, valid, q);
        if (chunk == 0) sr[fp8_rowwise_scale_index(row0 + r, kb, rows)] = fp8_block_scale_inv(s);
      }
    }
  }
  if (qc == nullptr) return;
  float cm[VW];
#pragma unroll
  for (int i = 0; i < VW / 2; ++i) {
    cm[2 * i] = fabsf(bf16_lo(w[0][i]));
    cm[2 * i + 1] = fabsf(bf16_hi(w[0][i]));
#pragma unroll
    for (int j = 1; j < L::kRows; ++j) {
      cm[2 * i] = fmaxf(cm[2 * i], fabsf(bf16_lo(w[j][i])));
      cm[2 * i + 1] = fmaxf(cm[2 * i + 1], fabsf(bf16_hi(w[j][i])));
    }
  }
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int v = 0; v < VW; ++v) {
#pragma unroll
    for (int s = L::kTpr; s < 32; s *= 2) cm[v] = fmaxf(cm[v], __shfl_xor_sync(0xffffffffu, cm[v], s));
    if (lane < L::kTpr) col_amax[threadIdx.x / 32][chunk * VW + v] = cm[v];
  }
  __syncthreads();
  if (threadIdx.x < kFp8Block) {
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) m = fmaxf(m, col_amax[i][threadIdx.x]);
    const float s = fp8_block_scale(m, pow2);
    col_scale[threadIdx.x] = s;
    if (kb * kFp8Block + threadIdx.x < k) sc[kb * kFp8Block + threadIdx.x] = fp8_block_scale_inv(s);
  }
  __syncthreads();
  float s[VW];
#pragma unroll
  for (int v = 0; v < VW; ++v) s[v] = col_scale[chunk * VW + v];
#pragma unroll
  for (int j = 0; j < L::kRows; ++j) {
    const int r = slice + j * L::kSlices;
    if (r >= n) continue;
    uint32_t q[VW / 4];
#pragma unroll
    for (int i = 0; i < VW / 4; ++i)
      q[i] = encode4(w[j][2 * i], w[j][2 * i + 1], s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]);
    store_u8<VW, Vec>(qc + (row0 + r) * k + c, valid, q);
  }
}

// CTA b < main_ctas: tile b / kbs (of `sched`: the group schedule's token tiles, or 128-row chunks
// without one), column block b % kbs; qr / qc null: that output is not written. CTAs past main_ctas
// (both outputs over a group schedule only): the row-wise blocks of the rows no token tile holds,
// [0, begin of group 0) and [end of the last group, rows) (the groups are contiguous between them,
// group_schedule.h), in 128-row chunks x column blocks strided over those CTAs.
template <int VW, bool Vec>
__global__ void __launch_bounds__(kThreads, VW == 16 ? 3 : 1)
    quantize_kernel(const uint16_t* __restrict__ x, int64_t rows, int64_t k, GroupSchedule sched, unsigned main_ctas,
                    bool pow2, uint8_t* __restrict__ qr, float* __restrict__ sr, uint8_t* __restrict__ qc,
                    float* __restrict__ sc) {
  __shared__ float col_amax[kWarps][kFp8Block];
  __shared__ float col_scale[kFp8Block];
  const unsigned kbs = static_cast<unsigned>(ceil_div(k, kFp8Block));
  if (blockIdx.x < main_ctas) {
    const unsigned tile = blockIdx.x / kbs, kb = blockIdx.x % kbs;
    const TokenTile t = token_tile(sched, tile, rows);
    if (t.n <= 0) return;
    quantize_tile<VW, Vec>(x, rows, k, t.row0, t.n, kb, pow2, qr, sr, qc,
                           qc == nullptr ? nullptr : sc + static_cast<int64_t>(tile) * k, col_amax, col_scale);
    return;
  }
  const int64_t lo = sched.groups[0].begin, hi = sched.groups[sched.experts - 1].end;
  const int64_t lo_chunks = ceil_div(lo, kFp8Block), units = (lo_chunks + ceil_div(rows - hi, kFp8Block)) * kbs;
  for (int64_t u = blockIdx.x - main_ctas; u < units; u += gridDim.x - main_ctas) {
    const int64_t ch = u / kbs, kb = u % kbs;
    const int64_t row0 = ch < lo_chunks ? ch * kFp8Block : hi + (ch - lo_chunks) * kFp8Block;
    const int64_t n = min(static_cast<int64_t>(kFp8Block), (ch < lo_chunks ? lo : rows) - row0);
    quantize_tile<VW, Vec>(x, rows, k, row0, n, kb, pow2, qr, sr, nullptr, nullptr, col_amax, col_scale);
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
    for (int64_t r = r0; r < r1; r += kThreads / kFp8Block)
      qe[r * cols + c] = fp8_block_encode(f32_from_bf16(w[r * cols + c]), s);
  if (threadIdx.x == 0) sinv[b] = fp8_block_scale_inv(s);
}

void zero(const TensorView& t, cudaStream_t stream) {
  if (t.data != nullptr && t.bytes() > 0)
    MXMOE_CUDA_CHECK(cudaMemsetAsync(t.data, 0, static_cast<size_t>(t.bytes()), stream));
}

// CTAs past the tiles that take the row-wise blocks of rows outside every group (a grid-stride loop:
// none, or a few chunks, in the usual case).
constexpr int64_t kExtraCtas = 1024;

}  // namespace

// Both outputs: one pass over X (quantize_kernel over the token tiles of the group schedule, each
// tile's row-wise blocks from the same registers, plus the extra CTAs for rows outside the
// groups). Only row-wise: the same kernel over 128-row chunks. Only token blocks: over the token
// tiles.
void quantize_fp8_block(const QuantizeArgs& a, void* stream_ptr) {
  const cudaStream_t stream = as_stream(stream_ptr);
  const int64_t m = a.src.size(0), k = a.src.size(1);
  const bool row = a.rowwise.data.data != nullptr, col = a.colwise.data.data != nullptr;
  if (row) zero(a.rowwise.scales, stream);  // padding rows, and block rows no group reaches, are 0
  if (col) zero(a.colwise.scales, stream);
  if (m == 0 || k == 0 || (!row && !col)) return;
  const auto* src = a.src.ptr<uint16_t>();
  uint8_t* qr = row ? a.rowwise.data.ptr<uint8_t>() : nullptr;
  float* sr = row ? a.rowwise.scales.ptr<float>() : nullptr;
  uint8_t* qc = col ? a.colwise.data.ptr<uint8_t>() : nullptr;
  float* sc = col ? a.colwise.scales.ptr<float>() : nullptr;
  Workspace ws(col ? token_schedule_bytes(a.groups, m) : 0, stream);
  const GroupSchedule sched = col ? token_schedule(a.groups, m, ws, stream) : GroupSchedule{};
  const int64_t kbs = ceil_div(k, kFp8Block);
  const int64_t main_ctas = (col ? token_tiles(a.groups, m) : ceil_div(m, kFp8Block)) * kbs;
  const int64_t extra = row && col && sched.tiles != nullptr ? std::min(ceil_div(m, kFp8Block) * kbs, kExtraCtas) : 0;
  if (main_ctas + extra > 0x7fffffff)
    throw Error("src", "too many 128x128 tiles for one grid: " + std::to_string(main_ctas + extra));
  const int vw = k % 16 == 0 && aligned(src, 16) && aligned(qr, 16) && aligned(qc, 16) ? 16
                 : k % 8 == 0 && aligned(src, 16) && aligned(qr, 8) && aligned(qc, 8)  ? 8
                 : k % 4 == 0 && aligned(src, 8) && aligned(qr, 4) && aligned(qc, 4)   ? 4
                                                                                       : 0;  // element accesses
  auto launch = [&](auto kernel) {
    kernel<<<static_cast<unsigned>(main_ctas + extra), kThreads, 0, stream>>>(
        src, m, k, sched, static_cast<unsigned>(main_ctas), a.pow2_scales, qr, sr, qc, sc);
  };
  switch (vw) {
    case 16:
      launch(quantize_kernel<16, true>);
      break;
    case 8:
      launch(quantize_kernel<8, true>);
      break;
    case 4:
      launch(quantize_kernel<4, true>);
      break;
    default:
      launch(quantize_kernel<4, false>);
      break;
  }
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
  if (s.dequantized.data != nullptr)  // the bf16 copy the sm90 GEMMs read (prepare_weights)
    weights_to_bf16(s.data.ptr<uint8_t>(), s.scales.ptr<float>(), s.experts, s.rows, s.cols,
                    s.dequantized.ptr<uint16_t>(), stream);
}

}  // namespace mxmoe::cuda
