// The wgrad epilogue (k-grouped): D_e[m, n] = acc, bf16 or fp32, or D_e[m, n] + acc when
// accumulating into an fp32 main grad.
#pragma once
#include "src/cuda/sm90/epilogue_staging.cuh"

namespace mxmoe::cuda::sm90 {

// D_e[m, n] = acc (+ D_e[m, n] when accumulating into fp32). An empty group writes zeros, or leaves
// D_e untouched when accumulating.
template <int BN, bool kF32, bool kAdd>
__device__ __forceinline__ void epilogue_wgrad_impl(const KernelParams& p, const Tile& t, int cw, int ctid,
                                                    const float (&acc)[BN / 2], Stage st) {
  const Frag fr{(ctid % 128) / 32, ctid % 32};
  constexpr int kElem = kF32 ? 4 : 2, kPassJ = kOutRowBytes / kElem / 8;
  const int64_t n0 = static_cast<int64_t>(t.n_tile) * BN;
  const int64_t row_first = t.row0 + 64 * cw;
  char* d = static_cast<char*>(p.d_experts.at<void>(t.expert));
  const int rows = stage_rows(row_first, p.m);
#pragma unroll
  for (int j0 = 0; j0 < BN / 8; j0 += kPassJ) {
    const int64_t col0 = n0 + 8 * j0;
    const OutBlock o{d + (row_first * p.n + col0) * kElem, p.n * kElem, rows, stage_bytes(col0, p.n, kElem)};
    if constexpr (kAdd) {
      // The main grad's block comes in by cp.async (one round trip per pass, no registers), the
      // accumulator is added in the stage, the sum goes out.
      copy_in_start(st, o, ctid % 128);
      copy_in_finish(cw);
    }
#pragma unroll
    for (int jj = 0; jj < kPassJ; ++jj)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float v0 = acc[4 * (j0 + jj) + 2 * h], v1 = acc[4 * (j0 + jj) + 2 * h + 1];
        if constexpr (kF32)
          stage_pair<kAdd>(st, fr, h, jj, v0, v1);
        else
          stage_pair(st, fr, h, jj, pack_bf16x2(v0, v1));
      }
    copy_out(st, o, ctid % 128, cw);
  }
}

template <int BN>
__device__ __forceinline__ void epilogue_wgrad(const KernelParams& p, const Tile& t, int cw, int ctid,
                                               const float (&acc)[BN / 2], Stage st) {
  if (t.k_blocks == 0 && p.accumulate) return;
  if (!p.d_f32)
    epilogue_wgrad_impl<BN, false, false>(p, t, cw, ctid, acc, st);
  else if (p.accumulate)
    epilogue_wgrad_impl<BN, true, true>(p, t, cw, ctid, acc, st);
  else
    epilogue_wgrad_impl<BN, true, false>(p, t, cw, ctid, acc, st);
}

template <int BN>
struct EpilogueWgrad : OutStageEpilogue {
  __device__ __forceinline__ static void run(const KernelParams& p, const Tile& t, int cw, int ctid,
                                             const float (&acc)[BN / 2], uint8_t* epi) {
    epilogue_wgrad<BN>(p, t, cw, ctid, acc, stage(epi, cw));
  }
};

}  // namespace mxmoe::cuda::sm90
