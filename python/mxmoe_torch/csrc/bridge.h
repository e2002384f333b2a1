// Between torch tensors and mxmoe views: dtype/device mapping, a Context per call that runs on the
// current stream and takes its memory from PyTorch's allocator, and the problem scalars every layer
// op carries in its schema.
//
// dtypes: bf16 <-> at::kBFloat16, f32 <-> kFloat, e4m3 <-> kFloat8_e4m3fn, e8m0 scales <-> kByte
// (or kFloat8_e8m0fnu), offsets i32 <-> kInt, pointer tables i64 <-> kLong.
#pragma once
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mxmoe/mxmoe.h"

namespace mxmoe::torch_ext {

mxmoe::DType dtype_of(const at::Tensor& t);
mxmoe::Device mx_device(const at::Tensor& t);

// A contiguous tensor of rank 1..3 as a view; `as` overrides the dtype (uint8 scales -> e8m0).
TensorView view(const at::Tensor& t, std::optional<DType> as = std::nullopt);
// Empty view for an absent optional tensor.
TensorView view(const std::optional<at::Tensor>& t);
Mxfp8View mx_view(const at::Tensor& data, const at::Tensor& scales, BlockAxis axis, ScaleLayout layout);

// Every tensor argument of an op on one device, the first one given's (x for the layer ops); a
// mismatch (CPU data with CUDA offsets, ...) is an error naming each tensor and its device. Absent
// optionals are skipped; a list's tensors are named name[i]. Meta tensors never reach these
// kernels: the dispatcher sends any call with one to the fake kernel, which checks the same
// (mxmoe_torch/_checks.py).
//   DeviceCheck("grouped_gemm_m").add("a", a).add("offsets", offsets).add("bias", bias).check();
class DeviceCheck {
 public:
  explicit DeviceCheck(const char* op) : op_(op) {}
  DeviceCheck& add(const std::string& name, const at::Tensor& t);
  DeviceCheck& add(const std::string& name, const std::optional<at::Tensor>& t);
  DeviceCheck& add(const std::string& name, at::TensorList list);
  void check() const;

 private:
  const char* op_;
  std::vector<std::pair<std::string, c10::Device>> seen_;
};

ScaleLayout parse_layout(const std::string& s);
BlockAxis parse_axis(const std::string& s);

// The problem scalars of the layer ops' schemas, in schema order.
struct LayerScalars {
  std::string recipe;
  std::string activation;
  double limit = 7.0;
  double alpha = 1.702;
  double linear_offset = 1.0;
  std::string glu_layout;
  bool scale_fc2_bias = false;
};
// H, F, E from w1 [E, 2F, H]; the biases' presence sets fc1_bias / fc2_bias.
Problem make_problem(const at::Tensor& w1, bool fc1_bias, bool fc2_bias, const LayerScalars& s);
// A saved column-wise pair (data, scales) of a quantized recipe: MXFP8 (uint8 e8m0 scales, compact)
// or FP8 blockwise (float32 scales).
Mxfp8View colwise_view(const at::Tensor& data, const at::Tensor& scales);
// recipe and pow2_scales from the ops' recipe string: "bf16", "mxfp8", "fp8_blockwise" or
// "fp8_blockwise_pow2" (fp8_blockwise with power-of-two scales).
void set_recipe(Problem& p, const std::string& s);

// The saved list of grouped_mlp_forward: [c, a] (bf16) or [c, x_col, x_col_scales, a_col,
// a_col_scales] (mxfp8). The wgrad ops take it without c.
std::vector<at::Tensor> empty_saved(const Problem& p, int64_t tokens, const at::TensorOptions& like);
StateBuffers saved_buffers(const Problem& p, at::TensorList saved);
// The deferred-backward list: [dc] (bf16) or [dy_col, dy_col_scales, dc_col, dc_col_scales] (mxfp8).
std::vector<at::Tensor> empty_deferred(const Problem& p, int64_t tokens, const at::TensorOptions& like);
void add_deferred_buffers(StateBuffers& into, const Problem& p, at::TensorList deferred);

// One library call's Context: on `like`'s device (guarded), the current stream there, PyTorch's
// allocator (the CUDA caching allocator on that stream, so capture into a CUDA graph works);
// check_finite: Options::check_finite.
class CallContext {
 public:
  explicit CallContext(const at::Tensor& like, bool check_finite = false);
  Context& get() { return ctx_; }

 private:
  c10::OptionalDeviceGuard guard_;
  Context ctx_;
};

// Bytes of scale tensors (mxfp8_layout.h), for output allocation here and in the fake kernels.
int64_t rowwise_scales(int64_t rows, int64_t cols);
int64_t colwise_scales(int64_t rows, int64_t cols, int64_t groups);

}  // namespace mxmoe::torch_ext
