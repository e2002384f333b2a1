// Host entry of the sm90 k-grouped GEMM (the weight gradients): D_e = A_e^T B_e over each expert's
// own tokens, both operands token-major (MN-major tiles through one tensor map each over all tokens).
// Group row ranges come from the device schedule; no host reads of the offsets, no stream sync.
#include <algorithm>
#include <string>

#include "src/common/fp8_block.h"
#include "src/cuda/common/check.h"
#include "src/cuda/cuda_ops.h"
#include "src/cuda/sm90/gemm_m_plan.h"
#include "src/cuda/sm90/launch.cuh"
#include "src/cuda/sm90/tensor_map.h"

namespace mxmoe::cuda::sm90 {
namespace {
constexpr int kWgradN = 256;
using Wgrad = KernelConfig<kWgradN, Major::mn, Major::mn, Grouping::k, Epi::wgrad, 2>;  // CTA pairs sharing B
// FP8 blockwise wgrad: FP8 wgmma on both token-block operands transposed to [M or N, Tp]
// (gemm_kernel.cuh Mx::blk, k-grouped), CTA pairs sharing B.
using BlkWgrad = KernelConfig<kBlkN, Major::k, Major::k, Grouping::k, Epi::wgrad, 2, Mx::blk>;
using SBlkWgrad = KernelConfig<kBlkN, Major::k, Major::k, Grouping::k, Epi::wgrad, 2, Mx::blk_staged>;  // staged scales
constexpr int64_t kStandIn = 256;  // bytes a tensor map over no tokens points at
}  // namespace

namespace {
const TensorView& view(const Operand& o) { return o.is_mxfp8() ? o.mx.data : o.bf16; }
}  // namespace

std::string gemm_k_refusal(const KGroupedGemmArgs& a) {
  if (a.a.is_fp8_block() != a.b.is_fp8_block()) return "one fp8_block operand and one of another format";
  if (a.a.is_mxfp8() != a.b.is_mxfp8()) return "one MXFP8 operand and one BF16 operand";
  if (a.a.is_fp8_block() && (a.a.mx.axis != BlockAxis::col || a.b.mx.axis != BlockAxis::col))
    return "fp8_block wgrad operands must be in token blocks (blocks along the tokens)";
  if (a.a.is_mxfp8() && (a.a.mx.axis != BlockAxis::col || a.b.mx.axis != BlockAxis::col))
    return "MXFP8 wgrad operands must be column-wise (blocks along the tokens)";
  const int64_t m = view(a.a).shape[1], n = view(a.b).shape[1];
  if (m % 8 != 0 || n % 8 != 0)
    return "M = " + std::to_string(m) + ", N = " + std::to_string(n) +
           ": both must be multiples of 8 (TMA rows must be 16-byte aligned)";
  if (!a.a.is_mxfp8() && (!tma_aligned(a.a.bf16.data) || !tma_aligned(a.b.bf16.data)))
    return "an operand's address is not 16-byte aligned (TMA)";
  return {};
}

namespace {
// The k-grouped kernels' shape and output fields: D_e [m, n] (fp32 with beta 0/1, or bf16) in tiles of
// 128 x bn.
void wgrad_params(const KGroupedGemmArgs& a, int64_t rows, int64_t m, int64_t n, int bn, KernelParams& p) {
  p.experts = static_cast<int32_t>(a.offsets.experts());
  p.rows = rows;
  p.m = m;
  p.n = n;
  p.m_tiles = static_cast<int32_t>((m + kBlockM - 1) / kBlockM);
  p.n_tiles = static_cast<int32_t>((n + bn - 1) / bn);
  const DType out_dt = a.d.per_expert() ? a.d.dtype : a.d.dense.dtype;
  p.d_f32 = out_dt == DType::f32;
  p.accumulate = a.accumulate && p.d_f32;
  p.d_experts = expert_ptrs(a.d, m * n, p.d_f32 ? 4 : 2);
}
}  // namespace

int64_t gemm_k_workspace_bytes(const KGroupedGemmArgs& a) {
  return group_schedule_bytes(a.offsets.experts(), a.a.bf16.shape[0], 0) + Workspace::aligned(kStandIn);
}

KPlan plan_gemm_k(const KGroupedGemmArgs& a, int bn, Workspace& ws, cudaStream_t stream) {
  const TensorView& av = a.a.bf16;
  const TensorView& bv = a.b.bf16;
  const int64_t rows = av.shape[0], m = av.shape[1], n = bv.shape[1], experts = a.offsets.experts();
  KPlan plan;
  KernelParams& p = plan.params;
  if (experts <= 0 || m == 0 || n == 0) return plan;
  wgrad_params(a, rows, m, n, bn, p);
  p.sched = build_group_schedule(a.offsets.data(), experts, rows, 0, ws, stream);
  // T = 0 has no tensor to map; every group is then empty and the kernel only writes zeros (or
  // nothing), so the maps point at a one-row stand-in that no TMA ever reads.
  char* stand_in = ws.take<char>(kStandIn);
  const bool empty = rows == 0;
  const uint64_t T = empty ? 1 : static_cast<uint64_t>(rows);
  plan.a = make_tensor_map_bf16("a", empty ? stand_in : av.data, {empty ? 64 : static_cast<uint64_t>(m), T},
                                {empty ? 128 : static_cast<uint64_t>(m) * 2}, {64, kBlockK});
  plan.b = make_tensor_map_bf16("b", empty ? stand_in : bv.data, {empty ? 64 : static_cast<uint64_t>(n), T},
                                {empty ? 128 : static_cast<uint64_t>(n) * 2}, {64, kBlockK});
  plan.launch_tiles = static_cast<int64_t>(experts) * p.m_tiles * p.n_tiles;
  return plan;
}

namespace {
void run_gemm_k(const KGroupedGemmArgs& a, cudaStream_t stream) {
  Workspace ws(gemm_k_workspace_bytes(a), stream);
  const KPlan plan = plan_gemm_k(a, kWgradN, ws, stream);
  launch<Wgrad>(plan.params, plan.launch_tiles, plan.a, plan.b, plan.b, stream);
}
}  // namespace

// MXFP8 operands (column-wise, blocks of 32 tokens restarting at each group): both are dequantized
// FP8 blockwise (the FP8 backward, on unless MXMOE_SM90_FP8_BLOCK=forward or dequant): both operands transposed
// into whole-block K-major copies (transpose_token_blocks), then the FP8-wgmma kernel with the
// per-block outer-product promotion acc = fma(partial, s_a(m) s_b(n), acc).
bool fp8_block_wgrad_takes(const KGroupedGemmArgs& a) {
  return fp8_backward_on() && a.a.is_fp8_block() && a.b.is_fp8_block() && gemm_k_refusal(a).empty();
}

namespace {
void run_gemm_k_blk(const KGroupedGemmArgs& a, cudaStream_t stream) {
  const TensorView &av = a.a.mx.data, &bv = a.b.mx.data;
  const int64_t rows = av.shape[0], m = av.shape[1], n = bv.shape[1], experts = a.offsets.experts();
  if (experts <= 0 || m == 0 || n == 0) return;
  const int64_t tp = std::max<int64_t>(128, fp8_token_block_tiles(a.offsets, rows) * kFp8Block);
  Workspace tmp(Workspace::aligned(m * tp) + Workspace::aligned(n * tp) + group_schedule_bytes(experts, rows, kFp8Block),
                stream);
  uint8_t* at = tmp.take<uint8_t>(m * tp);
  uint8_t* bt = tmp.take<uint8_t>(n * tp);
  transpose_token_blocks(a.a.mx, a.offsets, at, tp, stream);
  transpose_token_blocks(a.b.mx, a.offsets, bt, tp, stream);
  KernelParams p;
  wgrad_params(a, rows, m, n, kBlkN, p);
  p.sched = build_group_schedule(a.offsets.data(), experts, rows, kFp8Block, tmp, stream);  // tile_start per group
  p.a_sinv = static_cast<const float*>(a.a.mx.scales.data);
  p.a_sinv_pitch = m;
  p.b_sinv = static_cast<const float*>(a.b.mx.scales.data);
  p.b_sinv_pitch = n;
  const CUtensorMap ma = make_tensor_map_u8_sw128("a", at, {static_cast<uint64_t>(tp), static_cast<uint64_t>(m)},
                                                  {static_cast<uint64_t>(tp)}, {kFp8Block, kBlockM});
  const CUtensorMap mb = make_tensor_map_u8_sw128("b", bt, {static_cast<uint64_t>(tp), static_cast<uint64_t>(n)},
                                                  {static_cast<uint64_t>(tp)}, {kFp8Block, kBlkN / 2});
  const int64_t tiles = static_cast<int64_t>(experts) * p.m_tiles * p.n_tiles;
  switch (fp8_mainloop()) {
    case Fp8Mainloop::staged: launch<SBlkWgrad>(p, tiles, ma, mb, mb, stream); break;
    case Fp8Mainloop::l2: launch<BlkWgrad>(p, tiles, ma, mb, mb, stream); break;
  }
}
}  // namespace

// into transient BF16 copies [T, M] and [T, N] (the exact values), which the BF16 kernel reads
// through TMA; the copies are freed (stream-ordered) when the call returns.
void gemm_k(const KGroupedGemmArgs& a, void* stream_ptr) {
  const cudaStream_t stream = as_stream(stream_ptr);
  const std::string why = gemm_k_refusal(a);
  if (!why.empty()) throw Error("cuda_sm90", why);
  // FP8 blockwise: the FP8-wgmma kernel where opted in, else (power-of-two scales: the probe refuses
  // f32 ones) the BF16 kernel on the dequantized token blocks.
  if (a.a.is_fp8_block()) {
    if (fp8_block_wgrad_takes(a)) return run_gemm_k_blk(a, stream);
    return gemm_k_fp8_block(a, stream_ptr, &sm90::gemm_k);
  }
  if (!a.a.is_mxfp8()) return run_gemm_k(a, stream);
  const TensorView &av = a.a.mx.data, &bv = a.b.mx.data;
  const int64_t rows = av.shape[0], m = av.shape[1], n = bv.shape[1];
  Workspace tmp(Workspace::aligned(rows * m * 2) + Workspace::aligned(rows * n * 2), stream);
  KGroupedGemmArgs b = a;
  b.a = Operand{};
  b.b = Operand{};
  b.a.bf16 = TensorView::of(tmp.take<uint16_t>(rows * m), DType::bf16, {rows, m}, av.device);
  b.b.bf16 = TensorView::of(tmp.take<uint16_t>(rows * n), DType::bf16, {rows, n}, bv.device);
  if (rows > 0) {
    dequantize(DequantizeArgs{a.a.mx, a.offsets, b.a.bf16}, stream);
    dequantize(DequantizeArgs{a.b.mx, a.offsets, b.b.bf16}, stream);
  }
  run_gemm_k(b, stream);
}

}  // namespace mxmoe::cuda::sm90
