// Token permute / unpermute (include/mxmoe/permute.h) as torch ops. Every output is allocated
// here; rows and probabilities no slot writes (past offsets[E], or not named by the row_map) are
// zeros, so results are deterministic and the backward ops' untouched rows carry no gradient. An
// absent optional output (permuted_probs without probs, probs without permuted_probs) is an empty
// f32 [0] tensor: schemas return plain Tensors, as grouped_mlp_backward's db1/db2 do.
//
// The library validates every argument (mxmoe::Error naming it) and picks the backend from the
// data's device; on CUDA data today no backend serves the steps (route_tokens, permute_rows,
// unpermute_rows), which surfaces in Python as a RuntimeError naming the step.
#include <algorithm>

#include "layer_ops.h"

namespace mxmoe::torch_ext {

namespace {

at::Tensor no_probs(const at::Tensor& like) { return at::empty({0}, like.options().dtype(at::kFloat)); }

std::optional<at::Tensor> contiguous(const std::optional<at::Tensor>& t) {
  if (t && t->defined()) return t->contiguous();
  return std::nullopt;
}

bool given(const std::optional<at::Tensor>& t) { return t && t->defined(); }

}  // namespace

// What permute_tokens and permute_tokens_mxfp8 share: the checked, contiguous inputs, the routing
// outputs (offsets, row_map, permuted_probs, invalid) and the arguments naming them.
struct PermuteCall {
  at::Tensor x, expert_ids, offsets, row_map, permuted_probs, invalid;
  std::optional<at::Tensor> probs;
  int64_t H = 0, R = 0, E = 0;
  PermuteArgs args;
};
PermuteCall begin_permute(const char* op, const at::Tensor& x_in, const at::Tensor& expert_ids_in,
                          const std::optional<at::Tensor>& probs_in, int64_t experts, int64_t capacity) {
  DeviceCheck(op).add("x", x_in).add("expert_ids", expert_ids_in).add("probs", probs_in).check();
  TORCH_CHECK(x_in.dim() == 2, "mxmoe: ", op, ": x must be [T, H], got shape ", x_in.sizes());
  TORCH_CHECK(expert_ids_in.dim() == 2, "mxmoe: ", op, ": expert_ids must be [T, K], got shape ", expert_ids_in.sizes());
  PermuteCall c;
  c.x = x_in.contiguous();
  c.expert_ids = expert_ids_in.contiguous();
  c.probs = contiguous(probs_in);
  const int64_t T = c.x.size(0), K = c.expert_ids.size(1);
  c.H = c.x.size(1);
  c.R = std::max<int64_t>(0, permuted_rows_bound(T, K, experts, capacity));
  c.E = std::max<int64_t>(experts, 0);
  const at::TensorOptions i32 = c.x.options().dtype(at::kInt);
  c.offsets = at::empty({c.E + 1}, i32);
  c.row_map = at::empty(c.expert_ids.sizes(), i32);
  c.permuted_probs = given(c.probs) ? at::empty({c.R}, c.x.options().dtype(at::kFloat)) : no_probs(c.x);
  c.invalid = at::empty({1}, i32);  // always written by the routing
  PermuteArgs& a = c.args;
  a.x = view(c.x);
  a.expert_ids = view(c.expert_ids);
  a.probs = view(c.probs);
  a.experts = experts;
  a.capacity = capacity;
  a.offsets = view(c.offsets);
  a.row_map = view(c.row_map);
  if (given(c.probs)) a.permuted_probs = view(c.permuted_probs);
  a.invalid = view(c.invalid);
  // Rows past offsets[E] written by the library: zeros for permuted_x (costs nothing when every slot
  // is kept, where a zero fill of R x H would cost as much as the permute; docs/kernels/permute.md),
  // probability 0 for permuted_probs.
  a.zero_unused_rows = true;
  return c;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> permute_tokens(
    const at::Tensor& x_in, const at::Tensor& expert_ids_in, const std::optional<at::Tensor>& probs_in, int64_t experts,
    int64_t capacity) {
  PermuteCall c = begin_permute("permute_tokens", x_in, expert_ids_in, probs_in, experts, capacity);
  at::Tensor permuted_x = at::empty({c.R, c.H}, c.x.options());
  c.args.permuted_x = view(permuted_x);
  CallContext cc(c.x);
  mxmoe::permute_tokens(cc.get(), c.args);
  return {permuted_x, c.offsets, c.row_map, c.permuted_probs, c.invalid};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
permute_tokens_mxfp8(const at::Tensor& x_in, const at::Tensor& expert_ids_in, const std::optional<at::Tensor>& probs_in,
                     int64_t experts, int64_t capacity, bool zero_unused_rows) {
  PermuteCall c = begin_permute("permute_tokens_mxfp8", x_in, expert_ids_in, probs_in, experts, capacity);
  const int64_t R = c.R, H = c.H;
  const at::TensorOptions u8 = c.x.options().dtype(at::kByte), e4m3 = c.x.options().dtype(at::kFloat8_e4m3fn);
  // The library leaves the data rows past offsets[E] untouched: zeroed here when asked (a layer run
  // on all R rows, as the MoE block with a capacity does, reads them as the last group's zero rows).
  // Scales are zeroed: the library writes every byte of a kept row's block, padding as 0.
  at::Tensor x_row = zero_unused_rows ? at::zeros({R, H}, e4m3) : at::empty({R, H}, e4m3);
  at::Tensor x_col = zero_unused_rows ? at::zeros({R, H}, e4m3) : at::empty({R, H}, e4m3);
  at::Tensor x_row_scales = at::zeros({rowwise_scales(R, H)}, u8);
  at::Tensor x_col_scales = at::zeros({colwise_scales(R, H, c.E)}, u8);
  at::Tensor permuted_x;
  if (R == 0) {
    // No rows to quantize (T = 0, or a capacity of 0): a [0, H] bf16 output, so the routing still
    // writes offsets, row_map and invalid.
    permuted_x = at::empty({0, H}, c.x.options());
    c.args.permuted_x = view(permuted_x);
  } else {
    // The layers' scale layout (compact, Options' default): what grouped_mlp_forward_prequantized reads.
    c.args.rowwise = mx_view(x_row, x_row_scales, BlockAxis::row, ScaleLayout::compact);
    c.args.colwise = mx_view(x_col, x_col_scales, BlockAxis::col, ScaleLayout::compact);
  }
  CallContext cc(c.x);
  mxmoe::permute_tokens(cc.get(), c.args);
  return {c.offsets, c.row_map, c.permuted_probs, c.invalid, x_row, x_row_scales, x_col, x_col_scales};
}

std::tuple<at::Tensor, at::Tensor> unpermute_tokens(const at::Tensor& permuted_y_in, const at::Tensor& row_map_in,
                                                    const std::optional<at::Tensor>& permuted_probs_in) {
  DeviceCheck("unpermute_tokens").add("permuted_y", permuted_y_in).add("row_map", row_map_in)
      .add("permuted_probs", permuted_probs_in).check();
  TORCH_CHECK(permuted_y_in.dim() == 2, "mxmoe: unpermute_tokens: permuted_y must be [R, H], got shape ",
              permuted_y_in.sizes());
  TORCH_CHECK(row_map_in.dim() == 2, "mxmoe: unpermute_tokens: row_map must be [T, K], got shape ",
              row_map_in.sizes());
  const at::Tensor permuted_y = permuted_y_in.contiguous(), row_map = row_map_in.contiguous();
  const std::optional<at::Tensor> permuted_probs = contiguous(permuted_probs_in);
  at::Tensor y = at::empty({row_map.size(0), permuted_y.size(1)}, permuted_y.options());
  at::Tensor probs = given(permuted_probs) ? at::empty(row_map.sizes(), permuted_y.options().dtype(at::kFloat))
                                           : no_probs(permuted_y);
  UnpermuteArgs a;
  a.permuted_y = view(permuted_y);
  a.row_map = view(row_map);
  a.permuted_probs = view(permuted_probs);
  a.y = view(y);
  if (given(permuted_probs)) a.probs = view(probs);
  CallContext cc(permuted_y);
  mxmoe::unpermute_tokens(cc.get(), a);
  return {y, probs};
}

std::tuple<at::Tensor, at::Tensor> permute_by_map(const at::Tensor& x_in, const at::Tensor& row_map_in,
                                                  const std::optional<at::Tensor>& probs_in, int64_t rows) {
  DeviceCheck("permute_by_map").add("x", x_in).add("row_map", row_map_in).add("probs", probs_in).check();
  TORCH_CHECK(x_in.dim() == 2, "mxmoe: permute_by_map: x must be [T, H], got shape ", x_in.sizes());
  TORCH_CHECK(rows >= 0, "mxmoe: permute_by_map: rows=", rows, " must be >= 0");
  const at::Tensor x = x_in.contiguous(), row_map = row_map_in.contiguous();
  const std::optional<at::Tensor> probs = contiguous(probs_in);
  // Uninitialized: the library zeroes the rows no slot names (zero_unused_rows), cheaper than a fill.
  at::Tensor permuted_x = at::empty({rows, x.size(1)}, x.options());
  at::Tensor permuted_probs = given(probs) ? at::empty({rows}, x.options().dtype(at::kFloat)) : no_probs(x);
  PermuteByMapArgs a;
  a.x = view(x);
  a.row_map = view(row_map);
  a.probs = view(probs);
  a.permuted_x = view(permuted_x);
  if (given(probs)) a.permuted_probs = view(permuted_probs);
  a.zero_unused_rows = true;
  CallContext cc(x);
  mxmoe::permute_by_map(cc.get(), a);
  return {permuted_x, permuted_probs};
}

}  // namespace mxmoe::torch_ext
