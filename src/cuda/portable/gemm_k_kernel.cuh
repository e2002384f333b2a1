// k-grouped ("wgrad") GEMM kernel of the portable backend:
//   D_e[m, n] = (beta ? D_e[m, n] : 0) + sum_{t in group e} A[t, m] * B[t, n]
//   A: [T, M], B: [T, N], bf16 or MXFP8 column-wise (32-token blocks restarting at each group's
//   first row; scale of (t, m) at colwise_scale_index(s_e, m_e, (t - o_e) / 32, m, M, layout)).
//   Both operands are MN-major tiles (32 tokens, 128) loaded with cp.async; the K tile is exactly
//   one MXFP8 block. D_e: f32 (beta 0/1) or bf16, dense [E, M, N] or per-expert pointers.
// Grid: (m-tile x n-tile, expert); each CTA loops over its expert's tokens. Empty experts write
// zeros (beta 0) or leave D_e untouched (beta 1).
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuGemmK*' (correctness, per backend);
//      mxmoe bench (its fc1_wgrad / fc2_wgrad rows).
#pragma once
#include "src/cuda/common/check.h"
#include "src/cuda/portable/mainloop.cuh"

namespace mxmoe::cuda::portable {

template <bool Fp8>
struct KGemmConfig {
  static constexpr bool kFp8 = Fp8;
  static constexpr int kStages = kFp8 ? 5 : 4;  // e4m3 tiles wait one stage less (decode ahead)
  using Mainloop = portable::Mainloop<kFp8, Major::mn, Major::mn, kStages>;
  static constexpr int kSmemBytes = Mainloop::kSmemBytes;
};

template <class Cfg>
__global__ void __launch_bounds__(kThreads, 2) gemm_k_kernel(const KGemmParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int kElem = Cfg::kFp8 ? 1 : 2;
  const int expert = blockIdx.y;
  const int m_tile = blockIdx.x / p.n_tiles, n_tile = blockIdx.x % p.n_tiles;
  const GroupInfo g = p.groups[expert];
  const int rows = g.end - g.begin;
  if (rows == 0 && p.accumulate && p.d_f32) return;  // beta = 1: D_e untouched
  const int64_t m0 = static_cast<int64_t>(m_tile) * kTileMN, n0 = static_cast<int64_t>(n_tile) * kTileMN;
  auto a_col = [&](int i) -> int64_t { return m0 + i < p.m ? m0 + i : -1; };
  auto b_col = [&](int i) -> int64_t { return n0 + i < p.n ? n0 + i : -1; };

  typename Cfg::Mainloop::LoadA la;
  la.init(p.a + g.begin * p.m * kElem, p.m * kElem, rows, a_col);
  typename Cfg::Mainloop::LoadB lb;
  lb.init(p.b + g.begin * p.n * kElem, p.n * kElem, rows, b_col);

  ScaleAddr scale;
  int64_t scale_mn = -1;
  if constexpr (Cfg::kFp8) {
    const int local = threadIdx.x % kTileMN;
    const bool is_a = threadIdx.x < kTileMN;
    scale = ScaleAddr{is_a ? p.a_scales : p.b_scales, is_a ? p.m : p.n, g.col_chunk, rows, BlockAxis::col,
                      is_a ? p.a_layout : p.b_layout};
    scale_mn = is_a ? a_col(local) : b_col(local);
  }

  Accum acc;
  Cfg::Mainloop::run(acc, smem, la, lb, (rows + kTileK - 1) / kTileK, scale, scale_mn);

  const FragCoord f;
  char* d = static_cast<char*>(const_cast<void*>(p.d.get(expert)));
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t i = m0 + f.row(mi, 2 * h);
      if (i >= p.m) continue;
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        const int64_t j = n0 + f.col(ni, 0);
        if (j >= p.n) continue;
        float v0 = acc[mi][ni][2 * h], v1 = acc[mi][ni][2 * h + 1];
        if (p.d_f32) {
          float2* dst = reinterpret_cast<float2*>(d) + (i * p.n + j) / 2;
          if (p.accumulate) {
            const float2 old = *dst;
            v0 += old.x, v1 += old.y;
          }
          *dst = make_float2(v0, v1);
        } else {
          reinterpret_cast<uint32_t*>(d)[(i * p.n + j) / 2] = pack_bf16x2(v0, v1);
        }
      }
    }
}

template <bool Fp8>
void launch_gemm_k(const KGemmParams& p, int64_t experts, cudaStream_t stream) {
  using Cfg = KGemmConfig<Fp8>;
  const int64_t tiles = static_cast<int64_t>(p.m_tiles) * p.n_tiles;
  if (tiles == 0 || experts == 0) return;
  MXMOE_CUDA_CHECK(cudaFuncSetAttribute(gemm_k_kernel<Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        Cfg::kSmemBytes));
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(experts));
  gemm_k_kernel<Cfg><<<grid, kThreads, Cfg::kSmemBytes, stream>>>(p);
  MXMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace mxmoe::cuda::portable
