// `mxmoe plan`: what a training step of a problem would do on a GPU (or the CPU), without running it
// and without that GPU: every step with its backend, its configuration, its launches, the workspace
// it takes and the weight form it reads, and why each better backend refused it. The plan is made by
// the library's own forward/backward on views with no memory behind them (src/api/layer_plan.h).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "src/api/tooling.h"
#include "tools/mxmoe/cli.h"

namespace mxmoe::cli {
namespace {

// Bytes in the largest binary unit that keeps a number >= 1, one decimal.
std::string short_bytes(int64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

std::string launches_text(const StepRecord& r) {
  std::string s;
  for (const LaunchRecord& l : r.launches)
    s += (s.empty() ? "" : ", ") + l.kernel + (l.config.empty() ? "" : " [" + l.config + "]");
  return s;
}

void write_json(const std::string& path, const std::string& target, const RunConfig& cfg,
                const detail::LayerPlan& plan) {
  using json = nlohmann::ordered_json;
  json steps = json::array();
  for (const StepRecord& r : plan.steps) {
    json launches = json::array(), skipped = json::array();
    for (const LaunchRecord& l : r.launches) launches.push_back({{"kernel", l.kernel}, {"config", l.config}});
    for (const auto& [backend, why] : r.skipped) skipped.push_back({{"backend", backend}, {"reason", why}});
    steps.push_back({{"step", r.step},
                     {"backend", r.backend},
                     {"config", r.config},
                     {"workspace_bytes", r.workspace_bytes},
                     {"weights", r.weights},
                     {"launches", launches},
                     {"skipped", skipped}});
  }
  const Problem& p = cfg.problem;
  const json j = {{"target", target},
                  {"problem",
                   {{"preset", cfg.preset},
                    {"hidden", p.hidden},
                    {"ffn", p.ffn},
                    {"experts", p.experts},
                    {"tokens", cfg.tokens},
                    {"recipe", to_string(p.recipe)}}},
                  {"library_buffers_peak_bytes", plan.peak_bytes},
                  {"steps", steps}};
  OutputFile f("--json", path);
  f.write(j.dump(2) + "\n");
  f.commit();
}

}  // namespace

int command_plan(const CliOptions& o) {
  const bool gpu = o.arch.empty() ? cuda_device_count() > 0 : o.arch != "cpu";
  const RunConfig cfg = resolve_config(o, gpu);
  if (!o.json_path.empty()) check_output_file("--json", o.json_path);
  Options options;
  options.backend = o.backend;
  options.deny = o.deny;
  options.overrides = o.overrides;
  Context ctx(options);
  if (!o.arch.empty()) detail::set_planning_target(ctx, o.arch);
  const Device d = gpu ? Device{DeviceType::cuda, 0} : Device{DeviceType::cpu, 0};
  const std::string target = !o.arch.empty() ? o.arch : gpu ? cuda_device_description(0) : "cpu";
  const detail::LayerPlan plan = detail::plan_layer(ctx, cfg.problem, cfg.tokens, d, o.prepared);

  std::printf("plan for %s: %s, T=%lld%s%s\n", target.c_str(), describe(cfg.problem).c_str(),
              static_cast<long long>(cfg.tokens), o.prepared ? ", prepared weights" : "",
              o.arch.empty() ? "" : " (planned: nothing runs, no device needed)");
  std::printf("%-24s %-14s %-20s %10s  %s\n", "step", "backend", "config", "workspace", "weights");
  for (const StepRecord& r : plan.steps) {
    std::printf("%-24s %-14s %-20s %10s  %s\n", r.step.c_str(), r.backend.c_str(), r.config.c_str(),
                short_bytes(r.workspace_bytes).c_str(), r.weights.empty() ? "-" : r.weights.c_str());
    std::printf("    launches: %s\n", launches_text(r).c_str());
    for (const auto& [backend, why] : r.skipped) std::printf("    not %s: %s\n", backend.c_str(), why.c_str());
  }
  std::printf("library buffers held at once (workspaces aside): %s\n", short_bytes(plan.peak_bytes).c_str());
  if (!o.json_path.empty()) write_json(o.json_path, target, cfg, plan);
  return kExitOk;
}

}  // namespace mxmoe::cli
