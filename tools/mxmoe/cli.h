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
// A bad command line: main prints the message and a pointer to --help on stderr and exits with
// kExitUsage. Parse errors (CLI11's) are reported the same way.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr int kExitOk = 0;
inline constexpr int kExitCheckFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitError = 3;

// Bounds of the dimension flags: beyond any real MoE layer, small enough that every size the CLI
// computes from them (elements, bytes) fits an int64 and a double exactly.
inline constexpr int64_t kMaxHidden = int64_t{1} << 16;
inline constexpr int64_t kMaxFfn = int64_t{1} << 17;
inline constexpr int64_t kMaxExperts = int64_t{1} << 16;
inline constexpr int64_t kMaxTokens = 2147483647;  // int32 group offsets

struct CliOptions {
  std::string command;  // info | run | plan | bench | version
  std::string preset;   // empty: small without a GPU (or with --backend cpu), dsv3 with one
  std::optional<int64_t> hidden, ffn, experts, tokens;
  std::optional<Recipe> recipe;
  std::optional<Activation> activation;
  std::optional<GluLayout> glu_layout;
  std::optional<WeightLayout> weight_layout;
  bool skew = false;
  bool bias = false;
  bool scale_fc2_bias = false;
  bool pow2_scales = false;  // fp8_blockwise: power-of-two scales
  uint64_t seed = 1;
  std::string backend;
  std::vector<std::string> deny;
  std::string json_path;
  std::string dump_dir;
  int64_t check_rows = 0;  // 0: automatic (all rows when small, 256 sampled when large)
  std::optional<DType> dw_dtype;  // bench: the weight gradients' type (default bf16, like the peers' autograd)
  std::vector<StepOverride> overrides;  // --override STEP=CONFIG
  std::string arch;                     // plan: sm_80 | sm_90a | sm_100a | cpu (empty: this machine)
  bool prepared = false;                // plan: with prepared weights
};

// Parses the command line with CLI11 (per-command flags and --help). Returns the exit status when
// parsing already ended the program (help or version printed, or a usage error reported on stderr),
// nothing when `o` holds a command to run.
std::optional<int> parse_args(int argc, char** argv, CliOptions& o);
// The version `mxmoe --version` prints.
const char* cli_version();

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
  // Where the sizes and layouts came from, as the report prints it: "H=128 F=256 E=8 T=1024 from
  // the command line", or with "; from preset small: F=256 E=8 ..." for what the preset filled in.
  std::string origin;
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
  bool warmup = false;     // one untimed iteration first (GPU)
  std::string label;       // progress lines on stderr (a terminal only); empty: none
  double estimate_s = 0;   // expected seconds of forward + backward (0: unknown), for the progress line
};
LayerResult run_layer(const LayerData& data, const RunSettings& settings);

int command_info(const CliOptions& o);
int command_run(const CliOptions& o);
int command_bench(const CliOptions& o);  // bench.cpp
int command_plan(const CliOptions& o);   // plan.cpp

// ---- progress.cpp ----
// On a terminal (stderr), `phase` starts a progress line that is redrawn every second with the time
// spent and, given an estimate (seconds > 0), about how long is left; the next phase ends it.
// Not a terminal: nothing is printed.
bool progress_shown();
void progress(const std::string& phase, double estimate_s = 0);
void progress_end();  // ends the current line (before the report, or an error, is printed)

// ---- report.cpp ----
// Pass when ||out - ref|| <= tolerance * ||ref|| + abs_floor (docs/numerics.md "Tolerances": a
// relative error over a handful of values is noise; the floor, the error the tolerance allows on a
// few typical elements, absorbs it and is negligible beside tolerance * ||ref|| over many values).
struct Check {
  std::string kind;    // "same-points vs cpu" or "fp64 reference"
  std::string output;  // y, dx, dprobs, dw1, ...
  std::string scope;   // "all rows", "256 sampled rows", "expert 3 (1024 rows)"
  int64_t values = 0;  // elements compared (0: nothing to compare, passes)
  double error_norm = 0, ref_norm = 0;  // ||out - ref||, ||ref|| (error_norm inf: NaN or Inf seen)
  double tolerance = 0;                 // relative
  double abs_floor = 0;                 // on ||out - ref||, in the output's units
  double error() const;                 // relative Frobenius error (||out - ref|| when ref is all zeros)
  double bound() const;                 // the relative error allowed: tolerance + abs_floor / ||ref||
  bool pass() const;
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
void write_report_json(const RunReport& r, const std::string& path);  // --json

// ---- output.cpp ----
// Output files named on the command line. Before the run, check_output_file / check_output_dir
// refuse a path that cannot be written (a directory, a missing folder, a folder where no file can be
// created) with a UsageError naming the flag and the path. OutputFile writes a regular file through
// a temporary name in the same folder, checks every write and the close, and renames it over the
// path only when all of it is written; a character device or FIFO (/dev/stdout) is written in place.
// Write failures throw Error naming the flag, the path and the reason.
// One rule for both: the folder the output goes into must exist (nothing is created before the run).
// A dump directory must be absent, empty, or hold an earlier dump (problem.json and .npy files only),
// which the new one replaces whole.
void check_output_file(const std::string& flag, const std::string& path);
void check_output_dir(const std::string& flag, const std::string& dir);
// --json must be neither the --dump directory nor inside it (a UsageError naming both).
void check_distinct_outputs(const std::string& json_path, const std::string& dump_dir);
// A dump directory written whole or not at all: files go into a temporary directory beside it,
// renamed into place by commit(); destroyed uncommitted (a failed write), the temporary is removed.
class OutputDir {
 public:
  OutputDir(std::string flag, const std::string& dir);
  ~OutputDir();
  OutputDir(const OutputDir&) = delete;
  OutputDir& operator=(const OutputDir&) = delete;
  std::string file(const std::string& name) const;  // where to write `name` until commit()
  void commit();

 private:
  std::string flag_, path_, temp_;
};
class OutputFile {
 public:
  OutputFile(std::string flag, std::string path);
  ~OutputFile();  // not committed: closes and removes the temporary
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  void write(const void* data, size_t bytes);
  void write(const std::string& text) { write(text.data(), text.size()); }
  void commit();  // close (checked), then rename over the path

 private:
  [[noreturn]] void fail(const std::string& what, int err);
  std::string flag_, path_, temp_;  // temp_ empty: writing the path in place
  int fd_ = -1;
};
// A whole text file (JSON) written through OutputFile.
void write_text_file(const std::string& flag, const std::string& path, const std::string& text);

// ---- npy.cpp ----
// Minimal .npy v1.0 writer (through OutputFile, flag "--dump"). descr: "<f4", "<i4", "<u2", "<f8".
void write_npy(const std::string& path, const void* data, const char* descr, size_t elem_bytes,
               const std::vector<int64_t>& shape);
void write_npy_bf16_as_f32(const std::string& path, const std::vector<uint16_t>& bits,
                           const std::vector<int64_t>& shape);

// ---- memory.cpp ----
// What a `run` needs at its peak (bytes), estimated from the sizes before anything is allocated,
// and what the machine has. The estimate counts the CLI's host copies (inputs, outputs, the CPU
// check, the fp64 reference) and the library's workspaces; it errs on the high side.
struct MemoryEstimate {
  double host = 0, device = 0;  // device: 0 for a CPU run
};
MemoryEstimate estimate_run_memory(const RunConfig& cfg, bool gpu, bool sampled, int64_t check_rows);
double available_host_memory();            // bytes; MemAvailable, else physical pages free
double available_device_memory(int index);  // bytes free on cuda:index (0 without CUDA)
std::string bytes_text(double bytes);        // "1.23 GiB"

}  // namespace mxmoe::cli
