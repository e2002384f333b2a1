// Epilogues of the sm90 grouped GEMM kernel: what happens to a consumer warp group's (64, BN) fp32
// accumulator. Fragment layout of wgmma m64nNk16 (per warp group, thread t = 32 w + l):
//   acc[4j + 2h + i] is row 16w + l/4 + 8h, column 8j + 2(l%4) + i     (j < N/8, h, i in {0, 1})
// so a thread owns 2 rows and pairs of adjacent columns (Frag). Every output goes through shared
// memory: each warp group writes its fragments into its own 64-row staging block and copies the
// block out in whole 16-byte chunks, 16 lanes to a 256-byte row piece (the fragment layout written
// straight to global memory stores 16 bytes per row per 4 lanes, half-sector writes; ncu counted 48%
// excess sectors); glu_backward also reads the saved C through it. Semantics as docs/numerics.md and
// the portable epilogues (same formulas, from src/common/glu.h); only the fp32 summation order of
// partial sums differs between backends.
#pragma once
#include <type_traits>

#include "mxmoe/numerics.h"
#include "src/common/glu.h"
#include "src/cuda/common/mx_tile_quant.cuh"

namespace mxmoe::cuda::sm90 {

struct Frag {
  // Row of fragment half h within the warp group's 64 rows; fragment j's columns are 8j + 2(lane%4)
  // and the next one.
  __device__ int row(int h) const { return 16 * warp + lane / 4 + 8 * h; }
  int warp, lane;
};

// One cvt (F2FP) per pair, round to nearest even like bf16_from_f32; a NaN becomes the canonical
// bf16 NaN (bf16_from_f32 keeps sign and payload bits). The integer rounding of bf16_from_f32 took
// about 8 instructions per value, a large part of the epilogues' length.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ float bf16_lo(uint32_t v) { return f32_from_bf16(static_cast<uint16_t>(v & 0xFFFF)); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return f32_from_bf16(static_cast<uint16_t>(v >> 16)); }

// ---- staged output -------------------------------------------------------------------------
// Per consumer warp group: 64 rows x kRow bytes (256: 128 bf16 or 64 f32 columns of one pass; 512:
// the 128 features of a GLU backward pass), 16-byte chunks XOR-swizzled by row % 8 so that the
// fragment writes (8 rows x 16 bytes per instruction) and the row-contiguous chunk reads are both
// free of bank conflicts.
template <int kRow = kOutRowBytes>
__device__ __forceinline__ uint32_t stage_off(int r, int byte_col) {
  return static_cast<uint32_t>(r * kRow + ((((byte_col >> 4) ^ (r & 7))) << 4) + (byte_col & 15));
}
// Barriers 3 and 4: one per consumer warp group (1: k-grouped tail zeroing, 2: glu_backward sums).
__device__ __forceinline__ void wg_sync(int cw) { named_barrier_sync(3 + cw, 128); }

// The stage is addressed through 32-bit shared-window addresses (generic 64-bit pointers cost two
// registers each and made ptxas spill next to the accumulators).
using Stage = uint32_t;
__device__ __forceinline__ Stage stage_of(const uint8_t* p) { return static_cast<Stage>(__cvta_generic_to_shared(p)); }

template <int kRow = kOutRowBytes>
__device__ __forceinline__ void stage_word(Stage st, int r, int byte_col, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;" ::"r"(st + stage_off<kRow>(r, byte_col)), "r"(v) : "memory");
}
template <int kRow = kOutRowBytes>
__device__ __forceinline__ uint32_t stage_word(Stage st, int r, int byte_col) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(st + stage_off<kRow>(r, byte_col)) : "memory");
  return v;
}
// Fragment j (pass-relative jj) of row h into the stage: a bf16 pair, or an f32 pair (kAdd: added to
// the f32 pair the stage holds).
__device__ __forceinline__ void stage_pair(Stage st, const Frag& fr, int h, int jj, uint32_t bf16x2) {
  stage_word(st, fr.row(h), (8 * jj + 2 * (fr.lane % 4)) * 2, bf16x2);
}
template <bool kAdd = false>
__device__ __forceinline__ void stage_pair(Stage st, const Frag& fr, int h, int jj, float v0, float v1) {
  const uint32_t a = st + stage_off(fr.row(h), (8 * jj + 2 * (fr.lane % 4)) * 4);
  if constexpr (kAdd) {
    float o0, o1;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(o0), "=f"(o1) : "r"(a) : "memory");
    v0 = o0 + v0, v1 = o1 + v1;
  }
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(a), "f"(v0), "f"(v1) : "memory");
}

// Where a staged block goes (or comes from): chunk c of staged row r at base + r * ld +
// (c / group) * gstride + (c % group) * 16 (group = all chunks: one contiguous piece; half of them:
// two pieces, e.g. the a and b columns of C in the halves layout). Rows >= rows are skipped, and in
// each group the bytes from valid_bytes on.
struct OutBlock {
  char* base;
  int64_t ld;
  int rows;
  int valid_bytes;  // per group, a multiple of 4
  int group = 16;
  int64_t gstride = 256;
};

__device__ __forceinline__ int stage_rows(int64_t first, int64_t end) {
  const int64_t r = end - first;
  return r <= 0 ? 0 : (r >= 64 ? 64 : static_cast<int>(r));
}
__device__ __forceinline__ int stage_bytes(int64_t first_col, int64_t end_col, int elem) {
  const int64_t c = end_col - first_col;
  return c <= 0 ? 0 : (c * elem >= kOutRowBytes ? kOutRowBytes : static_cast<int>(c * elem));
}

// The thread's chunk of a stage row and its first row; rows advance by kStep (128 threads).
template <int kRow>
struct ChunkWalk {
  static constexpr int kChunks = kRow / 16, kStep = 128 / kChunks;
  __device__ ChunkWalk(const OutBlock& o, int wtid)
      : c(wtid % kChunks), r0(wtid / kChunks), col((c / o.group) * o.gstride + (c % o.group) * 16),
        in_group((c % o.group) * 16),
        vec(((reinterpret_cast<uintptr_t>(o.base) | static_cast<uintptr_t>(o.ld | o.gstride)) & 15) == 0) {}
  int c, r0;
  int64_t col;
  int in_group;
  bool vec;
};

// Copies the stage out (all 128 threads of the warp group, wtid = 0..127), 16-byte chunks where the
// destination allows (the base, row pitch and group stride 16-byte aligned and the chunk inside
// valid_bytes), 4-byte words otherwise. Ends with the warp group's barrier (the stage is free again).
// kUnroll: rows in flight per thread (glu_backward, whose copies are on the critical path: 4).
template <int kRow = kOutRowBytes, int kUnroll = 1>
__device__ __forceinline__ void copy_out(Stage st, const OutBlock& o, int wtid, int cw) {
  wg_sync(cw);  // the stage is complete
  const ChunkWalk<kRow> w(o, wtid);
#pragma unroll kUnroll
  for (int r = w.r0; r < o.rows; r += w.kStep) {
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(st + stage_off<kRow>(r, 16 * w.c))
                 : "memory");
    char* dst = o.base + r * o.ld + w.col;
    if (w.vec && w.in_group + 16 <= o.valid_bytes) {
      *reinterpret_cast<uint4*>(dst) = v;
    } else {
      const uint32_t word[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (w.in_group + 4 * i < o.valid_bytes) *reinterpret_cast<uint32_t*>(dst + 4 * i) = word[i];
    }
  }
  wg_sync(cw);  // every chunk read: the stage may be written again
}

// Stage <- global, the mirror of copy_out: cp.async 16-byte chunks (no registers held while they
// fly), 4-byte loads where the source does not allow them. Chunks it skips (rows >= rows, bytes
// past valid_bytes) keep stale values, which the caller masks. copy_in_start only issues;
// copy_in_finish waits for this thread's copies and the warp group's barrier (the stage complete).
template <int kRow = kOutRowBytes, int kUnroll = 1>
__device__ __forceinline__ void copy_in_start(Stage st, const OutBlock& o, int wtid) {
  const ChunkWalk<kRow> w(o, wtid);
#pragma unroll kUnroll
  for (int r = w.r0; r < o.rows; r += w.kStep) {
    const char* src = o.base + r * o.ld + w.col;
    if (w.vec && w.in_group + 16 <= o.valid_bytes) {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(st + stage_off<kRow>(r, 16 * w.c)), "l"(src)
                   : "memory");
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (w.in_group + 4 * i < o.valid_bytes)
          stage_word<kRow>(st, r, 16 * w.c + 4 * i, *reinterpret_cast<const unsigned int*>(src + 4 * i));
    }
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// kPending: this thread's copy groups that may still fly (the later ones).
template <int kPending = 0>
__device__ __forceinline__ void copy_in_finish(int cw) {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
  wg_sync(cw);
}

// The warp group's stage as a tile of bf16 columns for quantize_staged_tile.
template <int kRow>
struct SwizzledStage {
  Stage st;
  __device__ uint4 chunk(int r, int c) const {
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(st + stage_off<kRow>(r, 2 * c))
                 : "memory");
    return v;
  }
  __device__ uint32_t pair(int r, int c) const { return stage_word<kRow>(st, r, 2 * c); }
};

// Fused quantizing epilogue (Mx::a kernels, docs/kernels/sm90_mxfp8.md): the bf16 values staged in
// the warp group's 64 rows -> p.out_mx (row-wise 1x32 and column-wise 32x1 blocks; the tile's rows
// start at a multiple of 32 from the group's first row, m-tiles being 128 rows of one group). ld: the
// quantized matrix's columns; col_of(c): its column of stage column c, or -1. Waits for the stage to
// be complete first and ends with the warp group's barrier (the stage may be written again).
template <int kRow, int kCols, class ColOf>
__device__ __forceinline__ void quantize_stage(const KernelParams& p, const Tile& t, int cw, int wtid, Stage st,
                                               int64_t ld, ColOf col_of) {
  wg_sync(cw);
  const GroupInfo g = p.sched.groups[t.expert];
  const int64_t row_first = t.row0 + 64 * cw;
  quantize_staged_tile<64, kCols>(SwizzledStage<kRow>{st}, p.out_mx,
                                  mx_tile_target(ld, row_first, t.row_end, g.begin, g.end, g.col_chunk), col_of, wtid,
                                  128);
  wg_sync(cw);
}

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
        const uint32_t b = n0 + 8 * j + 2 * (fr.lane % 4) < p.n ? __ldg(reinterpret_cast<const unsigned int*>(bias + 8 * j)) : 0u;
        bl = bf16_lo(b), bh = bf16_hi(b);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float v0 = acc[4 * j + 2 * h] + scale[h] * bl, v1 = acc[4 * j + 2 * h + 1] + scale[h] * bh;
        if constexpr (kF32) stage_pair(st, fr, h, jj, v0, v1);
        else stage_pair(st, fr, h, jj, pack_bf16x2(v0, v1));
      }
    }
    const int64_t col0 = n0 + 8 * j0;
    copy_out(st, {static_cast<char*>(p.d) + (row_first * p.n + col0) * kElem, p.n * kElem, rows,
                  stage_bytes(col0, p.n, kElem)}, ctid % 128, cw);
  }
}

template <int BN>
__device__ __forceinline__ void epilogue_store(const KernelParams& p, const Tile& t, int cw, int ctid,
                                               const float (&acc)[BN / 2], Stage st) {
  if (p.bias != nullptr) {
    if (p.d_f32) epilogue_store_impl<BN, true, true>(p, t, cw, ctid, acc, st);
    else epilogue_store_impl<BN, true, false>(p, t, cw, ctid, acc, st);
  } else {
    if (p.d_f32) epilogue_store_impl<BN, false, true>(p, t, cw, ctid, acc, st);
    else epilogue_store_impl<BN, false, false>(p, t, cw, ctid, acc, st);
  }
}

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
        if constexpr (kF32) stage_pair<kAdd>(st, fr, h, jj, v0, v1);
        else stage_pair(st, fr, h, jj, pack_bf16x2(v0, v1));
      }
    copy_out(st, o, ctid % 128, cw);
  }
}

template <int BN>
__device__ __forceinline__ void epilogue_wgrad(const KernelParams& p, const Tile& t, int cw, int ctid,
                                               const float (&acc)[BN / 2], Stage st) {
  if (t.k_blocks == 0 && p.accumulate) return;
  if (!p.d_f32) epilogue_wgrad_impl<BN, false, false>(p, t, cw, ctid, acc, st);
  else if (p.accumulate) epilogue_wgrad_impl<BN, true, true>(p, t, cw, ctid, acc, st);
  else epilogue_wgrad_impl<BN, true, false>(p, t, cw, ctid, acc, st);
}

// ---- GLU epilogues: C (and dC) in passes of kFeat features ---------------------------------------
// A pass stages the 2 kFeat columns of C that hold a and b of kFeat features, in C's own column
// order: halves [a f..f+kFeat-1 | b f..] (two pieces, F columns apart), interleave32 [a b a b ...]
// (32 columns each, one contiguous piece). Rows are 4 kFeat bytes: forward 64 features (256-byte
// rows, next to a 4-stage ring), backward 128 (512-byte rows).
template <int kFeat>
__device__ __forceinline__ OutBlock glu_pass_block(char* c_row_first, int64_t fq, int64_t F, int rows, GluLayout layout) {
  const int64_t v = F - fq <= 0 ? 0 : (F - fq >= kFeat ? kFeat : F - fq);
  if (layout == GluLayout::halves)
    return {c_row_first + fq * 2, 4 * F, rows, static_cast<int>(2 * v), kFeat / 8, 2 * F};
  return {c_row_first + 4 * fq, 4 * F, rows, static_cast<int>(4 * v), kFeat / 4, 4 * kFeat};  // v: a multiple of 32
}
// Byte columns in a pass's stage row of feature 8 jj + 2 (lane % 4) (and its pair): a, and b.
template <int kFeat>
struct GluPassCols {
  __device__ GluPassCols(GluLayout layout, int lane)
      : halves(layout == GluLayout::halves), lane_bytes(4 * (lane % 4)), b_delta(halves ? 2 * kFeat : 64) {}
  __device__ int a(int jj) const { return (halves ? 16 * jj : 128 * (jj / 4) + 16 * (jj % 4)) + lane_bytes; }
  __device__ int b(int jj) const { return a(jj) + b_delta; }
  bool halves;
  int lane_bytes, b_delta;
};


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

// kQuant: the kernel may be asked for MXFP8 outputs (p.out_mx; Mx::a and Mx::q kernels).
template <int BN, bool kQuant>
__device__ __forceinline__ void epilogue_glu_forward(const KernelParams& p, const Tile& t, int cw, int ctid,
                                                     const float (&acc)[BN / 2], Stage st) {
  constexpr Activation kSwiglu = Activation::swiglu, kClamped = Activation::clamped_swiglu;
  if (p.glu.activation == kSwiglu) {
    if (p.bias != nullptr) epilogue_glu_forward_impl<BN, kSwiglu, true, kQuant>(p, t, cw, ctid, acc, st);
    else epilogue_glu_forward_impl<BN, kSwiglu, false, kQuant>(p, t, cw, ctid, acc, st);
  } else {
    if (p.bias != nullptr) epilogue_glu_forward_impl<BN, kClamped, true, kQuant>(p, t, cw, ctid, acc, st);
    else epilogue_glu_forward_impl<BN, kClamped, false, kQuant>(p, t, cw, ctid, acc, st);
  }
}

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
__device__ __forceinline__ void glu_backward_prefetch(const KernelParams& p, const Tile& t, int cw, int ctid, Stage st) {
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
    if (q + 1 < kPasses) copy_in_finish<1>(cw);
    else copy_in_finish<0>(cw);
#pragma unroll
    for (int jj = 0; jj < kPassJ; ++jj) {
      const int j = q * kPassJ + jj;
      const bool in = fq + 8 * jj + 2 * (fr.lane % 4) < F;  // F is even: pairs are whole
      float sa[2] = {0.0f, 0.0f}, sb[2] = {0.0f, 0.0f};       // (i): this thread's two rows
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
      copy_out<kRow, kGluBwdCopyUnroll>(st, glu_pass_block<kGluBwdPass>(dc_rows, fq, F, rows, p.glu_layout),
                                        ctid % 128, cw);
    if constexpr (kQuant) {
      if (p.out_mx.any())
        quantize_stage<kRow, 2 * kGluBwdPass>(p, t, cw, ctid % 128, st, C,
                                              [&](int c) { return glu_pass_col(c, fq, F, p.glu_layout); });
    }
    if (q + kGluBwdBufs < kPasses)  // this buffer is free again: the saved C of pass q + 2
      copy_in_start<kRow, kGluBwdCopyUnroll>(st, glu_backward_c_block(p, t, cw, fq + kGluBwdBufs * kGluBwdPass),
                                             ctid % 128);
    if constexpr (kDb1) {
      named_barrier_sync(2, kConsumerThreads);  // every warp's sums are in
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
      named_barrier_sync(2, kConsumerThreads);  // col_sums is reused by the next pass
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
// backward epilogues are instantiated per activation and per whether db1 is asked for, one branch
// per tile.
template <class F>
__device__ __forceinline__ void with_glu_backward_kind(const KernelParams& p, F&& f) {
  using kSwiglu = std::integral_constant<Activation, Activation::swiglu>;
  using kClamped = std::integral_constant<Activation, Activation::clamped_swiglu>;
  const bool db1 = p.ws_db1 != nullptr;
  if (p.glu.activation == Activation::swiglu) {
    if (db1) f(kSwiglu{}, std::true_type{});
    else f(kSwiglu{}, std::false_type{});
  } else {
    if (db1) f(kClamped{}, std::true_type{});
    else f(kClamped{}, std::false_type{});
  }
}

template <int BN, bool kQuant>
__device__ __forceinline__ void epilogue_glu_backward(const KernelParams& p, const Tile& t, int cw, int ctid,
                                                      const float (&acc)[BN / 2], float* col_sums, Stage st) {
  with_glu_backward_kind(p, [&](auto act, auto db1) {
    epilogue_glu_backward_impl<BN, decltype(act)::value, decltype(db1)::value, kQuant>(p, t, cw, ctid, acc, col_sums,
                                                                                        st);
  });
}

// ---- Epilogue warps (Epi::glu_backward_ew) ---------------------------------------------------
// The consumers hand their fp32 accumulators over through shared memory and start the next tile's
// mainloop; warps 1-3 of the producer warp group run the GLU backward of the handed-off tile
// meanwhile (ncu, bench/results/2026-12-02-h200-sm90-s7.md: the epilogue left the tensor pipe idle for
// 19% of the kernel on dsv3, 32% on gptoss-120b). Hand-off tile: fp32 [128 rows][BN], rows of 4 BN
// bytes, 16-byte chunks XOR-swizzled by row % 8 (the fragment writes, 8 rows x 2 chunks per
// instruction, and the row reads are conflict-free). Epilogue warp w takes rows w, w + 3, ...; lane
// g takes features 8g..8g+7 of the tile (16-byte loads of a and b from the saved C, 16-byte stores of
// dC); the dprob partial of a row is a fixed-order butterfly over the warp, the db1 partials are per
// lane over the warp's rows, then the 3 warps' in warp order.
inline constexpr uint32_t kEwBarrier = 7;  // named barrier of the 96 epilogue-warp threads
template <int BN>
__device__ __forceinline__ uint32_t hand_off_offset(int r, int c) {
  static_assert(BN % 32 == 0, "whole groups of 8 swizzled chunks per row");
  const int b = 4 * c;
  return static_cast<uint32_t>(r * 4 * BN + (((b >> 4) ^ (r & 7)) << 4) + (b & 15));
}
template <int BN>
__device__ __forceinline__ void hand_off_tile(int cw, int ctid, const float (&acc)[BN / 2], uint8_t* epi) {
  const Frag fr{(ctid % 128) / 32, ctid % 32};
  const Stage st = stage_of(epi);
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t a = st + hand_off_offset<BN>(64 * cw + fr.row(h), 8 * j + 2 * (fr.lane % 4));
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(a), "f"(acc[4 * j + 2 * h]), "f"(acc[4 * j + 2 * h + 1])
                   : "memory");
    }
}

template <int BN, Activation kAct, bool kDb1>
__device__ __forceinline__ void epilogue_warps_impl(const KernelParams& p, const Tile& t, int ew, int lane, uint8_t* epi) {
  constexpr int kGroups = BN / 8;
  static_assert(kGroups <= 32, "one lane per 8-feature group");
  const Stage st = stage_of(epi);
  float* db1_part = reinterpret_cast<float*>(epi + kBlockM * BN * 4);  // [kEwWarps][2][BN]
  const int64_t F = p.ffn, C = 2 * F;
  const int64_t n0 = static_cast<int64_t>(t.n_tile) * BN;
  const int64_t f = n0 + 8 * lane;
  const bool in = lane < kGroups && f < F;  // F % 8 == 0 (gemm_m_refusal: N % 8)
  const int rows = static_cast<int>(t.row_end - t.row0 < kBlockM ? t.row_end - t.row0 : kBlockM);
  const int64_t acol = in ? glu_a_col(f, F, p.glu_layout) : 0, bcol = in ? glu_b_col(f, F, p.glu_layout) : 0;
  float sa[8], sb[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) sa[i] = 0.0f, sb[i] = 0.0f;
  // The saved C of the warp's next row is loaded while this one computes.
  auto load = [&](int r, uint4& av, uint4& bv, float& prob) {
    const int64_t row = t.row0 + r;
    prob = p.probs != nullptr ? __ldg(p.probs + row) : 1.0f;
    if (in) {
      const uint16_t* crow = p.c_in + row * C;
      av = __ldg(reinterpret_cast<const uint4*>(crow + acol));
      bv = __ldg(reinterpret_cast<const uint4*>(crow + bcol));
    }
  };
  uint4 av_n = make_uint4(0, 0, 0, 0), bv_n = av_n;
  float prob_n = 1.0f;
  if (ew < rows) load(ew, av_n, bv_n, prob_n);
#pragma unroll 1
  for (int r = ew; r < rows; r += kEwWarps) {
    const uint4 av = av_n, bv = bv_n;
    const float prob = prob_n;
    if (r + kEwWarps < rows) load(r + kEwWarps, av_n, bv_n, prob_n);
    const int64_t row = t.row0 + r;
    float rs = 0.0f;
    if (in) {
      float g[8];
      const uint32_t h0 = st + hand_off_offset<BN>(r, 8 * lane);
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(g[0]), "=f"(g[1]), "=f"(g[2]), "=f"(g[3]) : "r"(h0)
                   : "memory");
      const uint32_t h1 = st + hand_off_offset<BN>(r, 8 * lane + 4);
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(g[4]), "=f"(g[5]), "=f"(g[6]), "=f"(g[7]) : "r"(h1)
                   : "memory");
      const uint32_t aw[4] = {av.x, av.y, av.z, av.w}, bw[4] = {bv.x, bv.y, bv.z, bv.w};
      uint32_t daw[4], dbw[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const GluGrad r0 = glu_backward<kAct>(bf16_lo(aw[i]), bf16_lo(bw[i]), g[2 * i], prob, p.glu);
        const GluGrad r1 = glu_backward<kAct>(bf16_hi(aw[i]), bf16_hi(bw[i]), g[2 * i + 1], prob, p.glu);
        rs += g[2 * i] * r0.act + g[2 * i + 1] * r1.act;
        if constexpr (kDb1) {
          sa[2 * i] += r0.da, sa[2 * i + 1] += r1.da;
          sb[2 * i] += r0.db, sb[2 * i + 1] += r1.db;
        }
        daw[i] = pack_bf16x2(r0.da, r1.da);
        dbw[i] = pack_bf16x2(r0.db, r1.db);
      }
      uint16_t* drow = p.out_bf16 + row * C;
      *reinterpret_cast<uint4*>(drow + acol) = make_uint4(daw[0], daw[1], daw[2], daw[3]);
      *reinterpret_cast<uint4*>(drow + bcol) = make_uint4(dbw[0], dbw[1], dbw[2], dbw[3]);
    }
    if (p.ws_dprob != nullptr) {
#pragma unroll
      for (int s = 16; s >= 1; s /= 2) rs += __shfl_xor_sync(0xffffffffu, rs, s);
      if (lane == 0) p.ws_dprob[static_cast<int64_t>(t.n_tile) * p.rows + row] = rs;
    }
  }
  if constexpr (kDb1) {
    if (lane < kGroups) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        db1_part[(ew * 2 + 0) * BN + 8 * lane + i] = sa[i];
        db1_part[(ew * 2 + 1) * BN + 8 * lane + i] = sb[i];
      }
    }
    named_barrier_sync(kEwBarrier, 32 * kEwWarps);
    const int et = 32 * ew + lane;
    for (int c = et; c < 2 * BN; c += 32 * kEwWarps) {
      const int half = c / BN, cc = c % BN;
      const int64_t fc = n0 + cc;
      if (fc < F) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < kEwWarps; ++w) sum += db1_part[(w * 2 + half) * BN + cc];
        const int64_t col = half == 0 ? glu_a_col(fc, F, p.glu_layout) : glu_b_col(fc, F, p.glu_layout);
        p.ws_db1[static_cast<int64_t>(t.m_tile) * C + col] = sum;
      }
    }
    named_barrier_sync(kEwBarrier, 32 * kEwWarps);  // the partials are read before the next tile's
  }
}

template <int BN>
__device__ __forceinline__ void epilogue_warps_glu_backward(const KernelParams& p, const Tile& t, int ew, int lane,
                                                            uint8_t* epi) {
  with_glu_backward_kind(p, [&](auto act, auto db1) {
    epilogue_warps_impl<BN, decltype(act)::value, decltype(db1)::value>(p, t, ew, lane, epi);
  });
}

// epi: the epilogue's shared memory (Cfg::kEpiBytes): the two warp groups' stages, then
// (glu_backward) the column sums.
template <class Cfg>
__device__ __forceinline__ Stage epilogue_stage(uint8_t* epi, int cw) {
  return stage_of(epi + cw * (Cfg::kEpi == Epi::glu_backward ? kGluBwdStageBytes : kOutStageBytes));
}

// Work an epilogue starts with the tile's mainloop: glu_backward's first C pass.
template <class Cfg>
__device__ __forceinline__ void epilogue_prefetch(const KernelParams& p, const Tile& t, int cw, int ctid, uint8_t* epi) {
  if constexpr (Cfg::kEpi == Epi::glu_backward) glu_backward_prefetch<Cfg::kBlockN>(p, t, cw, ctid, epilogue_stage<Cfg>(epi, cw));
}

template <class Cfg>
__device__ __forceinline__ void epilogue(const KernelParams& p, const Tile& t, int cw, int ctid,
                                         const float (&acc)[Cfg::kBlockN / 2], uint8_t* epi) {
  constexpr int BN = Cfg::kBlockN;
  const Stage st = epilogue_stage<Cfg>(epi, cw);
  if constexpr (Cfg::kEpi == Epi::store) epilogue_store<BN>(p, t, cw, ctid, acc, st);
  else if constexpr (Cfg::kEpi == Epi::wgrad) epilogue_wgrad<BN>(p, t, cw, ctid, acc, st);
  else if constexpr (Cfg::kEpi == Epi::glu_forward) epilogue_glu_forward<BN, Cfg::kQuantOut>(p, t, cw, ctid, acc, st);
  else
    epilogue_glu_backward<BN, Cfg::kQuantOut>(p, t, cw, ctid, acc,
                                              reinterpret_cast<float*>(epi + 2 * kGluBwdStageBytes), st);
}

}  // namespace mxmoe::cuda::sm90
