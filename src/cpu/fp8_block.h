// CPU reference FP8-blockwise quantize / dequantize (docs/numerics.md "FP8 blockwise"): the
// statement of the recipe's numerics that the layer steps and kernels of recipe fp8_blockwise are
// checked against. Host pointers, row-major; bf16 in, e4m3 + fp32 inverse scales out
// (src/common/fp8_block.h: scale rule and where the scales live). Every argument is checked before
// anything is written (Error naming it); every scale slot, padding included, is written.
// Run: <build>/tests/mxmoe_unit_tests --gtest_filter='Fp8Block*'
#pragma once
#include <cstdint>

namespace mxmoe::cpu {

// Activations [rows, k], 1x128 blocks along k: q [rows, k]; scale_inv MN-major,
// fp8_rowwise_scale_count(rows, k) floats.
void fp8_quantize_rows(const uint16_t* x, int64_t rows, int64_t k, bool pow2, uint8_t* q, float* scale_inv);
void fp8_dequantize_rows(const uint8_t* q, const float* scale_inv, int64_t rows, int64_t k, float* out);

// The wgrad operands [rows, k], 128x1 blocks along the rows (tokens) restarting at every group's
// first row (offsets: experts + 1 ascending values from 0 to rows, host memory; nullptr: one
// group). q [rows, k] (not transposed); scale_inv [block rows][k] with group e's block rows from
// sum_{h<e} ceil(m_h / 128); scale_rows: the rows scale_inv has room for (at least the sum over
// the groups; fp8_token_block_rows_capacity(rows, experts) always is). Rows past the last group's
// block rows are written as 0. Returns the block rows used.
int64_t fp8_quantize_token_blocks(const uint16_t* x, int64_t rows, int64_t k, const int32_t* offsets, int64_t experts,
                                  bool pow2, uint8_t* q, float* scale_inv, int64_t scale_rows);
void fp8_dequantize_token_blocks(const uint8_t* q, const float* scale_inv, int64_t rows, int64_t k,
                                 const int32_t* offsets, int64_t experts, float* out);

// Weights [experts, n, k], 128x128 blocks: q [experts, n, k]; scale_inv
// [experts][ceil(n/128)][ceil(k/128)].
void fp8_quantize_weights(const uint16_t* w, int64_t experts, int64_t n, int64_t k, bool pow2, uint8_t* q,
                          float* scale_inv);
void fp8_dequantize_weights(const uint8_t* q, const float* scale_inv, int64_t experts, int64_t n, int64_t k,
                            float* out);

}  // namespace mxmoe::cpu

namespace mxmoe::cpu {

// ---- GEMMs on FP8-blockwise operands (docs/numerics.md "FP8 blockwise", GEMM rule) ----
// Per 128-wide block of the reduction axis: the partial sum of the exact E4M3 products in fp32
// (ascending index), then acc = fma(partial, fp32(s_inv_a * s_inv_b), acc), blocks in ascending
// order; acc starts at 0. Groups: offsets (experts + 1 ascending values from 0 to rows, host).
//
// fprop: D[t, n] = A[t, :] . W_e[n, :] for t in group e; A [rows, k] row-wise (fp8_quantize_rows),
//        W [experts, n, k] (fp8_quantize_weights); D fp32 [rows, n].
void fp8_gemm_fprop(const uint8_t* qa, const float* sa, int64_t rows, int64_t k, const uint8_t* qw, const float* sw,
                    int64_t experts, int64_t n, const int32_t* offsets, float* d);
// dgrad: D[t, c] = sum_j G[t, j] W_e[j, c] for t in group e; G [rows, n] row-wise (blocks along n),
//        W [experts, n, k] (its 128x128 blocks: block (j/128, c/128)); D fp32 [rows, k].
void fp8_gemm_dgrad(const uint8_t* qg, const float* sg, int64_t rows, int64_t n, const uint8_t* qw, const float* sw,
                    int64_t experts, int64_t k, const int32_t* offsets, float* d);
// wgrad: D_e[i, j] = sum_{t in group e} A[t, i] B[t, j]; A [rows, m] and B [rows, n] in token blocks
//        (fp8_quantize_token_blocks, same offsets); D fp32 [experts, m, n]; an empty group gives 0.
void fp8_gemm_wgrad(const uint8_t* qa, const float* sa, int64_t m, const uint8_t* qb, const float* sb, int64_t n,
                    int64_t rows, const int32_t* offsets, int64_t experts, float* d);

}  // namespace mxmoe::cpu
