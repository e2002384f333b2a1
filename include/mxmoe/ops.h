// The lower-level pieces users also want on their own: MXFP8 quantize/dequantize and the m-grouped
// and k-grouped GEMMs. All of them validate their arguments first (a bad argument throws
// mxmoe::Error and writes nothing) and run on the backend the Context picks for the data's device.
#pragma once
#include "mxmoe/context.h"
#include "mxmoe/groups.h"
#include "mxmoe/tensor.h"

namespace mxmoe {

// E matrices of the same shape [rows, cols]: either one dense [E, rows, cols] tensor or E separate
// row-major matrices whose addresses are in an i64 [E] tensor on the same device as the matrices.
struct ExpertMatrices {
  TensorView dense;     // [E, rows, cols]
  TensorView pointers;  // i64 [E] addresses (per-expert layout)
  DType dtype = DType::bf16;  // element type of the per-expert matrices
  bool per_expert() const { return pointers.data != nullptr; }
};

// A GEMM operand: BF16, or quantized (E4M3 data + scales along the GEMM's reduction axis; MXFP8,
// or FP8 blockwise for the layer's fp8_blockwise recipe).
struct Operand {
  TensorView bf16;  // set for BF16 operands
  Mxfp8View mx;     // set for quantized operands
  bool is_mxfp8() const { return mx.data.data != nullptr; }  // quantized, either format
  bool is_fp8_block() const { return is_mxfp8() && mx.format == QuantFormat::fp8_block; }
};

// Per-expert weight operand of an m-grouped GEMM. For MXFP8, scales of expert e are one matrix's
// worth: rowwise_scale_bytes(N, K) when B_e is [N, K] (row-wise), colwise_matrix_scale_bytes(K, N)
// when B_e is [K, N] (column-wise); dense scales are an e8m0 [E, bytes] tensor.
struct ExpertOperand {
  ExpertMatrices data;    // bf16 or e4m3
  ExpertMatrices scales;  // e8m0, MXFP8 only
  ScaleLayout layout = ScaleLayout::compact;
  // Optional: bf16 [E, rows, cols] holding exactly the dequantized values (MXFP8: data x
  // 2^(scale - 127); fp8_block with power-of-two scales: data x scale_inv; rounded to bf16), which
  // cuda_sm90 reads instead of dequantizing B per call. prepare_weights() fills it
  // (WeightsArgs::bf16_copies); other backends ignore it.
  ExpertMatrices dequantized;
  // fp8_block: 128x128 blocks, scales f32 [E, fp8_weight_scale_count(rows, cols)] of each expert's
  // [rows, cols] as stored (the same copy serves fprop and dgrad); layout unused.
  QuantFormat format = QuantFormat::mxfp8;
  // Optional, fp8_block: the same blocks transposed, e4m3 [E, cols, rows] with f32 scales
  // [E, fp8_weight_scale_count(cols, rows)], which cuda_sm90's FP8-wgmma dgrad reads (it takes K-major
  // operands only) instead of transposing per call. prepare_weights() fills it
  // (WeightsArgs::bf16_copies); other backends ignore it.
  ExpertMatrices transposed, transposed_scales;
  bool is_mxfp8() const { return data.dtype == DType::e4m3 || data.dense.dtype == DType::e4m3; }  // quantized
  bool is_fp8_block() const { return is_mxfp8() && format == QuantFormat::fp8_block; }
};

// ---- MXFP8 quantize / dequantize ----
// src: bf16 [M, K] (K % 32 == 0 for row-wise). Either output may be absent (data == nullptr).
// Column-wise blocks restart at each group's first row when `groups` is given (else one group).
struct QuantizeArgs {
  TensorView src;
  GroupOffsets groups;  // optional
  Mxfp8View rowwise;    // optional output (axis row)
  Mxfp8View colwise;    // optional output (axis col)
  bool pow2_scales = false;  // fp8_block outputs: power-of-two scales (Problem::pow2_scales)
};
MXMOE_API void quantize_mxfp8(Context& ctx, const QuantizeArgs& args);

// dst: f32 or bf16 [M, K]; src axis row or col (col with optional groups).
struct DequantizeArgs {
  Mxfp8View src;
  GroupOffsets groups;  // optional, column-wise only
  TensorView dst;
};
MXMOE_API void dequantize_mxfp8(Context& ctx, const DequantizeArgs& args);

// ---- m-grouped GEMM: D[t, :] = A[t, :] . B_e (+ bias_e) for the rows t of group e ----
// A: [T, K] bf16 or MXFP8 row-wise. B_e: [N, K] (b_kn = false, fprop) or [K, N] (b_kn = true, dgrad).
// D: bf16 or f32 [T, N], fp32 accumulation.
struct MGroupedGemmArgs {
  Operand a;
  GroupOffsets offsets;
  ExpertOperand b;
  bool b_kn = false;
  TensorView bias;  // optional bf16 [E, N]
  TensorView d;
};
MXMOE_API void grouped_gemm_m(Context& ctx, const MGroupedGemmArgs& args);

// ---- k-grouped GEMM: D_e = A_e^T B_e over the group's own rows (the "wgrad" GEMM) ----
// A: [T, M], B: [T, N], bf16 or MXFP8 column-wise (group-aware). D_e: [M, N], f32 with
// beta = accumulate ? 1 : 0, or bf16 (accumulate must be false). Empty groups: D_e = 0 or untouched.
struct KGroupedGemmArgs {
  Operand a;
  Operand b;
  GroupOffsets offsets;
  ExpertMatrices d;
  bool accumulate = false;
};
MXMOE_API void grouped_gemm_k(Context& ctx, const KGroupedGemmArgs& args);

}  // namespace mxmoe
