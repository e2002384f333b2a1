// cuda_sm100's probe decisions that need no GPU, so the CPU tests can check them
// (tests/sm100/test_sm100_probe.cpp): which devices it refuses before any kernel is tried, how the
// self-check's comparison against cuda_portable becomes a verdict with its numbers, and the
// per-device cache that runs the self-check once. The backend (backend.cpp) puts them together.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "src/cuda/common/device_facts.h"
#include "src/dispatch/backend.h"

namespace mxmoe::cuda::sm100 {

// The kernels are compiled for sm_100a, whose arch-specific instructions (tcgen05) load only on
// compute capability 10.0 devices.
inline constexpr int kComputeMajor = 10, kComputeMinor = 0;

// Why cuda_sm100 cannot run on a device with these facts, before any kernel is tried; empty when it
// may. build_problem: why this build has no sm100 kernels ("" when it has them).
inline std::string device_refusal(const DeviceFacts& f, const std::string& build_problem) {
  if (f.major == 0) return f.problem.empty() ? "no CUDA device" : f.problem;
  const std::string device = "device is " + f.cc() + " (" + f.name + ")";
  if (f.major != kComputeMajor) return device + ": cuda_sm100 needs compute capability 10.0";
  if (f.minor != kComputeMinor)
    return device + ": the cuda_sm100 kernels are compiled for sm_100a, which runs on compute capability 10.0 only";
  if (!build_problem.empty()) return build_problem;
  if (!f.ok) return f.problem;
  return "";
}

// The self-check's tolerance at one point: |got - want| <= kRelTol |want| + kAbsTol max|want| (over
// the output). Both backends multiply exact E4M3 products by the same E8M0 scales and accumulate in
// fp32, in different orders; bf16 outputs may round one ulp (2^-8) apart. A wrong scale is a power
// of two off, a wrong row or column a different sum: far outside.
inline constexpr double kRelTol = 1.0 / 128, kAbsTol = 1.0 / 1024;

// One output compared at the same points: how many points, how many failed, the largest difference.
struct Comparison {
  std::string what;  // which GEMM, e.g. "fprop (1-SM)"
  int64_t points = 0, bad = 0;
  double max_abs_diff = 0;  // infinity where a value is not finite
  int64_t worst = -1;       // index of the largest difference
  float got = 0, want = 0;  // cuda_sm100's and cuda_portable's value there
  std::string where;        // the worst point in the output's terms (row, column, group)
};

// Compares cuda_sm100's `got` with cuda_portable's `want` (same length); where(i) names point i.
inline Comparison compare_points(std::string what, const std::vector<float>& got, const std::vector<float>& want,
                                 const std::function<std::string(int64_t)>& where) {
  Comparison c;
  c.what = std::move(what);
  c.points = static_cast<int64_t>(want.size());
  double scale = 0;
  for (float w : want)
    if (std::isfinite(w)) scale = std::fmax(scale, std::fabs(static_cast<double>(w)));
  for (int64_t i = 0; i < c.points; ++i) {
    const double g = got[i], w = want[i];
    const bool finite = std::isfinite(g) && std::isfinite(w);
    const double diff = finite ? std::fabs(g - w) : INFINITY;
    if (!finite || diff > kRelTol * std::fabs(w) + kAbsTol * scale) ++c.bad;
    if (c.worst < 0 || diff > c.max_abs_diff) {
      c.max_abs_diff = diff;
      c.worst = i;
    }
  }
  if (c.worst >= 0) {
    c.got = got[c.worst];
    c.want = want[c.worst];
    c.where = where(c.worst);
  }
  return c;
}

inline std::string format_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// The self-check's verdict: available when every comparison passed, with the numbers either way
// (the reason `mxmoe info` and every dispatch report show).
inline detail::Probe self_check_verdict(const std::vector<Comparison>& results) {
  int64_t points = 0;
  double max_diff = 0;
  for (const Comparison& c : results) {
    points += c.points;
    max_diff = std::fmax(max_diff, c.max_abs_diff);
    if (c.bad > 0)
      return {false, "self-check against cuda_portable failed: " + c.what + ": " + std::to_string(c.bad) + " of " +
                         std::to_string(c.points) + " points differ, max abs diff " + format_number(c.max_abs_diff) +
                         " at " + c.where + " (cuda_sm100 " + format_number(c.got) + ", cuda_portable " +
                         format_number(c.want) + ")"};
  }
  if (points == 0) return {false, "self-check against cuda_portable compared nothing"};
  return {true, "self-check against cuda_portable passed (" + std::to_string(results.size()) + " GEMMs, " +
                    std::to_string(points) + " points, max abs diff " + format_number(max_diff) + ")"};
}

// One verdict per device index, computed by `run` the first time it is asked for; later calls from
// any thread get the same answer. `run` must not ask the cache again.
class VerdictCache {
 public:
  detail::Probe get(int device, const std::function<detail::Probe()>& run) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = verdicts_.find(device);
    if (it == verdicts_.end()) it = verdicts_.emplace(device, run()).first;
    return it->second;
  }

 private:
  std::mutex mu_;
  std::map<int, detail::Probe> verdicts_;
};

}  // namespace mxmoe::cuda::sm100
