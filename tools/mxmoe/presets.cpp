// Model presets (docs/architecture.md "Model presets": per-GPU expert loads of real models) and the
// problem a command line asks for.
#include <limits>

#include "tools/mxmoe/cli.h"

namespace mxmoe::cli {

const std::vector<Preset>& presets() {
  static const std::vector<Preset> kPresets = {
      {"small", 512, 256, 8, 1024, Activation::swiglu, GluLayout::halves},
      {"dsv3", 7168, 2048, 32, 32768, Activation::swiglu, GluLayout::halves},
      {"qwen3-30b", 2048, 768, 128, 65536, Activation::swiglu, GluLayout::halves},
      {"gptoss-120b", 2880, 2880, 32, 32768, Activation::clamped_swiglu, GluLayout::interleave32},
      {"mixtral", 4096, 14336, 8, 16384, Activation::swiglu, GluLayout::halves},
  };
  return kPresets;
}

const Preset* find_preset(const std::string& name) {
  for (const Preset& p : presets())
    if (name == p.name) return &p;
  return nullptr;
}

namespace {

// The problem as given: what the command line set, then what the preset filled in (if anything).
std::string origin_text(const CliOptions& o, const Preset& preset, const RunConfig& c) {
  const Problem& p = c.problem;
  std::string given, filled;
  auto add = [&](bool from_flag, const std::string& item) { (from_flag ? given : filled) += " " + item; };
  add(o.hidden.has_value(), "H=" + std::to_string(p.hidden));
  add(o.ffn.has_value(), "F=" + std::to_string(p.ffn));
  add(o.experts.has_value(), "E=" + std::to_string(p.experts));
  add(o.tokens.has_value(), "T=" + std::to_string(c.tokens));
  add(o.activation.has_value(), std::string("activation=") + to_string(p.activation));
  add(o.glu_layout.has_value(), std::string("glu=") + to_string(p.glu_layout));
  std::string s = given.empty() ? "" : "given:" + given;
  if (!filled.empty())
    s += (s.empty() ? "" : "; ") + std::string("from preset ") + preset.name +
         (o.preset.empty() ? " (the default)" : "") + ":" + filled;
  return s;
}

}  // namespace

RunConfig resolve_config(const CliOptions& o, bool gpu_run) {
  // Without a GPU the big presets would take hours on the CPU reference backend.
  const std::string name = !o.preset.empty() ? o.preset : (gpu_run ? "dsv3" : "small");
  const Preset* preset = find_preset(name);
  if (!preset) {
    std::string known;
    for (const Preset& p : presets()) known += std::string(known.empty() ? "" : "|") + p.name;
    throw UsageError("--preset expects " + known + ", got '" + name + "'");
  }
  RunConfig c;
  c.preset = name;
  c.skew = o.skew;
  c.seed = o.seed;
  Problem& p = c.problem;
  p.hidden = o.hidden.value_or(preset->hidden);
  p.ffn = o.ffn.value_or(preset->ffn);
  p.experts = o.experts.value_or(preset->experts);
  c.tokens = o.tokens.value_or(preset->tokens);
  p.activation = o.activation.value_or(preset->activation);
  p.glu_layout = o.glu_layout.value_or(preset->glu_layout);
  p.recipe = o.recipe.value_or(Recipe::mxfp8);
  p.weight_layout = o.weight_layout.value_or(WeightLayout::dense);
  p.fc1_bias = p.fc2_bias = o.bias;
  p.scale_fc2_bias = o.scale_fc2_bias;
  p.pow2_scales = o.pow2_scales;
  c.origin = origin_text(o, *preset, c);
  if (c.tokens > std::numeric_limits<int32_t>::max())
    throw UsageError("--tokens " + std::to_string(c.tokens) + " does not fit the int32 group offsets");
  try {
    validate_problem(p);
  } catch (const Error& e) {
    throw UsageError(std::string("invalid problem: ") + e.what());
  }
  return c;
}

}  // namespace mxmoe::cli
