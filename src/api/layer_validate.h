// Argument validation of the grouped-MLP entry points (forward, backward, the restore functions,
// compute_wgrad), all in src/api/layer_validate.cpp on top of the generic checks of validate.h.
// Each throws mxmoe::Error naming the argument and its value, before anything is written.
#pragma once
#include <cstdint>

#include "mxmoe/grouped_mlp.h"

namespace mxmoe::detail {

// forward(): the problem, every input, y, and `into` (caller-owned saved buffers) when given.
void validate_forward(const Problem& p, const ForwardArgs& a, const StateBuffers* into, ScaleLayout layout);
// A forward's T, device, and whether X comes pre-quantized (ForwardArgs::x_row / x_col): from x,
// or from x_row when x is absent and X is pre-quantized (valid once validate_forward passed).
int64_t forward_tokens(const ForwardArgs& a);
Device forward_device(const ForwardArgs& a);
bool forward_prequantized(const ForwardArgs& a);
// restore_saved_state(): returns T.
int64_t validate_restore_saved(const Problem& p, const ForwardArgs& inputs, const StateBuffers& saved);
// backward(): the saved state, dy, every output, and `into` (deferred-wgrad buffers) when given.
void validate_backward(SavedState& saved, const BackwardArgs& a, const StateBuffers* into, ScaleLayout layout);
// restore_wgrad_state(): returns T.
int64_t validate_restore_wgrad(const Problem& p, const ForwardArgs& inputs, const TensorView& dy,
                               const StateBuffers& state);
// prepare_weights(): the problem and w1, w2 (one device); returns that device.
Device validate_prepare_weights(const Problem& p, const WeightsArgs& w);
// ForwardArgs::prepared / BackwardArgs::prepared (when given): made by prepare_weights() for this
// problem's shapes, recipe and GLU layout, on `device`, with the context's scale `layout`.
void check_prepared(const PreparedWeights* prepared, const Problem& p, Device device, ScaleLayout layout);
// compute_wgrad(): a pending state and weight-gradient buffers that overlap none of its operands.
void validate_compute_wgrad(WgradState& state, const WeightGrads& grads);

}  // namespace mxmoe::detail
