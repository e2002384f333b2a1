// Planning a layer call (src/api/layer_plan.h): the real forward_run / backward_run / prepare_run on
// planning views, so that what is planned is what a run would do.
#include "src/api/layer_plan.h"

#include <optional>

#include "src/api/layer_state.h"
#include "src/dispatch/context_impl.h"

namespace mxmoe::detail {

namespace {

// A planning context: ctx's options (backend, deny, overrides, scale layout) and target, with the
// planning allocator behind every library buffer; steps plan but never run.
struct PlanningContext {
  PlanningMemory memory;
  Context ctx;
  explicit PlanningContext(const Context& from) : ctx(options_of(from, memory)) {
    ctx.impl().target = from.impl().target;
    ctx.impl().dry_run = true;
    ctx.impl().memory = &memory;
  }
  static Options options_of(const Context& from, PlanningMemory& m) {
    Options o = from.options();
    o.allocator = planning_allocator(m);
    o.stream = nullptr;
    return o;
  }
  // A caller tensor of the call: an address with nothing behind it, not counted as library memory.
  TensorView view(DType t, std::initializer_list<int64_t> shape, Device d) {
    TensorView v = TensorView::of(reinterpret_cast<void*>(memory.next), t, shape, d);
    memory.next += static_cast<uintptr_t>((v.bytes() + 255) / 256 * 256 + 256);
    return v;
  }
};

}  // namespace

LayerPlan plan_layer(const Context& ctx, const Problem& p, int64_t T, Device d, bool prepared) {
  PlanningContext pc(ctx);
  const int64_t E = p.experts, H = p.hidden, F = p.ffn;
  // The weights as the problem lays them out: one tensor, or a table of E pointers.
  auto weights = [&](int64_t rows, int64_t cols) {
    if (p.weight_layout == WeightLayout::per_expert)
      return ExpertMatrices{.pointers = pc.view(DType::i64, {E}, d), .dtype = DType::bf16};
    return ExpertMatrices{.dense = pc.view(DType::bf16, {E, rows, cols}, d)};
  };
  const ExpertMatrices w1 = weights(2 * F, H), w2 = weights(H, F);
  std::optional<PreparedWeights> pw;
  if (prepared && p.recipe != Recipe::bf16) {
    const WeightsArgs w{.w1 = w1, .w2 = w2};
    pw = prepare_run(pc.ctx, p, w, d, prepared_forms(pc.ctx, p, w, d));
  }
  ForwardArgs f{.x = pc.view(DType::bf16, {T, H}, d),
                .offsets = {pc.view(DType::i32, {E + 1}, d)},
                .probs = pc.view(DType::f32, {T}, d),
                .w1 = w1,
                .w2 = w2,
                .y = pc.view(DType::bf16, {T, H}, d),
                .prepared = pw ? &*pw : nullptr};
  if (p.fc1_bias) f.b1 = pc.view(DType::bf16, {E, 2 * F}, d);
  if (p.fc2_bias) f.b2 = pc.view(DType::bf16, {E, H}, d);
  SavedState saved = forward_run(pc.ctx, p, f, nullptr);
  BackwardArgs b{.dy = pc.view(DType::bf16, {T, H}, d),
                 .dx = pc.view(DType::bf16, {T, H}, d),
                 .dprobs = pc.view(DType::f32, {T}, d),
                 .grads = {.dw1 = {.dense = pc.view(DType::f32, {E, 2 * F, H}, d)},
                           .dw2 = {.dense = pc.view(DType::f32, {E, H, F}, d)},
                           .accumulate = true},
                 .wgrad = WgradMode::now,
                 .prepared = pw ? &*pw : nullptr};
  if (p.fc1_bias) b.grads.db1 = pc.view(DType::f32, {E, 2 * F}, d);
  if (p.fc2_bias) b.grads.db2 = pc.view(DType::f32, {E, H}, d);
  backward_run(pc.ctx, saved, b, nullptr);
  return {pc.ctx.report(), pc.memory.peak};
}

int64_t planned_peak(const Context& ctx, const std::function<void(Context&)>& call) {
  PlanningContext pc(ctx);
  call(pc.ctx);
  return pc.memory.peak;
}

PreparedForms prepared_forms(const Context& ctx, const Problem& p, const WeightsArgs& w, Device d) {
  PreparedForms f;
  if (!w.bf16_copies || p.recipe == Recipe::bf16) return f;
  // The GEMMs' plans in a call without prepared weights: what they read, or transpose in every call.
  for (const StepRecord& r : plan_layer(ctx, p, /*tokens=*/4096, d, /*prepared=*/false).steps) {
    const bool weight_gemm = r.step == "fc1_fprop" || r.step == "fc2_fprop" || r.step == "fc1_dgrad" ||
                             r.step == "fc2_dgrad";
    if (!weight_gemm) continue;
    f.bf16_copies |= p.recipe == Recipe::mxfp8 && r.weights == to_string(WeightForm::bf16_copy);
    for (const LaunchRecord& l : r.launches) f.transposed |= p.recipe == Recipe::fp8_blockwise && l.kernel == "transpose_b";
  }
  return f;
}

}  // namespace mxmoe::detail
