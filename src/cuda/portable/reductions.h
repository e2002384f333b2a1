// Deterministic reductions that finish the fused epilogues and the FC2 bias gradients: partial sums
// are written per tile into a workspace and summed here in a fixed order (no float atomics).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "src/cuda/portable/schedule.h"

namespace mxmoe::cuda::portable {

// A gradient output (detail::GradOut) as the kernels see it.
struct GradDst {
  void* data = nullptr;
  bool f32 = true;
  bool accumulate = false;
};

// dprobs[t] = sum_{j < parts} ws[j * rows + t] (+ add[t]).
void launch_reduce_dprob(const float* ws, int parts, int64_t rows, const float* add, float* dprobs,
                         cudaStream_t stream);

// dst[e, c] = sum over expert e's block_m-row tiles L (in order) of ws[L * cols + c], written with
// the GradOut rule; an expert without rows gets 0 (f32 accumulate: untouched).
void launch_reduce_expert_tiles(const float* ws, int64_t cols, const GroupInfo* groups, int64_t experts,
                                int block_m, GradDst dst, cudaStream_t stream);

// ws[L * cols + c] = sum over the rows t of tile L of w_t * x[t, c] (w_t = probs[t] or 1); x bf16.
void launch_tile_column_sums(const uint16_t* x, int64_t cols, const Schedule& sched, int block_m,
                             const float* probs, float* ws, cudaStream_t stream);

// out[t] = x[t, :] . bias[e(t), :] for every row of a group (0 elsewhere); x, bias bf16.
void launch_row_bias_dot(const uint16_t* x, int64_t rows, int64_t cols, const GroupInfo* groups, int64_t experts,
                         const uint16_t* bias, float* out, cudaStream_t stream);

}  // namespace mxmoe::cuda::portable
