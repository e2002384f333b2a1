// Shared staging of the sm90 epilogues: what every epilogue does with a consumer warp group's
// (64, BN) fp32 accumulator before it reaches global memory. Fragment layout of wgmma m64nNk16 (per
// warp group, thread t = 32 w + l):
//   acc[4j + 2h + i] is row 16w + l/4 + 8h, column 8j + 2(l%4) + i     (j < N/8, h, i in {0, 1})
// so a thread owns 2 rows and pairs of adjacent columns (Frag). Every output goes through shared
// memory: each warp group writes its fragments into its own 64-row staging block and copies the
// block out in whole 16-byte chunks, 16 lanes to a 256-byte row piece.
// NOTE: the fragment layout written straight to global memory stores 16 bytes per row per 4 lanes:
// half-sector writes (ncu counted 48% excess sectors). glu_backward also reads the saved C through
// the stage. Semantics as docs/numerics.md and the portable epilogues (same formulas, from
// src/common/glu.h); only the fp32 summation order of partial sums differs between backends.
#pragma once
#include <cstdint>

#include "mxmoe/numerics.h"
#include "src/common/glu.h"
#include "src/cuda/common/mx_tile_quant.cuh"
#include "src/cuda/sm90/params.h"
#include "src/cuda/sm90/tile_scheduler.cuh"
#include "src/cuda/sm90/warp_roles.cuh"

namespace mxmoe::cuda::sm90 {

// A consumer warp group's output stage: 64 rows of 256 bytes (128 bf16 or 64 f32 columns of a pass).
inline constexpr int kOutRowBytes = 256;
inline constexpr int kOutStageBytes = 64 * kOutRowBytes;

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
// Per consumer warp group: 64 rows x kRow bytes (256: 128 bf16 or 64 f32 columns of one pass, or the
// a and b columns of 64 GLU features), 16-byte chunks XOR-swizzled by row % 8 so that the fragment
// writes (8 rows x 16 bytes per instruction) and the row-contiguous chunk reads are both free of
// bank conflicts.
template <int kRow = kOutRowBytes>
__device__ __forceinline__ uint32_t stage_off(int r, int byte_col) {
  return static_cast<uint32_t>(r * kRow + ((((byte_col >> 4) ^ (r & 7))) << 4) + (byte_col & 15));
}

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
      : c(wtid % kChunks),
        r0(wtid / kChunks),
        col((c / o.group) * o.gstride + (c % o.group) * 16),
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

// Fused quantizing epilogue (the mx_a kernels, docs/kernels/sm90_mxfp8.md): the bf16 values staged in
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

// The epilogue interface (gemm_kernel.cuh): kSmemBytes of shared memory after the ring, prefetch()
// issued as the tile's mainloop starts, run() on the finished accumulators; run() ends with the
// stage free again. The epilogues with one output stage per consumer warp group (store, wgrad,
// glu_forward) have nothing to prefetch.
struct OutStageEpilogue {
  static constexpr int kSmemBytes = 2 * kOutStageBytes;
  __device__ __forceinline__ static Stage stage(uint8_t* epi, int cw) { return stage_of(epi + cw * kOutStageBytes); }
  __device__ __forceinline__ static void prefetch(const KernelParams&, const Tile&, int, int, uint8_t*) {}
};

// ---- GLU passes: C (and dC) in passes of kFeat features -------------------------------------
// A pass stages the 2 kFeat columns of C that hold a and b of kFeat features, in C's own column
// order: halves [a f..f+kFeat-1 | b f..] (two pieces, F columns apart), interleave32 [a b a b ...]
// (32 columns each, one contiguous piece). Rows are 4 kFeat bytes: 64 features a pass, forward and
// backward (256-byte rows).
template <int kFeat>
__device__ __forceinline__ OutBlock glu_pass_block(char* c_row_first, int64_t fq, int64_t F, int rows,
                                                   GluLayout layout) {
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

}  // namespace mxmoe::cuda::sm90
