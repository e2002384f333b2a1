// The GLU backward epilogue (FC2 dgrad): g = acc = dA; dC = act'(C, g, p) -> bf16 [T, 2F] and/or
// MXFP8 (kQuant); the dprob and db1 partials for the fixed-order reductions after the kernel.
#pragma once
#include "src/cuda/sm90/epilogue_staging.cuh"

namespace mxmoe::cuda::sm90 {

// Shared memory per consumer warp group: two buffers of 64 rows x (a and b of kGluBwdPass features):
// one pass computes in one while the saved C of the pass after next arrives in the other. Then the
// db1 column partials of the 8 consumer warps for one pass.
inline constexpr int kGluBwdPass = 64;              // features per pass
inline constexpr int kGluBwdRow = 4 * kGluBwdPass;  // bytes per stage row: a and b, bf16
inline constexpr int kGluBwdBufs = 2;
inline constexpr int kGluBwdBufBytes = 64 * kGluBwdRow;
inline constexpr int kGluBwdStageBytes = kGluBwdBufs * kGluBwdBufBytes;
inline constexpr int kGluBwdEpiBytes = 2 * kGluBwdStageBytes + 8 * 2 * kGluBwdPass * 4;

// FC2 dgrad: g = acc = dA for features n0..n0+BN-1, in passes of 64 features. Per pass q the
// saved C (bf16: a and b of the pass's features) is staged in buffer q % 2 of the warp group: the
// copies of passes 0 and 1 start with the tile's mainloop (glu_backward_prefetch), and pass q + 2's
// as soon as pass q's dC has left buffer q % 2, so it flies during pass q + 1. dC replaces C in
// place (each thread rewrites the words it read) and is copied out;
//   dprob partial (sum over the tile's features of g * act) -> ws_dprob[n_tile, t];
//   db1 partial (sum over the tile's rows of fp32 dC) -> ws_db1[m_tile, column].
// Both partials use a fixed order (row pairs, quad shuffles; lane-bit shuffles, then warps by index).
// The values are computed for every fragment position, valid or not (no branch per value: the
// branches around each pair kept ptxas from interleaving independent pairs, and the epilogue was
// latency bound, ncu stall_wait); positions outside the group's rows or past F read stale stage
// words and are kept out of the partials by selects and out of memory by copy_out.
// col_sums: 8 warps x 128 floats (a then b of the pass's 64 features).
__device__ __forceinline__ OutBlock glu_backward_c_block(const KernelParams& p, const Tile& t, int cw, int64_t fq) {
  const int64_t row_first = t.row0 + 64 * cw;
  char* c_rows = const_cast<char*>(reinterpret_cast<const char*>(p.c_in + row_first * 2 * p.ffn));
  return glu_pass_block<kGluBwdPass>(c_rows, fq, p.ffn, stage_rows(row_first, t.row_end), p.glu_layout);
}
inline constexpr int kGluBwdCopyUnroll = 4;
template <int BN>
__device__ __forceinline__ void glu_backward_prefetch(const KernelParams& p, const Tile& t, int cw, int ctid,
                                                      Stage st) {
  const int64_t n0 = static_cast<int64_t>(t.n_tile) * BN;
#pragma unroll
  for (int q = 0; q < kGluBwdBufs && q < BN / kGluBwdPass; ++q)
    copy_in_start<kGluBwdRow, kGluBwdCopyUnroll>(st + q * kGluBwdBufBytes,
                                                 glu_backward_c_block(p, t, cw, n0 + q * kGluBwdPass), ctid % 128);
}

// Column of C (and dC) of stage column c of a backward pass whose first feature is fq, or -1 past F:
// halves [a fq.. | b fq..], interleave32 [a 32 | b 32 | a 32 | b 32].
__device__ __forceinline__ int64_t glu_pass_col(int c, int64_t fq, int64_t F, GluLayout layout) {
  const bool halves = layout == GluLayout::halves;
  const int64_t f = fq + (halves ? c % kGluBwdPass : 32 * (c / 64) + c % 32);
  const bool b_half = halves ? c >= kGluBwdPass : (c % 64) >= 32;
  if (f >= F) return -1;
  return b_half ? glu_b_col(f, F, layout) : glu_a_col(f, F, layout);
}

template <int BN, Activation kAct, bool kDb1, bool kQuant>
__device__ __forceinline__ void epilogue_glu_backward_impl(const KernelParams& p, const Tile& t, int cw, int ctid,
                                                           const float (&acc)[BN / 2], float* col_sums, Stage st0) {
  static_assert(BN % kGluBwdPass == 0 && BN / kGluBwdPass >= kGluBwdBufs, "whole passes, both buffers used");
  constexpr int kPasses = BN / kGluBwdPass, kPassJ = kGluBwdPass / 8, kRow = kGluBwdRow;
  const Frag fr{(ctid % 128) / 32, ctid % 32};
  const int64_t F = p.ffn, C = 2 * F;
  const int64_t n0 = static_cast<int64_t>(t.n_tile) * BN;
  const int64_t row_first = t.row0 + 64 * cw;
  const int rows = stage_rows(row_first, t.row_end);
  const GluPassCols<kGluBwdPass> pc(p.glu_layout, fr.lane);
  const int gw = cw * 4 + fr.warp;  // consumer warp 0..7 (row order)
  bool live[2];
  float prob[2], row_sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    live[h] = fr.row(h) < rows;
    prob[h] = p.probs != nullptr && live[h] ? __ldg(p.probs + row_first + fr.row(h)) : 1.0f;
  }
  char* dc_rows = reinterpret_cast<char*>(p.out_bf16 + row_first * C);
#pragma unroll
  for (int q = 0; q < kPasses; ++q) {
    const int64_t fq = n0 + q * kGluBwdPass;
    const Stage st = st0 + (q % kGluBwdBufs) * kGluBwdBufBytes;
    // In flight: pass q's copy and, except in the last pass, pass q + 1's.
    if (q + 1 < kPasses)
      copy_in_finish<1>(cw);
    else
      copy_in_finish<0>(cw);
#pragma unroll
    for (int jj = 0; jj < kPassJ; ++jj) {
      const int j = q * kPassJ + jj;
      const bool in = fq + 8 * jj + 2 * (fr.lane % 4) < F;  // F is even: pairs are whole
      float sa[2] = {0.0f, 0.0f}, sb[2] = {0.0f, 0.0f};     // (i): this thread's two rows
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool ok = in && live[h];
        const uint32_t av = stage_word<kRow>(st, fr.row(h), pc.a(jj)), bv = stage_word<kRow>(st, fr.row(h), pc.b(jj));
        const float g0 = acc[4 * j + 2 * h], g1 = acc[4 * j + 2 * h + 1];
        const GluGrad r0 = glu_backward<kAct>(bf16_lo(av), bf16_lo(bv), g0, prob[h], p.glu);
        const GluGrad r1 = glu_backward<kAct>(bf16_hi(av), bf16_hi(bv), g1, prob[h], p.glu);
        const float rs = g0 * r0.act + g1 * r1.act;
        row_sum[h] += ok ? rs : 0.0f;
        if constexpr (kDb1) {
          sa[0] += ok ? r0.da : 0.0f, sa[1] += ok ? r1.da : 0.0f;
          sb[0] += ok ? r0.db : 0.0f, sb[1] += ok ? r1.db : 0.0f;
        }
        stage_word<kRow>(st, fr.row(h), pc.a(jj), pack_bf16x2(r0.da, r1.da));
        stage_word<kRow>(st, fr.row(h), pc.b(jj), pack_bf16x2(r0.db, r1.db));
      }
      if constexpr (kDb1) {
        // Column sums over the warp's 16 rows (lane bits 2-4), in a fixed order.
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int s = 4; s < 32; s *= 2) {
            sa[i] += __shfl_xor_sync(0xffffffffu, sa[i], s);
            sb[i] += __shfl_xor_sync(0xffffffffu, sb[i], s);
          }
        if (fr.lane < 4) {
          float* mine = col_sums + gw * 2 * kGluBwdPass;
          const int c = 8 * jj + 2 * fr.lane;
          mine[c] = sa[0], mine[c + 1] = sa[1];
          mine[kGluBwdPass + c] = sb[0], mine[kGluBwdPass + c + 1] = sb[1];
        }
      }
    }
    if (!kQuant || p.out_bf16 != nullptr)
      copy_out<kRow, kGluBwdCopyUnroll>(st, glu_pass_block<kGluBwdPass>(dc_rows, fq, F, rows, p.glu_layout), ctid % 128,
                                        cw);
    if constexpr (kQuant) {
      if (p.out_mx.any())
        quantize_stage<kRow, 2 * kGluBwdPass>(p, t, cw, ctid % 128, st, C,
                                              [&](int c) { return glu_pass_col(c, fq, F, p.glu_layout); });
    }
    if (q + kGluBwdBufs < kPasses)  // this buffer is free again: the saved C of pass q + 2
      copy_in_start<kRow, kGluBwdCopyUnroll>(st, glu_backward_c_block(p, t, cw, fq + kGluBwdBufs * kGluBwdPass),
                                             ctid % 128);
    if constexpr (kDb1) {
      named_barrier_sync(NamedBarrier::glu_bwd_sums, kConsumerThreads);  // every warp's sums are in
      if (ctid < 2 * kGluBwdPass) {
        const int half = ctid / kGluBwdPass, c = ctid % kGluBwdPass;  // a, b of 64 features
        const int64_t f = fq + c;
        if (f < F) {
          float sum = 0.0f;
          for (int w = 0; w < 8; ++w) sum += col_sums[w * 2 * kGluBwdPass + half * kGluBwdPass + c];
          const int64_t col = half == 0 ? glu_a_col(f, F, p.glu_layout) : glu_b_col(f, F, p.glu_layout);
          p.ws_db1[static_cast<int64_t>(t.m_tile) * C + col] = sum;
        }
      }
      named_barrier_sync(NamedBarrier::glu_bwd_sums, kConsumerThreads);  // col_sums is reused by the next pass
    }
  }
  if (p.ws_dprob != nullptr) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v = row_sum[h];
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      if (live[h] && fr.lane % 4 == 0) p.ws_dprob[static_cast<int64_t>(t.n_tile) * p.rows + row_first + fr.row(h)] = v;
    }
  }
}

// Calls f(activation, db1) with both as compile-time constants (std::integral_constant): the GLU

// Instantiated per activation and per whether db1 is asked for: one branch per tile.
template <int BN, bool kQuant>
__device__ __forceinline__ void epilogue_glu_backward(const KernelParams& p, const Tile& t, int cw, int ctid,
                                                      const float (&acc)[BN / 2], float* col_sums, Stage st) {
  constexpr Activation kSwiglu = Activation::swiglu, kClamped = Activation::clamped_swiglu;
  const bool db1 = p.ws_db1 != nullptr;
  if (p.glu.activation == kSwiglu) {
    if (db1)
      epilogue_glu_backward_impl<BN, kSwiglu, true, kQuant>(p, t, cw, ctid, acc, col_sums, st);
    else
      epilogue_glu_backward_impl<BN, kSwiglu, false, kQuant>(p, t, cw, ctid, acc, col_sums, st);
  } else {
    if (db1)
      epilogue_glu_backward_impl<BN, kClamped, true, kQuant>(p, t, cw, ctid, acc, col_sums, st);
    else
      epilogue_glu_backward_impl<BN, kClamped, false, kQuant>(p, t, cw, ctid, acc, col_sums, st);
  }
}

template <int BN, bool kQuant>
struct EpilogueGluBackward {
  static constexpr int kSmemBytes = kGluBwdEpiBytes;
  __device__ __forceinline__ static Stage stage(uint8_t* epi, int cw) { return stage_of(epi + cw * kGluBwdStageBytes); }
  // The saved C of the tile's first two passes is copied in while its mainloop runs.
  __device__ __forceinline__ static void prefetch(const KernelParams& p, const Tile& t, int cw, int ctid,
                                                  uint8_t* epi) {
    glu_backward_prefetch<BN>(p, t, cw, ctid, stage(epi, cw));
  }
  // col_sums: after both warp groups' stages.
  __device__ __forceinline__ static void run(const KernelParams& p, const Tile& t, int cw, int ctid,
                                             const float (&acc)[BN / 2], uint8_t* epi) {
    epilogue_glu_backward<BN, kQuant>(p, t, cw, ctid, acc, reinterpret_cast<float*>(epi + 2 * kGluBwdStageBytes),
                                      stage(epi, cw));
  }
};

}  // namespace mxmoe::cuda::sm90
