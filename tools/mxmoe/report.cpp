// The run report as readable text and as JSON (nlohmann/json).
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>

#include "tools/mxmoe/cli.h"

namespace mxmoe::cli {
namespace {

double tflops(double flops, double seconds) { return seconds > 0 ? flops / seconds * 1e-12 : 0.0; }

// JSON has no Inf/NaN: null (a failed check also says "pass": false).
nlohmann::ordered_json number(double v) { return std::isfinite(v) ? nlohmann::ordered_json(v) : nullptr; }

std::string split_kind(const RunConfig& c) { return c.skew ? "skewed (Dirichlet 0.5)" : "balanced"; }

}  // namespace

double Check::error() const {
  if (!std::isfinite(error_norm)) return INFINITY;
  return ref_norm > 0 ? error_norm / ref_norm : error_norm;
}

double Check::bound() const { return ref_norm > 0 ? tolerance + abs_floor / ref_norm : abs_floor; }

bool Check::pass() const {
  if (values == 0) return true;
  return std::isfinite(error_norm) && error_norm <= tolerance * ref_norm + abs_floor;
}

bool RunReport::pass() const {
  for (const Check& c : checks)
    if (!c.pass()) return false;
  return true;
}

void print_report(const RunReport& r, std::FILE* out) {
  const RunConfig& c = r.config;
  const double ff = forward_flops(c.problem, c.tokens), bf = backward_flops(c.problem, c.tokens);
  std::fprintf(out, "mxmoe run (seed %llu)\n", static_cast<unsigned long long>(c.seed));
  std::fprintf(out, "  problem   %s\n", r.problem_text.c_str());
  std::fprintf(out, "  sizes     %s\n", c.origin.c_str());
  std::fprintf(out, "  tokens    T=%lld over E=%lld experts, %s: min %lld, max %lld, %lld empty\n",
               static_cast<long long>(c.tokens), static_cast<long long>(c.problem.experts), split_kind(c).c_str(),
               static_cast<long long>(r.min_tokens), static_cast<long long>(r.max_tokens),
               static_cast<long long>(r.empty_experts));
  std::fprintf(out, "  device    %s, weights %s\n", r.device.c_str(), r.weight_layout.c_str());
  std::fprintf(out, "  backends\n");
  const StepRecord* previous = nullptr;
  for (const StepRecord& s : r.steps) {
    // Most steps skip the same backends for the same reason: say it once.
    const bool as_above = previous && !s.skipped.empty() && s.skipped == previous->skipped;
    std::fprintf(out, "    %-20s %-14s %s%s\n", s.step.c_str(), s.backend.c_str(), s.config.c_str(),
                 as_above ? "  (skipped as above)" : "");
    // One row per launch of the step's plan, with its configuration where it has one.
    for (const LaunchRecord& l : s.launches)
      std::fprintf(out, "      launch  %s%s\n", l.kernel.c_str(), l.config.empty() ? "" : (" [" + l.config + "]").c_str());
    if (!as_above)
      for (const auto& [name, why] : s.skipped) std::fprintf(out, "      skipped %s: %s\n", name.c_str(), why.c_str());
    previous = &s;
  }
  std::fprintf(out, "  time      forward  %10.3f ms  %9.3f TFLOP/s\n", r.forward_s * 1e3, tflops(ff, r.forward_s));
  std::fprintf(out, "            backward %10.3f ms  %9.3f TFLOP/s\n", r.backward_s * 1e3, tflops(bf, r.backward_s));
  std::fprintf(out, "  saved for backward  %s\n", bytes_text(double(r.saved_bytes)).c_str());
  std::fprintf(out, "  checks (relative Frobenius error <= tolerance + absolute floor's share)\n");
  for (const Check& k : r.checks) {
    if (k.values == 0)
      std::fprintf(out, "    %-19s %-7s %-28s %-20s  PASS\n", k.kind.c_str(), k.output.c_str(), k.scope.c_str(),
                   "no values to compare");
    else
      std::fprintf(out, "    %-19s %-7s %-28s %9.3e <= %7.1e  %s\n", k.kind.c_str(), k.output.c_str(),
                   k.scope.c_str(), k.error(), k.bound(), k.pass() ? "PASS" : "FAIL");
  }
  for (const std::string& n : r.notes) std::fprintf(out, "  note: %s\n", n.c_str());
  std::fprintf(out, "  result    %s\n", r.pass() ? "PASS" : "FAIL");
}

void write_report_json(const RunReport& r, const std::string& path) {
  using json = nlohmann::ordered_json;
  const RunConfig& c = r.config;
  const Problem& p = c.problem;
  const double ff = forward_flops(p, c.tokens), bf = backward_flops(p, c.tokens);
  json j;
  j["mxmoe_version"] = mxmoe::version();
  j["preset"] = c.preset;  // the preset resolve_config started from; "origin" says what it filled in
  j["origin"] = c.origin;
  j["seed"] = c.seed;
  j["problem"] = {{"hidden", p.hidden},
                  {"ffn", p.ffn},
                  {"experts", p.experts},
                  {"tokens", c.tokens},
                  {"activation", to_string(p.activation)},
                  {"glu_layout", to_string(p.glu_layout)},
                  {"recipe", to_string(p.recipe)},
                  {"fc1_bias", p.fc1_bias},
                  {"fc2_bias", p.fc2_bias},
                  {"scale_fc2_bias", p.scale_fc2_bias},
                  {"weight_layout", r.weight_layout},
                  {"description", r.problem_text}};
  j["token_split"] = {{"kind", c.skew ? "skewed" : "balanced"},
                      {"min", r.min_tokens},
                      {"max", r.max_tokens},
                      {"empty_experts", r.empty_experts}};
  j["device"] = r.device;
  json steps = json::array();
  for (const StepRecord& s : r.steps) {
    json skipped = json::array();
    for (const auto& [backend, why] : s.skipped) skipped.push_back({{"backend", backend}, {"reason", why}});
    json launches = json::array();
    for (const LaunchRecord& l : s.launches) launches.push_back({{"kernel", l.kernel}, {"config", l.config}});
    steps.push_back({{"step", s.step},
                     {"backend", s.backend},
                     {"config", s.config},
                     {"launches", std::move(launches)},
                     {"workspace_bytes", s.workspace_bytes},
                     {"weights", s.weights},
                     {"skipped", std::move(skipped)}});
  }
  j["steps"] = std::move(steps);
  j["forward"] = {{"seconds", number(r.forward_s)}, {"tflops", number(tflops(ff, r.forward_s))}};
  j["backward"] = {{"seconds", number(r.backward_s)}, {"tflops", number(tflops(bf, r.backward_s))}};
  j["saved_bytes"] = r.saved_bytes;
  json checks = json::array();
  for (const Check& k : r.checks)
    checks.push_back({{"kind", k.kind},
                      {"output", k.output},
                      {"scope", k.scope},
                      {"error", number(k.error())},
                      {"tolerance", number(k.tolerance)},
                      {"abs_floor", number(k.abs_floor)},
                      {"bound", number(k.bound())},
                      {"values", k.values},
                      {"error_norm", number(k.error_norm)},
                      {"ref_norm", number(k.ref_norm)},
                      {"pass", k.pass()}});
  j["checks"] = std::move(checks);
  j["notes"] = r.notes;
  j["pass"] = r.pass();
  // Invalid UTF-8 in a backend's reason is replaced rather than thrown on.
  write_text_file("--json", path, j.dump(2, ' ', false, json::error_handler_t::replace) + "\n");
}

}  // namespace mxmoe::cli
