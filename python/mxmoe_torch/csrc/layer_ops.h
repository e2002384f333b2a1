// Kernels of the torch ops (registered for CPU and CUDA in registration.cpp; the library picks the
// backend from the tensors' device). Argument order is the schema's.
#pragma once
#include <torch/custom_class.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bridge.h"

namespace mxmoe::torch_ext {

// torch.classes.mxmoe.PreparedWeights: an opaque, reference-counted owner of a mxmoe::PreparedWeights
// (the MXFP8 row- and column-wise copies of W1 and W2, in memory from PyTorch's allocator through
// CallContext, made on the current stream of the weights' device). Python holds it; the layer ops
// take it as an optional last argument and pass it as ForwardArgs::prepared / BackwardArgs::prepared.
// Default-constructed it is empty (what the fake kernel of grouped_mlp_prepare_weights returns): a
// layer op given an empty one fails naming `prepared`.
class PreparedWeightsHolder : public torch::CustomClassHolder {
 public:
  PreparedWeightsHolder() = default;
  PreparedWeightsHolder(PreparedWeights weights, c10::Device device) : weights_(std::move(weights)), device_(device) {}
  int64_t bytes() const { return weights_.bytes(); }
  bool valid() const { return weights_.valid(); }
  std::string device() const { return valid() ? device_.str() : std::string(); }
  // Fake-tensor tracing (opcheck, FakeTensorMode) hands fake kernels this real object: they never read it.
  std::string tracing_mode() const { return "real"; }
  const PreparedWeights* get() const { return &weights_; }

 private:
  PreparedWeights weights_;
  c10::Device device_{c10::kCPU};
};
using Prepared = std::optional<c10::intrusive_ptr<PreparedWeightsHolder>>;

// ---- layer (layer_ops.cpp) ----
// w1 and w2 quantized once for the problem the scalars describe (biases play no part).
c10::intrusive_ptr<PreparedWeightsHolder> grouped_mlp_prepare_weights(const at::Tensor& w1, const at::Tensor& w2,
                                                                      std::string recipe, std::string activation,
                                                                      double limit, double alpha, double linear_offset,
                                                                      std::string glu_layout, bool scale_fc2_bias);

std::tuple<at::Tensor, std::vector<at::Tensor>> grouped_mlp_forward(
    const at::Tensor& x, const at::Tensor& offsets, const at::Tensor& probs, const at::Tensor& w1,
    const std::optional<at::Tensor>& b1, const at::Tensor& w2, const std::optional<at::Tensor>& b2, std::string recipe,
    std::string activation, double limit, double alpha, double linear_offset, std::string glu_layout,
    bool scale_fc2_bias, const Prepared& prepared, bool check_finite);

// Recipe mxfp8 with X pre-quantized (ForwardArgs::x_row / x_col, as permute_tokens_mxfp8 writes
// them): no quantize_x step, no bf16 x. `saved` is [c, a_col, a_col_scales]: the backward's saved
// list is [c, x_col, x_col_scales, a_col, a_col_scales] (the caller keeps x_col for the wgrad).
std::tuple<at::Tensor, std::vector<at::Tensor>> grouped_mlp_forward_prequantized(
    const at::Tensor& x_row, const at::Tensor& x_row_scales, const at::Tensor& x_col, const at::Tensor& x_col_scales,
    const at::Tensor& offsets, const at::Tensor& probs, const at::Tensor& w1, const std::optional<at::Tensor>& b1,
    const at::Tensor& w2, const std::optional<at::Tensor>& b2, std::string recipe, std::string activation,
    double limit, double alpha, double linear_offset, std::string glu_layout, bool scale_fc2_bias,
    const Prepared& prepared, bool check_finite);

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, std::vector<at::Tensor>>
grouped_mlp_backward(const at::Tensor& dy, at::TensorList saved, const std::optional<at::Tensor>& x,
                     const at::Tensor& offsets, const at::Tensor& probs, const at::Tensor& w1,
                     const std::optional<at::Tensor>& b1, const at::Tensor& w2, const std::optional<at::Tensor>& b2,
                     std::string recipe, std::string activation, double limit, double alpha, double linear_offset,
                     std::string glu_layout, bool scale_fc2_bias, bool defer_wgrad, const Prepared& prepared,
                     bool check_finite);

// `deferred` (mutated) is the caller's deferred-wgrad list, empty unless defer_wgrad: auto-functionalization
// supports mutable list arguments but not list returns on a mutable op.
std::tuple<at::Tensor, at::Tensor> grouped_mlp_backward_(
    const at::Tensor& dy, at::TensorList saved, const std::optional<at::Tensor>& x, const at::Tensor& offsets,
    const at::Tensor& probs, const at::Tensor& w1, const std::optional<at::Tensor>& b1, const at::Tensor& w2,
    const std::optional<at::Tensor>& b2, std::string recipe, std::string activation, double limit, double alpha,
    double linear_offset, std::string glu_layout, bool scale_fc2_bias, bool defer_wgrad, at::Tensor& main_grad_w1,
    at::Tensor& main_grad_w2, const std::optional<at::Tensor>& main_grad_b1,
    const std::optional<at::Tensor>& main_grad_b2, at::TensorList deferred, const Prepared& prepared,
    bool check_finite);

std::tuple<at::Tensor, at::Tensor> grouped_mlp_wgrad(const std::optional<at::Tensor>& x,
                                                     const std::optional<at::Tensor>& dy, const at::Tensor& offsets,
                                                     at::TensorList saved_tail, at::TensorList deferred,
                                                     std::string recipe);

void grouped_mlp_wgrad_(const std::optional<at::Tensor>& x, const std::optional<at::Tensor>& dy,
                        const at::Tensor& offsets, at::TensorList saved_tail, at::TensorList deferred,
                        std::string recipe, at::Tensor& main_grad_w1, at::Tensor& main_grad_w2);

// ---- low-level ops (lowlevel_ops.cpp) ----
std::tuple<at::Tensor, at::Tensor> quantize_mxfp8(const at::Tensor& x, std::string axis,
                                                  const std::optional<at::Tensor>& groups, std::string scale_layout);

at::Tensor dequantize_mxfp8(const at::Tensor& data, const at::Tensor& scales, std::string axis,
                            const std::optional<at::Tensor>& groups, std::string scale_layout,
                            std::optional<at::ScalarType> dtype);

at::Tensor grouped_gemm_m(const at::Tensor& a, const std::optional<at::Tensor>& a_scales, const at::Tensor& offsets,
                          const at::Tensor& b, const std::optional<at::Tensor>& b_scales, bool b_kn,
                          const std::optional<at::Tensor>& bias, std::string scale_layout,
                          std::optional<at::ScalarType> dtype);

at::Tensor grouped_gemm_k(const at::Tensor& a, const std::optional<at::Tensor>& a_scales, const at::Tensor& b,
                          const std::optional<at::Tensor>& b_scales, const at::Tensor& offsets,
                          std::string scale_layout, std::optional<at::ScalarType> dtype);

void grouped_gemm_k_(const at::Tensor& a, const std::optional<at::Tensor>& a_scales, const at::Tensor& b,
                     const std::optional<at::Tensor>& b_scales, const at::Tensor& offsets, at::Tensor& out,
                     bool accumulate, std::string scale_layout);

// ---- token permute / unpermute (permute_ops.cpp) ----
// (permuted_x [R, H], offsets [E+1], row_map [T, K], permuted_probs [R] or [0] without probs,
// invalid [1]) with R = permuted_rows_bound(T, K, experts, capacity); rows past offsets[E] are zeros.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> permute_tokens(
    const at::Tensor& x, const at::Tensor& expert_ids, const std::optional<at::Tensor>& probs, int64_t experts,
    int64_t capacity);

// permute_tokens with the rows written as MXFP8 only (PermuteArgs::rowwise / colwise, compact scales,
// column-wise blocks restarting at each expert's first row; no bf16 copy): (offsets, row_map,
// permuted_probs, invalid, x_row [R, H] e4m3, x_row_scales u8, x_col [R, H] e4m3, x_col_scales u8).
// Data rows past offsets[E] are zeros with zero_unused_rows, otherwise uninitialized.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
permute_tokens_mxfp8(const at::Tensor& x, const at::Tensor& expert_ids, const std::optional<at::Tensor>& probs,
                     int64_t experts, int64_t capacity, bool zero_unused_rows);

// (y [T, H], probs [T, K] or [0] without permuted_probs).
std::tuple<at::Tensor, at::Tensor> unpermute_tokens(const at::Tensor& permuted_y, const at::Tensor& row_map,
                                                    const std::optional<at::Tensor>& permuted_probs);

// (permuted_x [rows, H], permuted_probs [rows] or [0] without probs); rows no slot names are zeros.
std::tuple<at::Tensor, at::Tensor> permute_by_map(const at::Tensor& x, const at::Tensor& row_map,
                                                  const std::optional<at::Tensor>& probs, int64_t rows);

}  // namespace mxmoe::torch_ext
