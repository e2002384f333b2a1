// The grouped-MLP layer as functional torch ops (plus main-grad variants that mutate fp32 buffers).
// Everything forward keeps for backward, and a deferred backward for the wgrad, is a torch tensor
// allocated here and handed to the library as caller-owned StateBuffers, so autograd (or a traced
// graph) owns the memory. Group offsets stay on the device. The one opaque object is the optional
// prepared weights (a PreparedWeights custom class made by grouped_mlp_prepare_weights, library
// memory from PyTorch's allocator); given, forward and backward read its quantized W1 and W2 and skip
// their own weight quantize steps, bit-identically.
//
//   grouped_mlp_prepare_weights (w1, w2, scalars) -> PreparedWeights
//   grouped_mlp_forward   (x, offsets, probs, w1, b1?, w2, b2?, scalars, prepared?) -> y, saved
//   grouped_mlp_forward_prequantized (x_row, x_row_scales, x_col, x_col_scales, offsets, probs, w1, b1?, w2, b2?,
//                         scalars, prepared?) -> y, [c, a_col, a_col_scales]   (mxfp8; X as MXFP8)
//   grouped_mlp_backward  (dy, saved, x?, inputs, scalars, defer_wgrad, prepared?)
//                           -> dx, dprobs, dw1, dw2, db1, db2, deferred
//   grouped_mlp_backward_ (... , main_grad_w1!, main_grad_w2!, main_grad_b1!?, main_grad_b2!?, deferred!, prepared?)
//                           -> dx, dprobs
//   grouped_mlp_wgrad     (x?, dy?, offsets, saved[1:], deferred, recipe) -> dw1, dw2
//   grouped_mlp_wgrad_    (..., main_grad_w1!, main_grad_w2!) -> ()
// The forward and backward ops take check_finite last (Options::check_finite).
#include "layer_ops.h"

namespace mxmoe::torch_ext {

namespace {

at::Tensor empty_if(bool present, std::initializer_list<int64_t> shape, const at::TensorOptions& o) {
  return present ? at::empty(shape, o) : at::empty({0}, o);
}

ForwardArgs inputs_of(const std::optional<at::Tensor>& x, const at::Tensor& offsets, const at::Tensor& probs,
                      const at::Tensor& w1, const std::optional<at::Tensor>& b1, const at::Tensor& w2,
                      const std::optional<at::Tensor>& b2) {
  ForwardArgs a;
  a.x = view(x);
  a.offsets.offsets = view(offsets);
  a.probs = view(probs);
  a.w1.dense = view(w1);
  a.b1 = view(b1);
  a.w2.dense = view(w2);
  a.b2 = view(b2);
  return a;
}

// Inputs made contiguous once, so views of them stay valid for the whole call.
struct LayerInputs {
  std::optional<at::Tensor> x;
  at::Tensor offsets, probs, w1, w2;
  std::optional<at::Tensor> b1, b2;
  LayerInputs(const std::optional<at::Tensor>& x_, const at::Tensor& offsets_, const at::Tensor& probs_,
              const at::Tensor& w1_, const std::optional<at::Tensor>& b1_, const at::Tensor& w2_,
              const std::optional<at::Tensor>& b2_)
      : offsets(offsets_.contiguous()), probs(probs_.contiguous()), w1(w1_.contiguous()), w2(w2_.contiguous()) {
    if (x_ && x_->defined()) x = x_->contiguous();
    if (b1_ && b1_->defined()) b1 = b1_->contiguous();
    if (b2_ && b2_->defined()) b2 = b2_->contiguous();
  }
  ForwardArgs args() const { return inputs_of(x, offsets, probs, w1, b1, w2, b2); }
  Problem problem(const LayerScalars& s) const { return make_problem(w1, b1.has_value(), b2.has_value(), s); }
};

LayerScalars scalars(std::string recipe, std::string activation, double limit, double alpha, double linear_offset,
                     std::string glu_layout, bool scale_fc2_bias) {
  return {std::move(recipe), std::move(activation), limit, alpha, linear_offset, std::move(glu_layout), scale_fc2_bias};
}

// The layer inputs' devices, x first (dy first where x is absent), for the ops' DeviceCheck.
DeviceCheck layer_devices(const char* op, const std::optional<at::Tensor>& x, const std::optional<at::Tensor>& dy,
                          at::TensorList saved, const at::Tensor& offsets, const std::optional<at::Tensor>& probs,
                          const std::optional<at::Tensor>& w1, const std::optional<at::Tensor>& b1,
                          const std::optional<at::Tensor>& w2, const std::optional<at::Tensor>& b2) {
  DeviceCheck c(op);
  c.add("x", x).add("dy", dy).add("saved", saved).add("offsets", offsets).add("probs", probs);
  c.add("w1", w1).add("b1", b1).add("w2", w2).add("b2", b2);
  return c;
}

// The library's view of an optional prepared-weights argument (an absent one: none).
const PreparedWeights* prepared_of(const Prepared& prepared) {
  return prepared && prepared->defined() ? (*prepared)->get() : nullptr;
}

// dx and dprobs, shared by both backward variants; `grads` and the `deferred` list come from the caller.
struct BackwardRun {
  at::Tensor dx, dprobs;
};

BackwardRun run_backward(const at::Tensor& dy_in, at::TensorList saved, const LayerInputs& in, const Problem& p,
                         bool defer_wgrad, const WeightGrads& grads, at::TensorList deferred,
                         const Prepared& prepared, bool check_finite) {
  const at::Tensor dy = dy_in.contiguous();
  const int64_t T = saved[0].size(0);
  BackwardRun r;
  r.dx = at::empty({T, p.hidden}, dy.options());
  r.dprobs = at::empty({T}, dy.options().dtype(at::kFloat));
  TORCH_CHECK(defer_wgrad || deferred.empty(), "mxmoe: a deferred-wgrad list is given but defer_wgrad is false");
  if (T == 0) return r;  // nothing to add: the callers zero or keep their gradient buffers
  StateBuffers state = saved_buffers(p, saved);
  CallContext cc(dy, check_finite);
  SavedState s = restore_saved_state(p, in.args(), state);
  BackwardArgs ba;
  ba.dy = view(dy);
  ba.dx = view(r.dx);
  ba.dprobs = view(r.dprobs);
  ba.grads = grads;
  ba.wgrad = defer_wgrad ? WgradMode::deferred : WgradMode::now;
  ba.prepared = prepared_of(prepared);
  if (defer_wgrad) {
    add_deferred_buffers(state, p, deferred);
    backward(cc.get(), s, ba, state);
  } else {
    backward(cc.get(), s, ba);
  }
  return r;
}

// The problem of a wgrad call, from the shapes of what forward saved.
Problem wgrad_problem(const std::optional<at::Tensor>& x, const at::Tensor& offsets, at::TensorList saved_tail,
                      const std::string& recipe) {
  Problem p;
  set_recipe(p, recipe);
  const bool mx = p.recipe != Recipe::bf16;
  TORCH_CHECK(saved_tail.size() == (mx ? 4u : 1u), "mxmoe: grouped_mlp_wgrad takes the forward's saved list without "
              "its first tensor (", mx ? 4 : 1, " tensors for ", recipe, "), got ", saved_tail.size());
  TORCH_CHECK(mx || (x && x->defined()), "mxmoe: the bf16 wgrad needs x");
  p.hidden = mx ? saved_tail[0].size(1) : x->size(1);
  p.ffn = mx ? saved_tail[2].size(1) : saved_tail[0].size(1);
  p.experts = offsets.size(0) - 1;
  return p;
}

void run_wgrad(const std::optional<at::Tensor>& x_in, const std::optional<at::Tensor>& dy_in, const at::Tensor& offsets,
               at::TensorList saved_tail, at::TensorList deferred, const Problem& p, const WeightGrads& grads) {
  const bool mx = p.recipe != Recipe::bf16;
  const int64_t T = saved_tail[0].size(0);
  if (T == 0) return;
  std::optional<at::Tensor> x, dy;
  if (!mx) {
    TORCH_CHECK(dy_in && dy_in->defined(), "mxmoe: the bf16 wgrad needs dy");
    x = x_in->contiguous();
    dy = dy_in->contiguous();
  }
  StateBuffers state;
  if (mx) {
    state.x_col = colwise_view(saved_tail[0], saved_tail[1]);
    state.a_col = colwise_view(saved_tail[2], saved_tail[3]);
  } else {
    state.a = view(saved_tail[0]);
  }
  add_deferred_buffers(state, p, deferred);
  const at::Tensor offs = offsets.contiguous();
  ForwardArgs in;
  in.x = view(x);
  in.offsets.offsets = view(offs);
  CallContext cc(saved_tail[0]);
  WgradState w = restore_wgrad_state(p, in, view(dy), state);
  compute_wgrad(cc.get(), w, grads);
}

}  // namespace

c10::intrusive_ptr<PreparedWeightsHolder> grouped_mlp_prepare_weights(const at::Tensor& w1_in, const at::Tensor& w2_in,
                                                                      std::string recipe, std::string activation,
                                                                      double limit, double alpha, double linear_offset,
                                                                      std::string glu_layout, bool scale_fc2_bias) {
  DeviceCheck("grouped_mlp_prepare_weights").add("w1", w1_in).add("w2", w2_in).check();
  const at::Tensor w1 = w1_in.contiguous(), w2 = w2_in.contiguous();
  // The prepared copies depend on hidden, ffn, experts, recipe and glu_layout only: the biases (and
  // so scale_fc2_bias, which needs an FC2 bias) play no part.
  (void)scale_fc2_bias;
  const Problem p =
      make_problem(w1, false, false, scalars(recipe, activation, limit, alpha, linear_offset, glu_layout, false));
  WeightsArgs wa;
  wa.w1.dense = view(w1);
  wa.w2.dense = view(w2);
  CallContext cc(w1);
  // prepare_weights copies what it reads: w1 and w2 (and the contiguous copies above) may go.
  return c10::make_intrusive<PreparedWeightsHolder>(prepare_weights(cc.get(), p, wa), w1.device());
}

std::tuple<at::Tensor, std::vector<at::Tensor>> grouped_mlp_forward(
    const at::Tensor& x_in, const at::Tensor& offsets, const at::Tensor& probs, const at::Tensor& w1,
    const std::optional<at::Tensor>& b1, const at::Tensor& w2, const std::optional<at::Tensor>& b2, std::string recipe,
    std::string activation, double limit, double alpha, double linear_offset, std::string glu_layout,
    bool scale_fc2_bias, const Prepared& prepared, bool check_finite) {
  layer_devices("grouped_mlp_forward", x_in, std::nullopt, {}, offsets, probs, w1, b1, w2, b2).check();
  const LayerInputs in(x_in, offsets, probs, w1, b1, w2, b2);
  const Problem p = in.problem(scalars(recipe, activation, limit, alpha, linear_offset, glu_layout, scale_fc2_bias));
  const at::Tensor& x = *in.x;
  const int64_t T = x.size(0);
  at::Tensor y = at::empty({T, p.hidden}, x.options());
  std::vector<at::Tensor> saved = empty_saved(p, T, x.options());
  if (T == 0) return {y, saved};
  ForwardArgs fa = in.args();
  fa.y = view(y);
  fa.prepared = prepared_of(prepared);
  CallContext cc(x, check_finite);
  forward(cc.get(), p, fa, saved_buffers(p, saved));  // the SavedState it returns owns nothing
  return {y, saved};
}

std::tuple<at::Tensor, std::vector<at::Tensor>> grouped_mlp_forward_prequantized(
    const at::Tensor& x_row_in, const at::Tensor& x_row_scales_in, const at::Tensor& x_col_in,
    const at::Tensor& x_col_scales_in, const at::Tensor& offsets, const at::Tensor& probs, const at::Tensor& w1,
    const std::optional<at::Tensor>& b1, const at::Tensor& w2, const std::optional<at::Tensor>& b2, std::string recipe,
    std::string activation, double limit, double alpha, double linear_offset, std::string glu_layout,
    bool scale_fc2_bias, const Prepared& prepared, bool check_finite) {
  layer_devices("grouped_mlp_forward_prequantized", x_row_in, std::nullopt, {}, offsets, probs, w1, b1, w2, b2)
      .add("x_row_scales", x_row_scales_in)
      .add("x_col", x_col_in)
      .add("x_col_scales", x_col_scales_in)
      .check();
  TORCH_CHECK(recipe == "mxfp8", "mxmoe: grouped_mlp_forward_prequantized: recipe must be 'mxfp8' (X quantized as "
              "MXFP8), got '", recipe, "'");
  TORCH_CHECK(x_row_in.dim() == 2, "mxmoe: grouped_mlp_forward_prequantized: x_row must be [T, H], got shape ",
              x_row_in.sizes());
  const LayerInputs in(std::nullopt, offsets, probs, w1, b1, w2, b2);
  const Problem p = in.problem(scalars(recipe, activation, limit, alpha, linear_offset, glu_layout, scale_fc2_bias));
  const at::Tensor x_row = x_row_in.contiguous(), x_row_scales = x_row_scales_in.contiguous();
  const at::Tensor x_col = x_col_in.contiguous(), x_col_scales = x_col_scales_in.contiguous();
  const int64_t T = x_row.size(0);
  const at::TensorOptions like = x_row.options();
  at::Tensor y = at::empty({T, p.hidden}, like.dtype(at::kBFloat16));
  // empty_saved's list without x_col and its scales (the caller's x_col is what backward reads);
  // column-wise scales zeroed, as empty_saved's are.
  std::vector<at::Tensor> saved{at::empty({T, 2 * p.ffn}, like.dtype(at::kBFloat16)),
                                at::empty({T, p.ffn}, like.dtype(at::kFloat8_e4m3fn)),
                                at::zeros({colwise_scales(T, p.ffn, p.experts)}, like.dtype(at::kByte))};
  if (T == 0) return {y, saved};
  ForwardArgs fa = in.args();
  fa.x_row = mx_view(x_row, x_row_scales, BlockAxis::row, ScaleLayout::compact);
  fa.x_col = colwise_view(x_col, x_col_scales);
  fa.y = view(y);
  fa.prepared = prepared_of(prepared);
  StateBuffers state;
  state.c = view(saved[0]);
  state.x_col = fa.x_col;  // forward writes nothing there: the library checks it is x_col itself
  state.a_col = colwise_view(saved[1], saved[2]);
  CallContext cc(x_row, check_finite);
  forward(cc.get(), p, fa, state);
  return {y, saved};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, std::vector<at::Tensor>>
grouped_mlp_backward(const at::Tensor& dy, at::TensorList saved, const std::optional<at::Tensor>& x,
                     const at::Tensor& offsets, const at::Tensor& probs, const at::Tensor& w1,
                     const std::optional<at::Tensor>& b1, const at::Tensor& w2, const std::optional<at::Tensor>& b2,
                     std::string recipe, std::string activation, double limit, double alpha, double linear_offset,
                     std::string glu_layout, bool scale_fc2_bias, bool defer_wgrad, const Prepared& prepared,
                     bool check_finite) {
  layer_devices("grouped_mlp_backward", x, dy, saved, offsets, probs, w1, b1, w2, b2).check();
  const LayerInputs in(x, offsets, probs, w1, b1, w2, b2);
  const Problem p = in.problem(scalars(recipe, activation, limit, alpha, linear_offset, glu_layout, scale_fc2_bias));
  const int64_t E = p.experts, H = p.hidden, F = p.ffn;
  const at::TensorOptions bf = dy.options().dtype(at::kBFloat16);
  at::Tensor dw1 = empty_if(!defer_wgrad, {E, 2 * F, H}, bf), dw2 = empty_if(!defer_wgrad, {E, H, F}, bf);
  at::Tensor db1 = empty_if(p.fc1_bias, {E, 2 * F}, bf), db2 = empty_if(p.fc2_bias, {E, H}, bf);
  WeightGrads g;
  if (!defer_wgrad) {
    g.dw1.dense = view(dw1);
    g.dw2.dense = view(dw2);
  }
  if (p.fc1_bias) g.db1 = view(db1);
  if (p.fc2_bias) g.db2 = view(db2);
  const std::vector<at::Tensor> deferred = defer_wgrad ? empty_deferred(p, saved[0].size(0), dy.options()) : std::vector<at::Tensor>{};
  BackwardRun r = run_backward(dy, saved, in, p, defer_wgrad, g, deferred, prepared, check_finite);
  if (saved[0].size(0) == 0) {  // no tokens: every gradient is zero
    for (at::Tensor* t : {&dw1, &dw2, &db1, &db2}) t->zero_();
  }
  return {r.dx, r.dprobs, dw1, dw2, db1, db2, deferred};
}

std::tuple<at::Tensor, at::Tensor> grouped_mlp_backward_(
    const at::Tensor& dy, at::TensorList saved, const std::optional<at::Tensor>& x, const at::Tensor& offsets,
    const at::Tensor& probs, const at::Tensor& w1, const std::optional<at::Tensor>& b1, const at::Tensor& w2,
    const std::optional<at::Tensor>& b2, std::string recipe, std::string activation, double limit, double alpha,
    double linear_offset, std::string glu_layout, bool scale_fc2_bias, bool defer_wgrad, at::Tensor& main_grad_w1,
    at::Tensor& main_grad_w2, const std::optional<at::Tensor>& main_grad_b1,
    const std::optional<at::Tensor>& main_grad_b2, at::TensorList deferred, const Prepared& prepared,
    bool check_finite) {
  layer_devices("grouped_mlp_backward_", x, dy, saved, offsets, probs, w1, b1, w2, b2)
      .add("main_grad_w1", main_grad_w1)
      .add("main_grad_w2", main_grad_w2)
      .add("main_grad_b1", main_grad_b1)
      .add("main_grad_b2", main_grad_b2)
      .add("deferred", deferred)
      .check();
  const LayerInputs in(x, offsets, probs, w1, b1, w2, b2);
  const Problem p = in.problem(scalars(recipe, activation, limit, alpha, linear_offset, glu_layout, scale_fc2_bias));
  TORCH_CHECK(!p.fc1_bias || (main_grad_b1 && main_grad_b1->defined()), "mxmoe: b1 is given, so main_grad_b1 must be");
  TORCH_CHECK(!p.fc2_bias || (main_grad_b2 && main_grad_b2->defined()), "mxmoe: b2 is given, so main_grad_b2 must be");
  WeightGrads g;
  g.accumulate = true;
  if (!defer_wgrad) {
    g.dw1.dense = view(main_grad_w1);
    g.dw2.dense = view(main_grad_w2);
  }
  if (p.fc1_bias) g.db1 = view(*main_grad_b1);
  if (p.fc2_bias) g.db2 = view(*main_grad_b2);
  BackwardRun r = run_backward(dy, saved, in, p, defer_wgrad, g, deferred, prepared, check_finite);
  return {r.dx, r.dprobs};
}

std::tuple<at::Tensor, at::Tensor> grouped_mlp_wgrad(const std::optional<at::Tensor>& x,
                                                     const std::optional<at::Tensor>& dy, const at::Tensor& offsets,
                                                     at::TensorList saved_tail, at::TensorList deferred,
                                                     std::string recipe) {
  DeviceCheck("grouped_mlp_wgrad").add("x", x).add("dy", dy).add("saved_tail", saved_tail).add("offsets", offsets)
      .add("deferred", deferred).check();
  const Problem p = wgrad_problem(x, offsets, saved_tail, recipe);
  const at::TensorOptions bf = saved_tail[0].options().dtype(at::kBFloat16);
  at::Tensor dw1 = at::empty({p.experts, 2 * p.ffn, p.hidden}, bf);
  at::Tensor dw2 = at::empty({p.experts, p.hidden, p.ffn}, bf);
  if (saved_tail[0].size(0) == 0) return {dw1.zero_(), dw2.zero_()};
  WeightGrads g;
  g.dw1.dense = view(dw1);
  g.dw2.dense = view(dw2);
  run_wgrad(x, dy, offsets, saved_tail, deferred, p, g);
  return {dw1, dw2};
}

void grouped_mlp_wgrad_(const std::optional<at::Tensor>& x, const std::optional<at::Tensor>& dy,
                        const at::Tensor& offsets, at::TensorList saved_tail, at::TensorList deferred,
                        std::string recipe, at::Tensor& main_grad_w1, at::Tensor& main_grad_w2) {
  DeviceCheck("grouped_mlp_wgrad_").add("x", x).add("dy", dy).add("saved_tail", saved_tail).add("offsets", offsets)
      .add("deferred", deferred).add("main_grad_w1", main_grad_w1).add("main_grad_w2", main_grad_w2).check();
  const Problem p = wgrad_problem(x, offsets, saved_tail, recipe);
  WeightGrads g;
  g.dw1.dense = view(main_grad_w1);
  g.dw2.dense = view(main_grad_w2);
  g.accumulate = true;
  run_wgrad(x, dy, offsets, saved_tail, deferred, p, g);
}

}  // namespace mxmoe::torch_ext
