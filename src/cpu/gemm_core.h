// Building blocks of the CPU reference GEMMs (src/cpu/gemm.cpp): operand decode to fp32, a
// cache-blocked fp32 GEMM, clamped group bounds and the GradOut write rule. Every GEMM in the CPU
// backend goes through these, so an MXFP8 element is decoded and a gradient is written in exactly
// one place.
//
// Determinism: each output element of gemm_f32 is a sequential fp32 sum over k in increasing order,
// computed by one thread; the result does not depend on the thread count or schedule.
#pragma once
#include <cstdint>
#include <vector>

#include "src/dispatch/backend.h"

// NOTE: a nested namespace keeps these helpers apart from the quantizer's (src/cpu/quant.cpp),
// which lives in mxmoe::cpu as well.
namespace mxmoe::cpu::gemm_detail {

inline constexpr int64_t kMicroM = 4;   // rows of one register tile
inline constexpr int64_t kMicroN = 16;  // columns of one register tile

// Below this many element operations a loop runs on one thread: on a loaded machine every OpenMP
// barrier can cost a scheduler time slice, which dwarfs small loops (measured: the unit tests took
// 5.7 s instead of 0.14 s with two busy cores).
inline constexpr int64_t kParallelMinWork = int64_t{1} << 16;
inline bool parallel_worth(int64_t work) { return work >= kParallelMinWork; }

// Padded extents the fp32 GEMM works on: rows to kMicroM, columns to kMicroN (padding is zero).
inline int64_t pad_m(int64_t m) { return (m + kMicroM - 1) / kMicroM * kMicroM; }
inline int64_t pad_n(int64_t n) { return (n + kMicroN - 1) / kMicroN * kMicroN; }

// C[m, n] = (accumulate ? C[m, n] : 0) + sum_{k < kdim} A[m, k] * B[k, n], fp32, row-major.
// m_pad % kMicroM == 0 and n_pad % kMicroN == 0 (callers zero-pad their operands). OpenMP inside.
void gemm_f32(int64_t m_pad, int64_t n_pad, int64_t kdim, const float* a, int64_t lda, const float* b,
              int64_t ldb, float* c, int64_t ldc, bool accumulate);

// Group bounds o[0..E] read from (possibly device-written) offsets, clamped to [0, T] and made
// monotone, so that bad offsets can give wrong numbers but never an out-of-bounds access.
std::vector<int64_t> group_bounds(const GroupOffsets& g, int64_t total_rows);
// The same bounds as the host i32 offsets src/cpu/fp8_block.h takes (0 .. total_rows: the end pinned
// at total_rows, where validated offsets end anyway); empty without offsets (one group).
std::vector<int32_t> fp8_offsets(const GroupOffsets& g, int64_t total_rows);

// First column-wise scale row of every group: s_e = sum_{h<e} colwise_group_scale_rows(m_h).
std::vector<int64_t> colwise_chunk_rows(const std::vector<int64_t>& bounds);

// Rows [t0, t1) of an activation operand [T, K] (bf16, f32 or MXFP8 row-wise) as fp32, row r at
// out + (r - t0) * ld. OpenMP over rows.
void load_rows(const Operand& a, int64_t k, int64_t t0, int64_t t1, float* out, int64_t ld);

// Rows [t0, t1) of a grouped operand [T, cols] (bf16, f32 or MXFP8 column-wise, group-aware) that
// all belong to the group starting at row `group_begin` with `group_rows` rows and scale chunk row
// `chunk_row`, transposed: element (t, i) goes to out[i * ld + (t - t0)]. OpenMP over columns.
void load_group_rows_transposed(const Operand& a, int64_t cols, int64_t group_begin, int64_t group_rows,
                                int64_t chunk_row, int64_t t0, int64_t t1, float* out, int64_t ld);

// Same, not transposed: element (t, i) goes to out[(t - t0) * ld + i].
void load_group_rows(const Operand& a, int64_t cols, int64_t group_begin, int64_t group_rows,
                     int64_t chunk_row, int64_t t0, int64_t t1, float* out, int64_t ld);

// Expert e's weight as fp32 [K, ld] with element (k, n) at out[k * ld + n], whatever its storage:
// [N, K] (b_kn = false; MXFP8 scales row-wise) or [K, N] (b_kn = true; MXFP8 scales column-wise,
// one group). Columns [N, ld) are zeroed. OpenMP inside.
void load_expert_kn(const ExpertOperand& b, int64_t e, int64_t k, int64_t n, bool b_kn, float* out,
                    int64_t ld);

// Element dtype of per-expert matrices (dense tensor's dtype, or the declared per-expert dtype).
DType expert_dtype(const ExpertMatrices& m);

// The GradOut rule for `count` values written at element offset `at` of g.dst:
// f32: dst = v + (accumulate ? dst : 0); bf16: dst = bf16(v).
void write_grad(const detail::GradOut& g, int64_t at, const double* v, int64_t count);

// An empty group's gradient: zeros, or untouched when accumulating.
void write_empty_grad(const detail::GradOut& g, int64_t at, int64_t count);

}  // namespace mxmoe::cpu::gemm_detail
