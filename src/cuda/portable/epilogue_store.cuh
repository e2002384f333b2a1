// Store epilogue of the m-grouped GEMM: D[t, n] = acc (+ bias_e[n], or p_t * bias_e[n]) -> bf16 or
// f32 [T, N], straight from the accumulator fragments (two adjacent columns per store).
#pragma once
#include "src/cuda/portable/mainloop.cuh"

namespace mxmoe::cuda::portable {

__device__ __forceinline__ void epilogue_store(const Accum& acc, const MGemmParams& p, int expert, int64_t row0,
                                               int64_t row_end, int64_t n0) {
  const FragCoord f;
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t t = row0 + f.row(mi, 2 * h);
      if (t >= row_end) continue;
      const float scale = p.bias_by_probs && p.probs != nullptr ? p.probs[t] : 1.0f;
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        const int64_t n = n0 + f.col(ni, 0);
        if (n >= p.n) continue;  // N % 8 == 0: both columns in or out
        float v0 = acc[mi][ni][2 * h], v1 = acc[mi][ni][2 * h + 1];
        if (p.bias != nullptr) {
          const uint32_t b = *reinterpret_cast<const uint32_t*>(p.bias + expert * p.n + n);
          v0 += scale * bf16_lo(b);
          v1 += scale * bf16_hi(b);
        }
        if (p.d_f32)
          *reinterpret_cast<float2*>(static_cast<float*>(p.d) + t * p.n + n) = make_float2(v0, v1);
        else
          *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(p.d) + t * p.n + n) = pack_bf16x2(v0, v1);
      }
    }
}

}  // namespace mxmoe::cuda::portable
