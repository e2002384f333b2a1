// The step interface every backend implements, and the dispatch that picks one per step.
// A backend that cannot serve a step says so through probe() with a reason; it never throws from a
// lookup. The next backend in the chain then runs, and the report records why (docs/architecture.md
// "Dispatch").
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "mxmoe/context.h"
#include "mxmoe/grouped_mlp.h"
#include "mxmoe/ops.h"
#include "mxmoe/permute.h"
#include "src/common/glu.h"
#include "src/dispatch/device_facts.h"
#include "src/common/memory.h"  // Buffer, allocate(): kept here for existing includers

namespace mxmoe::detail {

enum class Step : uint8_t {
  quantize,          // MXFP8 quantize of an activation-like [M, K] tensor
  dequantize,
  quantize_experts,  // MXFP8 quantize of E weight matrices (dense or per-expert pointers)
  gemm_m,            // m-grouped GEMM with an epilogue (fprop, dgrad)
  gemm_k,            // k-grouped GEMM (wgrad)
  fc2_bias_grads,    // db2 and the scale_fc2_bias dprob term
  route_tokens,      // top-k expert ids -> offsets, row_map, invalid count (permute_tokens)
  permute_rows,      // rows to their permuted places by a row_map (permute_tokens, permute_by_map)
  unpermute_rows,    // slot sums back to tokens by a row_map (unpermute_tokens)
  check_finite,      // the first NaN or +-Inf of an input (Options::check_finite)
};
const char* to_string(Step s);

// What a probe needs to know about a call.
struct MGemmStep;
struct StepQuery {
  Step step;
  Device device;          // where the data lives
  Recipe recipe = Recipe::bf16;
  int64_t n = 0, k = 0;   // GEMM N and K; the permute steps: H and top-k K (0 where neither)
  // The GEMM step itself, for probes and plans that depend on its shapes, layouts or outputs (set
  // by the layer's steps and the ops entry points for gemm_m / gemm_k; valid only during the call).
  const MGemmStep* gemm_m = nullptr;
  const KGroupedGemmArgs* gemm_k = nullptr;
  bool pow2_scales = false;  // fp8_blockwise: the operands' scales are powers of two (Problem::pow2_scales)
};

struct Probe {
  bool available = false;
  std::string reason;
};

// Output of a gradient: dtype f32 (dst = v + (accumulate ? dst : 0)) or bf16 (dst = v).
struct GradOut {
  TensorView dst;
  bool accumulate = false;
};

enum class Epilogue : uint8_t {
  store,         // D = acc (+ bias_e, or p_t * bias_e when bias_scale_by_probs)
  glu_forward,   // C = acc (+ b1_e) -> bf16; A = act(C) * p -> bf16 or MXFP8 row + col
  glu_backward,  // dA = acc; dC = act'(C, dA * p) -> bf16 or MXFP8 row + col; dprob; db1
};

// One m-grouped GEMM with its epilogue. For glu epilogues N = F (backward) or 2F (forward) is the
// GEMM width; `c` is FC1's pre-activation output [T, 2F] bf16 (written by glu_forward, read by
// glu_backward); `out_*` receive A (forward) or dC (backward) in the recipe's format (MXFP8:
// row-wise and column-wise, column blocks restarting per group, layouts as given in the views).
struct MGemmStep {
  MGroupedGemmArgs gemm;  // gemm.d: the store epilogue's output; unused by glu epilogues
  Epilogue epilogue = Epilogue::store;
  bool bias_scale_by_probs = false;  // store: add p_t * bias_e (scale_fc2_bias)
  TensorView probs;                  // f32 [T]
  GluParams glu{};
  GluLayout glu_layout = GluLayout::halves;
  int64_t ffn = 0;                   // F
  TensorView c;                      // bf16 [T, 2F]
  TensorView out_bf16;               // bf16 [T, F] (A) or [T, 2F] (dC)
  Mxfp8View out_row, out_col;        // MXFP8 A or dC
  TensorView dprobs;                 // glu_backward: f32 [T] = rowsum(dA * act(C)) + dprob_add
  TensorView dprob_add;              // optional f32 [T]
  GradOut db1;                       // glu_backward: db1_e = sum over the group's rows of fp32 dC
  bool pow2_scales = false;          // fp8_block out_row / out_col: power-of-two scales
  // MXFP8 weights kept only as their bf16 copy (gemm.b.dequantized; gemm.b.data carries the shape,
  // dtype e4m3 and device, with no bytes): the layer's weights where the step's plan reads the copy
  // (WeightForm::bf16_copy). Dispatch offers such a step only to backends whose plan reads it. The
  // copy's address may be null while the step is planned (the layer makes the copy just before the
  // step runs).
  bool b_copy_only = false;
};

// The GEMM's N: 2F for glu_forward, F for glu_backward, the output's columns for store.
inline int64_t gemm_width(const MGemmStep& s) {
  switch (s.epilogue) {
    case Epilogue::glu_forward: return 2 * s.ffn;
    case Epilogue::glu_backward: return s.ffn;
    case Epilogue::store: break;
  }
  return s.gemm.d.shape[1];
}

// E weight matrices [rows, cols] (bf16, dense or per-expert) -> dense e4m3 [E, rows, cols] with
// scales [E, bytes] along `axis` (row: rowwise_scale_bytes(rows, cols) per expert; col:
// colwise_matrix_scale_bytes(rows, cols) per expert).
struct QuantizeExpertsStep {
  ExpertMatrices src;
  int64_t experts = 0, rows = 0, cols = 0;
  TensorView data;    // e4m3 [E, rows, cols]
  TensorView scales;  // e8m0 [E, bytes]
  BlockAxis axis = BlockAxis::row;
  ScaleLayout layout = ScaleLayout::compact;
  TensorView dequantized;  // optional bf16 [E, rows, cols]: data x 2^(scale - 127), rounded to bf16
  // fp8_block: 128x128 blocks, scales f32 [E, fp8_weight_scale_count(rows, cols)] (axis and layout
  // unused).
  QuantFormat format = QuantFormat::mxfp8;
  bool pow2_scales = false;
  // Optional, fp8_block (GPU backends): the same blocks transposed, e4m3 [E, cols, rows] and f32
  // [E, fp8_weight_scale_count(cols, rows)] (cuda_ops.h transpose_fp8_block_weights).
  TensorView transposed, transposed_scales;
};

// db2_e = sum_{t in e} (scale_by_probs ? p_t : 1) * dY_t;  dprob_add_t = dY_t . b2_{e(t)} when
// scale_by_probs (else not written).
struct Fc2BiasGradStep {
  TensorView dy;       // bf16 [T, H]
  GroupOffsets offsets;
  TensorView probs;    // f32 [T]
  TensorView b2;       // bf16 [E, H]
  bool scale_by_probs = false;
  GradOut db2;         // [E, H]
  TensorView dprob_add;  // f32 [T]
};

// The routing half of permute_tokens (docs/numerics.md "Permute and unpermute"): per-expert counts
// of the valid ids, capped at the capacity, prefix-summed into offsets; the row of every
// (token, slot) in expert, token, slot order, or -1; the number of ids outside [0, E).
struct RouteTokensStep {
  TensorView expert_ids;  // i32 or i64 [T, K]
  int64_t experts = 0;    // E
  int64_t capacity = -1;  // C >= 0, or -1: keep every row
  TensorView offsets;     // i32 [E+1]
  TensorView row_map;     // i32 [T, K]
  TensorView invalid;     // optional i32 [1]
  // Optional (PermuteArgs::zero_unused_rows): rows offsets[E] .. R-1 of the permute's outputs,
  // written as zeros once the offsets exist (on the device: no host read of offsets[E]).
  TensorView zero_x;      // bf16 [R, H]
  TensorView zero_probs;  // f32 [R]
};

// permute_tokens with MXFP8 outputs (PermuteArgs::rowwise / colwise), dispatched as step
// permute_rows with recipe mxfp8 (label "permute_quantize_rows"): the rows of an existing row_map,
// quantized as quantize_mxfp8 of rows 0 .. offsets[E]-1 with groups = offsets would quantize them
// (rows past offsets[E] untouched, every other scale byte 0). move.permuted_x is optional (the bf16
// copy); move.permuted_probs as permute_rows writes it.
struct PermuteQuantizeStep {
  PermuteByMapArgs move;  // x, row_map, probs, optional permuted_x and permuted_probs
  GroupOffsets groups;    // the routing's offsets [E+1], on the data's device
  int64_t rows = 0;       // R
  Mxfp8View rowwise;      // optional e4m3 [R, H] + e8m0 rowwise_scale_bytes(R, H)
  Mxfp8View colwise;      // optional e4m3 [R, H] + e8m0 colwise_scale_bytes(R, H, E)
};

// Options::check_finite: E bf16 or f32 matrices of `count` values each (a tensor of any rank: E = 1),
// dense or per-expert, scanned for NaN and +-Inf. The backend returns the nonfinite_code
// (src/common/finite.h) of the first one in order e * count + i, or kAllFinite. It reads only; on a
// device it ends with one small device-to-host copy, so it synchronises the stream (refused, with an
// Error naming options.check_finite, while the stream is being captured).
struct CheckFiniteStep {
  ExpertMatrices src;
  DType dtype = DType::bf16;  // bf16 or f32
  int64_t experts = 1, count = 0;
};

// ---- The plan of a step: what the backend that serves it will do, decided before anything runs ----

// What a GEMM step reads of the layer's weights. prepare_weights makes the forms the plans of the
// layer's GEMMs read; a call without prepared weights quantizes into the form its step's plan reads.
enum class WeightForm : uint8_t {
  none,        // the step reads no weights (wgrads, quantizers, the bias gradients)
  given,       // the weights as passed (the bf16 recipe; per-expert pointers too)
  quantized,   // the recipe's FP8 copy: MXFP8 row-wise (fprop) / column-wise (dgrad), or 128x128 blocks
  bf16_copy,   // the quantized weights' exact bf16 copy alone (MGemmStep::b_copy_only)
  transposed,  // fp8_blockwise dgrad: the 128x128-block copy transposed, [E, cols, rows]
};
const char* to_string(WeightForm f);

// One kernel (or memory operation) a step enqueues, in order.
struct Launch {
  std::string kernel;  // e.g. "gemm", "dequantize_b", "quantize_out", "reduce_dprob"
  std::string config;  // its configuration, where it has several ("" otherwise)
};

struct StepPlan {
  // The step's named configuration: the entry of the backend's table its plan function chose, or
  // the one Options::overrides named. "default" for backends with one way to run a step.
  std::string config = "default";
  std::vector<Launch> launches;
  int64_t workspace = 0;  // bytes of library memory the step takes while it runs, freed after it
  WeightForm weights = WeightForm::none;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // Can this backend run on the device of `f` at all (hardware, build)? Reason either way. `f` may
  // be a planning target (DeviceFacts::planned), on which nothing runs.
  virtual Probe probe_device(const DeviceFacts& f) const = 0;
  // The same on the driver's (or the host's) facts of `d`.
  Probe probe_device(Device d) const;
  // Can it run this particular step? Called only when probe_device() said yes.
  virtual Probe probe(const StepQuery& q) const = 0;
  // The plan of a step that probe() took: a pure function of the step (shapes, layouts, formats)
  // and the device. `config` empty: the backend's own choice (its table of measured winners);
  // otherwise the configuration Options::overrides named for the step, or an Error naming the
  // override where this backend has no such configuration or it cannot run the step. The default
  // is one launch named after the step, with no workspace, reading the weights as given.
  virtual StepPlan plan(const StepQuery& q, const std::string& config) const;

  virtual void quantize(Context& ctx, const QuantizeArgs& a) = 0;
  virtual void dequantize(Context& ctx, const DequantizeArgs& a) = 0;
  virtual void quantize_experts(Context& ctx, const QuantizeExpertsStep& s) = 0;
  // The GEMM steps run the plan plan() returned for them.
  virtual void gemm_m(Context& ctx, const MGemmStep& s, const StepPlan& plan) = 0;
  virtual void gemm_k(Context& ctx, const KGroupedGemmArgs& a, const StepPlan& plan) = 0;
  virtual void fc2_bias_grads(Context& ctx, const Fc2BiasGradStep& s) = 0;
  virtual void route_tokens(Context& ctx, const RouteTokensStep& s) = 0;
  virtual void permute_rows(Context& ctx, const PermuteByMapArgs& a) = 0;
  // permute_tokens when one backend serves both steps: the routing, then the move of its row_map.
  // A backend may chain the two (cuda_portable: the move's x loads overlap the routing's tail).
  virtual void route_and_permute_rows(Context& ctx, const RouteTokensStep& s, const PermuteByMapArgs& a) {
    route_tokens(ctx, s);
    permute_rows(ctx, a);
  }
  virtual void unpermute_rows(Context& ctx, const UnpermuteArgs& a) = 0;
  virtual uint64_t check_finite(Context& ctx, const CheckFiniteStep& s) = 0;
  // The default is the unfused sequence on this backend's own steps (registry.cpp): permute_rows
  // into move.permuted_x (or library scratch of R x H bf16), then quantize of the kept rows (host
  // data: rows 0 .. offsets[E]-1, offsets read on the host; device data: all R rows with the
  // groups, which leaves rows past offsets[E] untouched when colwise is given). The CPU reference
  // uses it as it is; cuda_portable fuses the gather into its quantize kernel.
  virtual void permute_quantize_rows(Context& ctx, const PermuteQuantizeStep& s);
};

// Registry: backends in preference order (fastest first; cpu last).
const std::vector<Backend*>& backends();
// Adds `b` ahead of all others (tests use this to plant a backend that refuses some steps).
// Not thread-safe with concurrent dispatch; register before use.
void register_backend(Backend* b);
void unregister_backend(Backend* b);
Backend* find_backend(const std::string& name);
// Every registered backend's name, in preference order, comma-separated: the "known" list of
// error messages and of `mxmoe --help`.
std::string backend_names();

// A dispatch decision: the backend that serves a step and its plan there.
struct Choice {
  Backend* backend = nullptr;
  StepPlan plan;
};

// Picks the backend for a step, honouring force/deny options, plans the step there (with the
// configuration Options::overrides names for `label`, if any), records the decision in the
// context's report under `label` (e.g. "fc1_fprop"; empty: the generic step name), and throws
// mxmoe::Error only when no backend can serve the step or an override cannot apply.
Choice select(Context& ctx, const StepQuery& q, const std::string& label = {});
// The choice select() would make, with a null backend where none can serve the step; records
// nothing, never throws (an override that cannot apply leaves the backend's own choice).
Choice would_select(const Context& ctx, const StepQuery& q, const std::string& label = {});

// Backend factories (defined in their own folders; CUDA ones return nullptr without CUDA).
Backend* cpu_backend();
Backend* cuda_portable_backend();
Backend* cuda_sm90_backend();
Backend* cuda_sm100_backend();

}  // namespace mxmoe::detail
