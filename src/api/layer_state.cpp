// Library-owned layer buffers (src/api/layer_state.h).
#include "src/api/layer_state.h"

namespace mxmoe::detail {

OwnedTensor make_tensor(const Options& opt, Device d, DType t, std::initializer_list<int64_t> shape) {
  OwnedTensor o;
  o.view = TensorView::of(nullptr, t, shape, d);
  o.buf = allocate(d, o.view.bytes(), opt.stream, opt.allocator);
  o.view.data = o.buf.ptr;
  return o;
}

OwnedMxfp8 make_mxfp8(const Options& opt, Device d, int64_t rows, int64_t cols, BlockAxis axis, ScaleLayout layout,
                      int64_t experts) {
  OwnedMxfp8 o;
  const int64_t sbytes =
      axis == BlockAxis::row ? rowwise_scale_bytes(rows, cols) : colwise_scale_bytes(rows, cols, experts);
  o.data = allocate(d, rows * cols, opt.stream, opt.allocator);
  o.scales = allocate(d, sbytes, opt.stream, opt.allocator);
  o.view.data = TensorView::of(o.data.ptr, DType::e4m3, {rows, cols}, d);
  o.view.scales = TensorView::of(o.scales.ptr, DType::e8m0, {sbytes}, d);
  o.view.axis = axis;
  o.view.layout = layout;
  return o;
}

OwnedExpertMxfp8 make_expert_mxfp8(const Options& opt, Device d, int64_t experts, int64_t rows, int64_t cols,
                                   BlockAxis axis, ScaleLayout layout) {
  OwnedExpertMxfp8 o;
  const int64_t per = axis == BlockAxis::row ? rowwise_scale_bytes(rows, cols) : colwise_matrix_scale_bytes(rows, cols);
  o.data = allocate(d, experts * rows * cols, opt.stream, opt.allocator);
  o.scales = allocate(d, experts * per, opt.stream, opt.allocator);
  o.operand.data.dense = TensorView::of(o.data.ptr, DType::e4m3, {experts, rows, cols}, d);
  o.operand.data.dtype = DType::e4m3;
  o.operand.scales.dense = TensorView::of(o.scales.ptr, DType::e8m0, {experts, per}, d);
  o.operand.scales.dtype = DType::e8m0;
  o.operand.layout = layout;
  o.experts = experts;
  o.rows = rows;
  o.cols = cols;
  o.axis = axis;
  return o;
}

OwnedTensor borrowed(const TensorView& v) {
  OwnedTensor o;
  o.view = v;
  return o;
}

OwnedMxfp8 borrowed(const Mxfp8View& v) {
  OwnedMxfp8 o;
  o.view = v;
  return o;
}

}  // namespace mxmoe::detail
