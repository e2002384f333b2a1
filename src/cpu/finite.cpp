// The finiteness scan of Options::check_finite on host data: the first NaN or +-Inf in order.
#include <cmath>

#include "mxmoe/numerics.h"
#include "src/common/experts.h"
#include "src/common/finite.h"
#include "src/cpu/cpu_ops.h"

namespace mxmoe::cpu {

uint64_t check_finite(const detail::CheckFiniteStep& s) {
  const bool bf16 = s.dtype == DType::bf16;
  const ExpertPtrs src = expert_ptrs(s.src, s.count, static_cast<int64_t>(dtype_size(s.dtype)));
  for (int64_t e = 0; e < s.experts; ++e) {
    const void* m = src.get(e);
    for (int64_t i = 0; i < s.count; ++i) {
      const float v = bf16 ? f32_from_bf16(static_cast<const uint16_t*>(m)[i]) : static_cast<const float*>(m)[i];
      if (!std::isfinite(v)) return nonfinite_code(static_cast<uint64_t>(e * s.count + i), v);
    }
  }
  return kAllFinite;
}

}  // namespace mxmoe::cpu
