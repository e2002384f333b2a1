// The low-level mxmoe entry points (ops.h) as torch ops. MXFP8 tensors travel as pairs: data
// float8_e4m3fn [M, K] (never transposed) and scales uint8 (E8M0 bytes) in the library's layout:
// row-wise rowwise_scale_bytes(M, K), column-wise colwise_scale_bytes(M, K, groups), weights [E, bytes].
// Scale buffers start zeroed, so bytes a kernel leaves alone (capacity rows) are deterministic.
#include "layer_ops.h"

namespace mxmoe::torch_ext {

namespace {

int64_t group_count(const std::optional<at::Tensor>& groups) {
  return groups && groups->defined() ? groups->size(0) - 1 : 1;
}

GroupOffsets groups_view(const std::optional<at::Tensor>& groups) {
  GroupOffsets g;
  if (groups && groups->defined()) g.offsets = view(*groups);
  return g;
}

bool is_mx(const at::Tensor& t) { return t.scalar_type() == at::kFloat8_e4m3fn; }

Operand operand(const at::Tensor& t, const std::optional<at::Tensor>& scales, BlockAxis axis, ScaleLayout layout,
                const char* name) {
  if (!is_mx(t)) return Operand{view(t), {}};
  TORCH_CHECK(scales && scales->defined(), "mxmoe: ", name, " is float8_e4m3fn, so ", name, "_scales must be given");
  return Operand{{}, mx_view(t, *scales, axis, layout)};
}

ExpertOperand expert_operand(const at::Tensor& b, const std::optional<at::Tensor>& scales, ScaleLayout layout) {
  ExpertOperand o;
  o.data.dense = view(b);
  o.data.dtype = o.data.dense.dtype;
  o.layout = layout;
  if (is_mx(b)) {
    TORCH_CHECK(scales && scales->defined(), "mxmoe: b is float8_e4m3fn, so b_scales must be given");
    o.scales.dense = view(*scales, DType::e8m0);
    o.scales.dtype = DType::e8m0;
  }
  return o;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> quantize_mxfp8(const at::Tensor& x_in, std::string axis_name,
                                                  const std::optional<at::Tensor>& groups,
                                                  std::string scale_layout) {
  DeviceCheck("quantize_mxfp8").add("x", x_in).add("groups", groups).check();
  const at::Tensor x = x_in.contiguous();
  TORCH_CHECK(x.dim() == 2, "mxmoe: quantize_mxfp8 takes [M, K], got ", x.sizes());
  const BlockAxis axis = parse_axis(axis_name);
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t bytes = axis == BlockAxis::row ? rowwise_scales(M, K) : colwise_scales(M, K, group_count(groups));
  at::Tensor data = at::empty({M, K}, x.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor scales = at::zeros({bytes}, x.options().dtype(at::kByte));
  if (M == 0) return {data, scales};
  QuantizeArgs a;
  a.src = view(x);
  a.groups = groups_view(groups);
  (axis == BlockAxis::row ? a.rowwise : a.colwise) = mx_view(data, scales, axis, parse_layout(scale_layout));
  CallContext cc(x);
  mxmoe::quantize_mxfp8(cc.get(), a);
  return {data, scales};
}

at::Tensor dequantize_mxfp8(const at::Tensor& data, const at::Tensor& scales, std::string axis,
                            const std::optional<at::Tensor>& groups, std::string scale_layout,
                            std::optional<at::ScalarType> dtype) {
  DeviceCheck("dequantize_mxfp8").add("data", data).add("scales", scales).add("groups", groups).check();
  TORCH_CHECK(data.dim() == 2, "mxmoe: dequantize_mxfp8 takes data [M, K], got ", data.sizes());
  at::Tensor out = at::empty(data.sizes(), data.options().dtype(dtype.value_or(at::kFloat)));
  if (data.size(0) == 0) return out;
  // The contiguous copies live as long as the views into them (a temporary would be freed before the call).
  const at::Tensor src = data.contiguous(), src_scales = scales.contiguous();
  DequantizeArgs a;
  a.src = mx_view(src, src_scales, parse_axis(axis), parse_layout(scale_layout));
  a.groups = groups_view(groups);
  a.dst = view(out);
  CallContext cc(data);
  mxmoe::dequantize_mxfp8(cc.get(), a);
  return out;
}

at::Tensor grouped_gemm_m(const at::Tensor& a_in, const std::optional<at::Tensor>& a_scales, const at::Tensor& offsets,
                          const at::Tensor& b_in, const std::optional<at::Tensor>& b_scales, bool b_kn,
                          const std::optional<at::Tensor>& bias, std::string scale_layout,
                          std::optional<at::ScalarType> dtype) {
  DeviceCheck("grouped_gemm_m").add("a", a_in).add("a_scales", a_scales).add("offsets", offsets).add("b", b_in)
      .add("b_scales", b_scales).add("bias", bias).check();
  const at::Tensor a = a_in.contiguous(), b = b_in.contiguous();
  TORCH_CHECK(a.dim() == 2 && b.dim() == 3, "mxmoe: grouped_gemm_m takes a [T, K] and b [E, N, K] or [E, K, N]");
  const int64_t T = a.size(0), N = b_kn ? b.size(2) : b.size(1);
  at::Tensor d = at::empty({T, N}, a.options().dtype(dtype.value_or(at::kBFloat16)));
  if (T == 0) return d;
  const ScaleLayout layout = parse_layout(scale_layout);
  MGroupedGemmArgs g;
  g.a = operand(a, a_scales, BlockAxis::row, layout, "a");
  g.offsets.offsets = view(offsets);
  g.b = expert_operand(b, b_scales, layout);
  g.b_kn = b_kn;
  g.bias = view(bias);
  g.d = view(d);
  CallContext cc(a);
  mxmoe::grouped_gemm_m(cc.get(), g);
  return d;
}

void grouped_gemm_k_(const at::Tensor& a_in, const std::optional<at::Tensor>& a_scales, const at::Tensor& b_in,
                     const std::optional<at::Tensor>& b_scales, const at::Tensor& offsets, at::Tensor& out,
                     bool accumulate, std::string scale_layout) {
  DeviceCheck("grouped_gemm_k_").add("a", a_in).add("a_scales", a_scales).add("b", b_in).add("b_scales", b_scales)
      .add("offsets", offsets).add("out", out).check();
  const at::Tensor a = a_in.contiguous(), b = b_in.contiguous();
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2, "mxmoe: grouped_gemm_k takes a [T, M] and b [T, N]");
  if (a.size(0) == 0) {  // no rows: D_e = 0, or unchanged when accumulating
    if (!accumulate) out.zero_();
    return;
  }
  const ScaleLayout layout = parse_layout(scale_layout);
  KGroupedGemmArgs g;
  g.a = operand(a, a_scales, BlockAxis::col, layout, "a");
  g.b = operand(b, b_scales, BlockAxis::col, layout, "b");
  g.offsets.offsets = view(offsets);
  g.d.dense = view(out);
  g.d.dtype = g.d.dense.dtype;
  g.accumulate = accumulate;
  CallContext cc(a);
  mxmoe::grouped_gemm_k(cc.get(), g);
}

at::Tensor grouped_gemm_k(const at::Tensor& a, const std::optional<at::Tensor>& a_scales, const at::Tensor& b,
                          const std::optional<at::Tensor>& b_scales, const at::Tensor& offsets,
                          std::string scale_layout, std::optional<at::ScalarType> dtype) {
  DeviceCheck("grouped_gemm_k").add("a", a).add("a_scales", a_scales).add("b", b).add("b_scales", b_scales)
      .add("offsets", offsets).check();
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2, "mxmoe: grouped_gemm_k takes a [T, M] and b [T, N]");
  at::Tensor d = at::empty({offsets.size(0) - 1, a.size(1), b.size(1)}, a.options().dtype(dtype.value_or(at::kFloat)));
  grouped_gemm_k_(a, a_scales, b, b_scales, offsets, d, /*accumulate=*/false, std::move(scale_layout));
  return d;
}

}  // namespace mxmoe::torch_ext
