// Expert groups: tokens are sorted by expert; group e owns rows offsets[e] .. offsets[e+1]-1.
#pragma once
#include <cstdint>

#include "mxmoe/tensor.h"

namespace mxmoe {

// int32 offsets [E+1] on the data's device: offsets[0] = 0, monotone, offsets[E] = T.
// Any m_e = offsets[e+1]-offsets[e] >= 0 is valid, zero included; no padding.
// On the GPU the offsets are never read by the host during forward/backward (graph safety); the
// host validates them only where they live on the host. Kernels clamp every offset to [0, T] so
// that bad device offsets can produce wrong numbers but never an out-of-bounds access.
struct GroupOffsets {
  TensorView offsets;  // i32 [E+1]
  int64_t experts() const { return offsets.rank == 1 ? offsets.shape[0] - 1 : 0; }
  const int32_t* data() const { return offsets.ptr<const int32_t>(); }
};

}  // namespace mxmoe
