// The GEMM steps on FP8-blockwise operands (cuda_ops.h; docs/numerics.md "FP8 blockwise") through
// a backend's BF16 GEMMs. With power-of-two scales, e4m3 x s_inv is exact in bf16, so the GEMM of
// the bf16 dequantized operands is the recipe's GEMM rule up to accumulation order (numerics
// "GEMMs"): the operands are dequantized into a stream-ordered workspace, the backend's BF16 kernel
// runs with the same epilogue, and an FP8-blockwise activation output is quantized from the bf16
// it wrote ("Quantized value"). Non-power-of-two scales are refused by the probes (they need FP8
// MMAs with promotion every 128). No host synchronisation: the steps capture in a CUDA graph.
// The dequantizers: one CTA per (128-row tile, 128-column block) with wide accesses for the
// activations (row-wise or token blocks), one thread per element for the weights.
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*Fp8Block*:*GpuLayer*'
#include <string>

#include "mxmoe/numerics.h"
#include "src/common/experts.h"
#include "src/common/fp8_block.h"
#include "src/cuda/common/check.h"
#include "src/cuda/common/group_schedule.h"
#include "src/cuda/common/workspace.h"
#include "src/cuda/cuda_ops.h"
#include "src/cuda/quant/fp8_block_common.cuh"

namespace mxmoe::cuda {
using namespace fp8_block_detail;
namespace {

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

// ---- dequantize to bf16: one CTA per (128-row tile, 128-column block) ----
// Thread t: W columns (chunk t % (128 / W)) of rows t / (128 / W) + i 256 W / 128. Token: the
// token blocks' scales, one per column of the tile's scale row (loaded once); otherwise the
// row-wise scales, one per row of the block. W = 16 (16-byte loads, 32-byte stores), 4 or 1 where
// K and the pointers allow. No per-element index arithmetic beyond the row offset.
template <int W, bool Token>
__global__ void __launch_bounds__(kThreads)
    to_bf16_kernel(const uint8_t* __restrict__ q, const float* __restrict__ sinv, int64_t rows, int64_t k,
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

__global__ void __launch_bounds__(kThreads)
    weights_to_bf16_kernel(const uint8_t* __restrict__ q, const float* __restrict__ sinv, int64_t experts, int64_t rows,
                           int64_t cols, uint16_t* __restrict__ out) {
  const int64_t per = rows * cols, n = experts * per;
  const int64_t nbs = ceil_div(rows, kFp8Block), kbs = ceil_div(cols, kFp8Block);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t e = i / per, r = (i % per) / cols, c = i % cols;
    out[i] = bf16_from_f32(fp8_block_decode(q[i], sinv[(e * nbs + r / kFp8Block) * kbs + c / kFp8Block]));
  }
}

// [rows, k] e4m3 -> bf16 over `tiles` 128-row tiles of `sched` (none: 128-row chunks); token: the
// token blocks' scales (scale row = tile), else the row-wise ones.
void to_bf16(const uint8_t* q, const float* sinv, int64_t rows, int64_t k, const GroupSchedule& sched, int64_t tiles,
             bool token, uint16_t* out, cudaStream_t stream) {
  const int64_t kbs = ceil_div(k, kFp8Block);
  if (kbs > 65535)
    throw Error("k", "more than 65535 128-column blocks for one dequantize grid: k = " + std::to_string(k));
  if (tiles > 0x7fffffff) throw Error("rows", "too many 128-row tiles for one grid: " + std::to_string(tiles));
  const bool s16 = !token || aligned(sinv, 16);
  const int w = k % 16 == 0 && aligned(q, 16) && aligned(out, 16) && s16 ? 16
                : k % 4 == 0 && aligned(q, 4) && aligned(out, 8) && s16  ? 4
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

void token_blocks_to_bf16(const Mxfp8View& v, const GroupOffsets& g, uint16_t* out, Workspace& ws,
                          cudaStream_t stream) {
  const int64_t rows = v.data.shape[0], k = v.data.shape[1];
  if (rows == 0 || k == 0) return;
  const GroupSchedule sched = token_schedule(g, rows, ws, stream);
  to_bf16(v.data.ptr<uint8_t>(), v.scales.ptr<float>(), rows, k, sched, token_tiles(g, rows), true, out, stream);
}

}  // namespace

void fp8_block_detail::weights_to_bf16(const uint8_t* q, const float* sinv, int64_t experts, int64_t rows, int64_t cols,
                                       uint16_t* out, cudaStream_t stream) {
  weights_to_bf16_kernel<<<grid_1d(experts * rows * cols), kThreads, 0, stream>>>(q, sinv, experts, rows, cols, out);
  MXMOE_CUDA_CHECK_LAUNCH();
}

void gemm_m_fp8_block(const detail::MGemmStep& s, void* stream_ptr,
                      void (*bf16_gemm)(const detail::MGemmStep&, void*)) {
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
  Workspace ws(
      Workspace::aligned(T * K * 2) + (have_copy ? 0 : Workspace::aligned(E * br * bc * 2)) + staged_output_bytes(s),
      stream);
  uint16_t* a16 = ws.take<uint16_t>(T * K);
  uint16_t* b16 = have_copy ? static_cast<uint16_t*>(copy.data) : ws.take<uint16_t>(E * br * bc);
  if (T * K > 0)
    to_bf16(g.a.mx.data.ptr<uint8_t>(), g.a.mx.scales.ptr<float>(), T, K, GroupSchedule{}, ceil_div(T, kFp8Block),
            false, a16, stream);
  if (E * br * bc > 0 && !have_copy)
    weights_to_bf16(bd.ptr<uint8_t>(), g.b.scales.dense.ptr<float>(), E, br, bc, b16, stream);
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
