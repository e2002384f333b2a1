// Shared pieces of the CPU GEMM tests: NaN-poisoned outputs, fp64 comparisons, MXFP8 operands made
// by the CPU quantizer and decoded by the CPU dequantizer (so a naive fp64 loop multiplies exactly
// the values a GEMM must multiply), and expert weights in dense and per-expert-pointer layouts.
#pragma once
#include <cstring>
#include <vector>

#include "src/cpu/cpu_ops.h"
#include "support.h"

namespace mxmoe::test {

inline constexpr ScaleLayout kLayouts[] = {ScaleLayout::compact, ScaleLayout::swizzled};
inline constexpr uint8_t kNaNPoison = 0xFF;  // every f32 and bf16 element becomes NaN

inline int64_t total_of(const std::vector<int>& sizes) {
  int64_t t = 0;
  for (int s : sizes) t += s;
  return t;
}
inline std::vector<double> values(const TensorView& v) {
  std::vector<double> out(static_cast<size_t>(v.numel()));
  for (int64_t i = 0; i < v.numel(); ++i) out[i] = value_at(v, i);
  return out;
}
inline HostTensor poisoned(DType t, std::initializer_list<int64_t> shape) {
  HostTensor h(t, shape);
  if (h.numel() > 0) h.poison(kNaNPoison);  // memset on an empty buffer's null pointer is UB
  return h;
}
inline HostTensor f64_tensor(const std::vector<double>& v, std::initializer_list<int64_t> shape) {
  HostTensor h(DType::f64, shape);
  for (size_t i = 0; i < v.size(); ++i) h.ptr<double>()[i] = v[i];
  return h;
}
inline double rel(const TensorView& out, const std::vector<double>& ref,
                  std::initializer_list<int64_t> shape) {
  return rel_error(out, f64_tensor(ref, shape).view);
}
inline std::vector<int64_t> group_of_rows(const std::vector<int>& sizes) {
  std::vector<int64_t> g;
  for (size_t e = 0; e < sizes.size(); ++e)
    g.insert(g.end(), static_cast<size_t>(sizes[e]), static_cast<int64_t>(e));
  return g;
}

// ---- MXFP8 tensors made by the CPU quantizer ----

struct MxTensor {
  HostTensor data, scales;
  BlockAxis axis = BlockAxis::row;
  ScaleLayout layout = ScaleLayout::compact;
  std::vector<double> decoded;  // what the GEMM must multiply
  Mxfp8View view() const { return Mxfp8View{data.view, scales.view, axis, layout}; }
};

// An activation [M, K] quantized along `axis` (column-wise blocks restart at each group).
inline MxTensor quantize_activation(const HostTensor& src, BlockAxis axis, ScaleLayout layout,
                                    const HostTensor& offsets) {
  const int64_t m = src.view.shape[0], k = src.view.shape[1];
  MxTensor r;
  r.axis = axis;
  r.layout = layout;
  r.data = HostTensor(DType::e4m3, {m, k});
  const int64_t experts = offsets.numel() - 1;
  r.scales = HostTensor(
      DType::e8m0, {axis == BlockAxis::row ? rowwise_scale_bytes(m, k) : colwise_scale_bytes(m, k, experts)});
  QuantizeArgs q;
  q.src = src.view;
  q.groups.offsets = offsets.view;
  (axis == BlockAxis::row ? q.rowwise : q.colwise) = r.view();
  cpu::quantize(q);
  HostTensor deq(DType::f32, {m, k});
  cpu::dequantize(DequantizeArgs{r.view(), q.groups, deq.view});
  r.decoded = values(deq.view);
  return r;
}

inline Operand bf16_operand(const HostTensor& t) {
  Operand o;
  o.bf16 = t.view;
  return o;
}
inline Operand mx_operand(const MxTensor& t) {
  Operand o;
  o.mx = t.view();
  return o;
}

// E weight matrices [rows, cols], bf16 or MXFP8 (scales along `axis`), dense and per-expert copies.
struct Weights {
  int64_t experts, rows, cols;
  bool mx;
  ScaleLayout layout;
  HostTensor bf16, q, scales;   // [E, rows, cols] bf16; e4m3 [E, rows, cols]; e8m0 [E, bytes]
  std::vector<double> decoded;  // [E, rows, cols]
  std::vector<HostTensor> data_parts, scale_parts;
  HostTensor data_ptrs, scale_ptrs;  // i64 [E]

  Weights(int64_t e, int64_t r, int64_t c, bool is_mx, BlockAxis axis, ScaleLayout lay, float lo, float hi)
      : experts(e), rows(r), cols(c), mx(is_mx), layout(lay), bf16(random_bf16({e, r, c}, lo, hi)) {
    const int64_t bytes =
        axis == BlockAxis::row ? rowwise_scale_bytes(r, c) : colwise_matrix_scale_bytes(r, c);
    if (mx) {
      q = HostTensor(DType::e4m3, {e, r, c});
      scales = HostTensor(DType::e8m0, {e, bytes});
      detail::QuantizeExpertsStep s;
      s.src.dense = bf16.view;
      s.experts = e;
      s.rows = r;
      s.cols = c;
      s.data = q.view;
      s.scales = scales.view;
      s.axis = axis;
      s.layout = lay;
      cpu::quantize_experts(s);
      decoded.resize(static_cast<size_t>(e * r * c));
      for (int64_t x = 0; x < e; ++x) {
        HostTensor deq(DType::f32, {r, c});
        const Mxfp8View v{TensorView::of(q.ptr<uint8_t>() + x * r * c, DType::e4m3, {r, c}),
                          TensorView::of(scales.ptr<uint8_t>() + x * bytes, DType::e8m0, {bytes}), axis, lay};
        cpu::dequantize(DequantizeArgs{v, {}, deq.view});
        for (int64_t i = 0; i < r * c; ++i) decoded[x * r * c + i] = deq.ptr<float>()[i];
      }
    } else {
      decoded = values(bf16.view);
    }
    // Per-expert copies in separate allocations.
    const HostTensor& data = mx ? q : bf16;
    const int64_t elem = mx ? 1 : 2;
    data_ptrs = HostTensor(DType::i64, {e});
    scale_ptrs = HostTensor(DType::i64, {e});
    data_parts.reserve(static_cast<size_t>(e));
    scale_parts.reserve(static_cast<size_t>(e));
    for (int64_t x = 0; x < e; ++x) {
      data_parts.emplace_back(mx ? DType::e4m3 : DType::bf16, std::initializer_list<int64_t>{r, c});
      std::memcpy(data_parts.back().bytes.data(), data.bytes.data() + x * r * c * elem,
                  static_cast<size_t>(r * c * elem));
      data_ptrs.ptr<int64_t>()[x] = reinterpret_cast<int64_t>(data_parts.back().bytes.data());
      if (mx) {
        scale_parts.emplace_back(DType::e8m0, std::initializer_list<int64_t>{bytes});
        std::memcpy(scale_parts.back().bytes.data(), scales.bytes.data() + x * bytes,
                    static_cast<size_t>(bytes));
        scale_ptrs.ptr<int64_t>()[x] = reinterpret_cast<int64_t>(scale_parts.back().bytes.data());
      }
    }
  }
  Weights(const Weights&) = delete;

  ExpertOperand dense() const {
    ExpertOperand o;
    o.data.dense = mx ? q.view : bf16.view;
    o.data.dtype = mx ? DType::e4m3 : DType::bf16;
    if (mx) o.scales.dense = scales.view;
    o.scales.dtype = DType::e8m0;
    o.layout = layout;
    return o;
  }
  ExpertOperand per_expert() const {
    ExpertOperand o;
    o.data.pointers = data_ptrs.view;
    o.data.dtype = mx ? DType::e4m3 : DType::bf16;
    if (mx) o.scales.pointers = scale_ptrs.view;
    o.scales.dtype = DType::e8m0;
    o.layout = layout;
    return o;
  }
  double at(int64_t e, int64_t r, int64_t c) const { return decoded[(e * rows + r) * cols + c]; }
};

// acc[t, n] = sum_k A[t, k] * B_e(n, k) in fp64. B stored [N, K] or [K, N] (b_kn).
inline std::vector<double> naive_gemm_m(const std::vector<double>& a, const Weights& w,
                                        const std::vector<int>& sizes, int64_t k, int64_t n, bool b_kn) {
  const std::vector<int64_t> group = group_of_rows(sizes);
  std::vector<double> out(group.size() * static_cast<size_t>(n), 0.0);
  for (size_t t = 0; t < group.size(); ++t)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t i = 0; i < k; ++i)
        s += a[t * k + i] * (b_kn ? w.at(group[t], i, j) : w.at(group[t], j, i));
      out[t * n + j] = s;
    }
  return out;
}

}  // namespace mxmoe::test
