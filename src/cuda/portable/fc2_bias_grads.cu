// Host entry of the portable FC2 bias gradients (cuda_ops.h):
//   db2_e = sum_{t in e} (scale_by_probs ? p_t : 1) * dY_t   (per 128-row tile partials, then a
//           fixed-order sum over the expert's tiles: deterministic)
//   dprob_add_t = dY_t . b2_{e(t)}                              (scale_by_probs only; one warp per row)
#include "src/cuda/common/check.h"
#include "src/cuda/cuda_ops.h"
#include "src/cuda/common/reductions.h"

namespace mxmoe::cuda::portable {

void fc2_bias_grads(const detail::Fc2BiasGradStep& s, void* stream_ptr) {
  constexpr int kBlockM = 128;
  const cudaStream_t stream = as_stream(stream_ptr);
  const int64_t rows = s.dy.shape[0], cols = s.dy.shape[1], experts = s.offsets.experts();
  if (experts <= 0) return;
  const bool want_db2 = s.db2.dst.data != nullptr;
  const bool want_dprob = s.scale_by_probs && s.dprob_add.data != nullptr && s.b2.data != nullptr;
  const int32_t tiles_bound = m_tiles_bound(rows, experts, kBlockM);
  const int64_t ws_floats = want_db2 ? static_cast<int64_t>(tiles_bound) * cols : 0;

  Workspace ws(group_schedule_bytes(experts, rows, kBlockM) + Workspace::aligned(ws_floats * 4), stream);
  const GroupSchedule sched = build_group_schedule(s.offsets.data(), experts, rows, kBlockM, ws, stream);
  float* partial = ws.take<float>(ws_floats);
  const uint16_t* dy = s.dy.ptr<const uint16_t>();

  if (want_db2) {
    launch_tile_column_sums(dy, cols, sched, s.scale_by_probs ? s.probs.ptr<const float>() : nullptr, partial,
                            stream);
    const GradDst dst{s.db2.dst.data, s.db2.dst.dtype == DType::f32, s.db2.accumulate};
    launch_reduce_expert_tiles(partial, cols, sched, dst, stream);
  }
  if (want_dprob)
    launch_row_bias_dot(dy, rows, cols, sched, s.b2.ptr<const uint16_t>(), s.dprob_add.ptr<float>(), stream);
}

}  // namespace mxmoe::cuda::portable
