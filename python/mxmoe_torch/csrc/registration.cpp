// Schemas of torch.ops.mxmoe.* and their CPU and CUDA kernels (one kernel each: the library picks
// its backend from the data's device), and the custom class torch.classes.mxmoe.PreparedWeights.
// Fake (meta) kernels for tracing live in Python (mxmoe_torch/_fake.py), where symbolic shapes are
// plain arithmetic.
#include <torch/library.h>

#include "layer_ops.h"
#include "mxmoe/context.h"

namespace {

// The problem scalars every layer op carries after its tensors.
#define MXMOE_LAYER_SCALARS \
  "str recipe, str activation, float limit, float alpha, float linear_offset, str glu_layout, bool scale_fc2_bias"
#define MXMOE_LAYER_INPUTS "Tensor offsets, Tensor probs, Tensor w1, Tensor? b1, Tensor w2, Tensor? b2"
#define MXMOE_PREPARED "__torch__.torch.classes.mxmoe.PreparedWeights"

}  // namespace

TORCH_LIBRARY(mxmoe, m) {
  using mxmoe::torch_ext::PreparedWeightsHolder;
  // mxmoe's own device memory pools (kernel scratch; layer buffers come from torch's allocator) give
  // back the reserved memory no live buffer holds (docs/pytorch.md). No tensors: one kernel for all.
  m.def("release_cached_memory() -> ()", [] { mxmoe::release_cached_memory(); });
  // Registered before the schemas that name it.
  m.class_<PreparedWeightsHolder>("PreparedWeights")
      .def(torch::init<>())
      .def("bytes", &PreparedWeightsHolder::bytes)
      .def("valid", &PreparedWeightsHolder::valid)
      .def("device", &PreparedWeightsHolder::device)
      .def("tracing_mode", &PreparedWeightsHolder::tracing_mode)
      // Identity (FakeTensorMode's dispatch cache compares the arguments it keys on).
      .def("__eq__", [](const c10::intrusive_ptr<PreparedWeightsHolder>& self,
                        const c10::intrusive_ptr<PreparedWeightsHolder>& other) { return self.get() == other.get(); });
  m.def("grouped_mlp_prepare_weights(Tensor w1, Tensor w2, " MXMOE_LAYER_SCALARS ") -> " MXMOE_PREPARED);
  // `prepared` (default None): grouped_mlp_prepare_weights's object for these w1 and w2.
  // `check_finite` (last, default False): Options::check_finite, the inputs (dy in backward) scanned
  // for NaN and Inf before anything is written; on CUDA it synchronises the stream.
  m.def("grouped_mlp_forward(Tensor x, " MXMOE_LAYER_INPUTS ", " MXMOE_LAYER_SCALARS ", " MXMOE_PREPARED
        "? prepared=None, bool check_finite=False) -> (Tensor y, Tensor[] saved)");
  // Recipe mxfp8 with X pre-quantized (permute_tokens_mxfp8's outputs): saved is [c, a_col, a_col_scales];
  // grouped_mlp_backward takes [c, x_col, x_col_scales, a_col, a_col_scales].
  m.def("grouped_mlp_forward_prequantized(Tensor x_row, Tensor x_row_scales, Tensor x_col, Tensor x_col_scales, "
        MXMOE_LAYER_INPUTS ", " MXMOE_LAYER_SCALARS ", " MXMOE_PREPARED
        "? prepared=None, bool check_finite=False) -> (Tensor y, Tensor[] saved)");
  m.def("grouped_mlp_backward(Tensor dy, Tensor[] saved, Tensor? x, " MXMOE_LAYER_INPUTS ", " MXMOE_LAYER_SCALARS
        ", bool defer_wgrad, " MXMOE_PREPARED "? prepared=None, bool check_finite=False) -> (Tensor dx, "
        "Tensor dprobs, Tensor dw1, Tensor dw2, Tensor db1, Tensor db2, Tensor[] deferred)");
  m.def("grouped_mlp_backward_(Tensor dy, Tensor[] saved, Tensor? x, " MXMOE_LAYER_INPUTS ", " MXMOE_LAYER_SCALARS
        ", bool defer_wgrad, Tensor(a!) main_grad_w1, Tensor(b!) main_grad_w2, Tensor(c!)? main_grad_b1, "
        "Tensor(d!)? main_grad_b2, Tensor(e!)[] deferred, " MXMOE_PREPARED "? prepared=None, bool check_finite=False) "
        "-> (Tensor dx, Tensor dprobs)");
  m.def("grouped_mlp_wgrad(Tensor? x, Tensor? dy, Tensor offsets, Tensor[] saved_tail, Tensor[] deferred, "
        "str recipe) -> (Tensor dw1, Tensor dw2)");
  m.def("grouped_mlp_wgrad_(Tensor? x, Tensor? dy, Tensor offsets, Tensor[] saved_tail, Tensor[] deferred, "
        "str recipe, Tensor(a!) main_grad_w1, Tensor(b!) main_grad_w2) -> ()");
  m.def("quantize_mxfp8(Tensor x, str axis, Tensor? groups=None, str scale_layout=\"compact\") "
        "-> (Tensor data, Tensor scales)");
  m.def("dequantize_mxfp8(Tensor data, Tensor scales, str axis, Tensor? groups=None, "
        "str scale_layout=\"compact\", ScalarType? dtype=None) -> Tensor");
  m.def("grouped_gemm_m(Tensor a, Tensor? a_scales, Tensor offsets, Tensor b, Tensor? b_scales, bool b_kn=False, "
        "Tensor? bias=None, str scale_layout=\"compact\", ScalarType? dtype=None) -> Tensor");
  m.def("grouped_gemm_k(Tensor a, Tensor? a_scales, Tensor b, Tensor? b_scales, Tensor offsets, "
        "str scale_layout=\"compact\", ScalarType? dtype=None) -> Tensor");
  m.def("grouped_gemm_k_(Tensor a, Tensor? a_scales, Tensor b, Tensor? b_scales, Tensor offsets, Tensor(o!) out, "
        "bool accumulate, str scale_layout=\"compact\") -> ()");
  // Token permute / unpermute (include/mxmoe/permute.h). An absent optional output is an empty f32 [0].
  m.def("permute_tokens(Tensor x, Tensor expert_ids, Tensor? probs, int experts, int capacity=-1) "
        "-> (Tensor permuted_x, Tensor offsets, Tensor row_map, Tensor permuted_probs, Tensor invalid)");
  // The permute with the rows written as MXFP8 only (row- and column-wise, compact scales; no bf16 copy).
  m.def("permute_tokens_mxfp8(Tensor x, Tensor expert_ids, Tensor? probs, int experts, int capacity=-1, "
        "bool zero_unused_rows=True) -> (Tensor offsets, Tensor row_map, Tensor permuted_probs, Tensor invalid, "
        "Tensor x_row, Tensor x_row_scales, Tensor x_col, Tensor x_col_scales)");
  m.def("unpermute_tokens(Tensor permuted_y, Tensor row_map, Tensor? permuted_probs=None) "
        "-> (Tensor y, Tensor probs)");
  m.def("permute_by_map(Tensor x, Tensor row_map, Tensor? probs, int rows) "
        "-> (Tensor permuted_x, Tensor permuted_probs)");
}

namespace {

void register_kernels(torch::Library& m) {
  using namespace mxmoe::torch_ext;
  m.impl("grouped_mlp_prepare_weights", &grouped_mlp_prepare_weights);
  m.impl("grouped_mlp_forward", &grouped_mlp_forward);
  m.impl("grouped_mlp_forward_prequantized", &grouped_mlp_forward_prequantized);
  m.impl("grouped_mlp_backward", &grouped_mlp_backward);
  m.impl("grouped_mlp_backward_", &grouped_mlp_backward_);
  m.impl("grouped_mlp_wgrad", &grouped_mlp_wgrad);
  m.impl("grouped_mlp_wgrad_", &grouped_mlp_wgrad_);
  m.impl("quantize_mxfp8", &quantize_mxfp8);
  m.impl("dequantize_mxfp8", &dequantize_mxfp8);
  m.impl("grouped_gemm_m", &grouped_gemm_m);
  m.impl("grouped_gemm_k", &grouped_gemm_k);
  m.impl("grouped_gemm_k_", &grouped_gemm_k_);
  m.impl("permute_tokens", &permute_tokens);
  m.impl("permute_tokens_mxfp8", &permute_tokens_mxfp8);
  m.impl("unpermute_tokens", &unpermute_tokens);
  m.impl("permute_by_map", &permute_by_map);
}

}  // namespace

TORCH_LIBRARY_IMPL(mxmoe, CPU, m) { register_kernels(m); }
TORCH_LIBRARY_IMPL(mxmoe, CUDA, m) { register_kernels(m); }
