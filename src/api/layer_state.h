// What forward keeps for backward and backward keeps for a deferred wgrad; library-owned buffers.
#pragma once
#include <initializer_list>

#include "mxmoe/grouped_mlp.h"
#include "src/common/memory.h"
#include "src/dispatch/backend.h"

namespace mxmoe::detail {

struct OwnedTensor {
  Buffer buf;
  TensorView view;
  int64_t bytes() const { return buf.ptr ? buf.bytes : 0; }
};
OwnedTensor make_tensor(const Options& o, Device d, DType t, std::initializer_list<int64_t> shape);

// Bytes the make_* functions below allocate, overflow-checked (mxmoe::Error naming `what`). The
// forward/backward memory estimates add these up before the first allocation.
int64_t tensor_bytes(DType t, std::initializer_list<int64_t> shape, const char* what);
int64_t mxfp8_bytes(int64_t rows, int64_t cols, BlockAxis axis, int64_t experts, const char* what);
int64_t expert_mxfp8_bytes(int64_t experts, int64_t rows, int64_t cols, BlockAxis axis, const char* what);

// MXFP8 [rows, cols] with row-wise scales, or column-wise scales grouped over `experts` groups.
struct OwnedMxfp8 {
  Buffer data, scales;
  Mxfp8View view;
  int64_t bytes() const { return (data.ptr ? data.bytes : 0) + (scales.ptr ? scales.bytes : 0); }
};
OwnedMxfp8 make_mxfp8(const Options& o, Device d, int64_t rows, int64_t cols, BlockAxis axis, ScaleLayout layout,
                      int64_t experts);

// How a quantized recipe stores its tensors: the format, MXFP8's scale layout, FP8 blockwise's
// power-of-two option.
struct QuantSpec {
  QuantFormat format = QuantFormat::mxfp8;
  ScaleLayout layout = ScaleLayout::compact;
  bool pow2_scales = false;
};
QuantSpec quant_spec(const Problem& p, ScaleLayout layout);

// Bytes and buffers of a quantized [rows, cols] tensor (axis row: blocks along cols; col: blocks
// along the rows, restarting per group of `experts`) in either format.
int64_t quant_bytes(const QuantSpec& q, int64_t rows, int64_t cols, BlockAxis axis, int64_t experts, const char* what);
OwnedMxfp8 make_quant(const Options& o, Device d, const QuantSpec& q, int64_t rows, int64_t cols, BlockAxis axis,
                      int64_t experts);

// Quantized copy of E weight matrices [rows, cols], scales along `axis` (fp8_block: 128x128 blocks,
// axis unused).
struct OwnedExpertMxfp8 {
  Buffer data, scales;
  Buffer deq;  // optional bf16 [E, rows, cols] of the dequantized values (operand.dequantized)
  Buffer tdata, tscales;  // optional fp8_block transpose (operand.transposed, transposed_scales)
  ExpertOperand operand;
  int64_t experts = 0, rows = 0, cols = 0;
  BlockAxis axis = BlockAxis::row;
  bool pow2_scales = false;
  int64_t bytes() const {
    int64_t n = 0;
    for (const Buffer* b : {&data, &scales, &deq, &tdata, &tscales}) n += b->ptr ? b->bytes : 0;
    return n;
  }
  // Allocates the bf16 copy of the dequantized values that quantize_from() then also fills.
  void add_bf16_copy(const Options& o, Device d);
  // fp8_block: allocates the transposed copy ([E, cols, rows] and its block scales) that
  // quantize_from() then also fills (where a dgrad's plan reads WeightForm::transposed).
  void add_transposed_copy(const Options& o, Device d);
  // The quantize_experts arguments that fill this copy (and its bf16 copy and transpose, if any)
  // from `src`.
  QuantizeExpertsStep quantize_from(const ExpertMatrices& src) const {
    QuantizeExpertsStep s{src,   experts, rows, cols, operand.data.dense, operand.scales.dense, axis, operand.layout,
                          operand.dequantized.dense, operand.format, pow2_scales};
    s.transposed = operand.transposed.dense;
    s.transposed_scales = operand.transposed_scales.dense;
    return s;
  }
};
// The weight forms beyond the FP8 copies that the plans of the layer's GEMMs read on device d
// (src/api/layer_plan.cpp): the bf16 copies alone (mxfp8, where the fprop and dgrad plans read
// WeightForm::bf16_copy), or the transposed 128x128-block copies (fp8_blockwise, where a dgrad plan
// would otherwise transpose its weights in every call). prepare_weights makes these when
// w.bf16_copies asks for them; `mxmoe bench` builds its step operands the same way.
struct PreparedForms {
  bool bf16_copies = false;
  bool transposed = false;
};
PreparedForms prepared_forms(const Context& ctx, const Problem& p, const WeightsArgs& w, Device d);
OwnedExpertMxfp8 make_expert_mxfp8(const Options& o, Device d, int64_t experts, int64_t rows, int64_t cols,
                                   BlockAxis axis, ScaleLayout layout);
// MXFP8 weights kept only as their bf16 copy (MGemmStep::b_copy_only): the operand carries the shape,
// dtype e4m3 and device of the FP8 data but no FP8 bytes or scales; `operand.dequantized` is the
// copy, allocated here when `allocate_copy` (prepare_weights), else left for the run to fill
// (PlannedSteps::add_weight_copy). quantize_from() then asks for the copy alone.
OwnedExpertMxfp8 make_expert_copy_only(const Options& o, Device d, int64_t experts, int64_t rows, int64_t cols,
                                       BlockAxis axis, ScaleLayout layout, bool allocate_copy);
// Whether an operand is MXFP8 weights kept only as their bf16 copy (made as above).
inline bool is_copy_only(const ExpertOperand& w) {
  return w.is_mxfp8() && !w.data.per_expert() && w.data.dense.data == nullptr && w.dequantized.dense.rank == 3;
}
int64_t expert_quant_bytes(const QuantSpec& q, int64_t experts, int64_t rows, int64_t cols, BlockAxis axis,
                           const char* what);
OwnedExpertMxfp8 make_expert_quant(const Options& o, Device d, const QuantSpec& q, int64_t experts, int64_t rows,
                                   int64_t cols, BlockAxis axis);

// Views of caller memory in the owned types (nothing is freed).
OwnedTensor borrowed(const TensorView& v);
OwnedMxfp8 borrowed(const Mxfp8View& v);

// The call a state belongs to.
struct StateOrigin {
  Problem problem;
  int64_t tokens = 0;
  Device device{};
};

struct SavedImpl : StateOrigin {
  ForwardArgs refs;      // caller's inputs, referenced not copied (y, prepared unused)
  OwnedTensor c;         // FC1 output, bf16 [T, 2F]
  OwnedMxfp8 x_col;      // mxfp8 / fp8_blockwise: X column-wise (for dW1)
  OwnedMxfp8 a_col;      // mxfp8 / fp8_blockwise: A column-wise (for dW2)
  OwnedTensor a_bf16;    // bf16 recipe: A [T, F]
  bool consumed = false;
  int64_t bytes() const { return c.bytes() + x_col.bytes() + a_col.bytes() + a_bf16.bytes(); }
};

struct WgradImpl : StateOrigin {
  GroupOffsets offsets;
  TensorView x_bf16, dy_bf16;  // bf16 recipe: caller's x and dy, referenced
  OwnedMxfp8 x_col, a_col, dy_col, dc_col;
  OwnedTensor a_bf16, dc_bf16;
  int64_t bytes() const {
    return x_col.bytes() + a_col.bytes() + dy_col.bytes() + dc_col.bytes() + a_bf16.bytes() + dc_bf16.bytes();
  }
};

// prepare_weights()'s copies (mxfp8 and fp8_blockwise recipes; empty for bf16).
struct PreparedImpl {
  Problem problem;
  Device device{};
  ScaleLayout layout = ScaleLayout::compact;
  // mxfp8 where the device's backend reads weight copies (WeightsArgs::bf16_copies): copy-only
  // operands (make_expert_copy_only), no FP8 bytes.
  OwnedExpertMxfp8 w1_row, w2_row;  // fprop operands (fp8_blockwise: fprop and dgrad)
  OwnedExpertMxfp8 w1_col, w2_col;  // mxfp8 dgrad operands (empty for fp8_blockwise)
  const ExpertOperand& w1_dgrad() const { return w1_col.operand.data.dense.rank > 0 ? w1_col.operand : w1_row.operand; }
  const ExpertOperand& w2_dgrad() const { return w2_col.operand.data.dense.rank > 0 ? w2_col.operand : w2_row.operand; }
  int64_t bytes() const { return w1_row.bytes() + w2_row.bytes() + w1_col.bytes() + w2_col.bytes(); }
};

// The runs behind forward(), backward() and prepare_weights() once the arguments are validated and
// the memory checked (src/api/grouped_mlp.cpp); layer_plan.cpp runs them on planning views.
SavedState forward_run(Context& ctx, const Problem& p, const ForwardArgs& a, const StateBuffers* into);
WgradState backward_run(Context& ctx, SavedState& saved, const BackwardArgs& a, const StateBuffers* into);
PreparedWeights prepare_run(Context& ctx, const Problem& p, const WeightsArgs& w, Device d, const PreparedForms& forms);

}  // namespace mxmoe::detail
