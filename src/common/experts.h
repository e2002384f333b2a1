// Addressing of per-expert matrices, host+device: one dense [E, rows, cols] buffer or an array of E
// addresses. Kernels receive an ExpertPtrs by value and never branch on the layout elsewhere.
#pragma once
#include <cstdint>

#include "mxmoe/ops.h"

namespace mxmoe {

struct ExpertPtrs {
  const char* dense = nullptr;     // base of [E, rows, cols]
  const int64_t* table = nullptr;  // E addresses (per-expert layout)
  int64_t stride_bytes = 0;        // rows * cols * element size (dense layout)

  MXMOE_HD const void* get(int64_t e) const {
    return table ? reinterpret_cast<const void*>(table[e]) : static_cast<const void*>(dense + e * stride_bytes);
  }
  template <class T>
  MXMOE_HD T* at(int64_t e) const { return static_cast<T*>(const_cast<void*>(get(e))); }
};

// rows * cols elements of `elem_bytes` each per expert.
inline ExpertPtrs expert_ptrs(const ExpertMatrices& m, int64_t elem_count, int64_t elem_bytes) {
  ExpertPtrs p;
  if (m.per_expert()) {
    p.table = m.pointers.ptr<const int64_t>();
  } else {
    p.dense = static_cast<const char*>(m.dense.data);
    p.stride_bytes = elem_count * elem_bytes;
  }
  return p;
}

// Clamp a device-resident offset so that bad offsets cannot address outside [0, total].
MXMOE_HD int64_t clamp_offset(int64_t v, int64_t total) { return v < 0 ? 0 : (v > total ? total : v); }

}  // namespace mxmoe
