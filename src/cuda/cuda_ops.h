// Device-side steps shared by the CUDA backends. Every function enqueues on `stream`, never
// synchronises the host and never reads group offsets on the host, except check_finite (below),
// which runs only where the caller opted in (Options::check_finite).
#pragma once
#include "src/cuda/common/mx_out.h"
#include "src/cuda/common/workspace.h"
#include "src/dispatch/backend.h"

namespace mxmoe::cuda {

// src/cuda/quant/: MXFP8 quantize (row-wise and column-wise in one pass), dequantize, weights.
void quantize(const QuantizeArgs& a, void* stream);
void dequantize(const DequantizeArgs& a, void* stream);
void quantize_experts(const detail::QuantizeExpertsStep& s, void* stream);
// E dense e4m3 matrices [rows, cols] with their scales ([E, bytes], blocks along cols for `axis` row,
// along rows for col) -> bf16 [E, rows, cols]: bf16(e4m3_to_f32(q) * e8m0_to_f32(s)), the CPU
// reference's dequantized value.
void dequantize_experts(const uint8_t* data, const uint8_t* scales, int64_t experts, int64_t rows, int64_t cols,
                        BlockAxis axis, ScaleLayout layout, uint16_t* dst, void* stream);

// GEMM steps whose GLU outputs are quantized (out_row / out_col, MXFP8 or fp8_block) on kernels
// that write bf16: the step runs with a bf16 output (its own out_bf16, or a transient one of
// staged_output_bytes()) and what it wrote is quantized afterwards, the bytes a fused quantizing
// epilogue would give (docs/numerics.md "Quantized value"). with_bf16_output() takes the transient
// one from `ws` when needed; quantize_outputs(s, bf16) fills s's quantized outputs from it.
bool has_quantized_outputs(const detail::MGemmStep& s);
int64_t staged_output_bytes(const detail::MGemmStep& s);
detail::MGemmStep with_bf16_output(detail::MGemmStep s, Workspace& ws);
void quantize_outputs(const detail::MGemmStep& s, const TensorView& bf16, void* stream);
// The MXFP8 outputs of a step for a kernel whose epilogue quantizes them itself
// (src/cuda/common/mx_tile_quant.cuh): their pointers and layouts, with every scale byte cleared on
// `stream` first (the kernel writes the scales of real blocks only; padding must read 0).
MxOut fused_mx_outputs(const detail::MGemmStep& s, void* stream);

// src/cuda/quant/fp8_block_*.cu: FP8 blockwise (recipe fp8_blockwise). quantize and quantize_experts
// above hand fp8_block outputs to the first two. The GEMM steps on fp8_block operands dequantize them
// to bf16 (exact for power-of-two scales, the only ones the probes let through) and run `bf16_gemm`,
// a backend's BF16 kernel, with the same epilogue; fp8_block activation outputs are quantized from
// the bf16 it wrote.
void quantize_fp8_block(const QuantizeArgs& a, void* stream);
void quantize_experts_fp8_block(const detail::QuantizeExpertsStep& s, void* stream);
void gemm_m_fp8_block(const detail::MGemmStep& s, void* stream, void (*bf16_gemm)(const detail::MGemmStep&, void*));
// E fp8_block weights [rows, cols] (e4m3, f32 scales [E][ceil(rows/128)][ceil(cols/128)]) -> the
// same blocks transposed, [E, cols, rows] and [E][ceil(cols/128)][ceil(rows/128)]: the K-major B
// of a dgrad on FP8 wgmma, which takes K-major operands only.
void transpose_fp8_block_weights(const uint8_t* q, const float* sinv, int64_t experts, int64_t rows, int64_t cols,
                                 uint8_t* qt, float* sinv_t, void* stream);
// Token blocks [T, K] (e4m3, 128-token blocks restarting at every group, groups g) -> [K, tp]: block
// row i (the group schedule's 128-row tile i, the scale row of its scales) at columns
// [128 i, 128 i + 128), rows past the group's end as 0 (padding inside the kernel's view): the
// K-major, whole-block operands of a k-grouped wgrad on FP8 wgmma. tp: a multiple of 16 of at least
// 128 fp8_token_block_tiles(g, T); columns of tiles past the real count are not written.
int64_t fp8_token_block_tiles(const GroupOffsets& g, int64_t rows);
void transpose_token_blocks(const Mxfp8View& v, const GroupOffsets& g, uint8_t* qt, int64_t tp, void* stream);
void gemm_k_fp8_block(const KGroupedGemmArgs& a, void* stream, void (*bf16_gemm)(const KGroupedGemmArgs&, void*));

// src/cuda/common/finite.cu: the first NaN or +-Inf of the step's matrices (nonfinite_code, or
// kAllFinite), by one device pass and one 8-byte copy to the host; synchronises `stream`. An Error
// naming options.check_finite while `stream` is being captured into a CUDA graph.
uint64_t check_finite(const detail::CheckFiniteStep& s, void* stream);

namespace portable {
// src/cuda/portable/: mma.sync grouped GEMMs for any GPU from sm_80.
void gemm_m(const detail::MGemmStep& s, void* stream);
void gemm_k(const KGroupedGemmArgs& a, void* stream);
// Their plans: one configuration, the launches in order and the workspace.
detail::StepPlan plan_gemm_m(const detail::MGemmStep& s);
detail::StepPlan plan_gemm_k(const KGroupedGemmArgs& a);
void fc2_bias_grads(const detail::Fc2BiasGradStep& s, void* stream);
// src/cuda/portable/permute_route*.cu, permute_move.cu, unpermute.cu: token routing (a stable
// counting sort of the top-k ids on the device), the row scatter and the fp32 slot-order gather-sum
// (docs/kernels/permute.md).
void route_tokens(const detail::RouteTokensStep& s, void* stream);
void permute_rows(const PermuteByMapArgs& a, void* stream);
// permute_tokens: route_tokens then permute_rows, the move chained on the routing (sm_90+).
void route_and_permute_rows(const detail::RouteTokensStep& s, const PermuteByMapArgs& a, void* stream);
void unpermute_rows(const UnpermuteArgs& a, void* stream);
}  // namespace portable

}  // namespace mxmoe::cuda
