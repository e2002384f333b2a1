// A layer call planned without running it: forward, backward and the weight gradients of a problem
// on views with no memory behind them, in a context whose steps plan but never run
// (src/dispatch/device_facts.h). `mxmoe plan` prints the result; prepare_weights asks it which weight
// forms the GEMMs' plans read.
#pragma once
#include <vector>

#include "mxmoe/context.h"
#include "mxmoe/grouped_mlp.h"

namespace mxmoe::detail {

struct LayerPlan {
  std::vector<StepRecord> steps;  // prepare_weights' steps (when asked), forward, backward, wgrad
  int64_t peak_bytes = 0;         // the library buffers the calls hold at once (workspaces not counted)
};

// The plan of one training step of `p` over `tokens` rows with data on `device`, under ctx's options
// and planning target (set_planning_target; none: the device's own backends). With `prepared`, the
// weights are prepared first, as prepare_weights would on that device.
LayerPlan plan_layer(const Context& ctx, const Problem& p, int64_t tokens, Device device, bool prepared);

}  // namespace mxmoe::detail
