// How much memory a `mxmoe run` needs at its peak, estimated from the sizes before anything is
// allocated, and how much the machine has: a run that cannot fit is refused up front with the
// estimate instead of failing with std::bad_alloc after minutes of work.
//
// The model follows run.cpp and layer_run.cpp phase by phase (bytes per element in brackets):
//   inputs    x, dy [2 each], probs [4], weights [2], biases [2]           (LayerData, host)
//   outputs   y, dx [2 each], dprobs [4], dW [4], db [4]                    (LayerResult, host)
//   a run     a device copy of the inputs and the outputs, plus the library's workspaces and saved
//             state: MXFP8 copies of X, dY, W1, W2 (row- and column-wise, 1 byte + scales), C and
//             the GLU output and its gradient (bf16 and MXFP8) [generous: 2.2 per weight, 6 per
//             activation, 16 per T*F]
//   fp64      every input and output the reference reads or writes in double, and its C, A, dC
// Phases: the main run; the CPU same-points check (a second run on the host); the fp64 reference;
// with sampled checks the same on the sampled rows (all experts' weights) and on whole experts.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "tools/mxmoe/cli.h"

#if defined(MXMOE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace mxmoe::cli {
namespace {

struct Sizes {
  double data = 0, result = 0, lib = 0, ref_with_grads = 0, ref_rows_only = 0;
  double bufs() const { return data + result; }  // the run's device copy of inputs and outputs
  double run() const { return bufs() + lib + result; }  // on the host: buffers, workspaces, result
};

// One layer call of `tokens` rows over `experts` experts of the problem's H, F.
Sizes sizes(const Problem& p, double tokens, double experts) {
  const double H = double(p.hidden), F = double(p.ffn), T = tokens, E = experts;
  const double A = T * H, W = E * 3 * F * H, I = T * F;
  const double B = (p.fc1_bias || p.fc2_bias) ? E * (2 * F + H) : 0;
  const bool mx = p.recipe != Recipe::bf16;
  Sizes s;
  s.data = 4 * A + 2 * W + 4 * T + 2 * B + 8 * (E + 1);
  s.result = 4 * A + 4 * W + 4 * T + 4 * B;
  s.lib = (mx ? 2.2 * W + 6 * A : 0.2 * W + 2 * A) + 16 * I + 64 * E + (64 << 20);
  const double ref_inputs = 8 * (2 * A + W + T + B);
  const double ref_rows = 16 * A + 8 * T + 40 * I;  // y, dx, dprobs, and C, A, dC
  s.ref_with_grads = ref_inputs + ref_rows + 8 * (W + B);
  s.ref_rows_only = ref_inputs + ref_rows;
  return s;
}

double read_number(const char* path) {
  std::ifstream f(path);
  double v = 0;
  std::string word;
  if (!(f >> word) || word == "max") return 0;
  std::istringstream(word) >> v;
  return v;
}

// A "key value" line of a stat file such as memory.stat.
double read_stat(const char* path, const std::string& want) {
  std::ifstream f(path);
  std::string key;
  double v = 0;
  while (f >> key >> v)
    if (key == want) return v;
  return 0;
}

}  // namespace

MemoryEstimate estimate_run_memory(const RunConfig& cfg, bool gpu, bool sampled, int64_t check_rows) {
  const Problem& p = cfg.problem;
  const double T = double(cfg.tokens), E = double(p.experts);
  const Sizes full = sizes(p, T, E);
  const double base = full.data + full.result;  // held for the whole run
  double peak = gpu ? base : base + full.bufs() + full.lib;  // the main run on the host itself
  if (!sampled) {
    if (gpu) peak = std::max(peak, base + full.run());  // the CPU same-points run
    peak = std::max(peak, base + full.ref_with_grads);
  } else {
    const double rows = std::min(T, double(check_rows > 0 ? check_rows : 256));
    const Sizes sub = sizes(p, rows, E);
    const double sub_inputs = 4 * rows * double(p.hidden) + 4 * rows;  // x, dy, probs; weights shared
    peak = std::max(peak, base + sub_inputs + sub.run());
    peak = std::max(peak, base + sub_inputs + sub.ref_rows_only);
    // Whole experts: at most twice the mean tokens (or the smallest expert, at most the mean).
    const Sizes one = sizes(p, std::min(T, 2 * T / E + 1), 1);
    peak = std::max(peak, base + one.data + std::max(one.run(), one.ref_with_grads));
  }
  // 10% and 64 MiB on top (allocator slack, the process itself): the model matches measured peaks
  // within a few percent where the fp64 reference dominates.
  auto margin = [](double b) { return 1.1 * b + double(64 << 20); };
  MemoryEstimate m;
  m.host = margin(peak);
  m.device = gpu ? margin(full.bufs() + full.lib) : 0;
  return m;
}

double available_host_memory() {
  double avail = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (meminfo >> key >> kib) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") {
      avail = kib * 1024;
      break;
    }
  }
  if (avail <= 0) avail = double(sysconf(_SC_AVPHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  // A container's cgroup limit (v2, then v1) may be lower than the machine's memory; its inactive
  // page cache can be reclaimed.
  const double limit_v2 = read_number("/sys/fs/cgroup/memory.max");
  if (limit_v2 > 0) {
    const double used = read_number("/sys/fs/cgroup/memory.current") -
                        read_stat("/sys/fs/cgroup/memory.stat", "inactive_file");
    avail = std::min(avail, std::max(0.0, limit_v2 - used));
  }
  const double limit_v1 = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
  if (limit_v1 > 0 && limit_v1 < 1e18)
    avail = std::min(avail, std::max(0.0, limit_v1 - read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes")));
  return avail;
}

double available_device_memory(int index) {
#if defined(MXMOE_WITH_CUDA)
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) return 0;
  size_t free_bytes = 0, total = 0;
  const bool ok = cudaSetDevice(index) == cudaSuccess && cudaMemGetInfo(&free_bytes, &total) == cudaSuccess;
  cudaSetDevice(previous);
  return ok ? double(free_bytes) : 0;
#else
  return 0;
#endif
}

std::string bytes_text(double b) {
  char buf[64];
  if (b >= double(int64_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(int64_t{1} << 30));
  else if (b >= double(int64_t{1} << 20))
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / double(int64_t{1} << 20));
  else
    std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

}  // namespace mxmoe::cli
