// What a Context holds: its options, the dispatch report, and (for `mxmoe plan`) the device it plans
// for. Dispatch reads the options and records each decision here; the public Context
// (src/api/context.cpp) hands both out.
#pragma once
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
  void record(StepRecord r);          // repeated identical decisions are merged
  void* stream() const { return options.stream; }
};

}  // namespace mxmoe::detail
