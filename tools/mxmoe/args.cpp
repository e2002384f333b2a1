// Command-line parsing for `mxmoe`: `--flag value` or `--flag=value`; any mistake is a UsageError.
#include <cerrno>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>

#include "src/api/tooling.h"
#include "tools/mxmoe/cli.h"

namespace mxmoe::cli {
namespace {

int64_t parse_int(const std::string& flag, const std::string& v, int64_t min_value) {
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE || n < min_value)
    throw UsageError(flag + " expects an integer >= " + std::to_string(min_value) + ", got '" + v + "'");
  return n;
}

template <class Enum>
Enum parse_enum(const std::string& flag, const std::string& v, const std::map<std::string, Enum>& names) {
  const auto it = names.find(v);
  if (it != names.end()) return it->second;
  std::string known;
  for (const auto& [name, value] : names) known += (known.empty() ? "" : "|") + name;
  throw UsageError(flag + " expects " + known + ", got '" + v + "'");
}

std::vector<std::string> split_commas(const std::string& v) {
  std::vector<std::string> out;
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace

void print_usage(std::FILE* out) {
  const std::string usage =
      "usage: mxmoe <command> [flags]\n"
      "\n"
      "commands:\n"
      "  info    library version, build options, GPUs and every backend with its availability\n"
      "  run     build a random problem, run forward + backward, time it and check every output\n"
      "  bench   time each step and the whole layer on the GPU (--preset, --recipe, --skew, --json)\n"
      "\n"
      "flags for run:\n"
      "  --preset NAME          small | dsv3 | qwen3-30b | gptoss-120b | mixtral\n"
      "                         (default: dsv3 with a GPU, small without one or with --backend cpu)\n"
      "  --hidden N --ffn N --experts N --tokens N   override the preset's sizes\n"
      "  --skew                 skewed token split (Dirichlet(0.5), some experts empty); default balanced\n"
      "  --recipe R             mxfp8 (default) | bf16\n"
      "  --activation A         swiglu | clamped_swiglu (default: the preset's)\n"
      "  --glu-layout L         halves | interleave32 (default: the preset's)\n"
      "  --bias                 FC1 and FC2 biases\n"
      "  --scale-fc2-bias       FC2 adds p*b2 instead of b2 (implies --bias)\n"
      "  --weight-layout W      dense (default) | per_expert\n"
      "  --seed N               random inputs (default 1)\n"
      "  --backend NAME         force a backend (" +
      detail::backend_names() +
      ")\n"
      "  --deny NAME[,NAME]     never use these backends (repeatable)\n"
      "  --check-rows N         check N sampled rows and whole sampled experts instead of everything\n"
      "  --json FILE            also write the report as JSON\n"
      "  --dump DIR             write problem.json and every input and output as .npy\n"
      "\n"
      "exit status: 0 all checks passed, 1 a check failed, 2 bad command line, 3 error\n";
  std::fputs(usage.c_str(), out);
}

CliOptions parse_args(int argc, char** argv) {
  CliOptions o;
  if (argc < 2) throw UsageError("missing command");
  o.command = argv[1];
  if (o.command == "-h" || o.command == "--help" || o.command == "help") {
    o.command = "help";
    return o;
  }
  if (o.command != "info" && o.command != "run" && o.command != "bench")
    throw UsageError("unknown command '" + o.command + "'");

  using Setter = std::function<void(const std::string& flag, const std::string& value)>;
  const std::map<std::string, Setter> valued = {
      {"--preset", [&](auto&, auto& v) { o.preset = v; }},
      {"--hidden", [&](auto& f, auto& v) { o.hidden = parse_int(f, v, 1); }},
      {"--ffn", [&](auto& f, auto& v) { o.ffn = parse_int(f, v, 1); }},
      {"--experts", [&](auto& f, auto& v) { o.experts = parse_int(f, v, 1); }},
      {"--tokens", [&](auto& f, auto& v) { o.tokens = parse_int(f, v, 0); }},
      {"--seed", [&](auto& f, auto& v) { o.seed = static_cast<uint64_t>(parse_int(f, v, 0)); }},
      {"--check-rows", [&](auto& f, auto& v) { o.check_rows = parse_int(f, v, 1); }},
      {"--backend", [&](auto&, auto& v) { o.backend = v; }},
      {"--deny",
       [&](auto&, auto& v) {
         for (auto& n : split_commas(v)) o.deny.push_back(n);
       }},
      {"--json", [&](auto&, auto& v) { o.json_path = v; }},
      {"--dump", [&](auto&, auto& v) { o.dump_dir = v; }},
      {"--recipe",
       [&](auto& f, auto& v) {
         o.recipe = parse_enum<Recipe>(f, v, {{"bf16", Recipe::bf16}, {"mxfp8", Recipe::mxfp8}});
       }},
      {"--activation",
       [&](auto& f, auto& v) {
         o.activation = parse_enum<Activation>(
             f, v, {{"swiglu", Activation::swiglu}, {"clamped_swiglu", Activation::clamped_swiglu}});
       }},
      {"--glu-layout",
       [&](auto& f, auto& v) {
         o.glu_layout =
             parse_enum<GluLayout>(f, v, {{"halves", GluLayout::halves}, {"interleave32", GluLayout::interleave32}});
       }},
      {"--weight-layout",
       [&](auto& f, auto& v) {
         o.weight_layout =
             parse_enum<WeightLayout>(f, v, {{"dense", WeightLayout::dense}, {"per_expert", WeightLayout::per_expert}});
       }},
  };
  const std::map<std::string, std::function<void()>> switches = {
      {"--skew", [&] { o.skew = true; }},
      {"--bias", [&] { o.bias = true; }},
      {"--scale-fc2-bias", [&] { o.scale_fc2_bias = o.bias = true; }},
  };

  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      o.command = "help";
      return o;
    }
    std::string value;
    bool has_value = false;
    if (const size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    if (const auto s = switches.find(arg); s != switches.end()) {
      if (has_value) throw UsageError(arg + " takes no value");
      s->second();
      continue;
    }
    const auto v = valued.find(arg);
    if (v == valued.end()) throw UsageError("unknown flag '" + arg + "'");
    if (!has_value) {
      if (i + 1 >= argc) throw UsageError(arg + " needs a value");
      value = argv[++i];
    }
    v->second(arg, value);
  }
  return o;
}

}  // namespace mxmoe::cli
