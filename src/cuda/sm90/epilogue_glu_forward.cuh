// The GLU forward epilogue (FC1 fprop): C = acc + b1 -> bf16 [T, 2F] (when saved for the backward),
// A = p_t * act(a, b) -> bf16 [T, F] and/or MXFP8 (kQuant).
#pragma once
#include "src/cuda/sm90/epilogue_staging.cuh"

namespace mxmoe::cuda::sm90 {

inline constexpr int kGluFwdPass = 64;  // features per C pass (256-byte stage rows)

// FC1: the tile's GEMM columns are the a-columns of features f0..f0+BN/2-1 followed by their
// b-columns (the producer loads B_e rows in that order), so acc fragment j and j + BN/16 are a and b
// of the same feature, in the same thread. Passes: C (when saved), 64 features each; then A = p * act
// for the tile's 128 features.
// NOTE: the epilogue is unrolled over the accumulator registers, so its length is paid in
// instruction-cache misses (ncu: stall_no_inst was half the epilogue's samples when it was 146 KB
// of SASS): activation and bias are template parameters (one branch per tile, not per value),
// conversions are single instructions.
template <int BN, Activation kAct, bool kBias, bool kQuant>
__device__ __forceinline__ void epilogue_glu_forward_impl(const KernelParams& p, const Tile& t, int cw, int ctid,
                                                          const float (&acc)[BN / 2], Stage st) {
  // A's pass: BN/2 features, 256 bytes of bf16 (BN 256) or the first 128 of them (BN 128, the FP8
  // blockwise kernels).
  static_assert(BN == 256 || BN == 128, "A's pass: BN/2 <= 128 features = 256 bytes of bf16");
  const Frag fr{(ctid % 128) / 32, ctid % 32};
  const int64_t F = p.ffn, C = 2 * F;
  const int64_t f0 = static_cast<int64_t>(t.n_tile) * (BN / 2);
  const int64_t row_first = t.row0 + 64 * cw;
  const int rows = stage_rows(row_first, t.row_end);
  const GluPassCols<kGluFwdPass> pc(p.glu_layout, fr.lane);
  const uint16_t* bias = kBias ? p.bias + static_cast<int64_t>(t.expert) * C : nullptr;
  // a + b1 (b_half: b + b1) of fragment j, row h, element i: what C holds and act reads (fp32).
  auto pre = [&](int j, int h, int i, bool b_half) {
    float v = acc[4 * (j + (b_half ? BN / 16 : 0)) + 2 * h + i];
    if constexpr (kBias) {
      const int64_t f = f0 + 8 * j + 2 * (fr.lane % 4);
      const uint32_t w = f < F ? __ldg(reinterpret_cast<const unsigned int*>(
                                     bias + (b_half ? glu_b_col(f, F, p.glu_layout) : glu_a_col(f, F, p.glu_layout))))
                               : 0u;
      v += i == 0 ? bf16_lo(w) : bf16_hi(w);
    }
    return v;
  };
  if (p.c_out != nullptr) {
    char* c_rows = reinterpret_cast<char*>(p.c_out + row_first * C);
#pragma unroll
    for (int q = 0; q < BN / 2 / kGluFwdPass; ++q) {
#pragma unroll
      for (int jj = 0; jj < kGluFwdPass / 8; ++jj)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int j = q * (kGluFwdPass / 8) + jj;
          stage_word(st, fr.row(h), pc.a(jj), pack_bf16x2(pre(j, h, 0, false), pre(j, h, 1, false)));
          stage_word(st, fr.row(h), pc.b(jj), pack_bf16x2(pre(j, h, 0, true), pre(j, h, 1, true)));
        }
      copy_out(st, glu_pass_block<kGluFwdPass>(c_rows, f0 + q * kGluFwdPass, F, rows, p.glu_layout), ctid % 128, cw);
    }
  }
  float prob[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = row_first + fr.row(h);
    prob[h] = p.probs != nullptr && row < t.row_end ? __ldg(p.probs + row) : 1.0f;
  }
#pragma unroll
  for (int j = 0; j < BN / 16; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      stage_pair(st, fr, h, j,
                 pack_bf16x2(prob[h] * glu_forward<kAct>(pre(j, h, 0, false), pre(j, h, 0, true), p.glu),
                             prob[h] * glu_forward<kAct>(pre(j, h, 1, false), pre(j, h, 1, true), p.glu)));
  const int a_bytes = stage_bytes(f0, F, 2) < BN ? stage_bytes(f0, F, 2) : BN;  // BN/2 features of 2 bytes
  if (!kQuant || p.out_bf16 != nullptr)
    copy_out(st, {reinterpret_cast<char*>(p.out_bf16 + row_first * F + f0), F * 2, rows, a_bytes}, ctid % 128, cw);
  if constexpr (kQuant) {
    if (p.out_mx.any())
      quantize_stage<kOutRowBytes, BN / 2>(p, t, cw, ctid % 128, st, F,
                                           [&](int c) -> int64_t { return f0 + c < F ? f0 + c : -1; });
  }
}

// kQuant: the kernel may be asked for MXFP8 outputs (p.out_mx; the mx_a kernels).
template <int BN, bool kQuant>
__device__ __forceinline__ void epilogue_glu_forward(const KernelParams& p, const Tile& t, int cw, int ctid,
                                                     const float (&acc)[BN / 2], Stage st) {
  constexpr Activation kSwiglu = Activation::swiglu, kClamped = Activation::clamped_swiglu;
  if (p.glu.activation == kSwiglu) {
    if (p.bias != nullptr)
      epilogue_glu_forward_impl<BN, kSwiglu, true, kQuant>(p, t, cw, ctid, acc, st);
    else
      epilogue_glu_forward_impl<BN, kSwiglu, false, kQuant>(p, t, cw, ctid, acc, st);
  } else {
    if (p.bias != nullptr)
      epilogue_glu_forward_impl<BN, kClamped, true, kQuant>(p, t, cw, ctid, acc, st);
    else
      epilogue_glu_forward_impl<BN, kClamped, false, kQuant>(p, t, cw, ctid, acc, st);
  }
}

template <int BN, bool kQuant>
struct EpilogueGluForward : OutStageEpilogue {
  __device__ __forceinline__ static void run(const KernelParams& p, const Tile& t, int cw, int ctid,
                                             const float (&acc)[BN / 2], uint8_t* epi) {
    epilogue_glu_forward<BN, kQuant>(p, t, cw, ctid, acc, stage(epi, cw));
  }
};

}  // namespace mxmoe::cuda::sm90
