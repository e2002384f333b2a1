// Options::check_finite (docs/numerics.md "Non-finite values"), checked the same way on every
// device: a NaN, +Inf or -Inf planted in any input of forward (x, probs, w1, b1, w2, b2) or backward
// (dy) is an Error whose argument is that tensor and whose message gives the first bad value's
// coordinates and kind (a later bad value is planted too), every output keeps its poison, and a
// refused backward leaves its saved state usable. Used by the CPU unit test and the GPU suite.
#pragma once
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/nonfinite_support.h"

namespace mxmoe::test {

// A value planted in an input: bf16 bits, or the f32 value (probs).
struct Planted {
  const char* name;  // as the message says it
  uint16_t bf16;
  float f32;
};
inline const std::vector<Planted>& planted_values() {
  static const std::vector<Planted> v = {{"NaN", 0x7fc0, NAN}, {"+Inf", 0x7f80, INFINITY}, {"-Inf", 0xff80, -INFINITY}};
  return v;
}

// Where the first bad value goes and where a later one (NaN) goes, in the tensor's coordinates.
struct FiniteCase {
  std::string tensor;  // "x", "probs", "w1", "b1", "w2", "b2" or "dy"
  std::vector<int64_t> first, later;
};

// Shapes of finite_problem: T = 16 over E = 3 experts, H = 256, F = 128, both biases.
inline const std::vector<FiniteCase>& finite_cases() {
  static const std::vector<FiniteCase> v = {
      {"x", {9, 37}, {12, 3}},       {"probs", {5}, {11}},          {"w1", {1, 200, 7}, {2, 0, 0}},
      {"b1", {2, 100}, {2, 101}},    {"w2", {0, 3, 64}, {0, 3, 65}}, {"b2", {1, 200}, {2, 0}},
      {"dy", {4, 250}, {15, 255}},
  };
  return v;
}

inline Problem finite_problem(Recipe recipe, Device device, WeightLayout layout = WeightLayout::dense) {
  Problem p = nonfinite_problem(recipe, device);
  p.fc1_bias = p.fc2_bias = true;
  p.weight_layout = layout;
  return p;
}

inline HostTensor& input_named(LayerData& d, const std::string& name) {
  if (name == "x") return d.x;
  if (name == "probs") return d.probs;
  if (name == "w1") return d.w1;
  if (name == "b1") return d.b1;
  if (name == "w2") return d.w2;
  if (name == "b2") return d.b2;
  return d.dy;
}

inline void plant(HostTensor& t, const std::vector<int64_t>& at, const Planted& v) {
  int64_t i = 0;
  for (size_t k = 0; k < at.size(); ++k) i = i * t.view.shape[k] + at[k];
  if (t.view.dtype == DType::f32) t.ptr<float>()[i] = v.f32;
  else t.ptr<uint16_t>()[i] = v.bf16;
}

inline std::string coordinates_text(const std::vector<int64_t>& at) {
  std::string s = "[";
  for (size_t k = 0; k < at.size(); ++k) s += (k ? ", " : "") + std::to_string(at[k]);
  return s + "]";
}

// Runs `call`, which must throw the Error of case `c` planted as `v`.
inline void expect_finite_error(const std::function<void()>& call, const FiniteCase& c, const Planted& v) {
  const std::string want = c.tensor + ": holds " + v.name + " at " + coordinates_text(c.first);
  try {
    call();
    ADD_FAILURE() << "no error for " << want;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), c.tensor) << e.what();
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << "got: " << e.what() << "\nwant: " << want;
  }
}

// The layer's views of `d` in `m`: inputs, poisoned y, backward's poisoned outputs.
struct FiniteCall {
  ForwardArgs fa;
  BackwardArgs ba;
  std::vector<TensorView> outputs;  // y, dx, dprobs, dw1, dw2, db1, db2
};
inline FiniteCall finite_call(Arena& m, const LayerData& d) {
  const Problem& p = d.problem;
  const int64_t T = d.tokens, H = p.hidden, F = p.ffn, E = p.experts;
  const bool per = p.weight_layout == WeightLayout::per_expert;
  FiniteCall c;
  c.fa.x = m.put(d.x);
  c.fa.offsets.offsets = m.put(d.offsets);
  c.fa.probs = m.put(d.probs);
  c.fa.w1 = m.experts(m.put(d.w1), per);
  c.fa.w2 = m.experts(m.put(d.w2), per);
  c.fa.b1 = m.put(d.b1);
  c.fa.b2 = m.put(d.b2);
  c.fa.y = m.poisoned(DType::bf16, {T, H});
  c.ba.dy = m.put(d.dy);
  c.ba.dx = m.poisoned(DType::bf16, {T, H});
  c.ba.dprobs = m.poisoned(DType::f32, {T});
  const TensorView dw1 = m.poisoned(DType::f32, {E, 2 * F, H}), dw2 = m.poisoned(DType::f32, {E, H, F});
  c.ba.grads.dw1 = m.experts(dw1, per);
  c.ba.grads.dw2 = m.experts(dw2, per);
  c.ba.grads.db1 = m.poisoned(DType::f32, {E, 2 * F});
  c.ba.grads.db2 = m.poisoned(DType::f32, {E, H});
  c.outputs = {c.fa.y, c.ba.dx, c.ba.dprobs, dw1, dw2, c.ba.grads.db1, c.ba.grads.db2};
  return c;
}

// Every case and value on `device` (ctx has check_finite on): refused naming the tensor and the first
// bad value, every output as poisoned; a refused backward leaves its saved state to a finite dy.
inline void expect_check_finite(Context& ctx, Device device, Recipe recipe, WeightLayout layout = WeightLayout::dense) {
  const Problem p = finite_problem(recipe, device, layout);
  const LayerData clean = make_layer_data(p, {7, 0, 9});
  for (const FiniteCase& c : finite_cases())
    for (const Planted& v : planted_values()) {
      SCOPED_TRACE(std::string(to_string(recipe)) + ", " + c.tensor + " holds " + v.name);
      LayerData d = clean;
      plant(input_named(d, c.tensor), c.first, v);
      plant(input_named(d, c.tensor), c.later, planted_values()[0]);
      Arena m{device, {}};
      FiniteCall call = finite_call(m, d);
      std::vector<HostTensor> before;
      for (const TensorView& t : call.outputs) before.push_back(m.get(t));
      auto unchanged = [&] {
        for (size_t i = 0; i < call.outputs.size(); ++i)
          EXPECT_TRUE(bytes_equal(m.get(call.outputs[i]).view, before[i].view)) << "output " << i << " was written";
      };
      if (c.tensor != "dy") {
        expect_finite_error([&] { forward(ctx, p, call.fa); }, c, v);
        unchanged();
        continue;
      }
      SavedState saved = forward(ctx, p, call.fa);
      before[0] = m.get(call.fa.y);
      expect_finite_error([&] { backward(ctx, saved, call.ba); }, c, v);
      unchanged();
      m.set(call.ba.dy, clean.dy);  // the saved state was not consumed
      EXPECT_NO_THROW(backward(ctx, saved, call.ba));
    }
}

// With every input finite the check changes nothing: outputs bit-identical to an unchecked run, and
// the report shows the check_finite step.
inline void expect_check_finite_transparent(Context& checked, Context& plain, Device device, Recipe recipe) {
  SCOPED_TRACE(to_string(recipe));
  const Problem p = finite_problem(recipe, device);
  const LayerData d = make_layer_data(p, {7, 0, 9});
  const LayerOutputs a = run_layer(checked, device, d), b = run_layer(plain, device, d);
  for (const auto& [name, t] : outputs_of(a, p)) {
    const HostTensor* u = nullptr;
    for (const auto& [n2, t2] : outputs_of(b, p))
      if (std::string(n2) == name) u = t2;
    EXPECT_TRUE(bytes_equal(t->view, u->view)) << name;
  }
  bool seen = false;
  for (const StepRecord& r : a.report) seen |= r.step == "check_finite";
  EXPECT_TRUE(seen) << "no check_finite step in the checked run's report";
  for (const StepRecord& r : b.report) EXPECT_NE(r.step, "check_finite") << "the check ran without being asked";
}

// Off (the default): a NaN in x is no error and propagates to its y row (the policy).
inline void expect_check_finite_off_by_default(Context& ctx, Device device) {
  EXPECT_FALSE(ctx.options().check_finite);
  const Problem p = finite_problem(Recipe::mxfp8, device);
  LayerData d = make_layer_data(p, {7, 0, 9});
  plant(d.x, {9, 37}, planted_values()[0]);
  LayerOutputs o;
  ASSERT_NO_THROW(o = run_layer(ctx, device, d));
  int bad = 0;
  for (int64_t h = 0; h < p.hidden; ++h) bad += !std::isfinite(f32_from_bf16(o.y.ptr<uint16_t>()[9 * p.hidden + h]));
  EXPECT_GT(bad, 0) << "the NaN in x[9] did not reach y[9]";
}

}  // namespace mxmoe::test
