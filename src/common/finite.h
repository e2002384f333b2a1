// The result of the finiteness scan (Options::check_finite; backend step check_finite), host+device:
// the linear index of a non-finite value and which it is, packed so that the smallest code belongs
// to the smallest index (the GPU scan keeps the first with one atomicMin).
#pragma once
#include <cstdint>

#include "mxmoe/types.h"

namespace mxmoe {

inline constexpr uint64_t kAllFinite = ~uint64_t{0};  // no NaN or Inf found

enum class NonfiniteKind : uint8_t { nan = 0, pos_inf = 1, neg_inf = 2 };

// v must be NaN or +-Inf.
MXMOE_HD uint64_t nonfinite_code(uint64_t index, float v) {
  const NonfiniteKind k = v != v ? NonfiniteKind::nan : v > 0 ? NonfiniteKind::pos_inf : NonfiniteKind::neg_inf;
  return index << 2 | static_cast<uint64_t>(k);
}
MXMOE_HD uint64_t nonfinite_index(uint64_t code) { return code >> 2; }
MXMOE_HD NonfiniteKind nonfinite_kind(uint64_t code) { return static_cast<NonfiniteKind>(code & 3); }

}  // namespace mxmoe
