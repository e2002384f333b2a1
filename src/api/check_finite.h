// Options::check_finite: the layer's inputs scanned for NaN and +-Inf (backend step check_finite,
// on the backend that serves the data's device) after validation and before anything is written.
// The first non-finite value is an mxmoe::Error whose argument is the tensor's name and whose
// message gives its coordinates and the value (NaN, +Inf or -Inf). Each function does nothing
// unless the context's options ask for the check, and nothing in a planning context.
#pragma once
#include "mxmoe/grouped_mlp.h"

namespace mxmoe::detail {

// forward(): x (where given), probs, w1, b1, w2, b2 (where given).
void check_forward_finite(Context& ctx, const Problem& p, const ForwardArgs& a);
// backward(): dy.
void check_backward_finite(Context& ctx, const BackwardArgs& a);
// prepare_weights(): w1, w2.
void check_weights_finite(Context& ctx, const Problem& p, const WeightsArgs& w);

}  // namespace mxmoe::detail
