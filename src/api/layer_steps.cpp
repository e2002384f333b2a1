// The grouped MLP's steps (src/api/layer_steps.h).
#include "src/api/layer_steps.h"

#include "src/dispatch/context_impl.h"

#include <algorithm>
#include <string>
#include <utility>

namespace mxmoe::detail {

namespace {

Device device_of(const Operand& o) { return o.is_mxfp8() ? o.mx.data.device : o.bf16.device; }
int64_t rows_of(const Operand& o) { return o.is_mxfp8() ? o.mx.data.shape[0] : o.bf16.shape[0]; }
// Bytes per element of a GEMM operand (e4m3 or bf16).
double elem_bytes(const Operand& o) { return o.is_mxfp8() ? 1.0 : 2.0; }
double elem_bytes(const ExpertOperand& o) { return o.is_mxfp8() ? 1.0 : 2.0; }
// A GLU output: 2 bytes per element either way (one bf16 copy, or row-wise + column-wise e4m3).
constexpr double kGluOutBytes = 2.0;
constexpr double kBf16Bytes = 2.0;

GluParams glu_params(const Problem& p) { return GluParams{p.activation, p.clamp}; }

// The GEMM part of an m-grouped step; B_e is [N, K] for fprop, [K, N] (b_kn) for dgrad.
MGemmStep gemm_step(Epilogue epilogue, const Operand& a, const ExpertOperand& b, bool b_kn, const GroupOffsets& offsets,
                    const TensorView& probs) {
  MGemmStep s;
  s.epilogue = epilogue;
  s.gemm.a = a;
  s.gemm.b = b;
  s.gemm.b_kn = b_kn;
  s.gemm.offsets = offsets;
  s.probs = probs;
  return s;
}

// The activation and where its output goes, for the glu epilogues.
void set_glu(MGemmStep& s, const Problem& p, const TensorView& c, const GluOutput& out) {
  s.glu = glu_params(p);
  s.glu_layout = p.glu_layout;
  s.ffn = p.ffn;
  s.c = c;
  s.out_bf16 = out.bf16;
  s.out_row = out.row;
  s.out_col = out.col;
  s.pow2_scales = p.pow2_scales;
}

// A GEMM step of the problem's recipe: its query carries pow2_scales (probes of fp8_blockwise GEMMs
// decide on it).
LayerStep with_pow2(const Problem& p, LayerStep step) {
  step.query.pow2_scales = p.pow2_scales;
  return step;
}

// The recipe a quantize step serves, from its output format.
Recipe recipe_of(QuantFormat f) { return f == QuantFormat::fp8_block ? Recipe::fp8_blockwise : Recipe::mxfp8; }

LayerStep quantize_activation(const char* label, const QuantizeArgs& a) {
  const double n = static_cast<double>(a.src.numel());
  const double outputs = (a.rowwise.data.data ? 1.0 : 0.0) + (a.colwise.data.data ? 1.0 : 0.0);
  return {label,
          {Step::quantize, a.src.device, recipe_of(a.rowwise.data.data ? a.rowwise.format : a.colwise.format), 0,
           a.src.rank == 2 ? a.src.shape[1] : 0},
          {0, n * (kBf16Bytes + outputs)},
          a};
}

LayerStep quantize_weights(const char* row_label, const char* col_label, const QuantizeExpertsStep& s) {
  const Device d = s.src.per_expert() ? s.src.pointers.device : s.src.dense.device;
  const double n = static_cast<double>(s.experts * s.rows * s.cols);
  // fp8_block weights have one copy (128x128 blocks) for fprop and dgrad: the row label.
  const bool row = s.axis == BlockAxis::row || s.format == QuantFormat::fp8_block;
  // bf16 read, e4m3 written; a bf16 copy (prepare_weights', or the only output of a per-call copy)
  // reads the e4m3 back and writes bf16.
  const double copy = s.dequantized.rank > 0 ? 1.0 + kBf16Bytes : 0.0;
  return {row ? row_label : col_label,
          {Step::quantize_experts, d, recipe_of(s.format), s.rows, s.cols},
          {0, n * (kBf16Bytes + 1.0 + copy)},
          s};
}

LayerStep wgrad(const char* label, const Problem& p, const KGroupedGemmArgs& a, int64_t m, int64_t n) {
  const double T = static_cast<double>(rows_of(a.a)), E = static_cast<double>(p.experts);
  const DType out = a.d.per_expert() ? a.d.dtype : a.d.dense.dtype;
  const double out_bytes = E * m * n * static_cast<double>(dtype_size(out)) * (a.accumulate ? 2.0 : 1.0);
  LayerStep step{label,
                 {Step::gemm_k, device_of(a.a), p.recipe, n, m},
                 {2.0 * T * m * n, T * (m + n) * elem_bytes(a.a) + out_bytes},
                 a};
  step.query.pow2_scales = p.pow2_scales;
  return step;
}

}  // namespace

namespace {
// The dispatch query of a step, pointing at its GEMM arguments (valid while `step` lives).
StepQuery query_of(const LayerStep& step) {
  StepQuery q = step.query;
  q.gemm_m = std::get_if<MGemmStep>(&step.args);
  q.gemm_k = std::get_if<KGroupedGemmArgs>(&step.args);
  return q;
}
}  // namespace

Choice plan(Context& ctx, const LayerStep& step) { return select(ctx, query_of(step), step.label); }

Choice would_plan(const Context& ctx, const LayerStep& step) { return would_select(ctx, query_of(step), step.label); }

void run(Context& ctx, const Choice& c, const LayerStep& step) {
  struct Visit {
    Context& ctx;
    Backend& b;
    const StepPlan& plan;
    void operator()(const QuantizeArgs& a) const { b.quantize(ctx, a); }
    void operator()(const QuantizeExpertsStep& s) const { b.quantize_experts(ctx, s); }
    void operator()(const MGemmStep& s) const { b.gemm_m(ctx, s, plan); }
    void operator()(const KGroupedGemmArgs& a) const { b.gemm_k(ctx, a, plan); }
    void operator()(const Fc2BiasGradStep& s) const { b.fc2_bias_grads(ctx, s); }
  };
  std::visit(Visit{ctx, *c.backend, c.plan}, step.args);
}

PlannedSteps::PlannedSteps(Context& ctx, std::vector<LayerStep> steps) : ctx_(ctx), steps_(std::move(steps)) {
  for (const LayerStep& s : steps_) choices_.push_back(plan(ctx_, s));
}

void PlannedSteps::add_weight_copy(size_t quantize, size_t gemm) {
  const bool ok = quantize < gemm && gemm < steps_.size() &&
                  std::holds_alternative<QuantizeExpertsStep>(steps_[quantize].args) &&
                  std::holds_alternative<MGemmStep>(steps_[gemm].args) && steps_[gemm].gemm_m().b_copy_only &&
                  steps_[quantize].quantize_experts().data.data == nullptr;
  if (!ok) throw Error("internal", "add_weight_copy: not a quantize step and a later copy-reading GEMM step");
  copies_.push_back({quantize, gemm});
}

void PlannedSteps::release_after(size_t after, Buffer buffer) {
  if (after >= steps_.size()) throw Error("internal", "release_after: no step " + std::to_string(after));
  releases_.emplace_back(after, std::move(buffer));
}

void PlannedSteps::count_release_after(size_t after, int64_t bytes) { counted_releases_.emplace_back(after, bytes); }

void PlannedSteps::run() {
  const Options& o = ctx_.options();
  for (size_t i = 0; i < steps_.size(); ++i) {
    for (const Copy& c : copies_) {
      if (c.quantize != i) continue;
      auto& q = std::get<QuantizeExpertsStep>(steps_[i].args);
      Buffer copy = allocate(q.dequantized.device, q.dequantized.bytes(), o.stream, o.allocator);
      q.dequantized.data = copy.ptr;
      std::get<MGemmStep>(steps_[c.gemm].args).gemm.b.dequantized.dense.data = copy.ptr;
      releases_.emplace_back(c.gemm, std::move(copy));
    }
    if (!planning(ctx_)) {
      detail::run(ctx_, choices_[i], steps_[i]);
    } else if (PlanningMemory* m = ctx_.impl().memory; m != nullptr) {
      m->peak = std::max(m->peak, m->live + choices_[i].plan.workspace);
      for (const auto& [after, bytes] : counted_releases_)
        if (after == i) m->live -= bytes;
    }
    std::erase_if(releases_, [i](const std::pair<size_t, Buffer>& r) { return r.first == i; });
  }
}

const std::vector<std::string>& step_labels() {
  static const std::vector<std::string> labels = [] {
    std::vector<std::string> v = {"quantize_x", "quantize_dy", "quantize_w1", "quantize_w2", "quantize_w1_col",
                                  "quantize_w2_col", "fc1_fprop", "fc2_fprop", "fc2_bias_grads", "fc2_dgrad",
                                  "fc1_dgrad", "fc2_wgrad", "fc1_wgrad"};
    for (const char* w : {"quantize_w1", "quantize_w2", "quantize_w1_col", "quantize_w2_col"})
      v.push_back(std::string("prepare.") + w);
    for (Step s : {Step::quantize, Step::dequantize, Step::gemm_m, Step::gemm_k, Step::route_tokens, Step::permute_rows,
                   Step::unpermute_rows, Step::check_finite})
      v.emplace_back(to_string(s));
    v.emplace_back("permute_quantize_rows");
    return v;
  }();
  return labels;
}

std::string step_label_names() {
  std::string s;
  for (const std::string& l : step_labels()) s += (s.empty() ? "" : ", ") + l;
  return s;
}

LayerStep quantize_x(const QuantizeArgs& args) { return quantize_activation("quantize_x", args); }
LayerStep quantize_dy(const QuantizeArgs& args) { return quantize_activation("quantize_dy", args); }
LayerStep quantize_w1(const QuantizeExpertsStep& args) {
  return quantize_weights("quantize_w1", "quantize_w1_col", args);
}
LayerStep quantize_w2(const QuantizeExpertsStep& args) {
  return quantize_weights("quantize_w2", "quantize_w2_col", args);
}

LayerStep fc1_fprop(const Problem& p, const Fc1FpropArgs& a) {
  MGemmStep s = gemm_step(Epilogue::glu_forward, a.x, a.w1, /*b_kn=*/false, a.offsets, a.probs);
  s.gemm.bias = p.fc1_bias ? a.b1 : TensorView{};
  set_glu(s, p, a.c, a.a);
  const double T = static_cast<double>(rows_of(a.x)), H = p.hidden, F = p.ffn, E = p.experts;
  const double bytes =
      T * H * elem_bytes(a.x) + E * 2 * F * H * elem_bytes(a.w1) + T * 2 * F * kBf16Bytes + T * F * kGluOutBytes;
  return with_pow2(p, {"fc1_fprop", {Step::gemm_m, device_of(a.x), p.recipe, 2 * p.ffn, p.hidden}, {4 * T * H * F, bytes}, s});
}

LayerStep fc2_fprop(const Problem& p, const Fc2FpropArgs& a) {
  MGemmStep s = gemm_step(Epilogue::store, a.a, a.w2, /*b_kn=*/false, a.offsets, a.probs);
  s.gemm.bias = p.fc2_bias ? a.b2 : TensorView{};
  s.bias_scale_by_probs = p.scale_fc2_bias;
  s.gemm.d = a.y;
  const double T = static_cast<double>(rows_of(a.a)), H = p.hidden, F = p.ffn, E = p.experts;
  const double bytes = T * F * elem_bytes(a.a) + E * H * F * elem_bytes(a.w2) + T * H * kBf16Bytes;
  return with_pow2(p, {"fc2_fprop", {Step::gemm_m, device_of(a.a), p.recipe, p.hidden, p.ffn}, {2 * T * H * F, bytes}, s});
}

LayerStep fc2_bias_grads(const Problem& p, const Fc2BiasGradStep& args) {
  Fc2BiasGradStep s = args;
  s.scale_by_probs = p.scale_fc2_bias;
  const double T = static_cast<double>(s.dy.rank == 2 ? s.dy.shape[0] : 0), H = p.hidden, E = p.experts;
  return {"fc2_bias_grads",
          {Step::fc2_bias_grads, s.dy.device, p.recipe, p.hidden, 0},
          {T * H, T * H * kBf16Bytes + E * H * static_cast<double>(dtype_size(s.db2.dst.dtype))},
          s};
}

LayerStep fc2_dgrad(const Problem& p, const Fc2DgradArgs& a) {
  // W2_e is [H, F] = [K, N]
  MGemmStep s = gemm_step(Epilogue::glu_backward, a.dy, a.w2, /*b_kn=*/true, a.offsets, a.probs);
  set_glu(s, p, a.c, a.dc);
  s.dprobs = a.dprobs;
  s.dprob_add = a.dprob_add;
  if (p.fc1_bias) s.db1 = a.db1;
  const double T = static_cast<double>(rows_of(a.dy)), H = p.hidden, F = p.ffn, E = p.experts;
  const double bytes =
      T * H * elem_bytes(a.dy) + E * H * F * elem_bytes(a.w2) + T * 2 * F * kBf16Bytes + T * 2 * F * kGluOutBytes;
  return with_pow2(p, {"fc2_dgrad", {Step::gemm_m, device_of(a.dy), p.recipe, p.ffn, p.hidden}, {2 * T * H * F, bytes}, s});
}

LayerStep fc1_dgrad(const Problem& p, const Fc1DgradArgs& a) {
  // W1_e is [2F, H] = [K, N]
  MGemmStep s = gemm_step(Epilogue::store, a.dc, a.w1, /*b_kn=*/true, a.offsets, {});
  s.gemm.d = a.dx;
  const double T = static_cast<double>(rows_of(a.dc)), H = p.hidden, F = p.ffn, E = p.experts;
  const double bytes = T * 2 * F * elem_bytes(a.dc) + E * 2 * F * H * elem_bytes(a.w1) + T * H * kBf16Bytes;
  return with_pow2(p, {"fc1_dgrad", {Step::gemm_m, device_of(a.dc), p.recipe, p.hidden, 2 * p.ffn}, {4 * T * H * F, bytes}, s});
}

LayerStep fc2_wgrad(const Problem& p, const KGroupedGemmArgs& a) { return wgrad("fc2_wgrad", p, a, p.hidden, p.ffn); }
LayerStep fc1_wgrad(const Problem& p, const KGroupedGemmArgs& a) {
  return wgrad("fc1_wgrad", p, a, 2 * p.ffn, p.hidden);
}

}  // namespace mxmoe::detail
