// The grouped MLP's steps, each named once. A constructor takes the problem and the step's operands
// and returns the backend arguments, the label the report records the step under, the question
// dispatch is asked, and the step's FLOP/byte model. forward() and backward() are short sequences of
// these; `mxmoe bench` times the same objects; tests build a layer step through the same door.
//
// Operand formats (docs/numerics.md "Which copy each GEMM reads"): the bf16 recipe passes bf16
// tensors everywhere; the mxfp8 recipe passes MXFP8 copies blocked along each GEMM's reduction
// axis: row-wise X, A, dY and dC as the A operand of fprop and dgrad, row-wise weights for fprop,
// column-wise weights for dgrad, column-wise activations and gradients for wgrad.
#pragma once
#include <string>
#include <variant>
#include <vector>

#include "src/dispatch/backend.h"

namespace mxmoe::detail {

// One run of a step: FLOPs and the minimum bytes it moves (every operand read once, every output
// written once; E8M0 scales and biases not counted).
struct StepCost {
  double flops = 0;
  double bytes = 0;
};

using StepArgs = std::variant<QuantizeArgs, QuantizeExpertsStep, MGemmStep, KGroupedGemmArgs, Fc2BiasGradStep>;

struct LayerStep {
  std::string label;  // e.g. "fc1_fprop": what the report and the bench table call it
  StepQuery query;    // what dispatch asks each backend's probe
  StepCost cost;
  StepArgs args;  // what the chosen backend runs

  // Typed access, for callers that run a step on one backend's functions directly (tests).
  const QuantizeArgs& quantize() const { return std::get<QuantizeArgs>(args); }
  const QuantizeExpertsStep& quantize_experts() const { return std::get<QuantizeExpertsStep>(args); }
  const MGemmStep& gemm_m() const { return std::get<MGemmStep>(args); }
  const KGroupedGemmArgs& gemm_k() const { return std::get<KGroupedGemmArgs>(args); }
  const Fc2BiasGradStep& fc2_bias_grads() const { return std::get<Fc2BiasGradStep>(args); }
};

// Picks the step's backend and its plan there, and records the decision under the step's label
// (throws as select()).
Choice plan(Context& ctx, const LayerStep& step);
// The choice plan() would make (a null backend where none can serve the step); records nothing,
// never throws.
Choice would_plan(const Context& ctx, const LayerStep& step);
// Runs the step as planned.
void run(Context& ctx, const Choice& choice, const LayerStep& step);

// Steps whose backends are all chosen, in order, before the first one runs: a step no backend can
// serve fails the call with nothing written.
class PlannedSteps {
 public:
  PlannedSteps(Context& ctx, std::vector<LayerStep> steps);
  // A bf16 copy of MXFP8 weights made during the run: steps[quantize] is a QuantizeExpertsStep that
  // writes only its `dequantized` [E, rows, cols] (data null), steps[gemm] an MGemmStep with
  // b_copy_only that reads it as gemm.b.dequantized. The copy is allocated on the context's stream
  // just before steps[quantize] runs and freed (stream-ordered) once steps[gemm] has run, so a call
  // holds only the copy of the GEMM that runs (as the FP8 route's GEMM holds its transient one).
  // Both addresses are null until then.
  void add_weight_copy(size_t quantize, size_t gemm);
  // Frees `buffer` (stream-ordered) once steps[after] has run: every step that reads it is at or
  // before `after`.
  void release_after(size_t after, Buffer buffer);
  // A dry run's accounting of a buffer the real call frees once steps[after] has run, where the dry
  // run must leave it alone (the saved state's, which the real call consumes).
  void count_release_after(size_t after, int64_t bytes);
  // Every step, in order; in a planning context (set_planning_target) none runs, and the steps'
  // buffers are only counted.
  void run();
  const std::vector<Choice>& choices() const { return choices_; }

 private:
  Context& ctx_;
  std::vector<LayerStep> steps_;
  std::vector<Choice> choices_;
  struct Copy {
    size_t quantize, gemm;
  };
  std::vector<Copy> copies_;
  std::vector<std::pair<size_t, Buffer>> releases_;
  std::vector<std::pair<size_t, int64_t>> counted_releases_;
};

// The labels steps are recorded under (the layer's steps, prepare_weights' "prepare." ones, and the
// entry points of ops.h and permute.h): what Options::overrides may name. Comma-separated.
const std::vector<std::string>& step_labels();
std::string step_label_names();

// ---- quantize steps (mxfp8 recipe) ----

// X or dY [T, H] -> row-wise (FC1 fprop / FC2 dgrad) and column-wise (wgrad) MXFP8.
LayerStep quantize_x(const QuantizeArgs& args);   // "quantize_x"
LayerStep quantize_dy(const QuantizeArgs& args);  // "quantize_dy"

// W1 [E, 2F, H] or W2 [E, H, F] -> MXFP8; row-wise for fprop ("quantize_w1", "quantize_w2"),
// column-wise for dgrad ("quantize_w1_col", "quantize_w2_col"), after args.axis.
LayerStep quantize_w1(const QuantizeExpertsStep& args);
LayerStep quantize_w2(const QuantizeExpertsStep& args);

// ---- forward ----

// A GLU epilogue's activation output: bf16, or MXFP8 row-wise and column-wise.
struct GluOutput {
  TensorView bf16;
  Mxfp8View row, col;
};

// C = X W1_e^T (+ b1_e) stored bf16; A = act(C) * p.
struct Fc1FpropArgs {
  Operand x;             // [T, H]
  ExpertOperand w1;      // [E, 2F, H]
  GroupOffsets offsets;  // i32 [E+1]
  TensorView b1;         // bf16 [E, 2F]; read when problem.fc1_bias
  TensorView probs;      // f32 [T]
  TensorView c;          // out: bf16 [T, 2F], kept for backward
  GluOutput a;           // out: A [T, F]
};
LayerStep fc1_fprop(const Problem& p, const Fc1FpropArgs& args);

// Y = A W2_e^T (+ b2_e, or p * b2_e when problem.scale_fc2_bias).
struct Fc2FpropArgs {
  Operand a;         // [T, F]
  ExpertOperand w2;  // [E, H, F]
  GroupOffsets offsets;
  TensorView b2;     // bf16 [E, H]; read when problem.fc2_bias
  TensorView probs;  // f32 [T]
  TensorView y;      // out: bf16 [T, H]
};
LayerStep fc2_fprop(const Problem& p, const Fc2FpropArgs& args);

// ---- backward ----

// db2 and, with scale_fc2_bias, the dprob term dY_t . b2_e (args.scale_by_probs is set from p).
LayerStep fc2_bias_grads(const Problem& p, const Fc2BiasGradStep& args);

// dA = dY W2_e; dC = act'(C, dA * p) with dprob and db1 in the same epilogue.
struct Fc2DgradArgs {
  Operand dy;        // [T, H]
  ExpertOperand w2;  // [E, H, F] read as [K, N] (column-wise MXFP8)
  GroupOffsets offsets;
  TensorView probs;      // f32 [T]
  TensorView c;          // bf16 [T, 2F] saved by forward
  TensorView dprobs;     // out: f32 [T]
  TensorView dprob_add;  // optional f32 [T] added to dprobs (fc2_bias_grads' scale_fc2_bias term)
  GradOut db1;           // written when problem.fc1_bias
  GluOutput dc;          // out: dC [T, 2F]
};
LayerStep fc2_dgrad(const Problem& p, const Fc2DgradArgs& args);

// dX = dC W1_e.
struct Fc1DgradArgs {
  Operand dc;        // [T, 2F]
  ExpertOperand w1;  // [E, 2F, H] read as [K, N] (column-wise MXFP8)
  GroupOffsets offsets;
  TensorView dx;  // out: bf16 [T, H]
};
LayerStep fc1_dgrad(const Problem& p, const Fc1DgradArgs& args);

// dW2_e = dY_e^T A_e (args.a = dY, args.b = A) and dW1_e = dC_e^T X_e (args.a = dC, args.b = X):
// k-grouped over each expert's own tokens, column-wise MXFP8 or bf16 operands.
LayerStep fc2_wgrad(const Problem& p, const KGroupedGemmArgs& args);
LayerStep fc1_wgrad(const Problem& p, const KGroupedGemmArgs& args);

}  // namespace mxmoe::detail
