// Kernels of the torch ops (registered for CPU and CUDA in registration.cpp; the library picks the
// backend from the tensors' device). Argument order is the schema's.
#pragma once
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bridge.h"

namespace mxmoe::torch_ext {

// ---- layer (layer_ops.cpp) ----
std::tuple<at::Tensor, std::vector<at::Tensor>> grouped_mlp_forward(
    const at::Tensor& x, const at::Tensor& offsets, const at::Tensor& probs, const at::Tensor& w1,
    const std::optional<at::Tensor>& b1, const at::Tensor& w2, const std::optional<at::Tensor>& b2, std::string recipe,
    std::string activation, double limit, double alpha, double linear_offset, std::string glu_layout,
    bool scale_fc2_bias);

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, std::vector<at::Tensor>>
grouped_mlp_backward(const at::Tensor& dy, at::TensorList saved, const std::optional<at::Tensor>& x,
                     const at::Tensor& offsets, const at::Tensor& probs, const at::Tensor& w1,
                     const std::optional<at::Tensor>& b1, const at::Tensor& w2, const std::optional<at::Tensor>& b2,
                     std::string recipe, std::string activation, double limit, double alpha, double linear_offset,
                     std::string glu_layout, bool scale_fc2_bias, bool defer_wgrad);

// `deferred` (mutated) is the caller's deferred-wgrad list, empty unless defer_wgrad: auto-functionalization
// supports mutable list arguments but not list returns on a mutable op.
std::tuple<at::Tensor, at::Tensor> grouped_mlp_backward_(
    const at::Tensor& dy, at::TensorList saved, const std::optional<at::Tensor>& x, const at::Tensor& offsets,
    const at::Tensor& probs, const at::Tensor& w1, const std::optional<at::Tensor>& b1, const at::Tensor& w2,
    const std::optional<at::Tensor>& b2, std::string recipe, std::string activation, double limit, double alpha,
    double linear_offset, std::string glu_layout, bool scale_fc2_bias, bool defer_wgrad, at::Tensor& main_grad_w1,
    at::Tensor& main_grad_w2, const std::optional<at::Tensor>& main_grad_b1,
    const std::optional<at::Tensor>& main_grad_b2, at::TensorList deferred);

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

}  // namespace mxmoe::torch_ext
