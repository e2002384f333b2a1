// Shared pieces of the grouped-GEMM GPU tests (test_gemm_gpu.cpp, test_glu_epilogue_gpu.cpp):
// tensors that live both on the host (for the CPU reference) and on the device (for the kernels),
// MXFP8 operands made by the CPU quantizer, expert weights in dense and per-expert-pointer layouts,
// and comparisons (relative Frobenius error, dequantized MXFP8 outputs, scale agreement).
// CUDA-only; include inside #if defined(MXMOE_WITH_CUDA).
#pragma once
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <vector>

#include "src/cpu/cpu_ops.h"
#include "src/dispatch/backend.h"
#include "tests/gpu_support.h"

namespace mxmoe::test::gg {

inline constexpr uint8_t kPoison = 0xFF;  // f32, bf16 and e4m3 elements all become NaN

inline int64_t total_of(const std::vector<int>& sizes) {
  int64_t t = 0;
  for (int s : sizes) t += s;
  return t;
}

// A tensor with a host copy (CPU reference) and a device copy (kernels).
struct Dual {
  HostTensor h;
  std::unique_ptr<DeviceTensor> d;
  Dual() = default;
  explicit Dual(HostTensor host) : h(std::move(host)), d(std::make_unique<DeviceTensor>(h)) {}
  TensorView hv() const { return h.view; }
  TensorView dv() const { return d->view; }
  HostTensor download() const { return d->download(); }
};

inline Dual poisoned(DType t, std::initializer_list<int64_t> shape) {
  HostTensor h(t, shape);
  if (!h.bytes.empty()) h.poison(kPoison);
  return Dual(h);
}
inline Dual random_bf16_dual(std::initializer_list<int64_t> shape, float lo = -1.f, float hi = 1.f) {
  return Dual(random_bf16(shape, lo, hi));
}
inline Dual random_f32_dual(std::initializer_list<int64_t> shape, float lo = -1.f, float hi = 1.f) {
  return Dual(random_f32(shape, lo, hi));
}

// An activation-like operand [M, K]: bf16, or MXFP8 along `axis` made by the CPU quantizer.
struct Act {
  bool mx = false;
  Dual bf16, data, scales;
  BlockAxis axis = BlockAxis::row;
  ScaleLayout layout = ScaleLayout::compact;

  Act(const HostTensor& src, bool is_mx, BlockAxis ax, ScaleLayout lay, const HostTensor& offsets)
      : mx(is_mx), axis(ax), layout(lay) {
    if (!mx) {
      bf16 = Dual(src);
      return;
    }
    const int64_t m = src.view.shape[0], k = src.view.shape[1], experts = offsets.numel() - 1;
    HostTensor q(DType::e4m3, {m, k});
    HostTensor s(DType::e8m0, {ax == BlockAxis::row ? rowwise_scale_bytes(m, k) : colwise_scale_bytes(m, k, experts)});
    QuantizeArgs qa;
    qa.src = src.view;
    qa.groups.offsets = offsets.view;
    (ax == BlockAxis::row ? qa.rowwise : qa.colwise) = Mxfp8View{q.view, s.view, ax, lay};
    cpu::quantize(qa);
    data = Dual(q);
    scales = Dual(s);
  }
  Operand host() const { return make(false); }
  Operand dev() const { return make(true); }

 private:
  Operand make(bool device) const {
    Operand o;
    if (!mx) {
      o.bf16 = device ? bf16.dv() : bf16.hv();
    } else {
      o.mx = Mxfp8View{device ? data.dv() : data.hv(), device ? scales.dv() : scales.hv(), axis, layout};
    }
    return o;
  }
};

// E weight matrices [rows, cols], bf16 or MXFP8 along `axis`; dense on host and device, and
// per-expert separate device allocations addressed by a device pointer table.
struct ExpertWeights {
  int64_t experts, rows, cols;
  bool mx;
  ScaleLayout layout;
  int64_t scale_bytes = 0;
  Dual data, scales;  // [E, rows, cols]; [E, scale_bytes]
  std::vector<std::unique_ptr<DeviceTensor>> parts, scale_parts;
  std::unique_ptr<DeviceTensor> table, scale_table;

  ExpertWeights(int64_t e, int64_t r, int64_t c, bool is_mx, BlockAxis axis, ScaleLayout lay, float lo = -1.f,
                float hi = 1.f)
      : experts(e), rows(r), cols(c), mx(is_mx), layout(lay) {
    HostTensor src = random_bf16({e, r, c}, lo, hi);
    if (!mx) {
      data = Dual(src);
    } else {
      scale_bytes = axis == BlockAxis::row ? rowwise_scale_bytes(r, c) : colwise_matrix_scale_bytes(r, c);
      HostTensor q(DType::e4m3, {e, r, c}), s(DType::e8m0, {e, scale_bytes});
      detail::QuantizeExpertsStep st;
      st.src.dense = src.view;
      st.experts = e;
      st.rows = r;
      st.cols = c;
      st.data = q.view;
      st.scales = s.view;
      st.axis = axis;
      st.layout = lay;
      cpu::quantize_experts(st);
      data = Dual(q);
      scales = Dual(s);
    }
    const int64_t elem = mx ? 1 : 2;
    HostTensor ptrs(DType::i64, {e}), sptrs(DType::i64, {e});
    for (int64_t x = 0; x < e; ++x) {
      HostTensor part(mx ? DType::e4m3 : DType::bf16, {r, c});
      std::memcpy(part.bytes.data(), data.h.bytes.data() + x * r * c * elem, part.bytes.size());
      parts.push_back(std::make_unique<DeviceTensor>(part));
      ptrs.ptr<int64_t>()[x] = reinterpret_cast<int64_t>(parts.back()->ptr);
      if (mx) {
        HostTensor sp(DType::e8m0, {scale_bytes});
        std::memcpy(sp.bytes.data(), scales.h.bytes.data() + x * scale_bytes, sp.bytes.size());
        scale_parts.push_back(std::make_unique<DeviceTensor>(sp));
        sptrs.ptr<int64_t>()[x] = reinterpret_cast<int64_t>(scale_parts.back()->ptr);
      }
    }
    table = std::make_unique<DeviceTensor>(ptrs);
    scale_table = std::make_unique<DeviceTensor>(sptrs);
  }

  ExpertOperand host() const {
    ExpertOperand o;
    o.data.dense = data.hv();
    o.data.dtype = data.h.view.dtype;
    if (mx) {
      o.scales.dense = scales.hv();
      o.scales.dtype = DType::e8m0;
    }
    o.layout = layout;
    return o;
  }
  ExpertOperand dev(bool per_expert) const {
    ExpertOperand o;
    o.data.dtype = data.h.view.dtype;
    o.layout = layout;
    if (!per_expert) {
      o.data.dense = data.dv();
      if (mx) o.scales.dense = scales.dv(), o.scales.dtype = DType::e8m0;
    } else {
      o.data.pointers = table->view;
      if (mx) o.scales.pointers = scale_table->view, o.scales.dtype = DType::e8m0;
    }
    return o;
  }
};

inline void sync() { cuda_ok(cudaDeviceSynchronize()); }

// Dequantized values (f32 [M, K]) of an MXFP8 tensor, decoded by the CPU dequantizer.
inline HostTensor dequantized(const HostTensor& data, const HostTensor& scales, BlockAxis axis, ScaleLayout layout,
                              const HostTensor& offsets) {
  HostTensor out(DType::f32, {data.view.shape[0], data.view.shape[1]});
  DequantizeArgs d;
  d.src = Mxfp8View{data.view, scales.view, axis, layout};
  if (axis == BlockAxis::col) d.groups.offsets = offsets.view;
  d.dst = out.view;
  cpu::dequantize(d);
  return out;
}

// Fraction of scale bytes that agree.
inline double scale_agreement(const HostTensor& a, const HostTensor& b) {
  if (a.bytes.empty()) return 1.0;
  int64_t same = 0;
  for (size_t i = 0; i < a.bytes.size(); ++i) same += a.bytes[i] == b.bytes[i];
  return static_cast<double>(same) / static_cast<double>(a.bytes.size());
}

}  // namespace mxmoe::test::gg
