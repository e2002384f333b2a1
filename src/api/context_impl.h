#pragma once
#include <string>
#include <vector>

#include "mxmoe/context.h"

namespace mxmoe::detail {

struct ContextImpl {
  Options options;
  std::vector<StepRecord> report;
  void record(StepRecord r);
  void* stream() const { return options.stream; }
};

}  // namespace mxmoe::detail
