// Host entry of the portable k-grouped GEMM (cuda_ops.h): D_e = A_e^T B_e over each expert's own
// rows. Builds the group schedule (row ranges and column-wise scale chunks) on the device, then one
// launch over (m-tile x n-tile, expert). No host reads of the offsets, no stream sync.
#include "src/cuda/common/check.h"
#include "src/cuda/cuda_ops.h"
#include "src/cuda/portable/launch.h"

namespace mxmoe::cuda::portable {
namespace {
const TensorView& operand_view(const Operand& a) { return a.mx.data.rank > 0 ? a.mx.data : a.bf16; }
}  // namespace

detail::StepPlan plan_gemm_k(const KGroupedGemmArgs& a) {
  detail::StepPlan p;
  p.config = "mma_sync";
  const bool fp8_block = a.a.mx.data.rank > 0 && a.a.mx.format == QuantFormat::fp8_block;
  const TensorView& av = operand_view(a.a);
  const TensorView& bv = operand_view(a.b);
  const int64_t rows = av.rank == 2 ? av.shape[0] : 0, experts = a.offsets.experts();
  if (fp8_block) {  // both operands dequantized (exact for power-of-two scales), then the BF16 kernel
    p.launches = {{"dequantize_a", ""}, {"dequantize_b", ""}};
    p.workspace = Workspace::aligned(av.numel() * 2) + Workspace::aligned(bv.numel() * 2);
  }
  p.launches.push_back({"group_schedule", ""});
  p.launches.push_back({"gemm", std::string(a.a.mx.data.rank > 0 && !fp8_block ? "mxfp8" : "bf16") + " mma.sync wgrad"});
  p.workspace += group_schedule_bytes(experts, rows, /*block_m=*/0);
  return p;
}

void gemm_k(const KGroupedGemmArgs& a, void* stream_ptr) {
  // FP8 blockwise: through these BF16 kernels (src/cuda/quant/fp8_block_gemm.cu).
  if (a.a.mx.data.rank > 0 && a.a.mx.format == QuantFormat::fp8_block)
    return gemm_k_fp8_block(a, stream_ptr, &portable::gemm_k);
  const cudaStream_t stream = as_stream(stream_ptr);
  const bool fp8 = a.a.mx.data.rank > 0;
  if (fp8 != (a.b.mx.data.rank > 0))
    throw Error("b", "cuda_portable needs A and B in the same format (both BF16 or both MXFP8)");
  const TensorView& av = operand_view(a.a);
  const TensorView& bv = operand_view(a.b);
  const int64_t rows = av.shape[0], m = av.shape[1], n = bv.shape[1], experts = a.offsets.experts();
  if (experts <= 0) return;

  KGemmParams p;
  p.m = m;
  p.n = n;
  p.m_tiles = static_cast<int32_t>((m + 127) / 128);
  p.n_tiles = static_cast<int32_t>((n + 127) / 128);
  p.a = static_cast<const uint8_t*>(av.data);
  p.b = static_cast<const uint8_t*>(bv.data);
  if (fp8) {
    p.a_scales = a.a.mx.scales.ptr<const uint8_t>();
    p.b_scales = a.b.mx.scales.ptr<const uint8_t>();
    p.a_layout = a.a.mx.layout;
    p.b_layout = a.b.mx.layout;
  }
  const DType out_dt = a.d.per_expert() ? a.d.dtype : a.d.dense.dtype;
  p.d_f32 = out_dt == DType::f32;
  p.accumulate = a.accumulate && p.d_f32;
  p.d = expert_ptrs(a.d, m * n, p.d_f32 ? 4 : 2);

  // Row ranges and scale chunks only: each CTA loops over its expert's rows (no m-tiles).
  Workspace ws(group_schedule_bytes(experts, rows, /*block_m=*/0), stream);
  p.groups = build_group_schedule(a.offsets.data(), experts, rows, /*block_m=*/0, ws, stream).groups;
  if (fp8) launch_gemm_k<true>(p, experts, stream);
  else launch_gemm_k<false>(p, experts, stream);
}

}  // namespace mxmoe::cuda::portable
