// The device side of cuda_sm100 as the host entries (gemm.cu) see it, without CUTLASS headers: the
// operands each grouped GEMM's prepare kernel turns into CUTLASS's per-group arguments, one run
// function per heavy translation unit, and the light kernels of grouped_operands.cu. Every function
// enqueues on `stream`, never synchronises and never reads group offsets on the host; a CUTLASS
// status other than success throws mxmoe::Error naming the call.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "src/common/experts.h"
#include "src/cuda/common/group_schedule.h"

namespace mxmoe::cuda::sm100 {

// m-grouped D[t, n] = sum_k A[t, k] B_e(n, k) over the rows t of group e (grouped_gemm.cuh).
struct MGroupedOperands {
  const GroupInfo* groups = nullptr;  // [experts]: rows [begin, end), tile_start with 128-row tiles
  int experts = 0;
  int n = 0, k = 0;
  const uint8_t* a = nullptr;    // e4m3 [T, K]
  const uint8_t* sfa = nullptr;  // repacked: ScaleSource::token_rows (token_rows_offset per group)
  const uint8_t* b = nullptr;    // e4m3 [E, N, K] (fprop) or [E, K, N] (dgrad: the _kn kernel)
  const uint8_t* sfb = nullptr;  // repacked: E matrices at expert_matrix_offset
  uint16_t* d = nullptr;         // bf16 [T, N]
};

// k-grouped D_e = A_e^T B_e over the tokens of group e (wgrad); D_e = 0 (beta 0) or D_e + (beta 1).
struct KGroupedOperands {
  const GroupInfo* groups = nullptr;  // [experts]: rows [begin, end), col_chunk
  int experts = 0;
  int m = 0, n = 0;
  const uint8_t* a = nullptr;    // e4m3 [T, M]
  const uint8_t* sfa = nullptr;  // repacked: ScaleSource::token_cols (token_cols_offset per group)
  const uint8_t* b = nullptr;    // e4m3 [T, N]
  const uint8_t* sfb = nullptr;
  float* d = nullptr;       // f32 [E, M, N]
  bool accumulate = false;  // beta 1: C = D read in the epilogue
};

// The CUTLASS kernels, one per translation unit (about 1.5 min of nvcc each on 2 cores).
void run_mgrouped_1sm(const MGroupedOperands& op, cudaStream_t stream);     // gemm_m_1sm.cu: 128x256x128
void run_mgrouped_kn_1sm(const MGroupedOperands& op, cudaStream_t stream);  // gemm_m_kn_1sm.cu: B_e [K, N]
void run_kgrouped_1sm(const KGroupedOperands& op, cudaStream_t stream);     // gemm_k_1sm.cu: 128x128x128

// ---- grouped_operands.cu: scale repacks (scale_repack.h) and the edges the GEMMs leave ----

// m-grouped A: mxmoe's row-wise scales over T rows -> token_rows_capacity(T, E, k) bytes at `dst`.
// `s` must be built with 128-row m-tiles (its tile table gives each padded row its group).
void repack_token_row_scales(const uint8_t* src, ScaleLayout layout, const GroupSchedule& s, int64_t k, uint8_t* dst,
                             cudaStream_t stream);
// m-grouped B: E expert matrices of row-wise ([N, K], fprop) or column-wise ([K, N], dgrad) scales
// -> E * rowwise_scale_bytes(n, k) bytes at `dst`.
void repack_expert_scales(ExpertPtrs src, BlockAxis axis, ScaleLayout layout, int64_t experts, int64_t n, int64_t k,
                          uint8_t* dst, cudaStream_t stream);
// k-grouped A or B [T, mn]: mxmoe's column-wise group chunks -> colwise_scale_bytes(t, mn, E) bytes.
void repack_token_col_scales(const uint8_t* src, ScaleLayout layout, const GroupSchedule& s, int64_t t, int64_t mn,
                             uint8_t* dst, cudaStream_t stream);
// D_e = 0 for every empty group (the k-grouped kernel schedules none of their tiles: CUTLASS #2674).
void zero_empty_groups(const GroupInfo* groups, int64_t experts, int64_t elems_per_group, float* d,
                       cudaStream_t stream);

}  // namespace mxmoe::cuda::sm100
