// The run report as readable text and as JSON (hand-written, no dependencies).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "tools/mxmoe/cli.h"

namespace mxmoe::cli {
namespace {

std::string bytes_text(int64_t b) {
  char buf[64];
  if (b >= (int64_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(int64_t{1} << 30));
  else if (b >= (int64_t{1} << 20))
    std::snprintf(buf, sizeof buf, "%.2f MiB", double(b) / double(int64_t{1} << 20));
  else
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
  return buf;
}

double tflops(double flops, double seconds) { return seconds > 0 ? flops / seconds * 1e-12 : 0.0; }

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";  // JSON has no Inf/NaN; a failed check also says "pass": false
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string split_kind(const RunConfig& c) { return c.skew ? "skewed (Dirichlet 0.5)" : "balanced"; }

}  // namespace

bool RunReport::pass() const {
  for (const Check& c : checks)
    if (!c.pass()) return false;
  return true;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out;
}

void print_report(const RunReport& r, std::FILE* out) {
  const RunConfig& c = r.config;
  const double ff = forward_flops(c.problem, c.tokens), bf = backward_flops(c.problem, c.tokens);
  std::fprintf(out, "mxmoe run (preset %s, seed %llu)\n", c.preset.c_str(), static_cast<unsigned long long>(c.seed));
  std::fprintf(out, "  problem   %s\n", r.problem_text.c_str());
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
    if (as_above)
      std::fprintf(out, "    %-20s %-14s (skipped as above)\n", s.step.c_str(), s.backend.c_str());
    else
      std::fprintf(out, "    %-20s %s\n", s.step.c_str(), s.backend.c_str());
    if (!as_above)
      for (const auto& [name, why] : s.skipped) std::fprintf(out, "      skipped %s: %s\n", name.c_str(), why.c_str());
    previous = &s;
  }
  std::fprintf(out, "  time      forward  %10.3f ms  %9.3f TFLOP/s\n", r.forward_s * 1e3, tflops(ff, r.forward_s));
  std::fprintf(out, "            backward %10.3f ms  %9.3f TFLOP/s\n", r.backward_s * 1e3, tflops(bf, r.backward_s));
  std::fprintf(out, "  saved for backward  %s\n", bytes_text(r.saved_bytes).c_str());
  std::fprintf(out, "  checks (relative Frobenius error)\n");
  for (const Check& k : r.checks)
    std::fprintf(out, "    %-19s %-7s %-28s %9.3e <= %7.1e  %s\n", k.kind.c_str(), k.output.c_str(), k.scope.c_str(),
                 k.error, k.tolerance, k.pass() ? "PASS" : "FAIL");
  for (const std::string& n : r.notes) std::fprintf(out, "  note: %s\n", n.c_str());
  std::fprintf(out, "  result    %s\n", r.pass() ? "PASS" : "FAIL");
}

void write_report_json(const RunReport& r, const std::string& path) {
  const RunConfig& c = r.config;
  const Problem& p = c.problem;
  const double ff = forward_flops(p, c.tokens), bf = backward_flops(p, c.tokens);
  std::ostringstream j;
  auto str = [](const std::string& s) {
    std::string q = "\"";  // appended, not operator+ on a literal: GCC 12 warns falsely (-Wrestrict)
    q += json_escape(s);
    q += '"';
    return q;
  };
  auto boolean = [](bool b) { return b ? "true" : "false"; };
  j << "{\n";
  j << "  \"preset\": " << str(c.preset) << ",\n  \"seed\": " << c.seed << ",\n";
  j << "  \"problem\": {\"hidden\": " << p.hidden << ", \"ffn\": " << p.ffn << ", \"experts\": " << p.experts
    << ", \"tokens\": " << c.tokens << ", \"activation\": " << str(to_string(p.activation))
    << ", \"glu_layout\": " << str(to_string(p.glu_layout)) << ", \"recipe\": " << str(to_string(p.recipe))
    << ", \"fc1_bias\": " << boolean(p.fc1_bias) << ", \"fc2_bias\": " << boolean(p.fc2_bias)
    << ", \"scale_fc2_bias\": " << boolean(p.scale_fc2_bias) << ", \"weight_layout\": " << str(r.weight_layout)
    << ", \"description\": " << str(r.problem_text) << "},\n";
  j << "  \"token_split\": {\"kind\": " << str(c.skew ? "skewed" : "balanced") << ", \"min\": " << r.min_tokens
    << ", \"max\": " << r.max_tokens << ", \"empty_experts\": " << r.empty_experts << "},\n";
  j << "  \"device\": " << str(r.device) << ",\n  \"steps\": [";
  for (size_t i = 0; i < r.steps.size(); ++i) {
    const StepRecord& s = r.steps[i];
    j << (i ? ",\n" : "\n") << "    {\"step\": " << str(s.step) << ", \"backend\": " << str(s.backend)
      << ", \"skipped\": [";
    for (size_t k = 0; k < s.skipped.size(); ++k)
      j << (k ? ", " : "") << "{\"backend\": " << str(s.skipped[k].first)
        << ", \"reason\": " << str(s.skipped[k].second) << "}";
    j << "]}";
  }
  j << "\n  ],\n";
  j << "  \"forward\": {\"seconds\": " << json_number(r.forward_s)
    << ", \"tflops\": " << json_number(tflops(ff, r.forward_s)) << "},\n";
  j << "  \"backward\": {\"seconds\": " << json_number(r.backward_s)
    << ", \"tflops\": " << json_number(tflops(bf, r.backward_s)) << "},\n";
  j << "  \"saved_bytes\": " << r.saved_bytes << ",\n  \"checks\": [";
  for (size_t i = 0; i < r.checks.size(); ++i) {
    const Check& k = r.checks[i];
    j << (i ? ",\n" : "\n") << "    {\"kind\": " << str(k.kind) << ", \"output\": " << str(k.output)
      << ", \"scope\": " << str(k.scope) << ", \"error\": " << json_number(k.error)
      << ", \"tolerance\": " << json_number(k.tolerance) << ", \"pass\": " << boolean(k.pass()) << "}";
  }
  j << "\n  ],\n  \"notes\": [";
  for (size_t i = 0; i < r.notes.size(); ++i) j << (i ? ", " : "") << str(r.notes[i]);
  j << "],\n  \"pass\": " << boolean(r.pass()) << "\n}\n";
  std::ofstream f(path);
  if (!f) throw Error("--json", "cannot write " + path);
  f << j.str();
}

}  // namespace mxmoe::cli
