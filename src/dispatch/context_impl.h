// What a Context holds: its options, the dispatch report, and (for `mxmoe plan`) the device it plans
// for. Dispatch reads the options and records each decision here; the public Context
// (src/api/context.cpp) hands both out.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "mxmoe/context.h"
#include "src/dispatch/device_facts.h"

namespace mxmoe::detail {

struct ContextImpl {
  Options options;
  std::vector<StepRecord> report;
  std::optional<DeviceFacts> target;  // set_planning_target: plan for this device
  bool dry_run = false;               // steps plan but never run (set_planning_target, plan_layer)
  PlanningMemory* memory = nullptr;   // a dry run's buffer accounting: each step's workspace on top
  // The planned peaks of the calls made through this context, by the call's shape (the memory
  // estimate's dry run is made once per shape, not once per call).
  std::map<std::string, int64_t> planned_peaks;
  void record(StepRecord r);          // repeated identical decisions are merged
  void* stream() const { return options.stream; }
};

}  // namespace mxmoe::detail
