#include "bridge.h"

#include <c10/core/CPUAllocator.h>

#if defined(MXMOE_TORCH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace mxmoe::torch_ext {

DType dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kBFloat16: return DType::bf16;
    case at::kFloat: return DType::f32;
    case at::kDouble: return DType::f64;
    case at::kFloat8_e4m3fn: return DType::e4m3;
    case at::kFloat8_e8m0fnu:
    case at::kByte: return DType::e8m0;
    case at::kInt: return DType::i32;
    case at::kLong: return DType::i64;
    default: TORCH_CHECK(false, "mxmoe: unsupported dtype ", t.scalar_type());
  }
}

mxmoe::Device mx_device(const at::Tensor& t) {
  if (t.is_cpu()) return {DeviceType::cpu, 0};
  TORCH_CHECK(t.is_cuda(), "mxmoe: tensors must be on the CPU or a CUDA device, got ", t.device());
  return {DeviceType::cuda, t.get_device()};
}

TensorView view(const at::Tensor& t, std::optional<DType> as) {
  TORCH_CHECK(t.dim() >= 1 && t.dim() <= 3, "mxmoe: tensors have rank 1..3, got shape ", t.sizes());
  TORCH_CHECK(t.is_contiguous(), "mxmoe: tensors must be contiguous, got strides ", t.strides());
  TensorView v;
  v.data = t.data_ptr();
  v.dtype = as ? *as : dtype_of(t);
  v.device = mx_device(t);
  v.rank = static_cast<int>(t.dim());
  for (int d = 0; d < v.rank; ++d) v.shape[d] = t.size(d);
  return v;
}

TensorView view(const std::optional<at::Tensor>& t) { return t && t->defined() ? view(*t) : TensorView{}; }

Mxfp8View mx_view(const at::Tensor& data, const at::Tensor& scales, BlockAxis axis, ScaleLayout layout) {
  Mxfp8View v;
  v.data = view(data, DType::e4m3);
  v.scales = view(scales, DType::e8m0);
  v.axis = axis;
  v.layout = layout;
  return v;
}

DeviceCheck& DeviceCheck::add(const std::string& name, const at::Tensor& t) {
  if (t.defined()) seen_.emplace_back(name, t.device());
  return *this;
}

DeviceCheck& DeviceCheck::add(const std::string& name, const std::optional<at::Tensor>& t) {
  return t ? add(name, *t) : *this;
}

DeviceCheck& DeviceCheck::add(const std::string& name, at::TensorList list) {
  for (size_t i = 0; i < list.size(); ++i) add(name + "[" + std::to_string(i) + "]", list[i]);
  return *this;
}

void DeviceCheck::check() const {
  if (seen_.empty()) return;
  const auto& [ref_name, ref] = seen_.front();
  std::string wrong;
  for (size_t i = 1; i < seen_.size(); ++i) {
    if (seen_[i].second == ref) continue;
    wrong += (wrong.empty() ? "" : ", ") + seen_[i].first + " is on " + seen_[i].second.str();
  }
  TORCH_CHECK(wrong.empty(), "mxmoe: ", op_, ": every tensor must be on ", ref_name, "'s device (", ref.str(),
              "), but ", wrong);
}

ScaleLayout parse_layout(const std::string& s) {
  if (s == "compact") return ScaleLayout::compact;
  if (s == "swizzled") return ScaleLayout::swizzled;
  TORCH_CHECK(false, "mxmoe: scale_layout must be 'compact' or 'swizzled', got '", s, "'");
}

BlockAxis parse_axis(const std::string& s) {
  if (s == "row") return BlockAxis::row;
  if (s == "col") return BlockAxis::col;
  TORCH_CHECK(false, "mxmoe: axis must be 'row' or 'col', got '", s, "'");
}

void set_recipe(Problem& p, const std::string& s) {
  p.pow2_scales = s == "fp8_blockwise_pow2";
  if (s == "mxfp8") p.recipe = Recipe::mxfp8;
  else if (s == "bf16") p.recipe = Recipe::bf16;
  else if (s == "fp8_blockwise" || s == "fp8_blockwise_pow2") p.recipe = Recipe::fp8_blockwise;
  else TORCH_CHECK(false, "mxmoe: recipe must be 'mxfp8', 'bf16', 'fp8_blockwise' or 'fp8_blockwise_pow2', got '", s, "'");
}

Problem make_problem(const at::Tensor& w1, bool fc1_bias, bool fc2_bias, const LayerScalars& s) {
  TORCH_CHECK(w1.dim() == 3 && w1.size(1) % 2 == 0, "mxmoe: w1 must be [E, 2F, H], got ", w1.sizes());
  Problem p;
  p.experts = w1.size(0);
  p.ffn = w1.size(1) / 2;
  p.hidden = w1.size(2);
  if (s.activation == "swiglu") p.activation = Activation::swiglu;
  else if (s.activation == "clamped_swiglu") p.activation = Activation::clamped_swiglu;
  else TORCH_CHECK(false, "mxmoe: activation must be 'swiglu' or 'clamped_swiglu', got '", s.activation, "'");
  p.clamp = {static_cast<float>(s.limit), static_cast<float>(s.alpha), static_cast<float>(s.linear_offset)};
  if (s.glu_layout == "halves") p.glu_layout = GluLayout::halves;
  else if (s.glu_layout == "interleave32") p.glu_layout = GluLayout::interleave32;
  else TORCH_CHECK(false, "mxmoe: glu_layout must be 'halves' or 'interleave32', got '", s.glu_layout, "'");
  p.fc1_bias = fc1_bias;
  p.fc2_bias = fc2_bias;
  p.scale_fc2_bias = s.scale_fc2_bias;
  set_recipe(p, s.recipe);
  return p;
}

int64_t rowwise_scales(int64_t rows, int64_t cols) { return rowwise_scale_bytes(rows, cols); }
int64_t colwise_scales(int64_t rows, int64_t cols, int64_t groups) { return colwise_scale_bytes(rows, cols, groups); }

Mxfp8View colwise_view(const at::Tensor& data, const at::Tensor& scales) {
  if (scales.scalar_type() == at::kFloat) {  // fp8_blockwise
    Mxfp8View v;
    v.data = view(data, DType::e4m3);
    v.scales = view(scales);
    v.axis = BlockAxis::col;
    v.format = QuantFormat::fp8_block;
    return v;
  }
  // Layers always use compact scales (Options default), so the saved scales need no layout tag.
  return mx_view(data, scales, BlockAxis::col, ScaleLayout::compact);
}

namespace {

// A column-wise pair (data, scales) grouped over E experts: MXFP8 (e8m0 bytes) or FP8 blockwise
// (f32, 128-token blocks: (ceil(T/128) + E) x cols).
void push_colwise(std::vector<at::Tensor>& out, const Problem& p, int64_t T, int64_t cols,
                  const at::TensorOptions& like) {
  const int64_t E = p.experts;
  out.push_back(at::empty({T, cols}, like.dtype(at::kFloat8_e4m3fn)));
  // Zeroed: the scale buffer is a capacity bound; rows no group uses stay deterministic.
  if (p.recipe == Recipe::fp8_blockwise)
    out.push_back(at::zeros({((T + 127) / 128 + E) * cols}, like.dtype(at::kFloat)));
  else
    out.push_back(at::zeros({colwise_scales(T, cols, E)}, like.dtype(at::kByte)));
}

Mxfp8View colwise_at(at::TensorList list, size_t i) { return colwise_view(list[i], list[i + 1]); }

}  // namespace

std::vector<at::Tensor> empty_saved(const Problem& p, int64_t T, const at::TensorOptions& like) {
  std::vector<at::Tensor> out;
  out.push_back(at::empty({T, 2 * p.ffn}, like.dtype(at::kBFloat16)));
  if (p.recipe != Recipe::bf16) {
    push_colwise(out, p, T, p.hidden, like);
    push_colwise(out, p, T, p.ffn, like);
  } else {
    out.push_back(at::empty({T, p.ffn}, like.dtype(at::kBFloat16)));
  }
  return out;
}

StateBuffers saved_buffers(const Problem& p, at::TensorList saved) {
  const bool mx = p.recipe != Recipe::bf16;
  TORCH_CHECK(saved.size() == (mx ? 5u : 2u), "mxmoe: the saved list of a ", to_string(p.recipe),
              " forward has ", mx ? 5 : 2, " tensors, got ", saved.size());
  StateBuffers b;
  b.c = view(saved[0]);
  if (mx) {
    b.x_col = colwise_at(saved, 1);
    b.a_col = colwise_at(saved, 3);
  } else {
    b.a = view(saved[1]);
  }
  return b;
}

std::vector<at::Tensor> empty_deferred(const Problem& p, int64_t T, const at::TensorOptions& like) {
  std::vector<at::Tensor> out;
  if (p.recipe != Recipe::bf16) {
    push_colwise(out, p, T, p.hidden, like);
    push_colwise(out, p, T, 2 * p.ffn, like);
  } else {
    out.push_back(at::empty({T, 2 * p.ffn}, like.dtype(at::kBFloat16)));
  }
  return out;
}

void add_deferred_buffers(StateBuffers& into, const Problem& p, at::TensorList deferred) {
  const bool mx = p.recipe != Recipe::bf16;
  TORCH_CHECK(deferred.size() == (mx ? 4u : 1u), "mxmoe: the deferred-wgrad list of a ", to_string(p.recipe),
              " backward has ", mx ? 4 : 1, " tensors, got ", deferred.size());
  if (mx) {
    into.dy_col = colwise_at(deferred, 0);
    into.dc_col = colwise_at(deferred, 2);
  } else {
    into.dc = view(deferred[0]);
  }
}

namespace {

void* torch_allocate(int64_t bytes, mxmoe::Device device, void* stream, void*) {
#if defined(MXMOE_TORCH_CUDA)
  if (device.type == DeviceType::cuda)
    return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(static_cast<size_t>(bytes),
                                                                  static_cast<cudaStream_t>(stream));
#endif
  TORCH_CHECK(device.type == DeviceType::cpu, "mxmoe: this extension was built without CUDA support");
  return c10::GetCPUAllocator()->raw_allocate(static_cast<size_t>(bytes));
}

void torch_release(void* ptr, int64_t, mxmoe::Device device, void*, void*) {
#if defined(MXMOE_TORCH_CUDA)
  if (device.type == DeviceType::cuda) {
    c10::cuda::CUDACachingAllocator::raw_delete(ptr);
    return;
  }
#endif
  c10::GetCPUAllocator()->raw_deallocate(ptr);
}

Options options_for(const at::Tensor& like, bool check_finite) {
  Options o;
  o.check_finite = check_finite;
  o.allocator = {torch_allocate, torch_release, nullptr};
  if (like.is_cuda()) {
#if defined(MXMOE_TORCH_CUDA)
    o.stream = c10::cuda::getCurrentCUDAStream(like.get_device()).stream();
#else
    TORCH_CHECK(false, "mxmoe: this extension was built without CUDA support");
#endif
  }
  return o;
}

}  // namespace

CallContext::CallContext(const at::Tensor& like, bool check_finite)
    : guard_(like.is_cuda() ? std::optional<c10::Device>(like.device()) : std::nullopt),
      ctx_(options_for(like, check_finite)) {}

}  // namespace mxmoe::torch_ext
