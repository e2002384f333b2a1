// The unfused permute_quantize_rows every backend inherits (backend.h): permute_rows, then quantize,
// on the backend's own steps. The CPU reference runs exactly this, so the fused kernels of other
// backends are checked against the composition the public API documents (include/mxmoe/permute.h).
#include <algorithm>

#include "src/dispatch/backend.h"

namespace mxmoe::detail {

void Backend::permute_quantize_rows(Context& ctx, const PermuteQuantizeStep& s) {
  const Device d = s.move.x.device;
  const int64_t R = s.rows, H = s.move.x.shape[1];
  PermuteByMapArgs move = s.move;
  Buffer scratch;
  if (move.permuted_x.data == nullptr) {
    scratch = allocate(d, R * H * 2, ctx.options().stream, ctx.options().allocator);
    move.permuted_x = TensorView::of(scratch.ptr, DType::bf16, {R, H}, d);
  }
  move.zero_unused_rows = false;  // the routing step zeroes permuted_x's unused rows when asked
  permute_rows(ctx, move);

  // Host offsets are read here: the kept rows 0 .. offsets[E]-1 are the quantizer's whole input.
  int64_t kept = R;
  if (d.type == DeviceType::cpu) kept = std::clamp<int64_t>(s.groups.data()[s.groups.experts()], 0, R);
  QuantizeArgs q;
  q.src = TensorView::of(move.permuted_x.data, DType::bf16, {kept, H}, d);
  q.groups = s.groups;
  q.rowwise = s.rowwise;
  q.colwise = s.colwise;
  quantize(ctx, q);
}

}  // namespace mxmoe::detail
