#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "mxmoe/version.h"
#include "src/api/layer_steps.h"
#include "src/api/validate.h"
#include "src/dispatch/context_impl.h"
#include "src/dispatch/backend.h"
#if defined(MXMOE_WITH_CUDA)
#include "src/common/pool.h"
#endif

namespace mxmoe {

namespace {
std::vector<std::string> split_list(const char* s) {
  std::vector<std::string> out;
  if (!s) return out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}
}  // namespace

Context::Context(Options options) : impl_(std::make_unique<detail::ContextImpl>()) {
  // Environment overrides fill what the caller left unset; unknown names are an error now,
  // not a surprise at the first step.
  if (options.backend.empty())
    if (const char* env = std::getenv("MXMOE_BACKEND")) options.backend = env;
  for (const std::string& d : split_list(std::getenv("MXMOE_DENY"))) options.deny.push_back(d);
  if (!options.backend.empty() && !detail::find_backend(options.backend))
    throw Error("options.backend", "unknown backend '" + options.backend + "' (known: " + detail::backend_names() + ")");
  for (const std::string& d : options.deny)
    if (!detail::find_backend(d))
      throw Error("options.deny", "unknown backend '" + d + "' (known: " + detail::backend_names() + ")");
  detail::check_scale_layout(options.scale_layout, "options.scale_layout");
  // Half an allocator would allocate through the caller and free through nothing (or the reverse):
  // refused, as the C ABI refuses it, rather than silently using library memory.
  const Allocator& a = options.allocator;
  if ((a.allocate == nullptr) != (a.release == nullptr))
    throw Error("options.allocator", a.allocate ? "allocate is set but release is null (set both or neither)"
                                                : "release is set but allocate is null (set both or neither)");
  // An override of a step that never runs under that label (a typo) would be silently ignored.
  for (const StepOverride& v : options.overrides) {
    const std::vector<std::string>& labels = detail::step_labels();
    if (std::find(labels.begin(), labels.end(), v.step) == labels.end())
      throw Error("options.overrides", "unknown step '" + v.step + "' (known: " + detail::step_label_names() + ")");
    if (v.config.empty()) throw Error("options.overrides", "step '" + v.step + "' names no configuration");
  }
  impl_->options = std::move(options);
}

Context::~Context() = default;
const Options& Context::options() const { return impl_->options; }
const std::vector<StepRecord>& Context::report() const { return impl_->report; }
void Context::clear_report() { impl_->report.clear(); }

std::vector<BackendInfo> Context::backends(Device device) const {
  std::vector<BackendInfo> out;
  for (detail::Backend* b : detail::backends()) {
    detail::Probe p = b->probe_device(device);
    bool denied = false;
    for (const std::string& d : impl_->options.deny) denied |= d == b->name();
    if (denied) p = {false, "denied by options/MXMOE_DENY"};
    out.push_back({b->name(), p.available, p.reason});
  }
  return out;
}

const char* version() { return MXMOE_VERSION; }

void release_cached_memory() {
#if defined(MXMOE_WITH_CUDA)
  cuda::pool_trim_all();
#endif
}

std::string build_options() {
  std::string s = "c++20, openmp";
#if defined(MXMOE_WITH_CUDA)
  s += std::string(", cuda (archs ") + MXMOE_CUDA_ARCHS + ")";
#else
  s += ", cuda: not built (" MXMOE_NO_CUDA_WHY ")";
#endif
#if defined(NDEBUG)
  s += ", release";
#else
  s += ", debug";
#endif
  return s;
}

}  // namespace mxmoe
