// Token permute and unpermute: the data movement of a whole MoE block around the grouped MLP
// (docs/numerics.md "Permute and unpermute" says exactly what is computed).
//
//   permute_tokens    x [T, H], top-k expert ids [T, K]  ->  rows sorted by expert [R, H], their
//                     group offsets [E+1] (the grouped MLP's), row_map [T, K], probs in row order
//   unpermute_tokens  rows [R, H], row_map  ->  y[t] = sum over k of rows[row_map[t, k]]
//   permute_by_map    x [T, H], an existing row_map  ->  rows [R, H] (the rows permute_tokens moves)
//
// Backward: permute_tokens' is unpermute_tokens (dx from d_permuted_x, d_probs from
// d_permuted_probs); unpermute_tokens' is permute_by_map (d_permuted_y from dy). All three are
// linear and exact data movement except unpermute's fp32 sum, rounded once to bf16.
//
// The router probabilities are not applied by any of these: the grouped MLP multiplies each row by
// its probability inside the GLU epilogue (docs/numerics.md "Router probabilities"), so a block is
// permute_tokens -> forward(x = permuted_x, offsets, probs = permuted_probs) -> unpermute_tokens.
//
// Every op validates all its arguments first (a bad one throws mxmoe::Error naming it and its
// value, and nothing is written), then runs on the backend the Context picks for the data's device:
// the CPU reference on host data, cuda_portable on any GPU from sm_80 (bit-identical to the CPU, no
// host synchronisation, capturable in a CUDA graph; docs/kernels/permute.md).
#pragma once
#include <cstdint>

#include "mxmoe/context.h"
#include "mxmoe/tensor.h"

namespace mxmoe {

// Rows permute_tokens can keep at most, the rows its permuted_x must have at least: T * K, or
// min(T * K, E * C) with a capacity C >= 0. A buffer of T * K rows always suffices. The arguments
// are checked as permute_tokens checks them (T in [0, 2^31 - 1], K >= 1 with T * K <= 2^31 - 1, E in
// [1, kMaxExperts], C = -1 or in [0, 2^31 - 1]); one out of range throws mxmoe::Error naming it.
MXMOE_API int64_t permuted_rows_bound(int64_t tokens, int64_t top_k, int64_t experts, int64_t capacity);

// Rows are sorted by expert; within an expert by token, then slot. With a capacity C >= 0 each
// expert keeps its first C rows in that order and drops the rest (row_map -1). An expert id outside
// [0, E) is dropped too (it takes no capacity) and counted in `invalid`; this is not an error, on
// the host or on a device, so both give the same outputs (-1 can be used to mask a slot).
// permuted_x has R >= permuted_rows_bound(T, K, E, C) rows; rows offsets[E] .. R-1 are left
// untouched (offsets[E] = T * K when every id is valid and nothing is dropped), or written as zeros
// (permuted_x and permuted_probs) with zero_unused_rows: a fresh output buffer then needs no fill
// of its own, which on a GPU costs as much as the permute (the count offsets[E] stays on the device).
struct PermuteArgs {
  TensorView x;               // bf16 [T, H]
  TensorView expert_ids;      // i32 or i64 [T, K] (torch.topk gives i64), K >= 1, T * K <= 2^31 - 1
  TensorView probs;           // optional f32 [T, K]
  int64_t experts = 0;        // E >= 1
  int64_t capacity = -1;      // C: rows kept per expert; -1 keeps every row
  TensorView offsets;         // out i32 [E+1]: offsets[e+1] - offsets[e] = rows kept for expert e
  TensorView permuted_x;      // out bf16 [R, H]: permuted_x[row_map[t, k]] = x[t] (optional with rowwise / colwise)
  TensorView row_map;         // out i32 [T, K]: the row of (t, k), or -1 when dropped
  TensorView permuted_probs;  // out f32 [R], given exactly when probs is: probs in row order
  TensorView invalid;         // optional out i32 [1]: number of ids outside [0, E)
  bool zero_unused_rows = false;  // also write rows offsets[E] .. R-1 of permuted_x / permuted_probs as 0
  // Optional MXFP8 outputs (quantize fused into the permute, for the grouped MLP's mxfp8 recipe:
  // ForwardArgs::x_row / x_col take them, and forward then runs no quantize of its own). rowwise:
  // e4m3 [R, H] + e8m0 rowwise_scale_bytes(R, H) (H % 32 == 0); colwise: e4m3 [R, H] + e8m0
  // colwise_scale_bytes(R, H, E), 32x1 blocks restarting at each expert's first row (the offsets
  // this call computes, read on the device). Layouts (compact or swizzled) as the views say, format
  // mxfp8. Bytes are those of permute_tokens followed by quantize_mxfp8 of rows 0 .. offsets[E]-1
  // with groups = offsets: data rows offsets[E] .. R-1 are left untouched (whatever
  // zero_unused_rows says: the grouped MLP never reads them), every scale byte that belongs to no
  // block of a kept row is 0, as the standalone quantizer writes padding. With either given,
  // permuted_x may be absent (no bf16 copy is written); R then comes from the quantized data.
  Mxfp8View rowwise;
  Mxfp8View colwise;
};
MXMOE_API void permute_tokens(Context& ctx, const PermuteArgs& args);

// y[t] = sum over k = 0..K-1 of permuted_y[row_map[t, k]], dropped slots (-1) adding nothing, in
// fp32 in slot order, rounded once to bf16 (T = 0 or every slot dropped: +0). Also the backward of
// permute_tokens: dx = unpermute(d_permuted_x) and, with permuted_probs = d_permuted_probs,
// probs = d_probs.
// row_map entries must be -1 or a row of permuted_y (checked on the host; device kernels treat an
// entry outside [-1, R) as dropped, never reading out of bounds).
struct UnpermuteArgs {
  TensorView permuted_y;      // bf16 [R, H]
  TensorView row_map;         // i32 [T, K]
  TensorView permuted_probs;  // optional f32 [R]
  TensorView y;               // out bf16 [T, H]
  TensorView probs;           // out f32 [T, K], given exactly when permuted_probs is:
                              //   probs[t, k] = permuted_probs[row_map[t, k]], 0 when dropped
};
MXMOE_API void unpermute_tokens(Context& ctx, const UnpermuteArgs& args);

// permuted_x[row_map[t, k]] = x[t] (and permuted_probs[row_map[t, k]] = probs[t, k]) for every
// slot that is not dropped; rows no slot maps to are left untouched, or written as zeros (permuted_x
// and permuted_probs) with zero_unused_rows, so a fresh output needs no zero fill of its own (on a
// GPU the rows named are marked as they move, then only the others are zeroed). The rows permute_tokens moves,
// for a routing it already made; also the backward of unpermute_tokens (x = dy, permuted_x =
// d_permuted_y). row_map entries must be -1 or a row of permuted_x, each row at most once (checked
// on the host; as permute_tokens writes it).
struct PermuteByMapArgs {
  TensorView x;               // bf16 [T, H]
  TensorView row_map;         // i32 [T, K]
  TensorView probs;           // optional f32 [T, K]
  TensorView permuted_x;      // out bf16 [R, H]
  TensorView permuted_probs;  // out f32 [R], given exactly when probs is
  bool zero_unused_rows = false;  // also write the rows no slot names as 0
};
MXMOE_API void permute_by_map(Context& ctx, const PermuteByMapArgs& args);

}  // namespace mxmoe
