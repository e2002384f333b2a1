// `mxmoe`: the command-line tool. `info` lists the library, GPUs and backends; `run` runs one layer
// forward + backward with timing and checks; `plan` prints what a run would do on a GPU, without
// one; `bench` times the steps on the GPU; `version` (and `--version`) prints the version.
#include <cstdio>
#include <exception>
#include <new>

#include "tools/mxmoe/cli.h"

namespace mxmoe::cli {
namespace {

void print_backends(const Context& ctx, Device d) {
  std::printf("backends for %s:\n", device_name(d).c_str());
  for (const BackendInfo& b : ctx.backends(d))
    std::printf("  %-16s %-11s %s\n", b.name.c_str(), b.available ? "available" : "unavailable", b.reason.c_str());
}

}  // namespace

int command_info(const CliOptions& o) {
  std::printf("mxmoe %s\n", version());
  std::printf("build: %s\n", build_options().c_str());
  const int gpus = cuda_device_count();
  std::printf("CUDA devices: %d\n", gpus);
  for (int i = 0; i < gpus; ++i) std::printf("  cuda:%d  %s\n", i, cuda_device_description(i).c_str());
  Options options;
  options.deny = o.deny;
  const Context ctx(options);
  print_backends(ctx, Device{DeviceType::cpu, 0});
  if (gpus > 0) print_backends(ctx, Device{DeviceType::cuda, 0});
  return kExitOk;
}

}  // namespace mxmoe::cli

int main(int argc, char** argv) {
  using namespace mxmoe::cli;
  CliOptions o;
  try {
    if (const std::optional<int> done = parse_args(argc, argv, o)) return *done;
    if (o.command == "info") return command_info(o);
    if (o.command == "bench") return command_bench(o);
    if (o.command == "plan") return command_plan(o);
    return command_run(o);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "mxmoe: %s\nrun 'mxmoe %s --help' for the flags\n", e.what(), o.command.c_str());
    return kExitUsage;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "mxmoe: error: out of memory (std::bad_alloc) beyond the run's estimate\n");
    return kExitError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mxmoe: error: %s\n", e.what());
    return kExitError;
  }
}
