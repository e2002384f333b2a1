// Backend registry and per-step selection. Preference order: cuda_sm100, cuda_sm90, cuda_portable, cpu.
#include <string>

#include "src/dispatch/backend.h"
#include "src/dispatch/context_impl.h"

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
  }
  return "?";
}

void ContextImpl::record(StepRecord r) {
  for (const StepRecord& old : report)
    if (old.step == r.step && old.backend == r.backend && old.skipped == r.skipped) return;
  report.push_back(std::move(r));
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
// Whether the options allow backend b and it is available on device d.
Probe usable(const Options& o, const Backend& b, Device d) {
  const std::string name = b.name();
  for (const std::string& n : o.deny)
    if (n == name) return {false, "denied by options/MXMOE_DENY"};
  return b.probe_device(d);
}

// select()'s rule for one backend: usable on the step's device, taking the step.
Probe offer(const Options& o, const Backend& b, const StepQuery& q) {
  Probe p = usable(o, b, q.device);
  if (p.available) p = b.probe(q);
  if (p.available && q.gemm_m != nullptr && q.gemm_m->b_copy_only && !b.reads_weight_copies())
    p = {false, "reads MXFP8 weights from their FP8 bytes, and this step carries only their bf16 copy"};
  return p;
}
}  // namespace

Backend* first_usable(const Context& ctx, Device d) {
  const Options& o = ctx.options();
  for (Backend* b : backends()) {
    if (!o.backend.empty() && o.backend != b->name()) continue;
    if (usable(o, *b, d).available) return b;
  }
  return nullptr;
}

Backend* would_select(const Context& ctx, const StepQuery& q) {
  const Options& o = ctx.options();
  for (Backend* b : backends()) {
    if (!o.backend.empty() && o.backend != b->name()) continue;
    if (offer(o, *b, q).available) return b;
  }
  return nullptr;
}

Backend& select(Context& ctx, const StepQuery& q, const std::string& label) {
  const Options& o = ctx.options();
  StepRecord rec{label.empty() ? to_string(q.step) : label, "", {}};
  std::string why_not;
  for (Backend* b : backends()) {
    const std::string name = b->name();
    if (!o.backend.empty() && o.backend != name) continue;
    const Probe p = offer(o, *b, q);
    if (!p.available) {
      rec.skipped.emplace_back(name, p.reason);
      why_not += (why_not.empty() ? "" : "; ") + name + ": " + p.reason;
      continue;
    }
    rec.backend = name;
    ctx.impl().record(std::move(rec));
    return *b;
  }
  if (!o.backend.empty())
    throw Error("options.backend", "forced backend '" + o.backend + "' cannot run step " + rec.step + " on " +
                                       device_name(q.device) + ": " + why_not);
  throw Error("backend", "no backend can run step " + rec.step + " on " + device_name(q.device) + ": " + why_not);
}

Backend& select(Context& ctx, const StepQuery& q) { return select(ctx, q, ""); }

}  // namespace mxmoe::detail
