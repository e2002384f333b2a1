// A layer call planned without running it: forward, backward and the weight gradients of a problem
// on views with no memory behind them, in a context whose steps plan but never run
// (src/dispatch/device_facts.h). `mxmoe plan` prints the result; prepare_weights asks it which weight
// forms the GEMMs' plans read.
#pragma once
#include <functional>
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

// The library memory `call` takes at its peak: the buffers it holds at once with the largest step's
// workspace on top of those live then, from a dry run of the call in a planning context made from
// ctx (its steps plan, nothing runs, no memory is allocated; `call` must make the library buffers it
// needs through the context's options, as forward_run / backward_run / prepare_run do). This is the
// memory estimate of forward, backward and prepare_weights: the sum over their plans.
int64_t planned_peak(const Context& ctx, const std::function<void(Context&)>& call);

}  // namespace mxmoe::detail
