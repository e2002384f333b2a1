// The grouped MLP entry points: validate -> plan (one backend per step, all chosen before anything
// is written) -> run the steps. The same orchestration drives every backend, so the CPU reference
// applies exactly the quantization points a GPU backend applies (NUMERICS B 1.3, B 4).
#include "mxmoe/grouped_mlp.h"

#include "src/api/layer_state.h"
#include "src/api/validate.h"

namespace mxmoe {

using detail::Backend;
using detail::Epilogue;
using detail::MGemmStep;
using detail::OwnedMxfp8;
using detail::OwnedTensor;
using detail::Step;
using detail::StepQuery;

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

namespace detail {

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
  const int64_t sbytes = axis == BlockAxis::row ? rowwise_scale_bytes(rows, cols) : colwise_scale_bytes(rows, cols, experts);
  o.data = allocate(d, rows * cols, opt.stream, opt.allocator);
  o.scales = allocate(d, sbytes, opt.stream, opt.allocator);
  o.view.data = TensorView::of(o.data.ptr, DType::e4m3, {rows, cols}, d);
  o.view.scales = TensorView::of(o.scales.ptr, DType::e8m0, {sbytes}, d);
  o.view.axis = axis;
  o.view.layout = layout;
  return o;
}

namespace {

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
  return o;
}

// A quantize_experts step: plan it (backend chosen now), run it later.
struct WeightQuant {
  Backend* backend = nullptr;
  QuantizeExpertsStep step;
  OwnedExpertMxfp8 out;
};

WeightQuant plan_weight_quant(Context& ctx, Device d, const ExpertMatrices& w, int64_t experts, int64_t rows,
                              int64_t cols, BlockAxis axis, const char* label) {
  WeightQuant q;
  q.backend = &select(ctx, {Step::quantize_experts, d, Recipe::mxfp8, rows, cols}, label);
  q.out = make_expert_mxfp8(ctx.options(), d, experts, rows, cols, axis, ctx.options().scale_layout);
  q.step = {w, experts, rows, cols, q.out.operand.data.dense, q.out.operand.scales.dense, axis, ctx.options().scale_layout};
  return q;
}

ExpertOperand bf16_operand(const ExpertMatrices& w) {
  ExpertOperand o;
  o.data = w;
  return o;
}

Operand bf16_op(const TensorView& t) { return Operand{t, {}}; }
Operand mx_op(const Mxfp8View& v) { return Operand{{}, v}; }

GluParams glu_params(const Problem& p) { return GluParams{p.activation, p.clamp}; }

void check_weight_layout(const Problem& p, const ExpertMatrices& m, const char* name) {
  const bool per = m.per_expert();
  if (per != (p.weight_layout == WeightLayout::per_expert))
    throw Error(name, std::string("problem.weight_layout=") + to_string(p.weight_layout) + " but " +
                          (per ? "a pointer table" : "a dense tensor") + " was given");
}

void check_bias(bool wanted, const TensorView& b, const char* name, const char* flag, int64_t experts, int64_t n,
                Device d) {
  if (wanted)
    check_tensor(b, name, DType::bf16, {experts, n}, d);
  else if (b.data)
    throw Error(name, std::string("given but problem.") + flag + " is false");
}

int64_t tokens_of(const TensorView& x, const char* name, int64_t cols) {
  if (x.rank != 2 || x.shape[1] != cols)
    throw Error(name, "shape " + shape_string(x) + " must be [T, " + std::to_string(cols) + "]");
  return x.shape[0];
}

// Every input of a forward with T tokens on `d`; x may be absent when !need_x (a restored mxfp8 state).
void validate_inputs(const Problem& p, const ForwardArgs& a, int64_t T, Device d, bool need_x) {
  validate_problem(p);
  const int64_t E = p.experts, H = p.hidden, F = p.ffn;
  if (need_x || a.x.data) check_tensor(a.x, "x", DType::bf16, {T, H}, d);
  check_offsets(a.offsets, "offsets", E, T, d);
  check_tensor(a.probs, "probs", DType::f32, {T}, d);
  check_weight_layout(p, a.w1, "w1");
  check_weight_layout(p, a.w2, "w2");
  check_experts(a.w1, "w1", {DType::bf16}, E, 2 * F, H, d);
  check_experts(a.w2, "w2", {DType::bf16}, E, H, F, d);
  check_bias(p.fc1_bias, a.b1, "b1", "fc1_bias", E, 2 * F, d);
  check_bias(p.fc2_bias, a.b2, "b2", "fc2_bias", E, H, d);
}

std::vector<Region> input_regions(const ForwardArgs& a) {
  return {region("x", a.x),   region("offsets", a.offsets.offsets), region("probs", a.probs),
          region("w1", a.w1.dense), region("w1.pointers", a.w1.pointers), region("b1", a.b1),
          region("w2", a.w2.dense), region("w2.pointers", a.w2.pointers), region("b2", a.b2)};
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

void check_state_mxfp8(const Mxfp8View& v, const std::string& name, int64_t T, int64_t cols, int64_t E,
                       ScaleLayout layout, Device d) {
  check_mxfp8(v, name, T, cols, BlockAxis::col, colwise_scale_bytes(T, cols, E), d);
  if (v.layout != layout)
    throw Error(name + ".layout", "must be the scale layout of the other state tensors and of the context");
}

// The members of StateBuffers forward fills, for the recipe.
void check_saved_buffers(const Problem& p, const StateBuffers& s, int64_t T, ScaleLayout layout, Device d) {
  check_tensor(s.c, "saved.c", DType::bf16, {T, 2 * p.ffn}, d);
  if (p.recipe == Recipe::mxfp8) {
    check_state_mxfp8(s.x_col, "saved.x_col", T, p.hidden, p.experts, layout, d);
    check_state_mxfp8(s.a_col, "saved.a_col", T, p.ffn, p.experts, layout, d);
  } else {
    check_tensor(s.a, "saved.a", DType::bf16, {T, p.ffn}, d);
  }
}

// The members a deferred backward fills.
void check_deferred_buffers(const Problem& p, const StateBuffers& s, int64_t T, ScaleLayout layout, Device d) {
  if (p.recipe == Recipe::mxfp8) {
    check_state_mxfp8(s.dy_col, "state.dy_col", T, p.hidden, p.experts, layout, d);
    check_state_mxfp8(s.dc_col, "state.dc_col", T, 2 * p.ffn, p.experts, layout, d);
  } else {
    check_tensor(s.dc, "state.dc", DType::bf16, {T, 2 * p.ffn}, d);
  }
}

void add_regions(std::vector<Region>& out, const std::string& name, const Mxfp8View& v) {
  out.push_back(region(name + ".data", v.data));
  out.push_back(region(name + ".scales", v.scales));
}

std::vector<Region> saved_buffer_regions(const StateBuffers& s) {
  std::vector<Region> r = {region("saved.c", s.c), region("saved.a", s.a)};
  add_regions(r, "saved.x_col", s.x_col);
  add_regions(r, "saved.a_col", s.a_col);
  return r;
}

std::vector<Region> deferred_buffer_regions(const StateBuffers& s) {
  std::vector<Region> r = {region("state.dc", s.dc)};
  add_regions(r, "state.dy_col", s.dy_col);
  add_regions(r, "state.dc_col", s.dc_col);
  return r;
}

void validate_forward(const Problem& p, const ForwardArgs& a, const StateBuffers* into, ScaleLayout layout) {
  validate_problem(p);  // first: a bad problem is reported before what it makes of x's shape
  const Device d = a.x.device;
  const int64_t T = tokens_of(a.x, "x", p.hidden);
  validate_inputs(p, a, T, d, true);
  check_tensor(a.y, "y", DType::bf16, {T, p.hidden}, d);
  std::vector<Region> outs = {region("y", a.y)};
  if (into) {
    check_saved_buffers(p, *into, T, layout, d);
    for (const Region& r : saved_buffer_regions(*into)) outs.push_back(r);
  }
  check_no_alias(outs, input_regions(a));
}

SavedState forward_impl(Context& ctx, const Problem& p, const ForwardArgs& a, const StateBuffers* into);

}  // namespace
}  // namespace detail

SavedState forward(Context& ctx, const Problem& p, const ForwardArgs& a) {
  return detail::forward_impl(ctx, p, a, nullptr);
}

SavedState forward(Context& ctx, const Problem& p, const ForwardArgs& a, const StateBuffers& saved) {
  return detail::forward_impl(ctx, p, a, &saved);
}

SavedState restore_saved_state(const Problem& p, const ForwardArgs& inputs, const StateBuffers& saved) {
  using namespace detail;
  if (saved.c.rank != 2) throw Error("saved.c", "shape " + shape_string(saved.c) + " must be [T, 2F]");
  const int64_t T = saved.c.shape[0];
  const Device d = saved.c.device;
  validate_inputs(p, inputs, T, d, p.recipe == Recipe::bf16);
  check_saved_buffers(p, saved, T, saved.x_col.layout, d);
  auto s = std::make_unique<SavedImpl>();
  s->problem = p;
  s->tokens = T;
  s->device = d;
  s->refs = inputs;
  s->refs.y = {};
  s->c = borrowed(saved.c);
  if (p.recipe == Recipe::mxfp8) {
    s->x_col = borrowed(saved.x_col);
    s->a_col = borrowed(saved.a_col);
  } else {
    s->a_bf16 = borrowed(saved.a);
  }
  return SavedState(std::move(s));
}

namespace detail {
namespace {

SavedState forward_impl(Context& ctx, const Problem& p, const ForwardArgs& a, const StateBuffers* into) {
  validate_forward(p, a, into, ctx.options().scale_layout);
  const Device d = a.x.device;
  const ScaleLayout layout = ctx.options().scale_layout;
  const int64_t E = p.experts, H = p.hidden, F = p.ffn, T = a.x.shape[0];

  auto s = std::make_unique<SavedImpl>();
  s->problem = p;
  s->tokens = T;
  s->device = d;
  s->refs = a;
  s->refs.y = {};

  MGemmStep fc1;
  fc1.epilogue = Epilogue::glu_forward;
  fc1.gemm.offsets = a.offsets;
  fc1.gemm.bias = p.fc1_bias ? a.b1 : TensorView{};
  fc1.probs = a.probs;
  fc1.glu = glu_params(p);
  fc1.glu_layout = p.glu_layout;
  fc1.ffn = F;
  MGemmStep fc2;
  fc2.epilogue = Epilogue::store;
  fc2.gemm.offsets = a.offsets;
  fc2.gemm.bias = p.fc2_bias ? a.b2 : TensorView{};
  fc2.bias_scale_by_probs = p.scale_fc2_bias;
  fc2.probs = a.probs;
  fc2.gemm.d = a.y;

  if (p.recipe == Recipe::mxfp8) {
    // Plan every step before the first one runs: a missing backend fails here, with nothing written.
    Backend& quant_x = select(ctx, {Step::quantize, d, p.recipe, 0, H}, "quantize_x");
    WeightQuant w1q = plan_weight_quant(ctx, d, a.w1, E, 2 * F, H, BlockAxis::row, "quantize_w1");
    Backend& fc1_b = select(ctx, {Step::gemm_m, d, p.recipe, 2 * F, H}, "fc1_fprop");
    WeightQuant w2q = plan_weight_quant(ctx, d, a.w2, E, H, F, BlockAxis::row, "quantize_w2");
    Backend& fc2_b = select(ctx, {Step::gemm_m, d, p.recipe, H, F}, "fc2_fprop");

    OwnedMxfp8 x_row = make_mxfp8(ctx.options(), d, T, H, BlockAxis::row, layout, E);
    s->x_col = into ? borrowed(into->x_col) : make_mxfp8(ctx.options(), d, T, H, BlockAxis::col, layout, E);
    quant_x.quantize(ctx, {a.x, a.offsets, x_row.view, s->x_col.view});
    w1q.backend->quantize_experts(ctx, w1q.step);

    s->c = into ? borrowed(into->c) : make_tensor(ctx.options(), d, DType::bf16, {T, 2 * F});
    OwnedMxfp8 a_row = make_mxfp8(ctx.options(), d, T, F, BlockAxis::row, layout, E);
    s->a_col = into ? borrowed(into->a_col) : make_mxfp8(ctx.options(), d, T, F, BlockAxis::col, layout, E);
    fc1.gemm.a = mx_op(x_row.view);
    fc1.gemm.b = w1q.out.operand;
    fc1.c = s->c.view;
    fc1.out_row = a_row.view;
    fc1.out_col = s->a_col.view;
    fc1_b.gemm_m(ctx, fc1);

    w2q.backend->quantize_experts(ctx, w2q.step);
    fc2.gemm.a = mx_op(a_row.view);
    fc2.gemm.b = w2q.out.operand;
    fc2_b.gemm_m(ctx, fc2);
  } else {
    Backend& fc1_b = select(ctx, {Step::gemm_m, d, p.recipe, 2 * F, H}, "fc1_fprop");
    Backend& fc2_b = select(ctx, {Step::gemm_m, d, p.recipe, H, F}, "fc2_fprop");
    s->c = into ? borrowed(into->c) : make_tensor(ctx.options(), d, DType::bf16, {T, 2 * F});
    s->a_bf16 = into ? borrowed(into->a) : make_tensor(ctx.options(), d, DType::bf16, {T, F});
    fc1.gemm.a = bf16_op(a.x);
    fc1.gemm.b = bf16_operand(a.w1);
    fc1.c = s->c.view;
    fc1.out_bf16 = s->a_bf16.view;
    fc1_b.gemm_m(ctx, fc1);
    fc2.gemm.a = bf16_op(s->a_bf16.view);
    fc2.gemm.b = bf16_operand(a.w2);
    fc2_b.gemm_m(ctx, fc2);
  }
  return SavedState(std::move(s));
}

void check_grad_matrices(const Problem& p, const WeightGrads& g, Device d) {
  const int64_t E = p.experts, H = p.hidden, F = p.ffn;
  check_weight_layout(p, g.dw1, "grads.dw1");
  check_weight_layout(p, g.dw2, "grads.dw2");
  check_experts(g.dw1, "grads.dw1", {DType::f32, DType::bf16}, E, 2 * F, H, d);
  check_experts(g.dw2, "grads.dw2", {DType::f32, DType::bf16}, E, H, F, d);
  const DType t1 = g.dw1.per_expert() ? g.dw1.dtype : g.dw1.dense.dtype;
  const DType t2 = g.dw2.per_expert() ? g.dw2.dtype : g.dw2.dense.dtype;
  if (g.accumulate && (t1 != DType::f32 || t2 != DType::f32))
    throw Error("grads.accumulate", "accumulate=true needs f32 weight-gradient buffers (dw1 is " +
                                        std::string(dtype_name(t1)) + ", dw2 is " + dtype_name(t2) + ")");
}

void check_bias_grads(const Problem& p, const WeightGrads& g, Device d) {
  auto one = [&](bool wanted, const TensorView& t, const char* name, const char* flag, int64_t n) {
    if (!wanted) {
      if (t.data) throw Error(name, std::string("given but problem.") + flag + " is false");
      return;
    }
    check_tensor_dtypes(t, name, {DType::f32, DType::bf16}, {p.experts, n}, d);
    if (g.accumulate && t.dtype != DType::f32)
      throw Error(name, "accumulate=true needs an f32 buffer, got " + std::string(dtype_name(t.dtype)));
  };
  one(p.fc1_bias, g.db1, "grads.db1", "fc1_bias", 2 * p.ffn);
  one(p.fc2_bias, g.db2, "grads.db2", "fc2_bias", p.hidden);
}

std::vector<Region> grad_regions(const WeightGrads& g) {
  return {region("grads.dw1", g.dw1.dense), region("grads.dw2", g.dw2.dense), region("grads.db1", g.db1),
          region("grads.db2", g.db2)};
}

// The forward's inputs and what it saved (caller memory when restored from StateBuffers).
std::vector<Region> saved_input_regions(const SavedImpl& s) {
  std::vector<Region> r = input_regions(s.refs);
  r.push_back(region("saved.c", s.c.view));
  r.push_back(region("saved.a", s.a_bf16.view));
  add_regions(r, "saved.x_col", s.x_col.view);
  add_regions(r, "saved.a_col", s.a_col.view);
  return r;
}

void validate_backward(SavedState& saved, const BackwardArgs& a, const StateBuffers* into, ScaleLayout layout) {
  if (!saved.valid()) throw Error("saved", "empty SavedState (forward() did not produce it)");
  SavedImpl& s = saved.impl();
  if (s.consumed) throw Error("saved", "this SavedState was already consumed by backward()");
  const Problem& p = s.problem;
  const Device d = s.device;
  const int64_t T = s.tokens, H = p.hidden;
  check_tensor(a.dy, "dy", DType::bf16, {T, H}, d);
  check_tensor(a.dx, "dx", DType::bf16, {T, H}, d);
  check_tensor(a.dprobs, "dprobs", DType::f32, {T}, d);
  if (a.wgrad == WgradMode::now) check_grad_matrices(p, a.grads, d);
  check_bias_grads(p, a.grads, d);
  std::vector<Region> outs = {region("dx", a.dx), region("dprobs", a.dprobs)};
  for (const Region& r : grad_regions(a.grads)) outs.push_back(r);
  if (into) {
    if (a.wgrad != WgradMode::deferred) throw Error("wgrad", "state buffers are for a deferred weight gradient only");
    check_deferred_buffers(p, *into, T, layout, d);
    for (const Region& r : deferred_buffer_regions(*into)) outs.push_back(r);
  }
  std::vector<Region> ins = saved_input_regions(s);
  ins.push_back(region("dy", a.dy));
  check_no_alias(outs, ins);
}

// The two k-grouped wgrad GEMMs (dW2 = dY^T A, dW1 = dC^T X), planned then run.
void run_wgrad(Context& ctx, WgradImpl& w, const WeightGrads& g) {
  const Problem& p = w.problem;
  const Device d = w.device;
  Backend& fc2_w = select(ctx, {Step::gemm_k, d, p.recipe, p.ffn, p.hidden}, "fc2_wgrad");
  Backend& fc1_w = select(ctx, {Step::gemm_k, d, p.recipe, p.hidden, 2 * p.ffn}, "fc1_wgrad");
  const bool mx = p.recipe == Recipe::mxfp8;
  KGroupedGemmArgs k2{mx ? mx_op(w.dy_col.view) : bf16_op(w.dy_bf16), mx ? mx_op(w.a_col.view) : bf16_op(w.a_bf16.view),
                      w.offsets, g.dw2, g.accumulate};
  KGroupedGemmArgs k1{mx ? mx_op(w.dc_col.view) : bf16_op(w.dc_bf16.view), mx ? mx_op(w.x_col.view) : bf16_op(w.x_bf16),
                      w.offsets, g.dw1, g.accumulate};
  fc2_w.gemm_k(ctx, k2);
  fc1_w.gemm_k(ctx, k1);
}

WgradState backward_impl(Context& ctx, SavedState& saved, const BackwardArgs& a, const StateBuffers* into) {
  validate_backward(saved, a, into, ctx.options().scale_layout);
  SavedImpl& s = saved.impl();
  const Problem& p = s.problem;
  const Device d = s.device;
  const ScaleLayout layout = ctx.options().scale_layout;
  const int64_t E = p.experts, H = p.hidden, F = p.ffn, T = s.tokens;
  const ForwardArgs& r = s.refs;
  const bool mx = p.recipe == Recipe::mxfp8;

  auto w = std::make_unique<WgradImpl>();
  w->problem = p;
  w->tokens = T;
  w->device = d;
  w->offsets = r.offsets;

  // ---- plan ----
  Backend* quant_dy = mx ? &select(ctx, {Step::quantize, d, p.recipe, 0, H}, "quantize_dy") : nullptr;
  Backend* bias_b = p.fc2_bias ? &select(ctx, {Step::fc2_bias_grads, d, p.recipe, H, 0}, "fc2_bias_grads") : nullptr;
  WeightQuant w2q, w1q;
  if (mx) w2q = plan_weight_quant(ctx, d, r.w2, E, H, F, BlockAxis::col, "quantize_w2_col");
  Backend& dgrad2 = select(ctx, {Step::gemm_m, d, p.recipe, F, H}, "fc2_dgrad");
  if (mx) w1q = plan_weight_quant(ctx, d, r.w1, E, 2 * F, H, BlockAxis::col, "quantize_w1_col");
  Backend& dgrad1 = select(ctx, {Step::gemm_m, d, p.recipe, H, 2 * F}, "fc1_dgrad");
  if (a.wgrad == WgradMode::now) {
    select(ctx, {Step::gemm_k, d, p.recipe, F, H}, "fc2_wgrad");
    select(ctx, {Step::gemm_k, d, p.recipe, H, 2 * F}, "fc1_wgrad");
  }

  // ---- dY: quantize (mxfp8) and FC2 bias gradients ----
  OwnedMxfp8 dy_row;
  if (mx) {
    dy_row = make_mxfp8(ctx.options(), d, T, H, BlockAxis::row, layout, E);
    w->dy_col = into ? borrowed(into->dy_col) : make_mxfp8(ctx.options(), d, T, H, BlockAxis::col, layout, E);
    quant_dy->quantize(ctx, {a.dy, r.offsets, dy_row.view, w->dy_col.view});
  } else {
    w->dy_bf16 = a.dy;
  }
  OwnedTensor dprob_add;
  if (bias_b) {
    if (p.scale_fc2_bias) dprob_add = make_tensor(ctx.options(), d, DType::f32, {T});
    bias_b->fc2_bias_grads(ctx, {a.dy, r.offsets, r.probs, r.b2, p.scale_fc2_bias, {a.grads.db2, a.grads.accumulate},
                                 dprob_add.view});
  }

  // ---- FC2 dgrad with dGLU epilogue: dA = dY W2_e; dC, dprobs, db1 ----
  MGemmStep d2;
  d2.epilogue = Epilogue::glu_backward;
  d2.gemm.offsets = r.offsets;
  d2.gemm.b_kn = true;  // W2_e is [H, F] = [K, N]
  d2.probs = r.probs;
  d2.glu = glu_params(p);
  d2.glu_layout = p.glu_layout;
  d2.ffn = F;
  d2.c = s.c.view;
  d2.dprobs = a.dprobs;
  d2.dprob_add = dprob_add.view;
  if (p.fc1_bias) d2.db1 = {a.grads.db1, a.grads.accumulate};
  OwnedMxfp8 dc_row;
  if (mx) {
    w2q.backend->quantize_experts(ctx, w2q.step);
    dc_row = make_mxfp8(ctx.options(), d, T, 2 * F, BlockAxis::row, layout, E);
    w->dc_col = into ? borrowed(into->dc_col) : make_mxfp8(ctx.options(), d, T, 2 * F, BlockAxis::col, layout, E);
    d2.gemm.a = mx_op(dy_row.view);
    d2.gemm.b = w2q.out.operand;
    d2.out_row = dc_row.view;
    d2.out_col = w->dc_col.view;
  } else {
    w->dc_bf16 = into ? borrowed(into->dc) : make_tensor(ctx.options(), d, DType::bf16, {T, 2 * F});
    d2.gemm.a = bf16_op(a.dy);
    d2.gemm.b = bf16_operand(r.w2);
    d2.out_bf16 = w->dc_bf16.view;
  }
  dgrad2.gemm_m(ctx, d2);

  // ---- FC1 dgrad: dX = dC W1_e ----
  MGemmStep d1;
  d1.epilogue = Epilogue::store;
  d1.gemm.offsets = r.offsets;
  d1.gemm.b_kn = true;  // W1_e is [2F, H] = [K, N]
  d1.gemm.d = a.dx;
  if (mx) {
    w1q.backend->quantize_experts(ctx, w1q.step);
    d1.gemm.a = mx_op(dc_row.view);
    d1.gemm.b = w1q.out.operand;
  } else {
    d1.gemm.a = bf16_op(w->dc_bf16.view);
    d1.gemm.b = bf16_operand(r.w1);
  }
  dgrad1.gemm_m(ctx, d1);

  // ---- wgrad operands move from the saved state ----
  if (mx) {
    w->x_col = std::move(s.x_col);
    w->a_col = std::move(s.a_col);
  } else {
    w->x_bf16 = r.x;
    w->a_bf16 = std::move(s.a_bf16);
  }
  s.c = OwnedTensor{};
  s.consumed = true;
  if (a.wgrad == WgradMode::now) {
    run_wgrad(ctx, *w, a.grads);
    return WgradState();
  }
  return WgradState(std::move(w));
}

}  // namespace
}  // namespace detail

WgradState backward(Context& ctx, SavedState& saved, const BackwardArgs& a) {
  return detail::backward_impl(ctx, saved, a, nullptr);
}

WgradState backward(Context& ctx, SavedState& saved, const BackwardArgs& a, const StateBuffers& state) {
  return detail::backward_impl(ctx, saved, a, &state);
}

WgradState restore_wgrad_state(const Problem& p, const ForwardArgs& inputs, const TensorView& dy,
                               const StateBuffers& state) {
  using namespace detail;
  validate_problem(p);
  const bool mx = p.recipe == Recipe::mxfp8;
  const TensorView& rows = mx ? state.x_col.data : state.a;
  if (rows.rank != 2) throw Error(mx ? "saved.x_col.data" : "saved.a", "shape " + shape_string(rows) + " must be 2-D");
  const int64_t T = rows.shape[0], E = p.experts, H = p.hidden, F = p.ffn;
  const Device d = rows.device;
  check_offsets(inputs.offsets, "offsets", E, T, d);
  auto w = std::make_unique<WgradImpl>();
  w->problem = p;
  w->tokens = T;
  w->device = d;
  w->offsets = inputs.offsets;
  const ScaleLayout layout = state.x_col.layout;
  if (mx) {
    check_state_mxfp8(state.x_col, "saved.x_col", T, H, E, layout, d);
    check_state_mxfp8(state.a_col, "saved.a_col", T, F, E, layout, d);
    check_deferred_buffers(p, state, T, layout, d);
    w->x_col = borrowed(state.x_col);
    w->a_col = borrowed(state.a_col);
    w->dy_col = borrowed(state.dy_col);
    w->dc_col = borrowed(state.dc_col);
  } else {
    check_tensor(inputs.x, "x", DType::bf16, {T, H}, d);
    check_tensor(dy, "dy", DType::bf16, {T, H}, d);
    check_tensor(state.a, "saved.a", DType::bf16, {T, F}, d);
    check_deferred_buffers(p, state, T, layout, d);
    w->x_bf16 = inputs.x;
    w->dy_bf16 = dy;
    w->a_bf16 = borrowed(state.a);
    w->dc_bf16 = borrowed(state.dc);
  }
  return WgradState(std::move(w));
}

void compute_wgrad(Context& ctx, WgradState& state, const WeightGrads& grads) {
  using namespace detail;
  if (!state.pending()) throw Error("state", "no deferred weight gradient is pending in this WgradState");
  WgradImpl& w = state.impl();
  check_grad_matrices(w.problem, grads, w.device);
  std::vector<Region> ins = {region("offsets", w.offsets.offsets), region("x", w.x_bf16), region("dy", w.dy_bf16),
                             region("a", w.a_bf16.view), region("dc", w.dc_bf16.view)};
  add_regions(ins, "x_col", w.x_col.view);
  add_regions(ins, "a_col", w.a_col.view);
  add_regions(ins, "dy_col", w.dy_col.view);
  add_regions(ins, "dc_col", w.dc_col.view);
  check_no_alias({region("grads.dw1", grads.dw1.dense), region("grads.dw2", grads.dw2.dense)}, ins);
  run_wgrad(ctx, w, grads);
  state = WgradState();
}

}  // namespace mxmoe
