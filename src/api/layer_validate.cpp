// Validation of the grouped-MLP entry points (src/api/layer_validate.h).
#include "src/api/layer_validate.h"

#include <string>
#include <vector>

#include "src/api/layer_state.h"
#include "src/api/validate.h"
#include "src/common/checked.h"
#include "src/common/fp8_block.h"

namespace mxmoe::detail {
namespace {

void check_weight_layout(const Problem& p, const ExpertMatrices& m, const char* name) {
  const bool per = m.per_expert();
  if (per != (p.weight_layout == WeightLayout::per_expert))
    throw Error(name, std::string("problem.weight_layout=") + to_string(p.weight_layout) + " but " +
                          (per ? "a pointer table" : "a dense tensor") + " was given");
}

void check_bias(bool wanted, const TensorView& b, const char* name, const char* flag, int64_t experts, int64_t n,
                const CallDevice& d) {
  if (wanted && b.data == nullptr && b.rank == 0)
    throw Error(name, std::string("missing (no data pointer) but problem.") + flag + " is true; expected bf16 [" +
                          std::to_string(experts) + ", " + std::to_string(n) + "]");
  if (wanted)
    check_tensor(b, name, DType::bf16, {experts, n}, d);
  else if (b.data)
    throw Error(name, std::string("given but problem.") + flag + " is false");
}

int64_t tokens_of(const TensorView& x, const char* name, int64_t cols) {
  if (x.data == nullptr && x.rank == 0)
    throw Error(name, "missing (no data pointer); expected [T, " + std::to_string(cols) + "]");
  check_rank(x, name);
  if (x.rank != 2 || x.shape[1] != cols)
    throw Error(name, "shape " + shape_string(x) + " must be [T, " + std::to_string(cols) + "]");
  check_dim(x.shape[0], kMaxTokens, name, "T");
  return x.shape[0];
}

// Every input of a forward with T tokens on `d`; x may be absent when !need_x (a restored mxfp8 state).
void validate_inputs(const Problem& p, const ForwardArgs& a, int64_t T, const CallDevice& d, bool need_x) {
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

// Every given input of a forward, x first.
void add_input_devices(std::vector<NamedDevice>& out, const ForwardArgs& a) {
  add_device(out, "x", a.x);
  add_device(out, "offsets", a.offsets.offsets);
  add_device(out, "probs", a.probs);
  add_device(out, "w1", a.w1.dense);
  add_device(out, "w1.pointers", a.w1.pointers);
  add_device(out, "b1", a.b1);
  add_device(out, "w2", a.w2.dense);
  add_device(out, "w2.pointers", a.w2.pointers);
  add_device(out, "b2", a.b2);
}

void add_mxfp8_devices(std::vector<NamedDevice>& out, const std::string& name, const Mxfp8View& v) {
  add_device(out, name + ".data", v.data);
  add_device(out, name + ".scales", v.scales);
}

void add_grad_devices(std::vector<NamedDevice>& out, const WeightGrads& g, bool weights, bool biases) {
  if (weights) {
    add_device(out, "grads.dw1", g.dw1.dense);
    add_device(out, "grads.dw1.pointers", g.dw1.pointers);
    add_device(out, "grads.dw2", g.dw2.dense);
    add_device(out, "grads.dw2.pointers", g.dw2.pointers);
  }
  if (biases) {
    add_device(out, "grads.db1", g.db1);
    add_device(out, "grads.db2", g.db2);
  }
}

std::vector<Region> input_regions(const ForwardArgs& a) {
  return {region("x", a.x),         region("offsets", a.offsets.offsets), region("probs", a.probs),
          region("w1", a.w1.dense), region("w1.pointers", a.w1.pointers), region("b1", a.b1),
          region("w2", a.w2.dense), region("w2.pointers", a.w2.pointers), region("b2", a.b2)};
}

// A column-wise state tensor of the recipe (mxfp8: e8m0 chunks in the context's layout;
// fp8_blockwise: f32 token-block scales).
void check_state_mxfp8(const Problem& p, const Mxfp8View& v, const std::string& name, int64_t T, int64_t cols,
                       ScaleLayout layout, const CallDevice& d) {
  const int64_t E = p.experts;
  if (p.recipe == Recipe::fp8_blockwise) {
    check_fp8_block(v, name, T, cols, BlockAxis::col,
                    checked_mul(checked_add(ceil_div(T, kFp8Block), E, name.c_str()), cols, name.c_str()), d);
    return;
  }
  check_mxfp8(v, name, T, cols, BlockAxis::col, colwise_scale_bytes(T, cols, E), d);
  if (v.layout != layout)
    throw Error(name + ".layout", "must be the scale layout of the other state tensors and of the context");
}

// The members of StateBuffers forward fills, for the recipe.
void check_saved_buffers(const Problem& p, const StateBuffers& s, int64_t T, ScaleLayout layout, const CallDevice& d) {
  check_tensor(s.c, "saved.c", DType::bf16, {T, 2 * p.ffn}, d);
  if (p.recipe != Recipe::bf16) {
    check_state_mxfp8(p, s.x_col, "saved.x_col", T, p.hidden, layout, d);
    check_state_mxfp8(p, s.a_col, "saved.a_col", T, p.ffn, layout, d);
  } else {
    check_tensor(s.a, "saved.a", DType::bf16, {T, p.ffn}, d);
  }
}

// The members a deferred backward fills.
void check_deferred_buffers(const Problem& p, const StateBuffers& s, int64_t T, ScaleLayout layout, const CallDevice& d) {
  if (p.recipe != Recipe::bf16) {
    check_state_mxfp8(p, s.dy_col, "state.dy_col", T, p.hidden, layout, d);
    check_state_mxfp8(p, s.dc_col, "state.dc_col", T, 2 * p.ffn, layout, d);
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

void check_grad_matrices(const Problem& p, const WeightGrads& g, const CallDevice& d) {
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

void check_bias_grads(const Problem& p, const WeightGrads& g, const CallDevice& d) {
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

// The saved-state buffers forward fills for the recipe, for the one-device check.
void add_saved_buffer_devices(std::vector<NamedDevice>& out, const Problem& p, const StateBuffers& s) {
  add_device(out, "saved.c", s.c);
  if (p.recipe != Recipe::bf16) {
    add_mxfp8_devices(out, "saved.x_col", s.x_col);
    add_mxfp8_devices(out, "saved.a_col", s.a_col);
  } else {
    add_device(out, "saved.a", s.a);
  }
}

void add_deferred_buffer_devices(std::vector<NamedDevice>& out, const Problem& p, const StateBuffers& s) {
  if (p.recipe != Recipe::bf16) {
    add_mxfp8_devices(out, "state.dy_col", s.dy_col);
    add_mxfp8_devices(out, "state.dc_col", s.dc_col);
  } else {
    add_device(out, "state.dc", s.dc);
  }
}

}  // namespace

namespace {

bool has_prequantized_x(const ForwardArgs& a) {
  return a.x_row.data.data != nullptr || a.x_col.data.data != nullptr || a.x_row.scales.data != nullptr ||
         a.x_col.scales.data != nullptr;
}

// The tensor a forward takes T and the device from: x, or x_row.data when x is absent and X comes
// pre-quantized.
std::pair<const TensorView*, const char*> forward_rows_source(const ForwardArgs& a) {
  if (has_prequantized_x(a) && !a.x.defined() && a.x_row.data.defined()) return {&a.x_row.data, "x_row.data"};
  return {&a.x, "x"};
}

// ForwardArgs::x_row / x_col: MXFP8 of [T, H], recipe mxfp8 only, both given, the context's layout.
void check_prequantized_x(const Problem& p, const ForwardArgs& a, int64_t T, ScaleLayout layout,
                          const StateBuffers* into, const CallDevice& d) {
  if (p.recipe != Recipe::mxfp8)
    throw Error(a.x_row.data.data ? "x_row" : "x_col",
                std::string("pre-quantized X is MXFP8; problem.recipe is ") + to_string(p.recipe) +
                    " (give x in bf16)");
  const bool row = a.x_row.data.data != nullptr, col = a.x_col.data.data != nullptr;
  if (row != col)
    throw Error(row ? "x_col.data" : "x_row.data",
                std::string("missing (no data pointer) but ") + (row ? "x_row" : "x_col") +
                    " is given; the two come together");
  check_mxfp8(a.x_row, "x_row", T, p.hidden, BlockAxis::row, rowwise_scale_bytes(T, p.hidden), d);
  if (a.x_row.layout != layout)
    throw Error("x_row.layout", "must be the context's scale layout (Options::scale_layout)");
  check_mxfp8(a.x_col, "x_col", T, p.hidden, BlockAxis::col, colwise_scale_bytes(T, p.hidden, p.experts), d);
  if (a.x_col.layout != layout)
    throw Error("x_col.layout", "must be the context's scale layout (Options::scale_layout)");
  if (into && (into->x_col.data.data != a.x_col.data.data || into->x_col.scales.data != a.x_col.scales.data))
    throw Error("saved.x_col", "must be x_col itself when X comes pre-quantized (forward writes nothing there)");
}

}  // namespace

int64_t forward_tokens(const ForwardArgs& a) { return forward_rows_source(a).first->shape[0]; }
Device forward_device(const ForwardArgs& a) { return forward_rows_source(a).first->device; }
bool forward_prequantized(const ForwardArgs& a) { return has_prequantized_x(a); }

void validate_forward(const Problem& p, const ForwardArgs& a, const StateBuffers* into, ScaleLayout layout) {
  validate_problem(p);  // first: a bad problem is reported before what it makes of x's shape
  const bool pre = has_prequantized_x(a);
  const auto [rows, rows_name] = forward_rows_source(a);
  const int64_t T = tokens_of(*rows, rows_name, p.hidden);
  std::vector<NamedDevice> devices;
  add_input_devices(devices, a);
  if (pre) {
    add_mxfp8_devices(devices, "x_row", a.x_row);
    add_mxfp8_devices(devices, "x_col", a.x_col);
  }
  add_device(devices, "y", a.y);
  if (into) add_saved_buffer_devices(devices, p, *into);
  check_one_device(devices, false);
  const CallDevice d{rows->device, rows_name};
  validate_inputs(p, a, T, d, !pre);
  if (pre) check_prequantized_x(p, a, T, layout, into, d);
  check_tensor(a.y, "y", DType::bf16, {T, p.hidden}, d);
  std::vector<Region> outs = {region("y", a.y)};
  if (into) {
    check_saved_buffers(p, *into, T, layout, d);
    for (const Region& r : saved_buffer_regions(*into))
      if (!pre || r.name.rfind("saved.x_col", 0) != 0) outs.push_back(r);  // pre: x_col is an input
  }
  std::vector<Region> ins = input_regions(a);
  if (pre) {
    add_regions(ins, "x_row", a.x_row);
    add_regions(ins, "x_col", a.x_col);
  }
  check_no_alias(outs, ins);
  check_prepared(a.prepared, p, d.device, layout);
}


int64_t validate_restore_saved(const Problem& p, const ForwardArgs& inputs, const StateBuffers& saved) {
  validate_problem(p);
  const int64_t T = tokens_of(saved.c, "saved.c", 2 * p.ffn);
  std::vector<NamedDevice> devices;
  add_device(devices, "saved.c", saved.c);
  add_input_devices(devices, inputs);
  add_saved_buffer_devices(devices, p, saved);
  check_one_device(devices, false);
  const CallDevice d{saved.c.device, "saved.c"};
  validate_inputs(p, inputs, T, d, p.recipe == Recipe::bf16);
  check_saved_buffers(p, saved, T, saved.x_col.layout, d);
  return T;
}

void validate_backward(SavedState& saved, const BackwardArgs& a, const StateBuffers* into, ScaleLayout layout) {
  if (!saved.valid()) throw Error("saved", "empty SavedState (forward() did not produce it)");
  SavedImpl& s = saved.impl();
  if (s.consumed) throw Error("saved", "this SavedState was already consumed by backward()");
  if (a.wgrad != WgradMode::now && a.wgrad != WgradMode::deferred)
    throw Error("wgrad", "wgrad=" + std::to_string(static_cast<int>(a.wgrad)) + " is not one of now, deferred");
  const Problem& p = s.problem;
  const CallDevice d{s.device, "the forward's data (saved)"};
  const int64_t T = s.tokens, H = p.hidden;
  std::vector<NamedDevice> devices = {{d.source, d.device}};
  add_device(devices, "dy", a.dy);
  add_device(devices, "dx", a.dx);
  add_device(devices, "dprobs", a.dprobs);
  add_grad_devices(devices, a.grads, a.wgrad == WgradMode::now, true);
  if (into) add_deferred_buffer_devices(devices, p, *into);
  check_one_device(devices, true);
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
  check_prepared(a.prepared, p, s.device, layout);
}

int64_t validate_restore_wgrad(const Problem& p, const ForwardArgs& inputs, const TensorView& dy,
                               const StateBuffers& state) {
  validate_problem(p);
  const bool mx = p.recipe != Recipe::bf16;
  const TensorView& rows = mx ? state.x_col.data : state.a;
  const char* rows_name = mx ? "saved.x_col.data" : "saved.a";
  const int64_t T = tokens_of(rows, rows_name, mx ? p.hidden : p.ffn);
  const int64_t E = p.experts, H = p.hidden, F = p.ffn;
  std::vector<NamedDevice> devices;
  add_device(devices, rows_name, rows);
  add_device(devices, "offsets", inputs.offsets.offsets);
  if (mx) {
    add_mxfp8_devices(devices, "saved.x_col", state.x_col);
    add_mxfp8_devices(devices, "saved.a_col", state.a_col);
  } else {
    add_device(devices, "x", inputs.x);
    add_device(devices, "dy", dy);
  }
  add_deferred_buffer_devices(devices, p, state);
  check_one_device(devices, false);
  const CallDevice d{rows.device, rows_name};
  const ScaleLayout layout = state.x_col.layout;
  check_offsets(inputs.offsets, "offsets", E, T, d);
  if (mx) {
    check_state_mxfp8(p, state.x_col, "saved.x_col", T, H, layout, d);
    check_state_mxfp8(p, state.a_col, "saved.a_col", T, F, layout, d);
  } else {
    check_tensor(inputs.x, "x", DType::bf16, {T, H}, d);
    check_tensor(dy, "dy", DType::bf16, {T, H}, d);
    check_tensor(state.a, "saved.a", DType::bf16, {T, F}, d);
  }
  check_deferred_buffers(p, state, T, layout, d);
  return T;
}

Device validate_prepare_weights(const Problem& p, const WeightsArgs& w) {
  validate_problem(p);
  std::vector<NamedDevice> devices;
  add_device(devices, "w1", w.w1.dense);
  add_device(devices, "w1.pointers", w.w1.pointers);
  add_device(devices, "w2", w.w2.dense);
  add_device(devices, "w2.pointers", w.w2.pointers);
  if (devices.empty()) throw Error("w1", "missing (no data pointer); expected bf16 [E, 2F, H]");
  check_one_device(devices, false);
  const CallDevice d{devices.front().device, devices.front().name};
  check_weight_layout(p, w.w1, "w1");
  check_weight_layout(p, w.w2, "w2");
  check_experts(w.w1, "w1", {DType::bf16}, p.experts, 2 * p.ffn, p.hidden, d);
  check_experts(w.w2, "w2", {DType::bf16}, p.experts, p.hidden, p.ffn, d);
  return d.device;
}

void check_prepared(const PreparedWeights* prepared, const Problem& p, Device device, ScaleLayout layout) {
  if (!prepared) return;
  if (!prepared->valid()) throw Error("prepared", "empty PreparedWeights (prepare_weights() did not produce it)");
  const PreparedImpl& w = prepared->impl();
  const Problem& q = w.problem;
  auto differs = [&](const char* field, const std::string& made, const std::string& now) {
    throw Error("prepared", std::string("was prepared for ") + field + "=" + made + " but this call has " + field +
                                "=" + now);
  };
  if (q.hidden != p.hidden) differs("problem.hidden", std::to_string(q.hidden), std::to_string(p.hidden));
  if (q.ffn != p.ffn) differs("problem.ffn", std::to_string(q.ffn), std::to_string(p.ffn));
  if (q.experts != p.experts) differs("problem.experts", std::to_string(q.experts), std::to_string(p.experts));
  if (q.recipe != p.recipe) differs("problem.recipe", to_string(q.recipe), to_string(p.recipe));
  if (q.glu_layout != p.glu_layout) differs("problem.glu_layout", to_string(q.glu_layout), to_string(p.glu_layout));
  if (w.device != device) differs("device", device_name(w.device), device_name(device));
  if (q.pow2_scales != p.pow2_scales)
    differs("problem.pow2_scales", q.pow2_scales ? "true" : "false", p.pow2_scales ? "true" : "false");
  if (p.recipe == Recipe::mxfp8 && w.layout != layout)
    differs("the context's scale_layout", w.layout == ScaleLayout::swizzled ? "swizzled" : "compact",
            layout == ScaleLayout::swizzled ? "swizzled" : "compact");
}

void validate_compute_wgrad(WgradState& state, const WeightGrads& grads) {
  if (!state.pending()) throw Error("state", "no deferred weight gradient is pending in this WgradState");
  const WgradImpl& w = state.impl();
  std::vector<NamedDevice> devices = {{"the deferred backward's data (state)", w.device}};
  add_grad_devices(devices, grads, true, false);
  check_one_device(devices, true);
  check_grad_matrices(w.problem, grads, {w.device, "the deferred backward's data (state)"});
  std::vector<Region> ins = {region("offsets", w.offsets.offsets), region("x", w.x_bf16), region("dy", w.dy_bf16),
                             region("a", w.a_bf16.view), region("dc", w.dc_bf16.view)};
  add_regions(ins, "x_col", w.x_col.view);
  add_regions(ins, "a_col", w.a_col.view);
  add_regions(ins, "dy_col", w.dy_col.view);
  add_regions(ins, "dc_col", w.dc_col.view);
  check_no_alias({region("grads.dw1", grads.dw1.dense), region("grads.dw2", grads.dw2.dense)}, ins);
}

}  // namespace mxmoe::detail
