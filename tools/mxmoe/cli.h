// Shared declarations of the `mxmoe` command-line tool: parsed options, presets, the random problem,
// the layer run on one device, the checks and the report.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mxmoe/mxmoe.h"

namespace mxmoe::cli {

// ---- args.cpp ----
// A bad command line: main prints the message and the usage on stderr and exits with kExitUsage.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr int kExitOk = 0;
inline constexpr int kExitCheckFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitError = 3;

struct CliOptions {
  std::string command;  // info | run | bench | help
  std::string preset;   // empty: small without a GPU (or with --backend cpu), dsv3 with one
  std::optional<int64_t> hidden, ffn, experts, tokens;
  std::optional<Recipe> recipe;
  std::optional<Activation> activation;
  std::optional<GluLayout> glu_layout;
  std::optional<WeightLayout> weight_layout;
  bool skew = false;
  bool bias = false;
  bool scale_fc2_bias = false;
  uint64_t seed = 1;
  std::string backend;
  std::vector<std::string> deny;
  std::string json_path;
  std::string dump_dir;
  int64_t check_rows = 0;  // 0: automatic (all rows when small, 256 sampled when large)
};

CliOptions parse_args(int argc, char** argv);  // throws UsageError
void print_usage(std::FILE* out);

// ---- presets.cpp ----
struct Preset {
  const char* name;
  int64_t hidden, ffn, experts, tokens;
  Activation activation;
  GluLayout glu_layout;
};
const std::vector<Preset>& presets();
const Preset* find_preset(const std::string& name);  // nullptr when unknown

// The problem and token count after applying preset and overrides.
struct RunConfig {
  Problem problem;
  int64_t tokens = 0;
  std::string preset;
  bool skew = false;
  uint64_t seed = 1;
};
RunConfig resolve_config(const CliOptions& o, bool gpu_run);  // throws UsageError

// ---- problem_data.cpp ----
// Host inputs of one layer call. bf16 tensors hold raw bits.
struct LayerData {
  Problem problem;
  int64_t tokens = 0;
  std::vector<int32_t> offsets;  // [E+1]
  std::vector<uint16_t> x;       // [T, H]
  std::vector<float> probs;      // [T]
  std::vector<uint16_t> dy;      // [T, H]
  // Weights are shared with the row-sampled sub-problem instead of copied (GBs at model sizes).
  std::shared_ptr<const std::vector<uint16_t>> w1;  // [E, 2F, H]
  std::shared_ptr<const std::vector<uint16_t>> b1;  // [E, 2F] or empty
  std::shared_ptr<const std::vector<uint16_t>> w2;  // [E, H, F]
  std::shared_ptr<const std::vector<uint16_t>> b2;  // [E, H] or empty
  int64_t expert_size(int64_t e) const { return offsets[e + 1] - offsets[e]; }
};
LayerData make_layer_data(const RunConfig& cfg);
// Tokens per expert: balanced (T/E each), or skewed (Dirichlet(0.5), about one in eight empty).
std::vector<int64_t> token_split(int64_t tokens, int64_t experts, bool skew, uint64_t seed);

// Sub-problems whose outputs equal slices of the full run's at the same quantization points.
// rows: sampled tokens (sorted, so they keep their experts), all experts' weights.
LayerData select_rows(const LayerData& full, const std::vector<int64_t>& rows);
// One whole expert as a single-expert problem.
LayerData select_expert(const LayerData& full, int64_t expert);

// ---- run.cpp ----
// Host copies of every output of one layer call (bf16 outputs as raw bits; grads fp32).
struct LayerResult {
  std::vector<uint16_t> y, dx;
  std::vector<float> dprobs, dw1, dw2, db1, db2;
  double forward_s = 0, backward_s = 0;
  int64_t saved_bytes = 0;
  std::vector<StepRecord> steps;
};

struct RunSettings {
  Device device{};
  Options options{};
  WeightLayout weight_layout = WeightLayout::dense;
  bool warmup = false;  // one untimed iteration first (GPU)
  std::string label;    // progress lines on stderr
};
LayerResult run_layer(const LayerData& data, const RunSettings& settings);

int command_info(const CliOptions& o);
int command_run(const CliOptions& o);
int command_bench(const CliOptions& o);  // bench.cpp

// ---- report.cpp ----
struct Check {
  std::string kind;    // "same-points vs cpu" or "fp64 reference"
  std::string output;  // y, dx, dprobs, dw1, ...
  std::string scope;   // "all rows", "256 sampled rows", "expert 3 (1024 rows)"
  double error = 0;    // relative Frobenius error
  double tolerance = 0;
  bool pass() const { return error <= tolerance; }
};

struct RunReport {
  RunConfig config;
  std::string problem_text;
  int64_t min_tokens = 0, max_tokens = 0, empty_experts = 0;
  std::string device;
  std::string weight_layout;
  std::vector<StepRecord> steps;
  double forward_s = 0, backward_s = 0;
  int64_t saved_bytes = 0;
  std::vector<Check> checks;
  std::vector<std::string> notes;
  bool pass() const;
};

void print_report(const RunReport& r, std::FILE* out);
void write_report_json(const RunReport& r, const std::string& path);
std::string json_escape(const std::string& s);

// ---- npy.cpp ----
// Minimal .npy v1.0 writer. descr: "<f4", "<i4", "<u2", "<f8".
void write_npy(const std::string& path, const void* data, const char* descr, size_t elem_bytes,
               const std::vector<int64_t>& shape);
void write_npy_bf16_as_f32(const std::string& path, const std::vector<uint16_t>& bits,
                           const std::vector<int64_t>& shape);

}  // namespace mxmoe::cli
