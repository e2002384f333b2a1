// `mxmoe run`: build a random problem, run forward + backward on the best device, time it, and check
// every output twice (docs/numerics.md "Tolerances"):
//   1. same-points vs the CPU backend (1e-2), when the run itself is not the CPU backend;
//   2. sanity vs the unquantized fp64 reference (2e-2 bf16, 0.1 mxfp8 swiglu, 0.25 mxfp8 clamped).
// Large problems are checked on ~256 sampled rows (y, dx, dprobs) and on whole sampled experts run as
// single-expert problems (dW1, dW2, db1, db2): row-wise quantization is per row and column-wise
// blocks restart at each expert, so those sub-problems see exactly the full run's quantization points.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <random>

#include <nlohmann/json.hpp>

#include "src/api/tooling.h"
#include "tools/mxmoe/cli.h"

namespace mxmoe::cli {
namespace {

constexpr double kSamePointsTolerance = 1e-2;
constexpr int64_t kDefaultCheckRows = 256;
constexpr double kLargeProblem = 2147483648.0;  // T*H*F above this: check sampled rows and experts
// The absolute floor of a check is the error norm the tolerance allows on this many typical
// elements (docs/numerics.md "Tolerances"): it decides only when a handful of values is compared.
constexpr double kFloorElements = 16;

double reference_tolerance(const Problem& p) {
  if (p.recipe == Recipe::bf16) return 2e-2;
  return p.activation == Activation::swiglu ? 0.1 : 0.25;
}

// ||out - ref|| and ||ref|| over n elements; NaN or Inf anywhere gives an infinite error norm.
struct Norms {
  double error = 0, ref = 0;
};
template <class Out, class Ref>
Norms norms(int64_t n, Out out, Ref ref) {
  double num = 0, den = 0;
  bool finite = true;
#pragma omp parallel for reduction(+ : num, den) reduction(&& : finite)
  for (int64_t i = 0; i < n; ++i) {
    const double a = out(i), b = ref(i);
    finite = finite && std::isfinite(a) && std::isfinite(b);
    num += (a - b) * (a - b);
    den += b * b;
  }
  return {finite ? std::sqrt(num) : INFINITY, std::sqrt(den)};
}

// The rms an element of each output has under make_layer_data's inputs (x, dy ~ U(-1,1); W1, W2
// scaled so that C has unit variance and Y is O(1)), measured over H 64..2048, F 64..1024: y ~1,
// dX ~1.4, dprobs_t = dY_t . Z_t (H terms) ~sqrt(H); biases raise them to ~1.6x. Weight and bias
// gradients compare at least H values (an expert's column of dW2, all of db2) and get no floor.
double typical_magnitude(const std::string& output, const Problem& p) {
  if (output == "y") return 1.0;
  if (output == "dx") return 1.4;
  if (output == "dprobs") return std::sqrt(double(p.hidden));
  return 0.0;
}

double bf(uint16_t v) { return f32_from_bf16(v); }

std::vector<double> to_double(const std::vector<uint16_t>& v) {
  std::vector<double> d(v.size());
#pragma omp parallel for
  for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) d[i] = bf(v[i]);
  return d;
}

cpu::RefLayerOutputs reference(const LayerData& d, bool weight_grads) {
  cpu::RefLayerInputs in;
  in.problem = d.problem;
  in.tokens = d.tokens;
  in.offsets = d.offsets;
  in.x = to_double(d.x);
  in.probs.assign(d.probs.begin(), d.probs.end());
  in.w1 = to_double(*d.w1);
  in.b1 = to_double(*d.b1);
  in.w2 = to_double(*d.w2);
  in.b2 = to_double(*d.b2);
  in.dy = to_double(d.dy);
  in.compute_weight_grads = weight_grads;
  cpu::RefLayerOutputs out = cpu::reference_layer_f64(in);
  // With T = 0 the reference sees an empty dY and skips the backward; the gradients of a layer that
  // saw no token are zeros.
  if (d.tokens == 0 && weight_grads) {
    const Problem& p = d.problem;
    out.dw1.assign(static_cast<size_t>(p.experts * 2 * p.ffn * p.hidden), 0.0);
    out.dw2.assign(static_cast<size_t>(p.experts * p.hidden * p.ffn), 0.0);
    if (p.fc1_bias) out.db1.assign(static_cast<size_t>(p.experts * 2 * p.ffn), 0.0);
    if (p.fc2_bias) out.db2.assign(static_cast<size_t>(p.experts * p.hidden), 0.0);
  }
  return out;
}

// Slices of an output to compare: `index(i)` maps the checked element i to the run's element.
struct Outputs {
  const LayerResult& run;
  std::vector<Check>& checks;
  std::string kind, scope;
  double tolerance;
  const Problem& problem;
  template <class Ref, class Index>
  void bf16(const char* name, const std::vector<uint16_t>& out, int64_t n, Index index, Ref ref) {
    add(name, n, norms(n, [&](int64_t i) { return bf(out[index(i)]); }, ref));
  }
  template <class Ref, class Index>
  void f32(const char* name, const std::vector<float>& out, int64_t n, Index index, Ref ref) {
    add(name, n, norms(n, [&](int64_t i) { return double(out[index(i)]); }, ref));
  }
  void add(const char* name, int64_t n, Norms e) {
    checks.push_back({.kind = kind,
                      .output = name,
                      .scope = scope,
                      .values = n,
                      .error_norm = e.error,
                      .ref_norm = e.ref,
                      .tolerance = tolerance,
                      .abs_floor = tolerance * std::sqrt(kFloorElements) * typical_magnitude(name, problem)});
  }
};

// Every output element of the run against a full-size result (another backend's or fp64).
template <class Get>
void compare_all(Outputs& o, const LayerData& d, Get get) {
  const Problem& p = d.problem;
  const int64_t T = d.tokens, H = p.hidden, F = p.ffn, E = p.experts;
  auto same = [](int64_t i) { return i; };
  o.bf16("y", o.run.y, T * H, same, [&](int64_t i) { return get.y(i); });
  o.bf16("dx", o.run.dx, T * H, same, [&](int64_t i) { return get.dx(i); });
  o.f32("dprobs", o.run.dprobs, T, same, [&](int64_t i) { return get.dprobs(i); });
  o.f32("dw1", o.run.dw1, E * 2 * F * H, same, [&](int64_t i) { return get.dw1(i); });
  o.f32("dw2", o.run.dw2, E * H * F, same, [&](int64_t i) { return get.dw2(i); });
  if (p.fc1_bias) o.f32("db1", o.run.db1, E * 2 * F, same, [&](int64_t i) { return get.db1(i); });
  if (p.fc2_bias) o.f32("db2", o.run.db2, E * H, same, [&](int64_t i) { return get.db2(i); });
}

// Sampled rows: the sub-problem's row i is the run's row rows[i].
template <class Get>
void compare_rows(Outputs& o, const LayerData& d, const std::vector<int64_t>& rows, Get get) {
  const int64_t H = d.problem.hidden, n = static_cast<int64_t>(rows.size());
  auto row_major = [&](int64_t i) { return rows[i / H] * H + i % H; };
  o.bf16("y", o.run.y, n * H, row_major, [&](int64_t i) { return get.y(i); });
  o.bf16("dx", o.run.dx, n * H, row_major, [&](int64_t i) { return get.dx(i); });
  o.f32(
      "dprobs", o.run.dprobs, n, [&](int64_t i) { return rows[i]; }, [&](int64_t i) { return get.dprobs(i); });
}

// One whole expert e: the single-expert sub-problem's weight grads are the run's slice e.
template <class Get>
void compare_expert(Outputs& o, const Problem& p, int64_t e, Get get) {
  const int64_t H = p.hidden, F = p.ffn;
  auto base = [](int64_t start) { return [start](int64_t i) { return start + i; }; };
  o.f32("dw1", o.run.dw1, 2 * F * H, base(e * 2 * F * H), [&](int64_t i) { return get.dw1(i); });
  o.f32("dw2", o.run.dw2, H * F, base(e * H * F), [&](int64_t i) { return get.dw2(i); });
  if (p.fc1_bias) o.f32("db1", o.run.db1, 2 * F, base(e * 2 * F), [&](int64_t i) { return get.db1(i); });
  if (p.fc2_bias) o.f32("db2", o.run.db2, H, base(e * H), [&](int64_t i) { return get.db2(i); });
}

// Element getters over a CPU-backend result or an fp64 result.
struct FromRun {
  const LayerResult& r;
  double y(int64_t i) const { return bf(r.y[i]); }
  double dx(int64_t i) const { return bf(r.dx[i]); }
  double dprobs(int64_t i) const { return r.dprobs[i]; }
  double dw1(int64_t i) const { return r.dw1[i]; }
  double dw2(int64_t i) const { return r.dw2[i]; }
  double db1(int64_t i) const { return r.db1[i]; }
  double db2(int64_t i) const { return r.db2[i]; }
};
struct FromRef {
  const cpu::RefLayerOutputs& r;
  double y(int64_t i) const { return r.y[i]; }
  double dx(int64_t i) const { return r.dx[i]; }
  double dprobs(int64_t i) const { return r.dprobs[i]; }
  double dw1(int64_t i) const { return r.dw1[i]; }
  double dw2(int64_t i) const { return r.dw2[i]; }
  double db1(int64_t i) const { return r.db1[i]; }
  double db2(int64_t i) const { return r.db2[i]; }
};

std::vector<int64_t> sample_rows(int64_t tokens, int64_t count, uint64_t seed) {
  std::vector<int64_t> rows;
  if (count >= tokens) {
    for (int64_t t = 0; t < tokens; ++t) rows.push_back(t);
    return rows;
  }
  std::mt19937_64 gen(seed * 7919 + 17);
  std::uniform_int_distribution<int64_t> pick(0, tokens - 1);
  while (static_cast<int64_t>(rows.size()) < count) {
    rows.push_back(pick(gen));
    if (static_cast<int64_t>(rows.size()) == count) {
      std::sort(rows.begin(), rows.end());
      rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    }
  }
  return rows;  // sorted, so the sampled tokens stay grouped by expert
}

// The smallest non-empty expert, and one more drawn from those no larger than twice the mean when
// such an expert is cheap enough: each whole-expert check runs the CPU backend and the fp64 reference
// over m_e*H*F (a mixtral expert is ~2e12 flops, a dsv3 one ~3e11).
std::vector<int64_t> sample_experts(const LayerData& d, uint64_t seed) {
  constexpr double kSecondExpertWork = 34359738368.0;  // m_e*H*F = 2^35
  const int64_t E = d.problem.experts;
  std::vector<int64_t> nonempty;
  for (int64_t e = 0; e < E; ++e)
    if (d.expert_size(e) > 0) nonempty.push_back(e);
  if (nonempty.empty()) return {};
  const int64_t smallest = *std::min_element(nonempty.begin(), nonempty.end(),
                                             [&](int64_t a, int64_t b) { return d.expert_size(a) < d.expert_size(b); });
  std::vector<int64_t> out = {smallest};
  std::vector<int64_t> affordable;
  for (int64_t e : nonempty)
    if (e != smallest && d.expert_size(e) * E <= 2 * d.tokens &&
        double(d.expert_size(e)) * double(d.problem.hidden) * double(d.problem.ffn) <= kSecondExpertWork)
      affordable.push_back(e);
  if (!affordable.empty()) out.push_back(affordable[std::mt19937_64(seed + 3)() % affordable.size()]);
  return out;
}

void dump(const std::string& dir_name, const RunConfig& cfg, const LayerData& d, const LayerResult& r) {
  OutputDir dir("--dump", dir_name);
  const Problem& p = d.problem;
  const int64_t T = d.tokens, H = p.hidden, F = p.ffn, E = p.experts;
  const nlohmann::ordered_json problem = {
      {"hidden", H},
      {"ffn", F},
      {"experts", E},
      {"tokens", T},
      {"activation", to_string(p.activation)},
      {"clamp_limit", p.clamp.limit},
      {"clamp_alpha", p.clamp.alpha},
      {"clamp_linear_offset", p.clamp.linear_offset},
      {"glu_layout", to_string(p.glu_layout)},
      {"fc1_bias", p.fc1_bias},
      {"fc2_bias", p.fc2_bias},
      {"scale_fc2_bias", p.scale_fc2_bias},
      {"recipe", to_string(p.recipe)},
      {"weight_layout", to_string(p.weight_layout)},
      {"preset", cfg.preset},
      {"seed", cfg.seed},
      {"skew", cfg.skew},
  };
  write_text_file("--dump", dir.file("problem.json"), problem.dump(2) + "\n");
  auto path = [&](const char* name) { return dir.file(std::string(name) + ".npy"); };
  auto f32 = [&](const char* name, const std::vector<float>& v, std::vector<int64_t> shape) {
    write_npy(path(name), v.data(), "<f4", 4, shape);
  };
  write_npy_bf16_as_f32(path("x"), d.x, {T, H});
  write_npy(path("offsets"), d.offsets.data(), "<i4", 4, {E + 1});
  f32("probs", d.probs, {T});
  write_npy_bf16_as_f32(path("w1"), *d.w1, {E, 2 * F, H});
  write_npy_bf16_as_f32(path("w2"), *d.w2, {E, H, F});
  if (p.fc1_bias) write_npy_bf16_as_f32(path("b1"), *d.b1, {E, 2 * F});
  if (p.fc2_bias) write_npy_bf16_as_f32(path("b2"), *d.b2, {E, H});
  write_npy_bf16_as_f32(path("dy"), d.dy, {T, H});
  write_npy_bf16_as_f32(path("y"), r.y, {T, H});
  write_npy_bf16_as_f32(path("dx"), r.dx, {T, H});
  f32("dprobs", r.dprobs, {T});
  f32("dw1", r.dw1, {E, 2 * F, H});
  f32("dw2", r.dw2, {E, H, F});
  if (p.fc1_bias) f32("db1", r.db1, {E, 2 * F});
  if (p.fc2_bias) f32("db2", r.db2, {E, H});
  dir.commit();
}

// Whether GPU 0 has a backend for every step of the problem's layer (its plan, made without running).
bool gpu_plans(const RunConfig& cfg) {
  try {
    detail::plan_layer(Context{}, cfg.problem, cfg.tokens, Device{DeviceType::cuda, 0}, /*prepared=*/false);
    return true;
  } catch (const Error&) {
    return false;
  }
}

bool sampled_checks(const RunConfig& c, int64_t check_rows) {
  return check_rows > 0 || double(c.tokens) * double(c.problem.hidden) * double(c.problem.ffn) > kLargeProblem;
}

// A run of the same problem that fits the memory there is (host, and GPU when dev > 0): the most
// tokens, or else the most experts at the given tokens (the weights alone did not fit); the
// estimate's terms decide, so a flag that lowers the need by a few MB is never the suggestion.
std::string what_fits(const RunConfig& cfg, bool gpu, int64_t check_rows, double host, double dev) {
  auto fits = [&](int64_t tokens, int64_t experts) {
    RunConfig c = cfg;
    c.tokens = tokens;
    c.problem.experts = experts;
    const MemoryEstimate m = estimate_run_memory(c, gpu, sampled_checks(c, check_rows), check_rows);
    return (host <= 0 || m.host <= host) && (dev <= 0 || m.device <= dev);
  };
  // The largest v in [lo, hi] with ok(v), given ok(lo) (ok is monotone: fewer fits when more does not).
  auto largest = [](int64_t lo, int64_t hi, auto ok) {
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (ok(mid)) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  };
  const int64_t T = cfg.tokens, E = cfg.problem.experts;
  if (T > 1 && fits(1, E)) {
    const int64_t t = largest(1, T, [&](int64_t v) { return fits(v, E); });
    return "--tokens " + std::to_string(t) + " (or fewer) fits with the other sizes unchanged";
  }
  if (E > 1 && fits(std::min<int64_t>(T, 1), 1)) {
    const int64_t keep_t = fits(T, 1) ? T : 1;
    const int64_t e = largest(1, E, [&](int64_t v) { return fits(keep_t, v); });
    return "--experts " + std::to_string(e) + (keep_t == T ? "" : " --tokens 1") + " (or fewer) fits";
  }
  return "even one expert of these --hidden/--ffn with one token does not fit; use smaller --hidden/--ffn";
}

// Seconds per token row of a CPU-backend layer run and of the fp64 reference, measured on a few rows
// of one expert, so that a terminal's progress lines can say about how long each phase takes (both
// scale with the rows; the per-expert weight work a full run adds is small beside it).
struct RowCost {
  double cpu_run = 0, reference = 0;
};
constexpr int64_t kCalibrationRows = 32;

RowCost measure_row_cost(const LayerData& data, uint64_t seed) {
  const std::vector<int64_t> experts = sample_experts(data, seed);
  if (experts.empty()) return {};
  const LayerData one = select_expert(data, experts.front());
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < std::min(one.tokens, kCalibrationRows); ++r) rows.push_back(r);
  const LayerData few = select_rows(one, rows);
  using Clock = std::chrono::steady_clock;
  RunSettings cpu;
  cpu.options.backend = "cpu";
  const auto t0 = Clock::now();
  run_layer(few, cpu);
  const auto t1 = Clock::now();
  reference(few, /*weight_grads=*/true);
  const auto t2 = Clock::now();
  const double n = double(few.tokens);
  return {std::chrono::duration<double>(t1 - t0).count() / n, std::chrono::duration<double>(t2 - t1).count() / n};
}

}  // namespace

int command_run(const CliOptions& o) {
  struct EndProgress {
    ~EndProgress() { progress_end(); }  // an error message then starts on a line of its own
  } end_progress;
  // fp8_blockwise with fp32 scales runs on the GPU where every GEMM of its plan takes them (cuda_sm90:
  // FP8 wgmma); elsewhere the GPU's GEMMs take power-of-two scales only, so without a --backend it
  // runs on the CPU (and says so).
  const bool fp8_on_cpu = o.recipe == Recipe::fp8_blockwise && !o.pow2_scales && o.backend.empty() &&
                          cuda_device_count() > 0 && !gpu_plans(resolve_config(o, /*gpu=*/true));
  const bool gpu = cuda_device_count() > 0 && o.backend != "cpu" && !fp8_on_cpu;
  const RunConfig cfg = resolve_config(o, gpu);
  const Problem& p = cfg.problem;
  const int64_t T = cfg.tokens, H = p.hidden, F = p.ffn, E = p.experts;
  const bool sampled = sampled_checks(cfg, o.check_rows);

  // Everything that can be refused is refused before the run: output paths, then memory.
  if (!o.json_path.empty()) check_output_file("--json", o.json_path);
  if (!o.dump_dir.empty()) check_output_dir("--dump", o.dump_dir);
  check_distinct_outputs(o.json_path, o.dump_dir);
  const MemoryEstimate need = estimate_run_memory(cfg, gpu, sampled, o.check_rows);
  const std::string sizes = "H=" + std::to_string(H) + " F=" + std::to_string(F) + " E=" + std::to_string(E) +
                            " T=" + std::to_string(T);
  const double host = available_host_memory(), dev = gpu ? available_device_memory(0) : 0;
  if (host > 0 && need.host > host)
    throw Error("memory", "this run (" + sizes + ") needs about " + bytes_text(need.host) +
                              " of host memory (estimate: inputs, outputs, the CPU check and the fp64 reference), " +
                              "but " + bytes_text(host) + " is available; " +
                              what_fits(cfg, gpu, o.check_rows, host, dev));
  if (dev > 0 && need.device > dev)
    throw Error("memory", "this run (" + sizes + ") needs about " + bytes_text(need.device) +
                              " of GPU memory (estimate: inputs, outputs and the library's workspaces), but " +
                              bytes_text(dev) + " is free on cuda:0; " + what_fits(cfg, gpu, o.check_rows, host, dev));

  progress("estimated peak memory: host " + bytes_text(need.host) +
           (gpu ? ", GPU " + bytes_text(need.device) : std::string()));

  progress("generating inputs");
  const LayerData data = make_layer_data(cfg);
  // Estimates only where someone watches, and only when the run is long beside the measurement.
  RowCost cost;
  if (progress_shown() && T > 4 * kCalibrationRows) {
    progress("measuring the CPU's speed on " + std::to_string(kCalibrationRows) + " rows");
    cost = measure_row_cost(data, cfg.seed);
  }
  auto cpu_seconds = [&](int64_t rows) { return cost.cpu_run * double(rows); };
  auto reference_seconds = [&](int64_t rows) { return cost.reference * double(rows); };

  RunSettings main_run;
  main_run.device = gpu ? Device{DeviceType::cuda, 0} : Device{};
  main_run.options.backend = o.backend;
  main_run.options.deny = o.deny;
  main_run.options.overrides = o.overrides;
  main_run.warmup = gpu;
  main_run.label = "run";
  if (!gpu) main_run.estimate_s = cpu_seconds(T);
  const LayerResult run = run_layer(data, main_run);

  RunReport rep;
  rep.config = cfg;
  rep.problem_text = describe(p);
  rep.min_tokens = T;
  for (int64_t e = 0; e < E; ++e) {
    rep.min_tokens = std::min<int64_t>(rep.min_tokens, data.expert_size(e));
    rep.max_tokens = std::max<int64_t>(rep.max_tokens, data.expert_size(e));
    rep.empty_experts += data.expert_size(e) == 0;
  }
  rep.device = gpu ? "cuda:0 (" + cuda_device_description(0) + ")" : "cpu";
  rep.weight_layout = to_string(p.weight_layout);
  rep.steps = run.steps;
  rep.forward_s = run.forward_s;
  rep.backward_s = run.backward_s;
  rep.saved_bytes = run.saved_bytes;

  RunSettings cpu_run;
  cpu_run.options.backend = "cpu";
  const double ref_tol = reference_tolerance(p);
  Outputs same{run, rep.checks, "same-points vs cpu", "", kSamePointsTolerance, p};
  Outputs ref{run, rep.checks, "fp64 reference", "", ref_tol, p};
  // On the CPU the full-size same-points check would compare the run with itself; with sampling it
  // still checks that the sub-problems reproduce the run's rows and experts (expected: exactly).
  const bool same_points = gpu || sampled;
  if (!same_points) rep.notes.push_back("the run is the CPU reference backend itself: no same-points check");
  if (fp8_on_cpu)
    rep.notes.push_back("fp8_blockwise with fp32 scales needs cuda_sm90 (a Hopper GPU) on the GPU; cuda_portable takes "
                        "power-of-two scales only (--pow2-scales): the run is on the CPU reference backend");
  if (p.recipe != Recipe::bf16 && p.activation == Activation::clamped_swiglu)
    rep.notes.push_back(
        std::string("clamped SwiGLU: a quantized value may cross the clamp limit and flip its mask, so the "
                    "fp64 bound is loose (0.25); ") +
        (same_points ? "the same-points check is the authoritative one"
                     : "the authoritative check is the same-points one, which needs a run on another backend "
                       "than the CPU reference (a GPU), so here the loose fp64 bound is the only check"));
  if (T == 0)
    rep.notes.push_back("T=0: y, dx and dprobs have no values to compare (PASS); the weight and bias gradients "
                        "of a layer that saw no token must be zeros");

  if (!sampled) {
    same.scope = ref.scope = "all";
    if (gpu) {
      cpu_run.label = "cpu check";
      cpu_run.estimate_s = cpu_seconds(T);
      const LayerResult c = run_layer(data, cpu_run);
      compare_all(same, data, FromRun{c});
    }
    progress("fp64 reference", reference_seconds(T));
    const cpu::RefLayerOutputs r = reference(data, /*weight_grads=*/true);
    compare_all(ref, data, FromRef{r});
  } else {
    const std::vector<int64_t> rows = sample_rows(T, o.check_rows > 0 ? o.check_rows : kDefaultCheckRows, cfg.seed);
    const LayerData sub = select_rows(data, rows);
    same.scope = ref.scope = std::to_string(rows.size()) + " sampled rows";
    rep.notes.push_back(std::string(o.check_rows > 0 ? "--check-rows" : "large problem") +
                        ": y, dx, dprobs checked on " + std::to_string(rows.size()) +
                        " sampled rows; weight and bias grads on whole sampled experts");
    if (same_points) {
      cpu_run.label = "cpu check (sampled rows)";
      cpu_run.estimate_s = cpu_seconds(sub.tokens);
      compare_rows(same, sub, rows, FromRun{run_layer(sub, cpu_run)});
    }
    progress("fp64 reference (sampled rows)", reference_seconds(sub.tokens));
    compare_rows(ref, sub, rows, FromRef{reference(sub, /*weight_grads=*/false)});
    for (int64_t e : sample_experts(data, cfg.seed)) {
      const LayerData one = select_expert(data, e);
      same.scope = ref.scope = "expert " + std::to_string(e) + " (" + std::to_string(one.tokens) + " rows)";
      if (same_points) {
        cpu_run.label = "cpu check (" + same.scope + ")";
        cpu_run.estimate_s = cpu_seconds(one.tokens);
        compare_expert(same, p, e, FromRun{run_layer(one, cpu_run)});
      }
      progress("fp64 reference (" + ref.scope + ")", reference_seconds(one.tokens));
      compare_expert(ref, p, e, FromRef{reference(one, /*weight_grads=*/true)});
    }
  }

  progress_end();
  print_report(rep, stdout);
  std::fflush(stdout);
  if (!o.json_path.empty()) write_report_json(rep, o.json_path);
  if (!o.dump_dir.empty()) {
    progress("dump");
    dump(o.dump_dir, cfg, data, run);
  }
  return rep.pass() ? kExitOk : kExitCheckFailed;
}

}  // namespace mxmoe::cli
