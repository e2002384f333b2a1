// Scale factors of cuda_sm100's operands: where each byte of CUTLASS's per-group block-scaled layout
// (Sm1xxBlockScaledConfig<32>: one swizzled matrix of round_up(rows, 128) MN rows by round_up(K-blocks, 4)
// K-blocks per group, every group starting at its own 128 x 4 tile) comes from in mxmoe's layouts
// (include/mxmoe/mxfp8_layout.h). Host+device and free of CUDA headers: the repack kernels
// (grouped_operands.cu) and the prepare kernels (grouped_gemm.cuh) use it, and
// tests/sm100/test_scale_repack.cpp checks it on the CPU against the layout definition.
//
// Every operand's scales are repacked into a workspace per call, whatever their layout: the repack
// writes the padding (rows past a group's end, K-blocks past K / 32) as zero, which mxmoe's own
// buffers do not promise (an E8M0 0xFF there would be a NaN scale inside the tile).
#pragma once
#include <cstdint>

#include "mxmoe/mxfp8_layout.h"

namespace mxmoe::cuda::sm100 {

inline constexpr int kScaleBlock = 32;  // values per E8M0 scale (MXFP8)

// Which of mxmoe's scale tensors an operand's scales come from.
enum class ScaleSource : uint8_t {
  token_rows,   // m-grouped A [T, K], row-wise: one matrix over all T rows (global row index)
  expert_rows,  // m-grouped B_e [N, K], row-wise (fprop): one matrix per expert
  expert_cols,  // m-grouped B_e [K, N], column-wise (dgrad): one matrix per expert
  token_cols,   // k-grouped A [T, M] / B [T, N], column-wise: one chunk per group (wgrad)
};

// ---- where each group's matrix starts in the repacked buffer (the prepare kernels' pointers) ----

// m-grouped A: group g's matrix starts at padded row 128 * tile_start_g, where tile_start_g =
// sum_{h<g} ceil(m_h / 128) (the group schedule's tile_start with 128-row m-tiles); each padded row
// holds rowwise_scale_cols(k) K-blocks.
MXMOE_HD int64_t token_rows_offset(int64_t tile_start, int64_t k) {
  return tile_start * kSwizzleRows * rowwise_scale_cols(k);
}
// Bytes of the repacked m-grouped A scales for any split of t rows into `experts` groups.
MXMOE_HD int64_t token_rows_capacity(int64_t t, int64_t experts, int64_t k) {
  return (ceil_div(t, kSwizzleRows) + experts) * kSwizzleRows * rowwise_scale_cols(k);
}
// m-grouped B_e (N MN rows by K / 32 K-blocks, fprop and dgrad alike): expert e's matrix at
// e * rowwise_scale_bytes(n, k), the same place mxmoe's swizzled row-wise weight scales use.
MXMOE_HD int64_t expert_matrix_offset(int64_t e, int64_t n, int64_t k) { return e * rowwise_scale_bytes(n, k); }
// k-grouped A / B (mn = M or N): group g's chunk at scale row s_g = col_chunk_g, as in mxmoe's own
// column-wise placement (colwise_scale_index), so the buffer is colwise_scale_bytes(t, mn, experts).
MXMOE_HD int64_t token_cols_offset(int64_t col_chunk, int64_t mn) { return col_chunk * colwise_scale_row_bytes(mn); }

// ---- where each byte comes from ----
// Element (i = MN index, j = K-block) of one group's CUTLASS matrix -> byte index in mxmoe's scale
// tensor (relative to the expert's own matrix for the expert_* sources), or -1 for padding (zero).

// m-grouped A: row i of the group whose first global row is `begin` and that has m rows.
MXMOE_HD int64_t token_rows_source(int64_t begin, int64_t m, int64_t i, int64_t j, int64_t k, ScaleLayout layout) {
  return i < m && j < k / kScaleBlock ? rowwise_scale_index(begin + i, j, k, layout) : -1;
}
// m-grouped B_e [N, K] row-wise: row i (an output column) of expert e's matrix.
MXMOE_HD int64_t expert_rows_source(int64_t i, int64_t j, int64_t n, int64_t k, ScaleLayout layout) {
  return i < n && j < k / kScaleBlock ? rowwise_scale_index(i, j, k, layout) : -1;
}
// m-grouped B_e [K, N] column-wise: column i, block j along K, of expert e's matrix (one group of k rows).
MXMOE_HD int64_t expert_cols_source(int64_t i, int64_t j, int64_t n, int64_t k, ScaleLayout layout) {
  return i < n && j < k / kScaleBlock ? colwise_scale_index(0, k, j, i, n, layout) : -1;
}
// k-grouped: column i, local block j of the group with m tokens whose chunk starts at col_chunk.
MXMOE_HD int64_t token_cols_source(int64_t col_chunk, int64_t m, int64_t i, int64_t j, int64_t mn, ScaleLayout layout) {
  return i < mn && j < ceil_div(m, kScaleBlock) ? colwise_scale_index(col_chunk, m, j, i, mn, layout) : -1;
}

// k-grouped: the group whose column-wise chunk holds scale row `row`: the last group whose chunk
// starts at or before it (an empty group shares its start with the next one). The caller checks
// that `row` is inside the chunk (rows past the last chunk belong to no group). Group: any type
// with a col_chunk member (the group schedule's GroupInfo).
template <class Group>
MXMOE_HD int chunk_group(const Group* groups, int experts, int64_t row) {
  int lo = 0, hi = experts - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (groups[mid].col_chunk <= row) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// The repack moves 4-byte words: K-blocks 4q .. 4q+3 of one MN row are 4 consecutive bytes of the
// swizzle (swizzled_scale_index), so each word is one aligned store. c_pad: the matrix's padded K-blocks.
MXMOE_HD int64_t word_offset(int64_t i, int64_t q, int64_t c_pad) {
  return swizzled_scale_index(i, q * kSwizzleCols, c_pad);
}

// One destination word from four source indices (-1: a zero byte), little-endian as the bytes lie.
template <class Src>
MXMOE_HD uint32_t pack_word(const uint8_t* src, Src source_of_block, int64_t q) {
  uint32_t w = 0;
  for (int b = 0; b < kSwizzleCols; ++b) {
    const int64_t at = source_of_block(q * kSwizzleCols + b);
    w |= static_cast<uint32_t>(at < 0 ? 0 : src[at]) << (8 * b);
  }
  return w;
}

}  // namespace mxmoe::cuda::sm100
