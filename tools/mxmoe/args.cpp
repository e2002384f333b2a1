// Command-line parsing for `mxmoe` with CLI11: one subcommand per command, each with its own flags
// and --help; `--flag value` or `--flag=value`. Any mistake is a usage error (exit status 2) that
// names the flag and the value.
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>

#include "src/api/tooling.h"
#include "tools/mxmoe/cli.h"

#if __has_include("mxmoe/version.h")
#include "mxmoe/version.h"
#endif

namespace mxmoe::cli {
namespace {

// Decimal only (CLI11's own conversion reads 010 as octal and wraps -1 into an unsigned).
uint64_t parse_decimal(const std::string& flag, const std::string& v, uint64_t lo, uint64_t hi) {
  const bool digits = !v.empty() && v.size() <= 20 && v.find_first_not_of("0123456789") == std::string::npos;
  errno = 0;
  const unsigned long long n = digits ? std::strtoull(v.c_str(), nullptr, 10) : 0;
  if (!digits || errno == ERANGE || n < lo || n > hi)
    throw CLI::ValidationError(flag, "expects an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                         "], got '" + v + "'");
  return n;
}

void int_option(CLI::App* app, const std::string& flag, std::optional<int64_t>& target, int64_t lo, int64_t hi,
                const std::string& help) {
  app->add_option_function<std::string>(
         flag, [&target, flag, lo, hi](const std::string& v) { target = static_cast<int64_t>(parse_decimal(flag, v, lo, hi)); },
         help + " [" + std::to_string(lo) + ", " + std::to_string(hi) + "]")
      ->type_name("N");
}

template <class Enum>
void enum_option(CLI::App* app, const std::string& flag, std::optional<Enum>& target,
                 const std::vector<std::pair<std::string, Enum>>& names, const std::string& help) {
  std::string known;
  for (const auto& [name, value] : names) known += (known.empty() ? "" : "|") + name;
  app->add_option_function<std::string>(
         flag,
         [&target, flag, names, known](const std::string& v) {
           for (const auto& [name, value] : names)
             if (v == name) {
               target = value;
               return;
             }
           throw CLI::ValidationError(flag, "expects " + known + ", got '" + v + "'");
         },
         help)
      ->type_name(known);
}

void preset_option(CLI::App* app, CliOptions& o, const std::string& help) {
  std::string known;
  for (const Preset& p : presets()) known += std::string(known.empty() ? "" : "|") + p.name;
  app->add_option_function<std::string>(
         "--preset",
         [&o, known](const std::string& v) {
           if (!find_preset(v)) throw CLI::ValidationError("--preset", "expects " + known + ", got '" + v + "'");
           o.preset = v;
         },
         help)
      ->type_name(known);
}

void backend_options(CLI::App* app, CliOptions& o, bool with_backend) {
  auto known = [](const std::string& flag, const std::string& name) {
    if (!detail::find_backend(name))
      throw CLI::ValidationError(flag, "unknown backend '" + name + "' (known: " + detail::backend_names() + ")");
  };
  if (with_backend)
    app->add_option_function<std::string>(
           "--backend",
           [&o, known](const std::string& v) {
             known("--backend", v);
             o.backend = v;
           },
           "force a backend (" + detail::backend_names() + ")")
        ->type_name("NAME");
  app->add_option_function<std::vector<std::string>>(
         "--deny",
         [&o, known](const std::vector<std::string>& names) {
           for (const std::string& n : names) {
             if (n.empty()) continue;
             known("--deny", n);
             o.deny.push_back(n);
           }
         },
         "never use these backends (repeatable)")
      ->type_name("NAME[,NAME]")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

void add_seed(CLI::App* app, CliOptions& o) {
  app->add_option_function<std::string>(
         "--seed", [&o](const std::string& v) { o.seed = parse_decimal("--seed", v, 0, UINT64_MAX); },
         "random inputs (default 1)")
      ->type_name("N");
}

// An empty value is refused, not taken as "not given".
std::string non_empty(const std::string& v) { return v.empty() ? "needs a path, got ''" : ""; }

void add_json(CLI::App* app, CliOptions& o, const std::string& help) {
  app->add_option("--json", o.json_path, help + " (its folder must exist)")->type_name("FILE")->check(non_empty);
}

// Flags of `run` that another command does not take: named in a clear refusal instead of CLI11's
// "arguments were not expected" (hidden from that command's help).
void reject_run_flags(CLI::App* app, const std::vector<std::string>& valued, const std::vector<std::string>& switches,
                      const std::string& why) {
  for (const std::string& flag : valued)
    app->add_option_function<std::string>(
           flag, [flag, why](const std::string&) -> void { throw CLI::ValidationError(flag, why); }, "")
        ->group("");
  for (const std::string& flag : switches)
    app->add_flag_function(flag, [flag, why](int64_t) -> void { throw CLI::ValidationError(flag, why); }, "")
        ->group("");
}

// The problem flags of `run` and `plan`.
void problem_options(CLI::App* app, CliOptions& o) {
  preset_option(app, o,
                "model preset (default: dsv3 with a GPU, small without one or with --backend cpu)");
  int_option(app, "--hidden", o.hidden, 1, kMaxHidden, "H: override the preset's hidden size");
  int_option(app, "--ffn", o.ffn, 1, kMaxFfn, "F: override the preset's per-expert FFN size");
  int_option(app, "--experts", o.experts, 1, kMaxExperts, "E: override the preset's expert count");
  int_option(app, "--tokens", o.tokens, 0, kMaxTokens, "T: override the preset's token count");
  app->add_flag("--skew", o.skew, "skewed token split (Dirichlet(0.5), some experts empty); default balanced");
  enum_option<Recipe>(app, "--recipe", o.recipe,
                      {{"mxfp8", Recipe::mxfp8}, {"bf16", Recipe::bf16}, {"fp8_blockwise", Recipe::fp8_blockwise}},
                      "numeric recipe (default mxfp8; fp8_blockwise with fp32 scales runs on a Hopper GPU (cuda_sm90), "
                      "on other GPUs only with --pow2-scales, else on the CPU)");
  app->add_flag("--pow2-scales", o.pow2_scales, "fp8_blockwise: power-of-two scales");
  enum_option<Activation>(app, "--activation", o.activation,
                          {{"swiglu", Activation::swiglu}, {"clamped_swiglu", Activation::clamped_swiglu}},
                          "activation (default: the preset's)");
  enum_option<GluLayout>(app, "--glu-layout", o.glu_layout,
                         {{"halves", GluLayout::halves}, {"interleave32", GluLayout::interleave32}},
                         "GLU column layout of W1 (default: the preset's)");
  app->add_flag("--bias", o.bias, "FC1 and FC2 biases");
  app->add_flag("--scale-fc2-bias", o.scale_fc2_bias, "FC2 adds p*b2 instead of b2 (implies --bias)");
  enum_option<WeightLayout>(app, "--weight-layout", o.weight_layout,
                            {{"dense", WeightLayout::dense}, {"per_expert", WeightLayout::per_expert}},
                            "expert weights as one tensor or a pointer table (default dense)");
}

// --override STEP=CONFIG (repeatable): a step in a named configuration of the backend that serves it
// (`mxmoe plan` lists each step's configuration).
void override_option(CLI::App* app, CliOptions& o) {
  app->add_option_function<std::vector<std::string>>(
         "--override",
         [&o](const std::vector<std::string>& items) {
           for (const std::string& v : items) {
             const size_t eq = v.find('=');
             if (eq == std::string::npos || eq == 0 || eq + 1 == v.size())
               throw CLI::ValidationError("--override", "expects STEP=CONFIG (e.g. fc2_dgrad=mxfp8_regs_n128), got '" +
                                                            v + "'");
             o.overrides.push_back({v.substr(0, eq), v.substr(eq + 1)});
           }
         },
         "run STEP in the named configuration of its backend (repeatable; `mxmoe plan` lists them)")
      ->type_name("STEP=CONFIG")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

// "MXMOE_BACKEND=NAME: unknown backend ..." for the first unknown name in the environment that the
// Context would read (MXMOE_BACKEND only without --backend), or "".
std::string unknown_env_backend(bool backend_flag) {
  std::vector<std::pair<std::string, std::string>> named;  // (variable, backend)
  if (const char* b = std::getenv("MXMOE_BACKEND"); b && *b && !backend_flag) named.emplace_back("MXMOE_BACKEND", b);
  if (const char* d = std::getenv("MXMOE_DENY")) {
    std::stringstream list(d);
    for (std::string item; std::getline(list, item, ',');)
      if (!item.empty()) named.emplace_back("MXMOE_DENY", item);
  }
  for (const auto& [variable, name] : named)
    if (!detail::find_backend(name))
      return variable + "=" + name + ": unknown backend '" + name + "' (known: " + detail::backend_names() + ")";
  return "";
}

constexpr const char* kExitStatus =
    "exit status: 0 all checks passed, 1 a check failed, 2 bad command line, 3 error";

}  // namespace

const char* cli_version() {
#if defined(MXMOE_VERSION)
  return MXMOE_VERSION;  // mxmoe/version.h: the headers this CLI was built with
#else
  return version();  // the library's, from its MXMOE_VERSION compile definition
#endif
}

std::optional<int> parse_args(int argc, char** argv, CliOptions& o) {
  CLI::App app("mxmoe: grouped MLP for mixture-of-experts layers (BF16 and MXFP8), forward and backward",
               "mxmoe");
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("mxmoe ") + cli_version(), "print the version and exit");
  app.footer(kExitStatus);

  CLI::App* info = app.add_subcommand("info", "library version, build options, GPUs and every backend with its availability");
  backend_options(info, o, /*with_backend=*/false);

  reject_run_flags(info,
                   {"--preset", "--hidden", "--ffn", "--experts", "--tokens", "--recipe", "--activation",
                    "--glu-layout", "--weight-layout", "--seed", "--backend", "--check-rows", "--json", "--dump"},
                   {"--skew", "--bias", "--scale-fc2-bias"}, "is a flag of 'mxmoe run', not of 'mxmoe info'");

  CLI::App* version_cmd = app.add_subcommand("version", "print the version (as --version does)");

  CLI::App* run = app.add_subcommand("run", "build a random problem, run forward + backward, time it and check every output");
  run->footer(kExitStatus);
  problem_options(run, o);
  override_option(run, o);
  add_seed(run, o);
  backend_options(run, o, /*with_backend=*/true);
  std::optional<int64_t> check_rows;
  int_option(run, "--check-rows", check_rows, 1, kMaxTokens,
             "check N sampled rows and whole sampled experts instead of everything");
  add_json(run, o, "also write the report as JSON");
  run->add_option("--dump", o.dump_dir,
                  "write problem.json and every input and output as .npy into DIR, whole or not at all (its "
                  "parent folder must exist; DIR is created, or replaced when it holds an earlier dump)")
      ->type_name("DIR")
      ->check(non_empty);

  CLI::App* plan = app.add_subcommand(
      "plan", "print what a run would do on a GPU, without one: each step's backend, configuration, launches, "
              "workspace and weight form, and why other backends refused it");
  plan->footer("exit status: 0 done, 2 bad command line, 3 error (a step no backend can run)");
  plan->add_option_function<std::string>(
          "--arch",
          [&o](const std::string& v) {
            if (v != "sm_80" && v != "sm_90a" && v != "sm_100a" && v != "cpu")
              throw CLI::ValidationError("--arch", "expects sm_80|sm_90a|sm_100a|cpu, got '" + v + "'");
            o.arch = v;
          },
          "the device to plan for (default: this machine's GPU 0, or the CPU)")
      ->type_name("sm_80|sm_90a|sm_100a|cpu");
  problem_options(plan, o);
  plan->add_flag("--prepared", o.prepared, "with prepared weights (prepare_weights)");
  backend_options(plan, o, /*with_backend=*/true);
  override_option(plan, o);
  add_json(plan, o, "also write the plan as JSON");

  CLI::App* bench = app.add_subcommand(
      "bench", "time each step and the whole layer on the GPU, per preset, balanced and skewed, both recipes");
  bench->footer("exit status: 0 done, 2 bad command line, 3 error (no GPU)");
  preset_option(bench, o, "one preset (default: every preset but small)");
  enum_option<Recipe>(bench, "--recipe", o.recipe,
                      {{"mxfp8", Recipe::mxfp8}, {"bf16", Recipe::bf16}, {"fp8_blockwise", Recipe::fp8_blockwise}},
                      "one recipe (default: mxfp8 and bf16; fp8_blockwise with fp32 scales needs a Hopper GPU, "
                      "--pow2-scales any GPU)");
  bench->add_flag("--pow2-scales", o.pow2_scales, "fp8_blockwise: power-of-two scales");
  bench->add_flag("--skew", o.skew, "the skewed split only (default: balanced and skewed)");
  enum_option<DType>(bench, "--dw-dtype", o.dw_dtype, {{"bf16", DType::bf16}, {"f32", DType::f32}},
                     "type of the weight gradients dW1, dW2 (default bf16, what the peers' autograd returns; f32: an "
                     "fp32 main grad)");
  add_seed(bench, o);
  add_json(bench, o, "also write the rows and token splits as JSON (bench/peer_torch.py reads it)");
  override_option(bench, o);
  reject_run_flags(bench,
                   {"--hidden", "--ffn", "--experts", "--tokens", "--activation", "--glu-layout", "--weight-layout",
                    "--backend", "--deny", "--check-rows", "--dump"},
                   {"--bias", "--scale-fc2-bias"},
                   "is a flag of 'mxmoe run': bench times the presets' shapes (--preset) on the backends the "
                   "layer picks");

  CLI::App* help = app.add_subcommand("help", "this help, or a command's: mxmoe help run");
  std::string help_topic;
  help->add_option("command", help_topic, "a command")->type_name("COMMAND");

  // A first word that is no command (CLI11 would only say that a subcommand is required).
  if (argc >= 2 && argv[1][0] != '-') {
    const std::string first = argv[1];
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands({})) known |= sub->get_name() == first;
    if (!known) {
      std::cerr << "mxmoe: unknown command '" << first << "' (info, run, plan, bench, version, help)\n"
                << "run 'mxmoe --help' for the commands\n";
      return kExitUsage;
    }
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);  // --help, --version
    std::cerr << "mxmoe: " << e.what() << "\n";
    CLI::App* failed = &app;
    for (CLI::App* sub : app.get_subcommands()) failed = sub;
    std::cerr << "run '" << (failed == &app ? std::string("mxmoe") : "mxmoe " + failed->get_name())
              << " --help' for the flags\n";
    return kExitUsage;
  }

  if (version_cmd->parsed()) {
    std::cout << "mxmoe " << cli_version() << "\n";
    return kExitOk;
  }
  if (help->parsed()) {
    if (help_topic.empty()) {
      std::cout << app.help();
      return kExitOk;
    }
    for (CLI::App* sub : {info, version_cmd, run, plan, bench})
      if (sub->get_name() == help_topic) {
        std::cout << sub->help();
        return kExitOk;
      }
    std::cerr << "mxmoe: help: unknown command '" << help_topic << "' (info, run, plan, bench, version)\n";
    return kExitUsage;
  }
  for (CLI::App* sub : {info, run, plan, bench})
    if (sub->parsed()) o.command = sub->get_name();
  // The environment names backends too (Options: MXMOE_BACKEND, MXMOE_DENY): an unknown one is the
  // same usage error as the flag's, not an error of the run.
  if (const std::string bad = unknown_env_backend(!o.backend.empty()); !bad.empty()) {
    std::cerr << "mxmoe: " << bad << "\n";
    return kExitUsage;
  }
  if (o.scale_fc2_bias) o.bias = true;
  if (check_rows) o.check_rows = *check_rows;
  return std::nullopt;
}

}  // namespace mxmoe::cli
