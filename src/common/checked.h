// Overflow-checked size arithmetic. Every element count and byte size the library derives from
// caller-given dimensions goes through these helpers; on overflow (or a negative dimension) they
// throw mxmoe::Error naming the argument the size belongs to, never wrap.
#pragma once
#include <cstdint>
#include <string>

#include "mxmoe/tensor.h"
#include "mxmoe/types.h"

namespace mxmoe::detail {

inline int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r))
    throw Error(what, "size " + std::to_string(a) + " * " + std::to_string(b) + " overflows int64");
  return r;
}

inline int64_t checked_add(int64_t a, int64_t b, const std::string& what) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r))
    throw Error(what, "size " + std::to_string(a) + " + " + std::to_string(b) + " overflows int64");
  return r;
}

inline int64_t checked_mul(std::initializer_list<int64_t> factors, const std::string& what) {
  int64_t r = 1;
  for (int64_t f : factors) r = checked_mul(r, f, what);
  return r;
}

// A dimension in [0, max]; `name` is the argument it came from, `dim` what it is ("T", "H", ...).
inline void check_dim(int64_t v, int64_t max, const std::string& name, const char* dim) {
  if (v < 0 || v > max)
    throw Error(name, std::string(dim) + "=" + std::to_string(v) + " must be in [0, " + std::to_string(max) + "]");
}

// Element count and byte size of a caller's view: every dimension >= 0, no overflow.
inline int64_t checked_numel(const TensorView& t, const std::string& name) {
  if (t.rank < 0 || t.rank > static_cast<int>(t.shape.size()))
    throw Error(name, "rank " + std::to_string(t.rank) + " must be in [1, " + std::to_string(t.shape.size()) +
                          "] (a TensorView holds at most " + std::to_string(t.shape.size()) + " dimensions)");
  int64_t n = 1;
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] < 0)
      throw Error(name, "dimension " + std::to_string(d) + " is negative (" + std::to_string(t.shape[d]) + ")");
    n = checked_mul(n, t.shape[d], name);
  }
  return n;
}
inline int64_t checked_bytes(const TensorView& t, const std::string& name) {
  return checked_mul(checked_numel(t, name), static_cast<int64_t>(dtype_size(t.dtype)), name);
}

}  // namespace mxmoe::detail
