// FP8 blockwise (recipe fp8_blockwise, DeepSeek-V3 / TransformerEngine Float8BlockScaling): E4M3
// data with one fp32 scale per block of 128 values (activations 1x128 along K, the wgrad operands
// 128x1 along tokens restarting at each group, weights 128x128). docs/numerics.md "FP8 blockwise".
// Host and device, so the CPU reference and the kernels evaluate the same rule.
#pragma once
#include <cstdint>

#include "mxmoe/mxfp8_layout.h"
#include "mxmoe/numerics.h"

namespace mxmoe {

inline constexpr int kFp8Block = 128;  // values (or rows x columns) sharing one fp32 scale

// The quantization multiplier of a block whose amax (NaN skipped, amax_update) is `amax`: the
// rule of TransformerEngine's compute_scale_from_amax with epsilon 0. s = 448 / amax, one IEEE
// division rounded to nearest; amax 0 or +Inf gives 1 (an all-zero block, or one holding an Inf,
// which fp8_block_encode stores as NaN); a quotient that overflows (amax below 448 / FLT_MAX) gives
// FLT_MAX. pow2: s's mantissa cleared, i.e. rounded down to a power of two, so that scaling and
// its inverse are exact.
MXMOE_HD float fp8_block_scale(float amax, bool pow2) {
  const uint32_t a = f32_bits(amax) & 0x7fffffffu;
  if (a == 0 || a >= 0x7f800000u) return 1.0f;  // 0, Inf (and NaN, which amax_update never gives)
  float s = kE4m3Max / amax;
  if ((f32_bits(s) & 0x7fffffffu) == 0x7f800000u) s = f32_from_bits(0x7f7fffffu);  // FLT_MAX
  if (pow2) s = f32_from_bits(f32_bits(s) & 0xff800000u);
  return s;
}

// What is stored beside the data and multiplies it back: fp32(1 / s), rounded to nearest (exact
// for pow2 scales).
MXMOE_HD float fp8_block_scale_inv(float s) { return 1.0f / s; }

// One value: q = E4M3(fp32(x * s)) (round to nearest even, saturating finite values at +-448);
// decoded, fp32(e4m3(q) * s_inv). Non-finite values stay non-finite (docs/numerics.md "Non-finite
// values"): NaN stays NaN with its sign, and +-Inf, which E4M3 cannot hold, becomes NaN with its
// sign rather than a finite +-448 (an overflow is never hidden). Both bypass the multiply: x86 keeps
// a NaN operand's sign through it, a GPU returns the canonical +NaN, and the bytes must not depend
// on which machine quantized.
MXMOE_HD uint8_t fp8_block_encode(float x, float s) {
  const uint32_t u = f32_bits(x);
  if ((u & 0x7fffffffu) >= 0x7f800000u) return static_cast<uint8_t>(((u >> 24) & 0x80u) | kE4m3NaN);
  return e4m3_from_f32(x * s);
}
MXMOE_HD float fp8_block_decode(uint8_t q, float s_inv) {
  return (q & 0x7fu) == 0x7fu ? e4m3_to_f32(q) : e4m3_to_f32(q) * s_inv;
}

// ---- where the scales live (fp32) ----
// Row-wise activations [T, K] (1x128 along K): MN-major [ceil(K/128)][roundup(T, 4)], the layout a
// kernel loads a k-block's 128 row scales from with one 16-byte-aligned TMA box; padding is 0.
MXMOE_HD int64_t fp8_rowwise_pitch(int64_t rows) { return round_up(rows, 4); }
MXMOE_HD int64_t fp8_rowwise_scale_count(int64_t rows, int64_t k) {
  return ceil_div(k, kFp8Block) * fp8_rowwise_pitch(rows);
}
MXMOE_HD int64_t fp8_rowwise_scale_index(int64_t row, int64_t kb, int64_t rows) {
  return kb * fp8_rowwise_pitch(rows) + row;
}
// Token blocks [T, K] (128x1 along the tokens, per group): [block rows][K], group e's blocks from
// block row b_e = sum_{h<e} ceil(m_h / 128); at most ceil(T / 128) + E block rows.
MXMOE_HD int64_t fp8_token_block_rows(int64_t group_rows) { return ceil_div(group_rows, kFp8Block); }
MXMOE_HD int64_t fp8_token_block_rows_capacity(int64_t rows, int64_t experts) {
  return ceil_div(rows, kFp8Block) + experts;
}
// Weights [E, N, K] (128x128): [E][ceil(N/128)][ceil(K/128)]; the same scales serve fprop (reducing
// over K) and dgrad (over N).
MXMOE_HD int64_t fp8_weight_scale_count(int64_t n, int64_t k) {
  return ceil_div(n, kFp8Block) * ceil_div(k, kFp8Block);
}

}  // namespace mxmoe
