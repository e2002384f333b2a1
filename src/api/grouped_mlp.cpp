// The grouped MLP entry points: validate (layer_validate.cpp) -> plan (one backend per step, all
// chosen before anything is written) -> run the steps (layer_steps.h). The same sequence drives
// every backend, so the CPU reference applies exactly the quantization points a GPU backend applies
// (docs/numerics.md "Layer dataflow").
#include "mxmoe/grouped_mlp.h"

#include <functional>
#include <map>
#include <new>
#include <optional>
#include <string>

#include "src/api/check_finite.h"
#include "src/api/layer_plan.h"
#include "src/api/layer_state.h"
#include "src/dispatch/context_impl.h"
#include "src/api/layer_steps.h"
#include "src/api/layer_validate.h"
#include "src/common/checked.h"
#include "src/common/fp8_block.h"

namespace mxmoe {

using detail::LayerStep;
using detail::OwnedExpertMxfp8;
using detail::OwnedMxfp8;
using detail::OwnedTensor;
using detail::PlannedSteps;

SavedState::SavedState() = default;
SavedState::SavedState(std::unique_ptr<detail::SavedImpl> impl) : impl_(std::move(impl)) {}
SavedState::SavedState(SavedState&&) noexcept = default;
SavedState& SavedState::operator=(SavedState&&) noexcept = default;
SavedState::~SavedState() = default;
int64_t SavedState::bytes() const { return impl_ ? impl_->bytes() : 0; }

WgradState::WgradState() = default;
WgradState::WgradState(std::unique_ptr<detail::WgradImpl> impl) : impl_(std::move(impl)) {}
WgradState::WgradState(WgradState&&) noexcept = default;
WgradState& WgradState::operator=(WgradState&&) noexcept = default;
WgradState::~WgradState() = default;
int64_t WgradState::bytes() const { return impl_ ? impl_->bytes() : 0; }

PreparedWeights::PreparedWeights() = default;
PreparedWeights::PreparedWeights(std::unique_ptr<detail::PreparedImpl> impl) : impl_(std::move(impl)) {}
PreparedWeights::PreparedWeights(PreparedWeights&&) noexcept = default;
PreparedWeights& PreparedWeights::operator=(PreparedWeights&&) noexcept = default;
PreparedWeights::~PreparedWeights() = default;
int64_t PreparedWeights::bytes() const { return impl_ ? impl_->bytes() : 0; }

namespace detail {
namespace {

Operand bf16_op(const TensorView& t) { return Operand{t, {}}; }
Operand mx_op(const Mxfp8View& v) { return Operand{{}, v}; }
ExpertOperand bf16_operand(const ExpertMatrices& w) { return ExpertOperand{w, {}, {}}; }

// ---- MXFP8 weights kept only as a bf16 copy ----
// Where the plan of a weight's GEMM reads the weights' bf16 copy alone (WeightForm::bf16_copy: a
// backend whose MXFP8 GEMMs compute in BF16 on the exact dequantized weights),
// the weight is kept as that copy alone (make_expert_copy_only): quantized in the call straight into
// a copy made just before its quantize step and freed after its GEMM (PlannedSteps::add_weight_copy;
// one copy alive at a time, as a GEMM that dequantizes an FP8 copy holds its transient one), or
// prepared so by prepare_weights. Values are those of the FP8 route (the GEMM dequantizing an FP8
// copy), so results are bit-identical. A prepared copy that no plan reads (a step refused for its
// activations, a forced backend) is not an error: that GEMM's weight is quantized in the call from
// the call's w1 / w2.

// `args` with one member replaced.
template <class Args, class Member, class Value>
Args with(Args args, Member Args::*member, const Value& value) {
  args.*member = value;
  return args;
}

LayerStep reading_copy(LayerStep step, bool copy_only) {
  std::get<MGemmStep>(step.args).b_copy_only = copy_only;
  return step;
}

// Whether the plan of a GEMM step reads the weights' bf16 copy alone where it is given only that.
bool plan_reads_copy(const Context& ctx, const LayerStep& step) {
  const Choice c = would_plan(ctx, reading_copy(step, true));
  return c.backend != nullptr && c.plan.weights == WeightForm::bf16_copy;
}

// What one GEMM of a call reads as its weights.
struct CallWeight {
  OwnedExpertMxfp8 own;        // quantized in the call (empty when a prepared operand is read)
  ExpertOperand operand;       // what the GEMM reads
  bool quantize = false;       // a quantize step fills `own`
  bool copy_only = false;      // the GEMM reads a copy alone (MGemmStep::b_copy_only); with quantize,
                               // the run makes it (PlannedSteps::add_weight_copy)
  size_t quantize_at = 0, gemm_at = 0;  // the steps' places (append_gemm)
};

// Appends the GEMM step that reads `w`, after w's quantize step from `src` where it has one.
template <class Quantize>
void append_gemm(std::vector<LayerStep>& steps, CallWeight& w, Quantize quantize, const ExpertMatrices& src,
                 LayerStep gemm) {
  w.quantize_at = steps.size();
  if (w.quantize) steps.push_back(quantize(w.own.quantize_from(src)));
  w.gemm_at = steps.size();
  steps.push_back(reading_copy(std::move(gemm), w.copy_only));
}

// Once the steps are planned: the copy `w` reads, where the run makes it.
void add_copy(PlannedSteps& steps, const CallWeight& w) {
  if (w.quantize && w.copy_only) steps.add_weight_copy(w.quantize_at, w.gemm_at);
}

// The weight [E, rows, cols] (blocks along `axis`) of the GEMM that `gemm_step` builds from a weight
// operand: the prepared one where given and taken, else quantized in the call (copy-only where a
// copy reader takes the GEMM, else FP8).
template <class GemmStep>
CallWeight call_weight(const Context& ctx, const Problem& p, const QuantSpec& q, Device d, BlockAxis axis,
                       int64_t rows, int64_t cols, const ExpertOperand* prepared, GemmStep gemm_step) {
  const Options& o = ctx.options();
  const int64_t E = p.experts;
  CallWeight w;
  // A prepared copy alone is taken where a backend that reads copies takes the step.
  if (prepared != nullptr && (!is_copy_only(*prepared) || plan_reads_copy(ctx, gemm_step(*prepared)))) {
    w.operand = *prepared;
    w.copy_only = is_copy_only(*prepared);
    return w;
  }
  w.quantize = true;
  w.own = make_expert_copy_only(o, d, E, rows, cols, axis, q.layout, /*allocate_copy=*/false);  // no memory yet
  w.copy_only = q.format == QuantFormat::mxfp8 && plan_reads_copy(ctx, gemm_step(w.own.operand));
  if (!w.copy_only) w.own = make_expert_quant(o, d, q, E, rows, cols, axis);
  w.operand = w.own.operand;
  return w;
}

// Frees the library's own buffers of an MXFP8 tensor once steps[after] has run (borrowed ones: no-op).
void release_after(PlannedSteps& steps, size_t after, OwnedMxfp8& t) {
  steps.release_after(after, std::move(t.data));
  steps.release_after(after, std::move(t.scales));
}
void release_after(PlannedSteps& steps, size_t after, CallWeight& w) {
  steps.release_after(after, std::move(w.own.data));
  steps.release_after(after, std::move(w.own.scales));
}

std::unique_ptr<SavedImpl> new_saved(const Problem& p, const ForwardArgs& refs, int64_t T, Device d) {
  auto s = std::make_unique<SavedImpl>();
  static_cast<StateOrigin&>(*s) = {p, T, d};
  s->refs = refs;
  s->refs.y = {};
  s->refs.prepared = nullptr;  // backward is given its own (BackwardArgs::prepared)
  return s;
}

std::unique_ptr<WgradImpl> new_wgrad(const Problem& p, const GroupOffsets& offsets, int64_t T, Device d) {
  auto w = std::make_unique<WgradImpl>();
  static_cast<StateOrigin&>(*w) = {p, T, d};
  w->offsets = offsets;
  return w;
}


// ---- Memory: the estimate is the planned peak of the same call (layer_plan.h planned_peak) ----

std::string call_name(const char* call, const Problem& p, int64_t T) {
  return std::string(call) + " (T=" + std::to_string(T) + ", " + describe(p) + ")";
}

// Runs `run` (the allocations and steps of one call) after checking the call's planned peak
// (`plan`, the same call run dry) against the device's memory where the library allocates from its
// own pool; an allocation failure becomes an OutOfMemoryError that says how much the whole call
// needs and which allocation failed. The dry run is made once per call shape (`key`: the problem,
// the tokens, the device and which buffers the caller gives) and kept in the context.
template <class Run>
auto with_memory_estimate(Context& ctx, const std::string& what, const std::string& key, Device d,
                          const std::function<void(Context&)>& plan, Run&& run) {
  const Allocator& allocator = ctx.options().allocator;
  auto need = [&] {
    std::map<std::string, int64_t>& peaks = ctx.impl().planned_peaks;
    const auto it = peaks.find(key);
    return it != peaks.end() ? it->second : peaks.emplace(key, planned_peak(ctx, plan)).first->second;
  };
  if (!allocator.set()) check_capacity(d, need(), allocator, what);
  auto head = [&] { return what + " needs about " + format_bytes(need()) + " of library memory; "; };
  try {
    return run();
  } catch (const OutOfMemoryError& e) {
    std::string msg = e.what();
    if (msg.rfind(e.argument() + ": ", 0) == 0) msg.erase(0, e.argument().size() + 2);
    throw OutOfMemoryError(e.argument(), head() + msg);
  } catch (const std::bad_alloc&) {
    throw OutOfMemoryError("memory", head() + "a host allocation inside the library failed (std::bad_alloc)");
  }
}

SavedState forward_impl(Context& ctx, const Problem& p, const ForwardArgs& a, const StateBuffers* into) {
  validate_forward(p, a, into, ctx.options().scale_layout);
  check_forward_finite(ctx, p, a);
  const int64_t T = forward_tokens(a);
  const std::string what = call_name("forward", p, T);
  const std::string key = what + " on " + device_name(forward_device(a)) + (into ? ", into" : "") +
                          (a.prepared ? ", prepared" : "") + (forward_prequantized(a) ? ", prequantized" : "");
  return with_memory_estimate(
      ctx, what, key, forward_device(a), [&](Context& dry) { forward_run(dry, p, a, into); },
      [&] { return forward_run(ctx, p, a, into); });
}

}  // namespace

SavedState forward_run(Context& ctx, const Problem& p, const ForwardArgs& a, const StateBuffers* into) {
  const Options& o = ctx.options();
  const Device d = forward_device(a);
  const ScaleLayout layout = o.scale_layout;
  const int64_t E = p.experts, H = p.hidden, F = p.ffn, T = forward_tokens(a);
  const bool mx = p.recipe != Recipe::bf16;  // a quantized recipe: mxfp8 or fp8_blockwise
  const bool pre = forward_prequantized(a);  // X given quantized (ForwardArgs::x_row / x_col)
  const QuantSpec q = quant_spec(p, layout);
  auto s = new_saved(p, a, T, d);

  s->c = into ? borrowed(into->c) : make_tensor(o, d, DType::bf16, {T, 2 * F});
  OwnedMxfp8 x_row, a_row;
  CallWeight w1, w2;
  Fc1FpropArgs fc1{.x = bf16_op(a.x), .w1 = bf16_operand(a.w1), .offsets = a.offsets, .b1 = a.b1, .probs = a.probs,
                   .c = s->c.view};
  Fc2FpropArgs fc2{.w2 = bf16_operand(a.w2), .offsets = a.offsets, .b2 = a.b2, .probs = a.probs, .y = a.y};
  if (mx) {
    if (!pre) x_row = make_quant(o, d, q, T, H, BlockAxis::row, E);
    s->x_col = pre    ? borrowed(a.x_col)
               : into ? borrowed(into->x_col)
                      : make_quant(o, d, q, T, H, BlockAxis::col, E);
    a_row = make_quant(o, d, q, T, F, BlockAxis::row, E);
    s->a_col = into ? borrowed(into->a_col) : make_quant(o, d, q, T, F, BlockAxis::col, E);
    fc1.x = mx_op(pre ? a.x_row : x_row.view);
    fc1.a = {.row = a_row.view, .col = s->a_col.view};
    fc2.a = mx_op(a_row.view);
    const PreparedImpl* pw = a.prepared ? &a.prepared->impl() : nullptr;
    w1 = call_weight(ctx, p, q, d, BlockAxis::row, 2 * F, H, pw ? &pw->w1_row.operand : nullptr,
                     [&](const ExpertOperand& w) { return fc1_fprop(p, with(fc1, &Fc1FpropArgs::w1, w)); });
    w2 = call_weight(ctx, p, q, d, BlockAxis::row, H, F, pw ? &pw->w2_row.operand : nullptr,
                     [&](const ExpertOperand& w) { return fc2_fprop(p, with(fc2, &Fc2FpropArgs::w2, w)); });
    fc1.w1 = w1.operand;
    fc2.w2 = w2.operand;
  } else {
    s->a_bf16 = into ? borrowed(into->a) : make_tensor(o, d, DType::bf16, {T, F});
    fc1.a.bf16 = s->a_bf16.view;
    fc2.a = bf16_op(s->a_bf16.view);
  }

  std::vector<LayerStep> steps;
  if (mx && !pre) steps.push_back(quantize_x({a.x, a.offsets, x_row.view, s->x_col.view, q.pow2_scales}));
  append_gemm(steps, w1, quantize_w1, a.w1, fc1_fprop(p, fc1));
  append_gemm(steps, w2, quantize_w2, a.w2, fc2_fprop(p, fc2));
  PlannedSteps planned(ctx, std::move(steps));
  add_copy(planned, w1);
  add_copy(planned, w2);
  release_after(planned, w1.gemm_at, x_row);
  release_after(planned, w1.gemm_at, w1);
  planned.run();
  return SavedState(std::move(s));
}

// The weight-gradient GEMMs' operands: column-wise MXFP8, or bf16.
namespace {
struct WgradOperands {
  Operand dy, a, dc, x;
};

WgradOperands operands_of(const WgradImpl& w) {
  if (w.problem.recipe != Recipe::bf16)
    return {mx_op(w.dy_col.view), mx_op(w.a_col.view), mx_op(w.dc_col.view), mx_op(w.x_col.view)};
  return {bf16_op(w.dy_bf16), bf16_op(w.a_bf16.view), bf16_op(w.dc_bf16.view), bf16_op(w.x_bf16)};
}

// dW2 = dY^T A, then dW1 = dC^T X.
std::vector<LayerStep> wgrad_steps(const Problem& p, const GroupOffsets& offsets, const WgradOperands& w,
                                   const WeightGrads& g) {
  return {fc2_wgrad(p, {w.dy, w.a, offsets, g.dw2, g.accumulate}),
          fc1_wgrad(p, {w.dc, w.x, offsets, g.dw1, g.accumulate})};
}

WgradState backward_impl(Context& ctx, SavedState& saved, const BackwardArgs& a, const StateBuffers* into) {
  validate_backward(saved, a, into, ctx.options().scale_layout);
  check_backward_finite(ctx, a);
  const SavedImpl& s = saved.impl();
  const std::string what = call_name("backward", s.problem, s.tokens);
  const std::string key = what + " on " + device_name(s.device) + (into ? ", into" : "") +
                          (a.prepared ? ", prepared" : "") + (a.wgrad == WgradMode::now ? ", wgrad now" : "");
  return with_memory_estimate(
      ctx, what, key, s.device, [&](Context& dry) { backward_run(dry, saved, a, into); },
      [&] { return backward_run(ctx, saved, a, into); });
}

}  // namespace

WgradState backward_run(Context& ctx, SavedState& saved, const BackwardArgs& a, const StateBuffers* into) {
  SavedImpl& s = saved.impl();
  const Options& o = ctx.options();
  const Problem& p = s.problem;
  const Device d = s.device;
  const ScaleLayout layout = o.scale_layout;
  const int64_t E = p.experts, H = p.hidden, F = p.ffn, T = s.tokens;
  const ForwardArgs& r = s.refs;
  const bool mx = p.recipe != Recipe::bf16;
  const QuantSpec q = quant_spec(p, layout);
  auto w = new_wgrad(p, r.offsets, T, d);

  OwnedMxfp8 dy_row, dc_row;
  CallWeight w2, w1;
  OwnedTensor dprob_add;
  if (p.fc2_bias && p.scale_fc2_bias) dprob_add = make_tensor(o, d, DType::f32, {T});
  Fc2DgradArgs fc2{.dy = bf16_op(a.dy), .w2 = bf16_operand(r.w2), .offsets = r.offsets, .probs = r.probs,
                   .c = s.c.view, .dprobs = a.dprobs, .dprob_add = dprob_add.view,
                   .db1 = {a.grads.db1, a.grads.accumulate}};
  Fc1DgradArgs fc1{.w1 = bf16_operand(r.w1), .offsets = r.offsets, .dx = a.dx};
  // The wgrad operands, viewed where they are now (forward's saved ones move into w after the dgrads).
  WgradOperands wops{bf16_op(a.dy), bf16_op(s.a_bf16.view), {}, bf16_op(r.x)};
  if (mx) {
    dy_row = make_quant(o, d, q, T, H, BlockAxis::row, E);
    w->dy_col = into ? borrowed(into->dy_col) : make_quant(o, d, q, T, H, BlockAxis::col, E);
    dc_row = make_quant(o, d, q, T, 2 * F, BlockAxis::row, E);
    w->dc_col = into ? borrowed(into->dc_col) : make_quant(o, d, q, T, 2 * F, BlockAxis::col, E);
    fc2.dy = mx_op(dy_row.view);
    fc2.dc = {.row = dc_row.view, .col = w->dc_col.view};
    fc1.dc = mx_op(dc_row.view);
    const PreparedImpl* pw = a.prepared ? &a.prepared->impl() : nullptr;
    w2 = call_weight(ctx, p, q, d, BlockAxis::col, H, F, pw ? &pw->w2_dgrad() : nullptr,
                     [&](const ExpertOperand& w) { return fc2_dgrad(p, with(fc2, &Fc2DgradArgs::w2, w)); });
    w1 = call_weight(ctx, p, q, d, BlockAxis::col, 2 * F, H, pw ? &pw->w1_dgrad() : nullptr,
                     [&](const ExpertOperand& w) { return fc1_dgrad(p, with(fc1, &Fc1DgradArgs::w1, w)); });
    fc2.w2 = w2.operand;
    fc1.w1 = w1.operand;
    wops = {mx_op(w->dy_col.view), mx_op(s.a_col.view), mx_op(w->dc_col.view), mx_op(s.x_col.view)};
  } else {
    w->dy_bf16 = a.dy;
    w->dc_bf16 = into ? borrowed(into->dc) : make_tensor(o, d, DType::bf16, {T, 2 * F});
    fc2.dc.bf16 = w->dc_bf16.view;
    fc1.dc = bf16_op(w->dc_bf16.view);
    wops.dc = fc1.dc;
  }

  std::vector<LayerStep> steps;
  if (mx) steps.push_back(quantize_dy({a.dy, r.offsets, dy_row.view, w->dy_col.view, q.pow2_scales}));
  if (p.fc2_bias)
    steps.push_back(fc2_bias_grads(p, {.dy = a.dy, .offsets = r.offsets, .probs = r.probs, .b2 = r.b2,
                                       .db2 = {a.grads.db2, a.grads.accumulate}, .dprob_add = dprob_add.view}));
  append_gemm(steps, w2, quantize_w2, r.w2, fc2_dgrad(p, fc2));
  append_gemm(steps, w1, quantize_w1, r.w1, fc1_dgrad(p, fc1));
  const size_t gemm2 = w2.gemm_at, gemm1 = w1.gemm_at;
  PlannedSteps dgrad(ctx, std::move(steps));
  std::optional<PlannedSteps> wgrad;
  if (a.wgrad == WgradMode::now) wgrad.emplace(ctx, wgrad_steps(p, r.offsets, wops, a.grads));
  // What only FC2's dgrad reads is freed once it has run (C among it: from here the state is
  // consumed, even should a later step fail), what only FC1's dgrad reads once that has run.
  add_copy(dgrad, w2);
  add_copy(dgrad, w1);
  // A dry run (the memory estimate, a plan) leaves the saved state to the real call.
  const bool dry = planning(ctx);
  if (!dry) {
    s.consumed = true;
    dgrad.release_after(gemm2, std::move(s.c.buf));
  } else {
    dgrad.count_release_after(gemm2, s.c.buf.bytes);
  }
  dgrad.release_after(gemm2, std::move(dprob_add.buf));
  release_after(dgrad, gemm2, dy_row);
  release_after(dgrad, gemm2, w2);
  release_after(dgrad, gemm1, dc_row);
  release_after(dgrad, gemm1, w1);
  dgrad.run();
  if (dry) {
    if (wgrad) wgrad->run();
    return WgradState();
  }

  // The wgrad operands move from the saved state.
  if (mx) {
    w->x_col = std::move(s.x_col);
    w->a_col = std::move(s.a_col);
  } else {
    w->x_bf16 = r.x;
    w->a_bf16 = std::move(s.a_bf16);
  }
  s.c = OwnedTensor{};
  if (wgrad) {
    wgrad->run();
    return WgradState();
  }
  return WgradState(std::move(w));
}

// The library memory prepare_weights allocates (with `copies`: the bf16 copies too; with
// `transposed`: fp8_blockwise's transposed copies).


namespace {

LayerStep prepare_step(LayerStep step) {
  step.label = "prepare." + step.label;
  return step;
}

}  // namespace

PreparedWeights prepare_run(Context& ctx, const Problem& p, const WeightsArgs& w, Device d, const PreparedForms& forms) {
  const bool copies = forms.bf16_copies, transposed = forms.transposed;
  const Options& o = ctx.options();
  const ScaleLayout layout = o.scale_layout;
  const int64_t E = p.experts, H = p.hidden, F = p.ffn;
  auto pw = std::make_unique<PreparedImpl>();
  pw->problem = p;
  pw->device = d;
  pw->layout = layout;
  if (p.recipe == Recipe::fp8_blockwise) {
    const QuantSpec q = quant_spec(p, layout);
    pw->w1_row = make_expert_quant(o, d, q, E, 2 * F, H, BlockAxis::row);
    pw->w2_row = make_expert_quant(o, d, q, E, H, F, BlockAxis::row);
    for (OwnedExpertMxfp8* c : {&pw->w1_row, &pw->w2_row}) {
      if (copies) c->add_bf16_copy(o, d);
      if (transposed) c->add_transposed_copy(o, d);
    }
    PlannedSteps(ctx, {prepare_step(quantize_w1(pw->w1_row.quantize_from(w.w1))),
                       prepare_step(quantize_w2(pw->w2_row.quantize_from(w.w2)))})
        .run();
  } else if (p.recipe == Recipe::mxfp8) {
    // Where the device's backend reads weight copies, the copies alone (its GEMMs never read the
    // FP8 bytes; a GEMM it refuses quantizes its weight in the call); else the FP8 copies.
    auto make = [&](int64_t rows, int64_t cols, BlockAxis axis) {
      return copies ? make_expert_copy_only(o, d, E, rows, cols, axis, layout, /*allocate_copy=*/true)
                    : make_expert_mxfp8(o, d, E, rows, cols, axis, layout);
    };
    pw->w1_row = make(2 * F, H, BlockAxis::row);
    pw->w2_row = make(H, F, BlockAxis::row);
    pw->w1_col = make(2 * F, H, BlockAxis::col);
    pw->w2_col = make(H, F, BlockAxis::col);
    PlannedSteps(ctx, {prepare_step(quantize_w1(pw->w1_row.quantize_from(w.w1))),
                       prepare_step(quantize_w2(pw->w2_row.quantize_from(w.w2))),
                       prepare_step(quantize_w1(pw->w1_col.quantize_from(w.w1))),
                       prepare_step(quantize_w2(pw->w2_col.quantize_from(w.w2)))})
        .run();
  }
  return PreparedWeights(std::move(pw));
}

}  // namespace detail

PreparedWeights prepare_weights(Context& ctx, const Problem& p, const WeightsArgs& w) {
  using namespace detail;
  const Device d = validate_prepare_weights(p, w);
  check_weights_finite(ctx, p, w);
  const std::string what = "prepare_weights (" + describe(p) + ")";
  const PreparedForms forms = prepared_forms(ctx, p, w, d);
  const std::string key = what + " on " + device_name(d) + (forms.bf16_copies ? ", bf16 copies" : "") +
                          (forms.transposed ? ", transposed" : "");
  return with_memory_estimate(
      ctx, what, key, d, [&](Context& dry) { prepare_run(dry, p, w, d, forms); },
      [&] { return prepare_run(ctx, p, w, d, forms); });
}

SavedState forward(Context& ctx, const Problem& p, const ForwardArgs& a) {
  return detail::forward_impl(ctx, p, a, nullptr);
}

SavedState forward(Context& ctx, const Problem& p, const ForwardArgs& a, const StateBuffers& saved) {
  return detail::forward_impl(ctx, p, a, &saved);
}

SavedState restore_saved_state(const Problem& p, const ForwardArgs& inputs, const StateBuffers& saved) {
  using namespace detail;
  const int64_t T = validate_restore_saved(p, inputs, saved);
  auto s = new_saved(p, inputs, T, saved.c.device);
  s->c = borrowed(saved.c);
  if (p.recipe != Recipe::bf16) {
    s->x_col = borrowed(saved.x_col);
    s->a_col = borrowed(saved.a_col);
  } else {
    s->a_bf16 = borrowed(saved.a);
  }
  return SavedState(std::move(s));
}

WgradState backward(Context& ctx, SavedState& saved, const BackwardArgs& a) {
  return detail::backward_impl(ctx, saved, a, nullptr);
}

WgradState backward(Context& ctx, SavedState& saved, const BackwardArgs& a, const StateBuffers& state) {
  return detail::backward_impl(ctx, saved, a, &state);
}

WgradState restore_wgrad_state(const Problem& p, const ForwardArgs& inputs, const TensorView& dy,
                               const StateBuffers& state) {
  using namespace detail;
  const int64_t T = validate_restore_wgrad(p, inputs, dy, state);
  const bool mx = p.recipe != Recipe::bf16;
  auto w = new_wgrad(p, inputs.offsets, T, (mx ? state.x_col.data : state.a).device);
  if (mx) {
    w->x_col = borrowed(state.x_col);
    w->a_col = borrowed(state.a_col);
    w->dy_col = borrowed(state.dy_col);
    w->dc_col = borrowed(state.dc_col);
  } else {
    w->x_bf16 = inputs.x;
    w->dy_bf16 = dy;
    w->a_bf16 = borrowed(state.a);
    w->dc_bf16 = borrowed(state.dc);
  }
  return WgradState(std::move(w));
}

void compute_wgrad(Context& ctx, WgradState& state, const WeightGrads& grads) {
  using namespace detail;
  validate_compute_wgrad(state, grads);
  const WgradImpl& w = state.impl();
  PlannedSteps(ctx, wgrad_steps(w.problem, w.offsets, operands_of(w), grads)).run();
  state = WgradState();
}

}  // namespace mxmoe
