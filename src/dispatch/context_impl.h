// What a Context holds: its options and the dispatch report. Dispatch reads the options and
// records each decision here; the public Context (src/api/context.cpp) hands both out.
#pragma once
#include <string>
#include <vector>

#include "mxmoe/context.h"

namespace mxmoe::detail {

struct ContextImpl {
  Options options;
  std::vector<StepRecord> report;
  void record(StepRecord r);  // repeated identical decisions are merged
  void* stream() const { return options.stream; }
};

}  // namespace mxmoe::detail
