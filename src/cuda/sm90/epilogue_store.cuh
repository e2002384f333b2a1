// The store epilogue (fprop and dgrad without GLU): D[t, n] = acc (+ bias_e[n] or p_t * bias_e[n]),
// bf16 or fp32, for the tile's rows inside its group.
#pragma once
#include "src/cuda/sm90/epilogue_staging.cuh"

namespace mxmoe::cuda::sm90 {

// D[t, n] = acc (+ bias_e[n] or p_t * bias_e[n]) for the tile's rows inside the group; passes of
// 128 bf16 or 64 f32 columns.
template <int BN, bool kBias, bool kF32>
__device__ __forceinline__ void epilogue_store_impl(const KernelParams& p, const Tile& t, int cw, int ctid,
                                                    const float (&acc)[BN / 2], Stage st) {
  const Frag fr{(ctid % 128) / 32, ctid % 32};
  constexpr int kElem = kF32 ? 4 : 2, kPassJ = kOutRowBytes / kElem / 8;  // fragments per pass
  const int64_t n0 = static_cast<int64_t>(t.n_tile) * BN;
  const int64_t row_first = t.row0 + 64 * cw;
  // The bias is read in the loop: held for all columns it would not fit next to the accumulators;
  // a small read-only row that stays in L1.
  const uint16_t* bias = kBias ? p.bias + static_cast<int64_t>(t.expert) * p.n + n0 + 2 * (fr.lane % 4) : nullptr;
  float scale[2] = {1.0f, 1.0f};
  if constexpr (kBias) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row_first + fr.row(h);
      if (p.bias_by_probs && p.probs != nullptr && row < t.row_end) scale[h] = __ldg(p.probs + row);
    }
  }
  const int rows = stage_rows(row_first, t.row_end);
#pragma unroll
  for (int j0 = 0; j0 < BN / 8; j0 += kPassJ) {
#pragma unroll
    for (int jj = 0; jj < kPassJ; ++jj) {
      const int j = j0 + jj;
      float bl = 0.0f, bh = 0.0f;
      if constexpr (kBias) {
        const uint32_t b =
            n0 + 8 * j + 2 * (fr.lane % 4) < p.n ? __ldg(reinterpret_cast<const unsigned int*>(bias + 8 * j)) : 0u;
        bl = bf16_lo(b), bh = bf16_hi(b);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float v0 = acc[4 * j + 2 * h] + scale[h] * bl, v1 = acc[4 * j + 2 * h + 1] + scale[h] * bh;
        if constexpr (kF32)
          stage_pair(st, fr, h, jj, v0, v1);
        else
          stage_pair(st, fr, h, jj, pack_bf16x2(v0, v1));
      }
    }
    const int64_t col0 = n0 + 8 * j0;
    copy_out(
        st,
        {static_cast<char*>(p.d) + (row_first * p.n + col0) * kElem, p.n * kElem, rows, stage_bytes(col0, p.n, kElem)},
        ctid % 128, cw);
  }
}

template <int BN>
__device__ __forceinline__ void epilogue_store(const KernelParams& p, const Tile& t, int cw, int ctid,
                                               const float (&acc)[BN / 2], Stage st) {
  if (p.bias != nullptr) {
    if (p.d_f32)
      epilogue_store_impl<BN, true, true>(p, t, cw, ctid, acc, st);
    else
      epilogue_store_impl<BN, true, false>(p, t, cw, ctid, acc, st);
  } else {
    if (p.d_f32)
      epilogue_store_impl<BN, false, true>(p, t, cw, ctid, acc, st);
    else
      epilogue_store_impl<BN, false, false>(p, t, cw, ctid, acc, st);
  }
}

template <int BN>
struct EpilogueStore : OutStageEpilogue {
  __device__ __forceinline__ static void run(const KernelParams& p, const Tile& t, int cw, int ctid,
                                             const float (&acc)[BN / 2], uint8_t* epi) {
    epilogue_store<BN>(p, t, cw, ctid, acc, stage(epi, cw));
  }
};

}  // namespace mxmoe::cuda::sm90
