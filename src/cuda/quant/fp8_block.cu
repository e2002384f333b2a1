// FP8 blockwise on the GPU (docs/numerics.md "FP8 blockwise"): the quantizers of the recipe
// fp8_blockwise (bit-exact with src/cpu/fp8_block.cpp: the scale rule, encoding and scale placement
// of src/common/fp8_block.h), their dequantizers to bf16, and the GEMM steps on FP8-blockwise
// operands through the BF16 GEMMs of a backend.
//
//   rows          1x128 blocks along K, f32 inverse scales MN-major [ceil(K/128)][roundup(T, 4)];
//   token blocks  128x1 blocks along the rows restarting at every group (the group schedule with
//                 128-row m-tiles: m-tile i is scale row i);
//   weights       128x128 blocks of each expert's [rows, cols], one CTA per block.
// Activations: one CTA per (128-row tile, 128-column block) reading X once with 16-byte loads and
// writing both outputs (their blocks share the tile's 128 columns / rows) with 16-byte stores; the
// byte transposes and the dequantizers use the same 128 x 128 tiles and wide accesses.
//
// The GEMMs: with power-of-two scales, e4m3 x s_inv is exact in bf16, so the GEMM of the bf16
// dequantized operands is the recipe's GEMM rule up to accumulation order (numerics "GEMMs"); the
// operands are dequantized into a stream-ordered workspace, the backend's BF16 kernel runs with the
// same epilogue, and an FP8-blockwise activation output is quantized from the bf16 it wrote
// ("Quantized value"). Non-power-of-two scales are refused by the probes (they need FP8 MMAs with
// promotion every 128, not yet written). No host synchronisation: the steps capture in a CUDA graph.
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuFp8Block*:*GpuLayer*'
#include <algorithm>
#include <string>
#include <type_traits>

#include "mxmoe/numerics.h"
#include "src/common/experts.h"
#include "src/common/fp8_block.h"
#include "src/cuda/common/check.h"
#include "src/cuda/common/group_schedule.h"
#include "src/cuda/cuda_ops.h"

namespace mxmoe::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int s = 16; s >= 1; s /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, s));
  return v;
}

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

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

// fp8_block_decode of two e4m3 bytes (low byte first) with their inverse scales, rounded to bf16
// (bf16_from_f32) -> the packed pair. e4m3 -> f16 -> f32 is exact; a NaN byte bypasses the
// multiply as fp8_block_decode does (it keeps its sign).
__device__ __forceinline__ uint32_t decode2(uint32_t two, float s0, float s1) {
  float lo, hi;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(static_cast<uint16_t>(two)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(static_cast<uint16_t>(h & 0xffffu)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(static_cast<uint16_t>(h >> 16)));
  lo = (two & 0x7fu) == 0x7fu ? e4m3_to_f32(static_cast<uint8_t>(two)) : lo * s0;
  hi = (two & 0x7f00u) == 0x7f00u ? e4m3_to_f32(static_cast<uint8_t>(two >> 8)) : hi * s1;
#else
  lo = fp8_block_decode(static_cast<uint8_t>(two), s0);
  hi = fp8_block_decode(static_cast<uint8_t>(two >> 8), s1);
#endif
  return static_cast<uint32_t>(bf16_from_f32(lo)) | (static_cast<uint32_t>(bf16_from_f32(hi)) << 16);
}

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
  static constexpr int kTpr = kFp8Block / VW;       // threads per row
  static constexpr int kSlices = kThreads / kTpr;   // rows read at once
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
__global__ void __launch_bounds__(kThreads, VW == 16 ? 3 : 1) quantize_kernel(const uint16_t* __restrict__ x, int64_t rows, int64_t k,
                                                             GroupSchedule sched, unsigned main_ctas, bool pow2,
                                                             uint8_t* __restrict__ qr, float* __restrict__ sr,
                                                             uint8_t* __restrict__ qc, float* __restrict__ sc) {
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

// ---- dequantize to bf16: one CTA per (128-row tile, 128-column block) ----
// Thread t: W columns (chunk t % (128 / W)) of rows t / (128 / W) + i 256 W / 128. Token: the
// token blocks' scales, one per column of the tile's scale row (loaded once); otherwise the
// row-wise scales, one per row of the block. W = 16 (16-byte loads, 32-byte stores), 4 or 1 where
// K and the pointers allow. No per-element index arithmetic beyond the row offset.
template <int W, bool Token>
__global__ void __launch_bounds__(kThreads) to_bf16_kernel(const uint8_t* __restrict__ q,
                                                            const float* __restrict__ sinv, int64_t rows, int64_t k,
                                                            GroupSchedule sched, uint16_t* __restrict__ out) {
  constexpr int kTpr = kFp8Block / W, kSlices = kThreads / kTpr, kRows = kFp8Block / kSlices;
  const TokenTile t = token_tile(sched, blockIdx.x, rows);
  const int chunk = threadIdx.x % kTpr, slice = threadIdx.x / kTpr;
  const int64_t kb = blockIdx.y, c = kb * kFp8Block + chunk * W;
  if (t.n <= 0 || c >= k) return;
  float s[W];
  if constexpr (Token) {
    const float* sp = sinv + static_cast<int64_t>(blockIdx.x) * k + c;
    if constexpr (W >= 4) {
#pragma unroll
      for (int i = 0; i < W / 4; ++i) {
        const float4 v = reinterpret_cast<const float4*>(sp)[i];
        s[4 * i] = v.x, s[4 * i + 1] = v.y, s[4 * i + 2] = v.z, s[4 * i + 3] = v.w;
      }
    } else {
      s[0] = sp[0];
    }
  }
#pragma unroll(W == 1 ? 4 : kRows)
  for (int j = 0; j < kRows; ++j) {
    const int64_t r = slice + j * kSlices;
    if (r >= t.n) break;
    const int64_t i = (t.row0 + r) * k + c;
    if constexpr (!Token) {
      const float sr = sinv[fp8_rowwise_scale_index(t.row0 + r, kb, rows)];
#pragma unroll
      for (int v = 0; v < W; ++v) s[v] = sr;
    }
    if constexpr (W == 1) {
      out[i] = static_cast<uint16_t>(decode2(q[i], s[0], s[0]));
    } else if constexpr (W == 4) {
      const uint32_t b = *reinterpret_cast<const uint32_t*>(q + i);
      *reinterpret_cast<uint2*>(out + i) = make_uint2(decode2(b, s[0], s[1]), decode2(b >> 16, s[2], s[3]));
    } else {
      const uint4 b = *reinterpret_cast<const uint4*>(q + i);
      const uint32_t bw[4] = {b.x, b.y, b.z, b.w};
      uint32_t o[8];
#pragma unroll
      for (int h = 0; h < 4; ++h) {
        o[2 * h] = decode2(bw[h], s[4 * h], s[4 * h + 1]);
        o[2 * h + 1] = decode2(bw[h] >> 16, s[4 * h + 2], s[4 * h + 3]);
      }
      reinterpret_cast<uint4*>(out + i)[0] = make_uint4(o[0], o[1], o[2], o[3]);
      reinterpret_cast<uint4*>(out + i)[1] = make_uint4(o[4], o[5], o[6], o[7]);
    }
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

// ---- byte transposes: 128 x 128 tiles, 16-byte accesses ----
// The tile is read row by row (8 lanes x 16 bytes per 128-byte row piece) into shared memory as 128
// rows of 32 words, with the 16-byte group g of row r stored at group g ^ ((r / 16) % 8) (an XOR
// swizzle: the 16-byte stores stay whole and conflict-free). Thread t (lane l, warp w) then takes
// the 4 columns of word cw = l / 8 + 4 w in the 16 rows 16 (l % 8) .. + 15: those 16 words of one
// load instruction lie in 32 distinct banks (bank = cw ^ 4 (l % 8)); four 4x4 byte transposes
// (__byte_perm) give 16 bytes for each of the 4 columns, stored at [c][16 (l % 8)] of the output,
// so each store instruction writes 4 whole 128-byte output row pieces. LW / SW: the widths of the
// global loads / stores (16, 4 or 1 bytes), chosen where the row lengths and pointers allow;
// partial tiles guard whole LW / SW units (nr, nc and wr are multiples of them).
constexpr int kT = 128;  // tile rows and columns (bytes)

__device__ __forceinline__ int swz(int row) { return ((row >> 4) & 7) << 2; }  // word offset XOR

// The tile src[r * sp + c] (r < nr, c < nc; zeros elsewhere) -> dst[c * dp + r] for c < nc, r < wr.
template <int LW, int SW>
__device__ __forceinline__ void transpose_tile(const uint8_t* __restrict__ src, int64_t sp, int nr, int nc,
                                               uint8_t* __restrict__ dst, int64_t dp, int wr,
                                               uint32_t (*tile)[kT / 4]) {
#pragma unroll
  for (int j = 0; j < kT * kT / 16 / kThreads; ++j) {
    const int i = static_cast<int>(threadIdx.x) + j * kThreads, r = i / 8, g = i % 8;
    const uint8_t* p = src + r * sp + 16 * g;
    uint32_t v[4] = {0u, 0u, 0u, 0u};
    if (r < nr) {
      if constexpr (LW == 16) {
        if (16 * g < nc) {
          const uint4 u = *reinterpret_cast<const uint4*>(p);
          v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
        }
      } else if constexpr (LW == 4) {
#pragma unroll
        for (int h = 0; h < 4; ++h)
          if (16 * g + 4 * h < nc) v[h] = reinterpret_cast<const uint32_t*>(p)[h];
      } else {
#pragma unroll
        for (int b = 0; b < 16; ++b)
          if (16 * g + b < nc) v[b / 4] |= static_cast<uint32_t>(p[b]) << (8 * (b % 4));
      }
    }
    *reinterpret_cast<uint4*>(&tile[r][(4 * g) ^ swz(r)]) = make_uint4(v[0], v[1], v[2], v[3]);
  }
  __syncthreads();
  const int lane = threadIdx.x % 32, rb = lane % 8, cw = lane / 8 + 4 * (threadIdx.x / 32);
  uint32_t o[4][4];  // o[column j][row group h]: bytes of rows 16 rb + 4 h .. + 3 of column 4 cw + j
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    const int r = 16 * rb + 4 * h;
    const uint32_t a0 = tile[r][cw ^ swz(r)], a1 = tile[r + 1][cw ^ swz(r + 1)];
    const uint32_t a2 = tile[r + 2][cw ^ swz(r + 2)], a3 = tile[r + 3][cw ^ swz(r + 3)];
    const uint32_t t0 = __byte_perm(a0, a1, 0x5140), t1 = __byte_perm(a2, a3, 0x5140);  // bytes 0, 1
    const uint32_t t2 = __byte_perm(a0, a1, 0x7362), t3 = __byte_perm(a2, a3, 0x7362);  // bytes 2, 3
    o[0][h] = __byte_perm(t0, t1, 0x5410);
    o[1][h] = __byte_perm(t0, t1, 0x7632);
    o[2][h] = __byte_perm(t2, t3, 0x5410);
    o[3][h] = __byte_perm(t2, t3, 0x7632);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int c = 4 * cw + j;
    if (c >= nc) break;
    uint8_t* p = dst + c * dp + 16 * rb;
    if constexpr (SW == 16) {
      if (16 * rb < wr) *reinterpret_cast<uint4*>(p) = make_uint4(o[j][0], o[j][1], o[j][2], o[j][3]);
    } else if constexpr (SW == 4) {
#pragma unroll
      for (int h = 0; h < 4; ++h)
        if (16 * rb + 4 * h < wr) reinterpret_cast<uint32_t*>(p)[h] = o[j][h];
    } else {
#pragma unroll
      for (int b = 0; b < 16; ++b)
        if (16 * rb + b < wr) p[b] = static_cast<uint8_t>(o[j][b / 4] >> (8 * (b % 4)));
    }
  }
}

// E e4m3 matrices [rows, cols] -> [cols, rows]: one CTA per 128 x 128 tile (blockIdx.x: column
// tile, y: row tile, z: expert); the 128x128-block scales [E][rb][cb] -> [E][cb][rb] below.
template <int LW, int SW>
__global__ void __launch_bounds__(kThreads) transpose_u8_kernel(const uint8_t* __restrict__ q, int64_t rows,
                                                                 int64_t cols, uint8_t* __restrict__ qt) {
  __shared__ __align__(16) uint32_t tile[kT][kT / 4];
  const int64_t e = blockIdx.z, r0 = static_cast<int64_t>(blockIdx.y) * kT, c0 = static_cast<int64_t>(blockIdx.x) * kT;
  const int nr = static_cast<int>(min(static_cast<int64_t>(kT), rows - r0));
  const int nc = static_cast<int>(min(static_cast<int64_t>(kT), cols - c0));
  transpose_tile<LW, SW>(q + e * rows * cols + r0 * cols + c0, cols, nr, nc, qt + e * rows * cols + c0 * rows + r0, rows,
                         nr, tile);
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

// The widest access (16, 4 or 1 bytes) that rows of `len` bytes at `p` allow.
int byte_width(const void* p, int64_t len) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (len % 16 == 0 && a % 16 == 0) return 16;
  if (len % 4 == 0 && a % 4 == 0) return 4;
  return 1;
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

// Width selection: the widest access the row length and the pointers allow (null pointers allow any).
bool aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0; }

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

// [rows, k] e4m3 -> bf16 over `tiles` 128-row tiles of `sched` (none: 128-row chunks); token: the
// token blocks' scales (scale row = tile), else the row-wise ones.
void to_bf16(const uint8_t* q, const float* sinv, int64_t rows, int64_t k, const GroupSchedule& sched, int64_t tiles,
             bool token, uint16_t* out, cudaStream_t stream) {
  const int64_t kbs = ceil_div(k, kFp8Block);
  if (kbs > 65535) throw Error("k", "more than 65535 128-column blocks for one dequantize grid: k = " + std::to_string(k));
  if (tiles > 0x7fffffff) throw Error("rows", "too many 128-row tiles for one grid: " + std::to_string(tiles));
  const bool s16 = !token || aligned(sinv, 16);
  const int w = k % 16 == 0 && aligned(q, 16) && aligned(out, 16) && s16 ? 16
                : k % 4 == 0 && aligned(q, 4) && aligned(out, 8) && s16 ? 4
                                                                         : 1;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(kbs));
  with_width(w, [&](auto W) {
    if (token) {
      to_bf16_kernel<W(), true><<<grid, kThreads, 0, stream>>>(q, sinv, rows, k, sched, out);
    } else {
      to_bf16_kernel<W(), false><<<grid, kThreads, 0, stream>>>(q, sinv, rows, k, sched, out);
    }
  });
  MXMOE_CUDA_CHECK_LAUNCH();
}

void token_blocks_to_bf16(const Mxfp8View& v, const GroupOffsets& g, uint16_t* out, Workspace& ws, cudaStream_t stream) {
  const int64_t rows = v.data.shape[0], k = v.data.shape[1];
  if (rows == 0 || k == 0) return;
  const GroupSchedule sched = token_schedule(g, rows, ws, stream);
  to_bf16(v.data.ptr<uint8_t>(), v.scales.ptr<float>(), rows, k, sched, token_tiles(g, rows), true, out, stream);
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
                 : k % 8 == 0 && aligned(src, 16) && aligned(qr, 8) && aligned(qc, 8) ? 8
                 : k % 4 == 0 && aligned(src, 8) && aligned(qr, 4) && aligned(qc, 4)  ? 4
                                                                                       : 0;  // element accesses
  auto launch = [&](auto kernel) {
    kernel<<<static_cast<unsigned>(main_ctas + extra), kThreads, 0, stream>>>(
        src, m, k, sched, static_cast<unsigned>(main_ctas), a.pow2_scales, qr, sr, qc, sc);
  };
  switch (vw) {
    case 16: launch(quantize_kernel<16, true>); break;
    case 8: launch(quantize_kernel<8, true>); break;
    case 4: launch(quantize_kernel<4, true>); break;
    default: launch(quantize_kernel<4, false>); break;
  }
  MXMOE_CUDA_CHECK_LAUNCH();
}

namespace {
// Token blocks [T, K] -> [K, Tp]: 128-row token tile i (the group schedule's; scale row i) to
// columns [128 i, 128 i + 128), the rows past its group's end as 0 (whole 128-byte output pieces).
// One CTA per (tile, 128 columns) through transpose_tile; tiles past the real count are skipped
// (no k-block reads them).
template <int LW, int SW>
__global__ void __launch_bounds__(kThreads) transpose_token_blocks_kernel(const uint8_t* __restrict__ q, int64_t rows,
                                                                           int64_t k, GroupSchedule sched, int64_t tp,
                                                                           uint8_t* __restrict__ qt) {
  __shared__ __align__(16) uint32_t tile[kT][kT / 4];
  const TokenTile t = token_tile(sched, blockIdx.x, rows);
  if (t.n <= 0) return;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * kT;
  transpose_tile<LW, SW>(q + t.row0 * k + c0, k, static_cast<int>(t.n),
                         static_cast<int>(min(static_cast<int64_t>(kT), k - c0)),
                         qt + c0 * tp + static_cast<int64_t>(blockIdx.x) * kFp8Block, tp, kFp8Block, tile);
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
  if (ceil_div(k, kT) > 65535) throw Error("k", "more than 65535 128-column tiles for one transpose grid");
  const dim3 grid(static_cast<unsigned>(token_tiles(g, rows)), static_cast<unsigned>(ceil_div(k, kT)));
  const uint8_t* q = v.data.ptr<uint8_t>();
  with_width(byte_width(q, k), [&](auto LW) {
    with_width(byte_width(qt, tp), [&](auto SW) {
      transpose_token_blocks_kernel<LW(), SW()><<<grid, kThreads, 0, stream>>>(q, rows, k, sched, tp, qt);
    });
  });
  MXMOE_CUDA_CHECK_LAUNCH();
}

void transpose_fp8_block_weights(const uint8_t* q, const float* sinv, int64_t experts, int64_t rows, int64_t cols,
                                 uint8_t* qt, float* sinv_t, void* stream_ptr) {
  const cudaStream_t stream = as_stream(stream_ptr);
  if (experts == 0 || rows == 0 || cols == 0) return;
  if (experts > 65535) throw Error("experts", "more than 65535 experts for one transpose grid");
  if (ceil_div(rows, kT) > 65535) throw Error("rows", "more than 65535 128-row tiles for one transpose grid");
  if (ceil_div(cols, kT) > 0x7fffffff) throw Error("cols", "too many 128-column tiles for one transpose grid");
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, kT)), static_cast<unsigned>(ceil_div(rows, kT)),
                  static_cast<unsigned>(experts));
  // Every expert's rows start at a multiple of the width too (e rows cols with cols (rows) a multiple).
  with_width(byte_width(q, cols), [&](auto LW) {
    with_width(byte_width(qt, rows), [&](auto SW) {
      transpose_u8_kernel<LW(), SW()><<<grid, kThreads, 0, stream>>>(q, rows, cols, qt);
    });
  });
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
  if (T * K > 0)
    to_bf16(g.a.mx.data.ptr<uint8_t>(), g.a.mx.scales.ptr<float>(), T, K, GroupSchedule{}, ceil_div(T, kFp8Block), false,
            a16, stream);
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
