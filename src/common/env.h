// Whether environment variable `name` is set to `value`: the backends' opt-in switches, read per call
// (cuda_sm90's MXMOE_SM90_*, the weights' MXMOE_QDQ_CONVERT).
#pragma once
#include <cstdlib>
#include <cstring>

namespace mxmoe {

inline bool env_is(const char* name, const char* value) {
  const char* e = std::getenv(name);
  return e != nullptr && std::strcmp(e, value) == 0;
}

}  // namespace mxmoe
