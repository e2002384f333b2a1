// What the backends' probes know about the device a step's data is on: read once per device index
// from the driver, or named for planning (`mxmoe plan --arch`), where no device exists and nothing
// runs. Probing must be cheap: it runs for every step.
#pragma once
#include <string>

#include "mxmoe/context.h"

namespace mxmoe::detail {

struct DeviceFacts {
  Device device;
  bool ok = false;      // a device exists (or is planned) and this build's kernels load on it
  std::string problem;  // why not, when !ok
  int major = 0, minor = 0;
  std::string name;
  // Named for planning: a probe that would run something on the device (cuda_sm100's self-check)
  // assumes it passes, and says so in its reason.
  bool planned = false;
  std::string cc() const { return "sm_" + std::to_string(major) + std::to_string(minor); }
};

// The facts dispatch uses for data on `d` under `ctx`: the context's planning target where it has
// one (set_planning_target), else the host or the driver's facts of the CUDA device.
DeviceFacts facts_for(const Context& ctx, Device d);

// The driver's facts of CUDA device `index`, cached (src/cuda/common/device_facts.cpp; a build
// without CUDA says so).
const DeviceFacts& cuda_device_facts(int index);

// Makes every later dispatch decision of `ctx` plan for `arch` instead of the data's device:
// "cpu", "sm_80" (any GPU from sm_80 without a faster path), "sm_90a" (Hopper) or "sm_100a"
// (Blackwell). Steps then plan but never run (PlannedSteps::run returns at once), so a layer call
// can be made on views with no memory behind them (planning_allocator). An unknown name is an
// Error naming `arch` and the accepted names.
void set_planning_target(Context& ctx, const std::string& arch);
bool planning(const Context& ctx);
// An allocator that hands out distinct, 256-byte aligned addresses with no memory behind them and
// counts the bytes live and their peak: the layer's buffers during a planning call.
struct PlanningMemory {
  int64_t live = 0, peak = 0;
  uintptr_t next = uintptr_t{1} << 40;
};
Allocator planning_allocator(PlanningMemory& m);

}  // namespace mxmoe::detail
