// Backend registry and per-step selection. Preference order: cuda_sm100, cuda_sm90, cuda_portable, cpu.
#include <string>

#include "src/dispatch/backend.h"
#include "src/dispatch/context_impl.h"
#include "src/dispatch/device_facts.h"

namespace mxmoe::detail {

const char* to_string(Step s) {
  switch (s) {
    case Step::quantize: return "quantize";
    case Step::dequantize: return "dequantize";
    case Step::quantize_experts: return "quantize_weights";
    case Step::gemm_m: return "gemm_m";
    case Step::gemm_k: return "gemm_k";
    case Step::fc2_bias_grads: return "fc2_bias_grads";
    case Step::route_tokens: return "route_tokens";
    case Step::permute_rows: return "permute_rows";
    case Step::unpermute_rows: return "unpermute_rows";
    case Step::check_finite: return "check_finite";
  }
  return "?";
}

const char* to_string(WeightForm f) {
  switch (f) {
    case WeightForm::none: return "";
    case WeightForm::given: return "as given";
    case WeightForm::quantized: return "quantized";
    case WeightForm::bf16_copy: return "bf16 copy";
    case WeightForm::transposed: return "quantized, transposed";
  }
  return "?";
}

void ContextImpl::record(StepRecord r) {
  for (const StepRecord& old : report)
    if (old.step == r.step && old.backend == r.backend && old.skipped == r.skipped && old.config == r.config &&
        old.workspace_bytes == r.workspace_bytes)
      return;
  report.push_back(std::move(r));
}

StepPlan Backend::plan(const StepQuery& q, const std::string& config) const {
  if (!config.empty() && config != "default")
    throw Error("options.overrides", std::string(name()) + " has one configuration for step " + to_string(q.step) +
                                         ", \"default\"; not \"" + config + "\"");
  StepPlan p;
  p.launches = {{to_string(q.step), ""}};
  if (q.gemm_m != nullptr) p.weights = q.gemm_m->gemm.b.is_mxfp8() ? WeightForm::quantized : WeightForm::given;
  return p;
}

namespace {
std::vector<Backend*>& registry() {
  static std::vector<Backend*> list = [] {
    std::vector<Backend*> v;
    for (Backend* b : {cuda_sm100_backend(), cuda_sm90_backend(), cuda_portable_backend(), cpu_backend()})
      if (b) v.push_back(b);
    return v;
  }();
  return list;
}
}  // namespace

const std::vector<Backend*>& backends() { return registry(); }

void register_backend(Backend* b) { registry().insert(registry().begin(), b); }

void unregister_backend(Backend* b) { std::erase(registry(), b); }

Backend* find_backend(const std::string& name) {
  for (Backend* b : backends())
    if (name == b->name()) return b;
  return nullptr;
}

std::string backend_names() {
  std::string s;
  for (Backend* b : backends()) s += (s.empty() ? "" : ", ") + std::string(b->name());
  return s;
}

namespace {
// Whether the options allow backend b and it is available on the device of `f`.
Probe usable(const Options& o, const Backend& b, const DeviceFacts& f) {
  const std::string name = b.name();
  for (const std::string& n : o.deny)
    if (n == name) return {false, "denied by options/MXMOE_DENY"};
  return b.probe_device(f);
}

// The configuration Options::overrides names for the step `label`, or "".
std::string override_for(const Options& o, const std::string& label) {
  std::string config;
  for (const StepOverride& v : o.overrides)
    if (v.step == label) config = v.config;
  return config;
}

// select()'s rule for one backend: usable on the step's device, taking the step, and planning it
// into *plan with `config` (throws where an override cannot apply). A step that carries only the
// weights' bf16 copy goes only where the plan reads that copy.
Probe offer(const Options& o, const Backend& b, const DeviceFacts& f, const StepQuery& q, const std::string& config,
            StepPlan* plan) {
  Probe p = usable(o, b, f);
  if (p.available) p = b.probe(q);
  if (!p.available) return p;
  *plan = b.plan(q, config);
  if (q.gemm_m != nullptr && q.gemm_m->b_copy_only && plan->weights != WeightForm::bf16_copy)
    return {false, "reads MXFP8 weights from their FP8 bytes, and this step carries only their bf16 copy"};
  return p;
}
}  // namespace

Choice would_select(const Context& ctx, const StepQuery& q, const std::string& label) {
  const Options& o = ctx.options();
  const DeviceFacts f = facts_for(ctx, q.device);
  for (Backend* b : backends()) {
    if (!o.backend.empty() && o.backend != b->name()) continue;
    Choice c{b, {}};
    Probe p;
    try {
      p = offer(o, *b, f, q, override_for(o, label), &c.plan);
    } catch (const Error&) {
      p = offer(o, *b, f, q, "", &c.plan);
    }
    if (p.available) return c;
  }
  return {};
}

Choice select(Context& ctx, const StepQuery& q, const std::string& label) {
  const Options& o = ctx.options();
  const DeviceFacts f = facts_for(ctx, q.device);
  StepRecord rec{label.empty() ? to_string(q.step) : label, "", {}};
  const std::string config = override_for(o, rec.step);
  std::string why_not;
  for (Backend* b : backends()) {
    const std::string name = b->name();
    if (!o.backend.empty() && o.backend != name) continue;
    Choice c{b, {}};
    Probe p;
    try {
      p = offer(o, *b, f, q, config, &c.plan);
    } catch (const Error& e) {
      if (config.empty()) throw;
      std::string why = e.what();
      if (why.rfind(e.argument() + ": ", 0) == 0) why.erase(0, e.argument().size() + 2);
      throw Error("options.overrides", rec.step + "=" + config + " on " + name + ": " + why);
    }
    if (!p.available) {
      rec.skipped.emplace_back(name, p.reason);
      why_not += (why_not.empty() ? "" : "; ") + name + ": " + p.reason;
      continue;
    }
    rec.backend = name;
    rec.config = c.plan.config;
    for (const Launch& l : c.plan.launches) rec.launches.push_back({l.kernel, l.config});
    rec.workspace_bytes = c.plan.workspace;
    rec.weights = to_string(c.plan.weights);
    ctx.impl().record(std::move(rec));
    return c;
  }
  if (!o.backend.empty())
    throw Error("options.backend", "forced backend '" + o.backend + "' cannot run step " + rec.step + " on " +
                                       device_name(q.device) + ": " + why_not);
  throw Error("backend", "no backend can run step " + rec.step + " on " + device_name(q.device) + ": " + why_not);
}

}  // namespace mxmoe::detail
