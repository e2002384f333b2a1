// Epilogues of the sm90 grouped GEMM kernel: what happens to a consumer warp group's (64, BN) fp32
// accumulator. Fragment layout of wgmma m64nNk16 (per warp group, thread t = 32 w + l):
//   acc[4j + 2h + i] is row 16w + l/4 + 8h, column 8j + 2(l%4) + i     (j < N/8, h, i in {0, 1})
// so a thread owns 2 rows and pairs of adjacent columns; stores are 4-byte (bf16x2) or 8-byte
// (f32x2) wide. Semantics as docs/numerics.md and the portable epilogues (same formulas, from
// src/common/glu.h); only the fp32 summation order of partial sums differs between backends.
#pragma once
#include "mxmoe/numerics.h"
#include "src/common/glu.h"

namespace mxmoe::cuda::sm90 {

struct Frag {
  __device__ int row(int h) const { return 16 * warp + lane / 4 + 8 * h; }  // within the warp group's 64 rows
  static constexpr int col(int j, int lane) { return 8 * j + 2 * (lane % 4); }
  int warp, lane;
};

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return static_cast<uint32_t>(bf16_from_f32(lo)) | (static_cast<uint32_t>(bf16_from_f32(hi)) << 16);
}
__device__ __forceinline__ float bf16_lo(uint32_t v) { return f32_from_bf16(static_cast<uint16_t>(v & 0xFFFF)); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return f32_from_bf16(static_cast<uint16_t>(v >> 16)); }

// D[t, n] = acc (+ bias_e[n] or p_t * bias_e[n]) for the tile's rows inside the group.
// NOTE: every load of an epilogue is issued before its first store. Loads after a store through a
// pointer that may alias must wait for it; interleaved, each thread's 32-64 loads ran one round trip
// at a time (measured: the FC2-dgrad epilogue took longer than its 7168-deep mainloop).
template <int BN, bool kBias>
__device__ __forceinline__ void epilogue_store_impl(const KernelParams& p, const Tile& t, int cw, int ctid,
                                                    const float (&acc)[BN / 2]) {
  const Frag fr{(ctid % 128) / 32, ctid % 32};
  const int64_t n0 = static_cast<int64_t>(t.n_tile) * BN;
  // The bias is read inside the loop: held for all columns it would not fit in the 168 registers
  // (ptxas spilled); it is a small read-only row that stays in L1.
  const uint16_t* bias = kBias ? p.bias + static_cast<int64_t>(t.expert) * p.n : nullptr;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = t.row0 + 64 * cw + fr.row(h);
    if (row >= t.row_end) continue;
    const float scale = (kBias && p.bias_by_probs && p.probs != nullptr) ? __ldg(p.probs + row) : 1.0f;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int64_t col = n0 + Frag::col(j, fr.lane);
      if (col >= p.n) continue;
      float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
      if constexpr (kBias) {
        const uint32_t b = __ldg(reinterpret_cast<const unsigned int*>(bias + col));
        v0 += scale * bf16_lo(b), v1 += scale * bf16_hi(b);
      }
      if (p.d_f32)
        *reinterpret_cast<float2*>(static_cast<float*>(p.d) + row * p.n + col) = make_float2(v0, v1);
      else
        *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(p.d) + row * p.n + col) = pack_bf16x2(v0, v1);
    }
  }
}

template <int BN>
__device__ __forceinline__ void epilogue_store(const KernelParams& p, const Tile& t, int cw, int ctid,
                                               const float (&acc)[BN / 2]) {
  if (p.bias != nullptr) epilogue_store_impl<BN, true>(p, t, cw, ctid, acc);
  else epilogue_store_impl<BN, false>(p, t, cw, ctid, acc);
}

// D_e[m, n] = acc (+ D_e[m, n] when accumulating into fp32). An empty group writes zeros, or leaves
// D_e untouched when accumulating.
template <int BN>
__device__ __forceinline__ void epilogue_wgrad(const KernelParams& p, const Tile& t, int cw, int ctid,
                                               const float (&acc)[BN / 2]) {
  if (t.k_blocks == 0 && p.accumulate) return;
  const Frag fr{(ctid % 128) / 32, ctid % 32};
  const int64_t n0 = static_cast<int64_t>(t.n_tile) * BN;
  void* d = p.d_experts.at<void>(t.expert);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = t.row0 + 64 * cw + fr.row(h);
    if (row >= p.m) continue;
    if (p.d_f32) {
      float* drow = static_cast<float*>(d) + row * p.n;
      // The main grad's values, read kChunk fragments at a time before their stores (all at once
      // would not fit the register budget next to the accumulators).
      constexpr int kChunk = 8;
#pragma unroll
      for (int j0 = 0; j0 < BN / 8; j0 += kChunk) {
        float2 old[kChunk];  // (j - j0)
#pragma unroll
        for (int j = j0; j < j0 + kChunk; ++j) {
          const int64_t col = n0 + Frag::col(j, fr.lane);
          old[j - j0] =
              (p.accumulate && col < p.n) ? *reinterpret_cast<const float2*>(drow + col) : make_float2(0.f, 0.f);
        }
#pragma unroll
        for (int j = j0; j < j0 + kChunk; ++j) {
          const int64_t col = n0 + Frag::col(j, fr.lane);
          if (col < p.n)
            *reinterpret_cast<float2*>(drow + col) =
                make_float2(old[j - j0].x + acc[4 * j + 2 * h], old[j - j0].y + acc[4 * j + 2 * h + 1]);
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const int64_t col = n0 + Frag::col(j, fr.lane);
        if (col < p.n)
          *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(d) + row * p.n + col) =
              pack_bf16x2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
      }
    }
  }
}

// FC1: the tile's GEMM columns are the a-columns of features f0..f0+BN/2-1 followed by their
// b-columns (the producer loads B_e rows in that order), so acc column c and c + BN/2 are a and b
// of the same feature, in the same thread (fragment j and j + BN/16).
template <int BN>
__device__ __forceinline__ void epilogue_glu_forward(const KernelParams& p, const Tile& t, int cw, int ctid,
                                                     const float (&acc)[BN / 2]) {
  const Frag fr{(ctid % 128) / 32, ctid % 32};
  const int64_t F = p.ffn, C = 2 * F;
  const int64_t f0 = static_cast<int64_t>(t.n_tile) * (BN / 2);
  const uint16_t* bias = p.bias != nullptr ? p.bias + static_cast<int64_t>(t.expert) * C : nullptr;
  uint32_t bias_a[BN / 16], bias_b[BN / 16];  // (j): bf16 pairs of b1 at the a and b columns
#pragma unroll
  for (int j = 0; j < BN / 16; ++j) {
    const int64_t f = f0 + Frag::col(j, fr.lane);
    const bool live = bias != nullptr && f < F;
    bias_a[j] = live ? __ldg(reinterpret_cast<const unsigned int*>(bias + glu_a_col(f, F, p.glu_layout))) : 0u;
    bias_b[j] = live ? __ldg(reinterpret_cast<const unsigned int*>(bias + glu_b_col(f, F, p.glu_layout))) : 0u;
  }
  int64_t rows[2];
  float prob[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    rows[h] = t.row0 + 64 * cw + fr.row(h);
    prob[h] = (rows[h] < t.row_end && p.probs != nullptr) ? __ldg(p.probs + rows[h]) : 1.0f;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = rows[h];
    if (row >= t.row_end) continue;
#pragma unroll
    for (int j = 0; j < BN / 16; ++j) {
      const int64_t f = f0 + Frag::col(j, fr.lane);
      if (f >= F) continue;
      const int64_t ca = glu_a_col(f, F, p.glu_layout), cb = glu_b_col(f, F, p.glu_layout);
      const float a0 = acc[4 * j + 2 * h] + bf16_lo(bias_a[j]), a1 = acc[4 * j + 2 * h + 1] + bf16_hi(bias_a[j]);
      const float b0 = acc[4 * (j + BN / 16) + 2 * h] + bf16_lo(bias_b[j]);
      const float b1 = acc[4 * (j + BN / 16) + 2 * h + 1] + bf16_hi(bias_b[j]);
      if (p.c_out != nullptr) {
        *reinterpret_cast<uint32_t*>(p.c_out + row * C + ca) = pack_bf16x2(a0, a1);
        *reinterpret_cast<uint32_t*>(p.c_out + row * C + cb) = pack_bf16x2(b0, b1);
      }
      *reinterpret_cast<uint32_t*>(p.out_bf16 + row * F + f) =
          pack_bf16x2(prob[h] * glu_forward(a0, b0, p.glu), prob[h] * glu_forward(a1, b1, p.glu));
    }
  }
}

// FC2 dgrad: g = acc = dA for features n0..n0+BN-1. With a, b from the saved C (bf16):
//   dC -> bf16 [T, 2F]; dprob partial (sum over the tile's features of g * act) -> ws_dprob[n_tile, t];
//   db1 partial (sum over the tile's rows of fp32 dC) -> ws_db1[m_tile, column].
// Both partials use a fixed order (quad shuffles; lane-bit shuffles, then warps by index).
template <int BN>
__device__ __forceinline__ void epilogue_glu_backward(const KernelParams& p, const Tile& t, int cw, int ctid,
                                                      const float (&acc)[BN / 2], float* smem_cols) {
  const Frag fr{(ctid % 128) / 32, ctid % 32};
  const int64_t F = p.ffn, C = 2 * F;
  const int64_t n0 = static_cast<int64_t>(t.n_tile) * BN;
  const bool want_db1 = p.ws_db1 != nullptr;
  float col_a[BN / 4], col_b[BN / 4];  // (j, i): this thread's column sums over its rows
#pragma unroll
  for (int c = 0; c < BN / 4; ++c) col_a[c] = 0.0f, col_b[c] = 0.0f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = t.row0 + 64 * cw + fr.row(h);
    const bool live = row < t.row_end;
    float row_sum = 0.0f;
    if (live) {
      const float prob = p.probs != nullptr ? __ldg(p.probs + row) : 1.0f;
      uint32_t c_a[BN / 8], c_b[BN / 8];  // (j): the saved C pairs, all loaded before the first store
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const int64_t f = n0 + Frag::col(j, fr.lane);
        const bool in = f < F;
        c_a[j] = in ? __ldg(reinterpret_cast<const unsigned int*>(p.c_in + row * C + glu_a_col(f, F, p.glu_layout))) : 0u;
        c_b[j] = in ? __ldg(reinterpret_cast<const unsigned int*>(p.c_in + row * C + glu_b_col(f, F, p.glu_layout))) : 0u;
      }
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const int64_t f = n0 + Frag::col(j, fr.lane);
        if (f >= F) continue;
        const int64_t ca = glu_a_col(f, F, p.glu_layout), cb = glu_b_col(f, F, p.glu_layout);
        const uint32_t av = c_a[j], bv = c_b[j];
        const float g0 = acc[4 * j + 2 * h], g1 = acc[4 * j + 2 * h + 1];
        const GluGrad r0 = glu_backward(bf16_lo(av), bf16_lo(bv), g0, prob, p.glu);
        const GluGrad r1 = glu_backward(bf16_hi(av), bf16_hi(bv), g1, prob, p.glu);
        row_sum += g0 * r0.act + g1 * r1.act;
        col_a[2 * j] += r0.da, col_a[2 * j + 1] += r1.da;
        col_b[2 * j] += r0.db, col_b[2 * j + 1] += r1.db;
        *reinterpret_cast<uint32_t*>(p.out_bf16 + row * C + ca) = pack_bf16x2(r0.da, r1.da);
        *reinterpret_cast<uint32_t*>(p.out_bf16 + row * C + cb) = pack_bf16x2(r0.db, r1.db);
      }
    }
    if (p.ws_dprob != nullptr) {
      row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 1);
      row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 2);
      if (live && fr.lane % 4 == 0) p.ws_dprob[static_cast<int64_t>(t.n_tile) * p.rows + row] = row_sum;
    }
  }
  if (!want_db1) return;
  // Column sums over the warp's 16 rows (lane bits 2-4), then over the 8 consumer warps in order.
#pragma unroll
  for (int c = 0; c < BN / 4; ++c) {
#pragma unroll
    for (int s = 4; s < 32; s *= 2) {
      col_a[c] += __shfl_xor_sync(0xffffffffu, col_a[c], s);
      col_b[c] += __shfl_xor_sync(0xffffffffu, col_b[c], s);
    }
  }
  const int gw = cw * 4 + fr.warp;  // consumer warp 0..7 (row order)
  if (fr.lane < 4) {
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int c = Frag::col(j, fr.lane) + i;
        smem_cols[(gw * 2 + 0) * BN + c] = col_a[2 * j + i];
        smem_cols[(gw * 2 + 1) * BN + c] = col_b[2 * j + i];
      }
  }
  named_barrier_sync(2, kConsumerThreads);
  for (int u = ctid; u < 2 * BN; u += kConsumerThreads) {
    const int half = u / BN, c = u % BN;
    const int64_t f = n0 + c;
    if (f < F) {
      float s = 0.0f;
      for (int w = 0; w < 8; ++w) s += smem_cols[(w * 2 + half) * BN + c];
      const int64_t col = half == 0 ? glu_a_col(f, F, p.glu_layout) : glu_b_col(f, F, p.glu_layout);
      p.ws_db1[static_cast<int64_t>(t.m_tile) * C + col] = s;
    }
  }
  named_barrier_sync(2, kConsumerThreads);  // smem_cols is reused by the next tile
}

template <class Cfg>
__device__ __forceinline__ void epilogue(const KernelParams& p, const Tile& t, int cw, int ctid,
                                         const float (&acc)[Cfg::kBlockN / 2], float* epi_smem) {
  constexpr int BN = Cfg::kBlockN;
  if constexpr (Cfg::kEpi == Epi::store) epilogue_store<BN>(p, t, cw, ctid, acc);
  else if constexpr (Cfg::kEpi == Epi::wgrad) epilogue_wgrad<BN>(p, t, cw, ctid, acc);
  else if constexpr (Cfg::kEpi == Epi::glu_forward) epilogue_glu_forward<BN>(p, t, cw, ctid, acc);
  else epilogue_glu_backward<BN>(p, t, cw, ctid, acc, epi_smem);
}

}  // namespace mxmoe::cuda::sm90
