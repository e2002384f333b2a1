// Library-owned layer buffers (src/api/layer_state.h).
#include "src/api/layer_state.h"

#include "src/common/checked.h"
#include "src/common/fp8_block.h"

namespace mxmoe::detail {

namespace {
int64_t rowwise_bytes(int64_t rows, int64_t cols, const char* what) {
  return checked_mul(round_up(rows, kSwizzleRows), rowwise_scale_cols(cols), what);
}
int64_t colwise_bytes(int64_t rows, int64_t cols, int64_t experts, const char* what) {
  const int64_t scale_rows = checked_add(ceil_div(rows, 32), checked_mul(4, experts, what), what);
  return checked_mul(scale_rows, colwise_scale_row_bytes(cols), what);
}
int64_t scale_bytes(int64_t rows, int64_t cols, BlockAxis axis, int64_t experts, const char* what) {
  return axis == BlockAxis::row ? rowwise_bytes(rows, cols, what) : colwise_bytes(rows, cols, experts, what);
}
int64_t expert_scale_bytes(int64_t rows, int64_t cols, BlockAxis axis, const char* what) {
  return axis == BlockAxis::row ? rowwise_bytes(rows, cols, what)
                                : checked_mul(colwise_group_scale_rows(rows), colwise_scale_row_bytes(cols), what);
}
}  // namespace

int64_t tensor_bytes(DType t, std::initializer_list<int64_t> shape, const char* what) {
  return checked_mul(checked_mul(shape, what), static_cast<int64_t>(dtype_size(t)), what);
}

int64_t mxfp8_bytes(int64_t rows, int64_t cols, BlockAxis axis, int64_t experts, const char* what) {
  return checked_add(checked_mul(rows, cols, what), scale_bytes(rows, cols, axis, experts, what), what);
}

int64_t expert_mxfp8_bytes(int64_t experts, int64_t rows, int64_t cols, BlockAxis axis, const char* what) {
  const int64_t per = checked_add(checked_mul(rows, cols, what), expert_scale_bytes(rows, cols, axis, what), what);
  return checked_mul(experts, per, what);
}

OwnedTensor make_tensor(const Options& opt, Device d, DType t, std::initializer_list<int64_t> shape) {
  OwnedTensor o;
  o.view = TensorView::of(nullptr, t, shape, d);
  o.buf = allocate(d, tensor_bytes(t, shape, "memory"), opt.stream, opt.allocator);
  o.view.data = o.buf.ptr;
  return o;
}

OwnedMxfp8 make_mxfp8(const Options& opt, Device d, int64_t rows, int64_t cols, BlockAxis axis, ScaleLayout layout,
                      int64_t experts) {
  OwnedMxfp8 o;
  const int64_t sbytes = scale_bytes(rows, cols, axis, experts, "memory");
  o.data = allocate(d, checked_mul(rows, cols, "memory"), opt.stream, opt.allocator);
  o.scales = allocate(d, sbytes, opt.stream, opt.allocator);
  o.view.data = TensorView::of(o.data.ptr, DType::e4m3, {rows, cols}, d);
  o.view.scales = TensorView::of(o.scales.ptr, DType::e8m0, {sbytes}, d);
  o.view.axis = axis;
  o.view.layout = layout;
  return o;
}

namespace {
// The e4m3 data view of E weight matrices [rows, cols] at `data` (null: shape, dtype and device
// only) and the copy's shape fields.
void set_e4m3(OwnedExpertMxfp8& o, Device d, int64_t experts, int64_t rows, int64_t cols, BlockAxis axis,
              ScaleLayout layout, void* data) {
  o.operand.data.dense = TensorView::of(data, DType::e4m3, {experts, rows, cols}, d);
  o.operand.data.dtype = DType::e4m3;
  o.operand.layout = layout;
  o.experts = experts;
  o.rows = rows;
  o.cols = cols;
  o.axis = axis;
}
}  // namespace

OwnedExpertMxfp8 make_expert_mxfp8(const Options& opt, Device d, int64_t experts, int64_t rows, int64_t cols,
                                   BlockAxis axis, ScaleLayout layout) {
  OwnedExpertMxfp8 o;
  const int64_t per = expert_scale_bytes(rows, cols, axis, "memory");
  o.data = allocate(d, checked_mul({experts, rows, cols}, "memory"), opt.stream, opt.allocator);
  o.scales = allocate(d, checked_mul(experts, per, "memory"), opt.stream, opt.allocator);
  set_e4m3(o, d, experts, rows, cols, axis, layout, o.data.ptr);
  o.operand.scales.dense = TensorView::of(o.scales.ptr, DType::e8m0, {experts, per}, d);
  o.operand.scales.dtype = DType::e8m0;
  return o;
}

OwnedExpertMxfp8 make_expert_copy_only(const Options& opt, Device d, int64_t experts, int64_t rows, int64_t cols,
                                       BlockAxis axis, ScaleLayout layout, bool allocate_copy) {
  OwnedExpertMxfp8 o;
  set_e4m3(o, d, experts, rows, cols, axis, layout, nullptr);
  if (allocate_copy) {
    o.add_bf16_copy(opt, d);
  } else {
    o.operand.dequantized.dense = TensorView::of(nullptr, DType::bf16, {experts, rows, cols}, d);
    o.operand.dequantized.dtype = DType::bf16;
  }
  return o;
}

void OwnedExpertMxfp8::add_transposed_copy(const Options& o, Device d) {
  const int64_t per = fp8_weight_scale_count(cols, rows);
  tdata = allocate(d, checked_mul({experts, rows, cols}, "memory"), o.stream, o.allocator);
  tscales = allocate(d, checked_mul({experts, per, 4}, "memory"), o.stream, o.allocator);
  operand.transposed.dense = TensorView::of(tdata.ptr, DType::e4m3, {experts, cols, rows}, d);
  operand.transposed.dtype = DType::e4m3;
  operand.transposed_scales.dense = TensorView::of(tscales.ptr, DType::f32, {experts, per}, d);
  operand.transposed_scales.dtype = DType::f32;
}

void OwnedExpertMxfp8::add_bf16_copy(const Options& o, Device d) {
  deq = allocate(d, checked_mul({experts, rows, cols, 2}, "memory"), o.stream, o.allocator);
  operand.dequantized.dense = TensorView::of(deq.ptr, DType::bf16, {experts, rows, cols}, d);
  operand.dequantized.dtype = DType::bf16;
}

QuantSpec quant_spec(const Problem& p, ScaleLayout layout) {
  QuantSpec q;
  q.format = p.recipe == Recipe::fp8_blockwise ? QuantFormat::fp8_block : QuantFormat::mxfp8;
  q.layout = layout;
  q.pow2_scales = p.recipe == Recipe::fp8_blockwise && p.pow2_scales;
  return q;
}

namespace {
// fp32 inverse scales of an fp8_block [rows, cols] tensor (src/common/fp8_block.h).
int64_t fp8_scale_count(int64_t rows, int64_t cols, BlockAxis axis, int64_t experts, const char* what) {
  if (axis == BlockAxis::row) return checked_mul(ceil_div(cols, kFp8Block), fp8_rowwise_pitch(rows), what);
  return checked_mul(checked_add(ceil_div(rows, kFp8Block), experts, what), cols, what);
}
}  // namespace

int64_t quant_bytes(const QuantSpec& q, int64_t rows, int64_t cols, BlockAxis axis, int64_t experts,
                    const char* what) {
  if (q.format == QuantFormat::mxfp8) return mxfp8_bytes(rows, cols, axis, experts, what);
  return checked_add(checked_mul(rows, cols, what), checked_mul(4, fp8_scale_count(rows, cols, axis, experts, what), what),
                     what);
}

OwnedMxfp8 make_quant(const Options& opt, Device d, const QuantSpec& q, int64_t rows, int64_t cols, BlockAxis axis,
                      int64_t experts) {
  if (q.format == QuantFormat::mxfp8) return make_mxfp8(opt, d, rows, cols, axis, q.layout, experts);
  OwnedMxfp8 o;
  const int64_t count = fp8_scale_count(rows, cols, axis, experts, "memory");
  o.data = allocate(d, checked_mul(rows, cols, "memory"), opt.stream, opt.allocator);
  o.scales = allocate(d, checked_mul(4, count, "memory"), opt.stream, opt.allocator);
  o.view.data = TensorView::of(o.data.ptr, DType::e4m3, {rows, cols}, d);
  o.view.scales = TensorView::of(o.scales.ptr, DType::f32, {count}, d);
  o.view.axis = axis;
  o.view.format = QuantFormat::fp8_block;
  return o;
}

int64_t expert_quant_bytes(const QuantSpec& q, int64_t experts, int64_t rows, int64_t cols, BlockAxis axis,
                           const char* what) {
  if (q.format == QuantFormat::mxfp8) return expert_mxfp8_bytes(experts, rows, cols, axis, what);
  const int64_t per = checked_add(checked_mul(rows, cols, what), checked_mul(4, fp8_weight_scale_count(rows, cols), what),
                                  what);
  return checked_mul(experts, per, what);
}

OwnedExpertMxfp8 make_expert_quant(const Options& opt, Device d, const QuantSpec& q, int64_t experts, int64_t rows,
                                   int64_t cols, BlockAxis axis) {
  if (q.format == QuantFormat::mxfp8) return make_expert_mxfp8(opt, d, experts, rows, cols, axis, q.layout);
  OwnedExpertMxfp8 o;
  const int64_t per = fp8_weight_scale_count(rows, cols);
  o.data = allocate(d, checked_mul({experts, rows, cols}, "memory"), opt.stream, opt.allocator);
  o.scales = allocate(d, checked_mul({experts, per, 4}, "memory"), opt.stream, opt.allocator);
  o.operand.data.dense = TensorView::of(o.data.ptr, DType::e4m3, {experts, rows, cols}, d);
  o.operand.data.dtype = DType::e4m3;
  o.operand.scales.dense = TensorView::of(o.scales.ptr, DType::f32, {experts, per}, d);
  o.operand.scales.dtype = DType::f32;
  o.operand.format = QuantFormat::fp8_block;
  o.experts = experts;
  o.rows = rows;
  o.cols = cols;
  o.axis = BlockAxis::row;
  o.pow2_scales = q.pow2_scales;
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
