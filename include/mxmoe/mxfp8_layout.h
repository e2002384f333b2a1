// Where an E8M0 scale lives (docs/numerics.md "Block axes",
// "Scale layouts", "Grouped scale placement"). Host+device, used by the CPU reference,
// the CUDA kernels and the tests, so there is exactly one definition of every scale index.
//
// Row-wise (1x32 blocks along K, the contiguous axis) of an [M, K] tensor: one global matrix
//   S[i = row, j = k/32], padded to [roundup(M,128), roundup(K/32,4)], over all M rows regardless of
//   groups (a group's rows keep their global row index).
// Column-wise (32x1 blocks along M) of a grouped [T, K] tensor: blocks restart at every group's first
//   row, the last block of a group may be partial. Group e owns a chunk of scale rows starting at
//   s_e = sum_{h<e} roundup(ceil(m_h/32), 4), each row roundup(K,128) bytes; inside the chunk the
//   local matrix S[j = local block, i = column] is compact (row-major) or swizzled with MN index = i.
//   A tensor without groups is one group. When every m_e is a multiple of 128 this is TE's layout.
#pragma once
#include <cstdint>

#include "mxmoe/types.h"

namespace mxmoe {

inline constexpr int kSwizzleRows = 128;  // MN extent of one swizzle tile
inline constexpr int kSwizzleCols = 4;    // K-block extent of one swizzle tile (512 bytes per tile)

enum class BlockAxis : uint8_t { row, col };
enum class ScaleLayout : uint8_t { compact, swizzled };

MXMOE_HD int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
MXMOE_HD int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// The cuBLAS / tcgen05 1D block-scaling swizzle ("Scale layouts"): i = MN index, j = K-block index,
// c_pad = roundup(#K-blocks, 4).
MXMOE_HD int64_t swizzled_scale_index(int64_t i, int64_t j, int64_t c_pad) {
  return ((i / 128) * (c_pad / 4) + j / 4) * 512 + (i % 32) * 16 + ((i % 128) / 32) * 4 + (j % 4);
}

// ---- row-wise ----
MXMOE_HD int64_t rowwise_scale_cols(int64_t k) { return round_up(k / 32, kSwizzleCols); }
MXMOE_HD int64_t rowwise_scale_bytes(int64_t m, int64_t k) {
  return round_up(m, kSwizzleRows) * rowwise_scale_cols(k);
}
MXMOE_HD int64_t rowwise_scale_index(int64_t row, int64_t kblock, int64_t k, ScaleLayout layout) {
  const int64_t c_pad = rowwise_scale_cols(k);
  return layout == ScaleLayout::compact ? row * c_pad + kblock
                                        : swizzled_scale_index(row, kblock, c_pad);
}

// ---- column-wise, group-aware ----
MXMOE_HD int64_t colwise_scale_row_bytes(int64_t k) { return round_up(k, kSwizzleRows); }
// Scale rows a group of m tokens occupies (its chunk height).
MXMOE_HD int64_t colwise_group_scale_rows(int64_t m) { return round_up(ceil_div(m, 32), kSwizzleCols); }
// Upper bound of sum_e colwise_group_scale_rows(m_e) over any split of T tokens into E groups.
MXMOE_HD int64_t colwise_scale_rows_capacity(int64_t t, int64_t experts) {
  return ceil_div(t, 32) + 4 * experts;
}
MXMOE_HD int64_t colwise_scale_bytes(int64_t t, int64_t k, int64_t experts) {
  return colwise_scale_rows_capacity(t, experts) * colwise_scale_row_bytes(k);
}
// Byte index of the scale of (local block j, column i) of a group whose chunk starts at scale row
// `chunk_row` (= s_e) and that has m tokens.
MXMOE_HD int64_t colwise_scale_index(int64_t chunk_row, int64_t m, int64_t j, int64_t i, int64_t k,
                                     ScaleLayout layout) {
  const int64_t row_bytes = colwise_scale_row_bytes(k);
  const int64_t base = chunk_row * row_bytes;
  return layout == ScaleLayout::compact
             ? base + j * row_bytes + i
             : base + swizzled_scale_index(i, j, colwise_group_scale_rows(m));
}
// Scale bytes of one ungrouped [m, k] matrix quantized column-wise (a weight: one group).
MXMOE_HD int64_t colwise_matrix_scale_bytes(int64_t m, int64_t k) {
  return colwise_group_scale_rows(m) * colwise_scale_row_bytes(k);
}

}  // namespace mxmoe
