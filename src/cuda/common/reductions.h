// Deterministic reductions that finish the fused GEMM epilogues and the FC2 bias gradients of the
// CUDA backends: partial sums are written per tile into a workspace and summed here in a fixed
// order (no float atomics), over the m-tiles of a group schedule (group_schedule.h).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "src/cuda/common/group_schedule.h"

namespace mxmoe::cuda {

// A gradient output (detail::GradOut) as the kernels see it.
struct GradDst {
  void* data = nullptr;
  bool f32 = true;
  bool accumulate = false;
};

// dprobs[t] = sum_{j < parts} ws[j * rows + t] (+ add[t]).
void launch_reduce_dprob(const float* ws, int parts, int64_t rows, const float* add, float* dprobs,
                         cudaStream_t stream);

// dst[e, c] = sum over expert e's m-tiles L (in order) of ws[L * cols + c], written with the
// GradOut rule; an expert without rows gets 0 (f32 accumulate: untouched). sched: built with tiles.
void launch_reduce_expert_tiles(const float* ws, int64_t cols, const GroupSchedule& sched, GradDst dst,
                                cudaStream_t stream);

// ws[L * cols + c] = sum over the rows t of m-tile L of w_t * x[t, c] (w_t = probs[t] or 1); x bf16
// [T, cols], cols even. sched: built with tiles.
void launch_tile_column_sums(const uint16_t* x, int64_t cols, const GroupSchedule& sched, const float* probs,
                             float* ws, cudaStream_t stream);

// out[t] = x[t, :] . bias[e(t), :] for every row of a group (0 elsewhere); x, bias bf16, cols % 8 == 0.
void launch_row_bias_dot(const uint16_t* x, int64_t rows, int64_t cols, const GroupSchedule& sched,
                         const uint16_t* bias, float* out, cudaStream_t stream);

}  // namespace mxmoe::cuda
