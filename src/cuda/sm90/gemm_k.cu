// Host planner and runner of the sm90 k-grouped GEMM (the weight gradients): D_e = A_e^T B_e over
// each expert's own tokens, both operands token-major (MN-major tiles through one tensor map each
// over all tokens). Group row ranges come from the device schedule; no host reads of the offsets, no
// stream sync.
#include <algorithm>
#include <string>

#include "src/common/fp8_block.h"
#include "src/cuda/common/check.h"
#include "src/cuda/cuda_ops.h"
#include "src/cuda/sm90/gemm_m_plan.h"
#include "src/cuda/sm90/tensor_map.h"

namespace mxmoe::cuda::sm90 {
namespace {
constexpr int kWgradN = kWideN;
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

KLaunch make_launch(const KGroupedGemmArgs& a, int bn, Workspace& ws, cudaStream_t stream) {
  const TensorView& av = a.a.bf16;
  const TensorView& bv = a.b.bf16;
  const int64_t rows = av.shape[0], m = av.shape[1], n = bv.shape[1], experts = a.offsets.experts();
  KLaunch plan;
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
  plan.tiles = static_cast<int64_t>(experts) * p.m_tiles * p.n_tiles;
  return plan;
}

bool fp8_block_wgrad_takes(const KGroupedGemmArgs& a) {
  return a.a.is_fp8_block() && a.b.is_fp8_block() && gemm_k_refusal(a).empty();
}

// ---- The configurations, and the choice among them ----

namespace {

enum class Route : uint8_t {
  bf16,         // BF16 operands: the BF16 kernel
  mx_dequant,   // MXFP8 column-wise operands dequantized into bf16 copies [T, M], [T, N] first
  fp8_block,    // both operands transposed into whole 128-token blocks, K-major; FP8 wgmma with promotion
  fp8_dequant,  // fp8_blockwise with power-of-two scales: both dequantized (exact); the BF16 kernel
};

struct Config {
  const char* name;
  Route route;
};

constexpr Config kConfigs[] = {
    {"bf16_n256", Route::bf16},
    {"mxfp8_dequant_n256", Route::mx_dequant},
    {"fp8_block_n128", Route::fp8_block},
    {"fp8_dequant", Route::fp8_dequant},
};

const Config* find_config(const std::string& name) {
  for (const Config& c : kConfigs)
    if (name == c.name) return &c;
  return nullptr;
}

// One configuration per operand format: the choice has no measured alternative here.
const Config& choose(const KGroupedGemmArgs& a) {
  if (a.a.is_fp8_block()) return kConfigs[fp8_block_wgrad_takes(a) ? 2 : 3];
  return kConfigs[a.a.is_mxfp8() ? 1 : 0];
}

std::string config_refusal(const KGroupedGemmArgs& a, const Config& c, bool pow2_scales) {
  const bool fp8 = a.a.is_fp8_block(), mx = a.a.is_mxfp8() && !fp8;
  switch (c.route) {
    case Route::bf16: return a.a.is_mxfp8() ? "its operands are quantized; this configuration reads BF16" : "";
    case Route::mx_dequant: return mx ? "" : "this configuration reads MXFP8 operands";
    case Route::fp8_block: return fp8_block_wgrad_takes(a) ? "" : "the FP8-wgmma kernel does not take this step";
    case Route::fp8_dequant:
      if (!fp8) return "this configuration reads fp8_blockwise operands";
      return pow2_scales ? "" : "dequantizing is exact only with power-of-two scales (pow2_scales)";
  }
  return "unknown route";
}

int64_t token_block_columns(const KGroupedGemmArgs& a, int64_t rows) {
  return std::max<int64_t>(128, fp8_token_block_tiles(a.offsets, rows) * kFp8Block);
}

}  // namespace

detail::StepPlan plan_gemm_k(const KGroupedGemmArgs& a, bool pow2_scales, const std::string& override) {
  const Config* c = &choose(a);
  if (!override.empty()) {
    c = find_config(override);
    if (c == nullptr) {
      std::string known;
      for (const Config& k : kConfigs) known += (known.empty() ? "" : ", ") + std::string(k.name);
      throw Error("options.overrides", "cuda_sm90 has no k-grouped configuration '" + override + "' (known: " + known + ")");
    }
    if (std::string why = config_refusal(a, *c, pow2_scales); !why.empty())
      throw Error("options.overrides", std::string(c->name) + " cannot run this step: " + why);
  }
  detail::StepPlan p;
  p.config = c->name;
  const TensorView &av = view(a.a), &bv = view(a.b);
  const int64_t rows = av.shape[0], m = av.shape[1], n = bv.shape[1], experts = a.offsets.experts();
  const int64_t schedule = group_schedule_bytes(experts, rows, 0) + Workspace::aligned(kStandIn);
  switch (c->route) {
    case Route::bf16:
      p.launches = {{"group_schedule", ""}, {"gemm", "bf16 wgrad 128x256"}};
      p.workspace = schedule;
      break;
    case Route::mx_dequant:
      p.launches = {{"dequantize_a", ""}, {"dequantize_b", ""}, {"group_schedule", ""}, {"gemm", "bf16 wgrad 128x256"}};
      p.workspace = Workspace::aligned(rows * m * 2) + Workspace::aligned(rows * n * 2) + schedule;
      break;
    case Route::fp8_block: {
      const int64_t tp = token_block_columns(a, rows);
      p.launches = {{"transpose_a", ""}, {"transpose_b", ""}, {"group_schedule", ""}, {"gemm", "fp8_block wgrad 128x128"}};
      p.workspace = Workspace::aligned(m * tp) + Workspace::aligned(n * tp) + group_schedule_bytes(experts, rows, kFp8Block);
      break;
    }
    case Route::fp8_dequant:
      p.launches = {{"dequantize_a", ""}, {"dequantize_b", ""}, {"group_schedule", ""}, {"gemm", "bf16 wgrad 128x256"}};
      p.workspace = Workspace::aligned(rows * m * 2) + Workspace::aligned(rows * n * 2) + schedule;
      break;
  }
  return p;
}

// ---- Running a plan ----

namespace {
void run_bf16(const KGroupedGemmArgs& a, cudaStream_t stream) {
  Workspace ws(gemm_k_workspace_bytes(a), stream);
  const KLaunch l = make_launch(a, kWgradN, ws, stream);
  launch_gemm_k(/*fp8_block=*/false, l, stream);
}
void run_bf16_on(const KGroupedGemmArgs& a, void* stream) { run_bf16(a, as_stream(stream)); }

// Both operands transposed into whole-block K-major copies (transpose_token_blocks), then the
// FP8-wgmma kernel with the per-block outer-product promotion acc = fma(partial, s_a(m) s_b(n), acc).
void run_fp8_block(const KGroupedGemmArgs& a, cudaStream_t stream) {
  const TensorView &av = a.a.mx.data, &bv = a.b.mx.data;
  const int64_t rows = av.shape[0], m = av.shape[1], n = bv.shape[1], experts = a.offsets.experts();
  if (experts <= 0 || m == 0 || n == 0) return;
  const int64_t tp = token_block_columns(a, rows);
  Workspace tmp(Workspace::aligned(m * tp) + Workspace::aligned(n * tp) + group_schedule_bytes(experts, rows, kFp8Block),
                stream);
  uint8_t* at = tmp.take<uint8_t>(m * tp);
  uint8_t* bt = tmp.take<uint8_t>(n * tp);
  transpose_token_blocks(a.a.mx, a.offsets, at, tp, stream);
  transpose_token_blocks(a.b.mx, a.offsets, bt, tp, stream);
  KLaunch l;
  KernelParams& p = l.params;
  wgrad_params(a, rows, m, n, kBlkN, p);
  p.sched = build_group_schedule(a.offsets.data(), experts, rows, kFp8Block, tmp, stream);  // tile_start per group
  p.a_sinv = static_cast<const float*>(a.a.mx.scales.data);
  p.a_sinv_pitch = m;
  p.b_sinv = static_cast<const float*>(a.b.mx.scales.data);
  p.b_sinv_pitch = n;
  l.a = make_tensor_map_u8_sw128("a", at, {static_cast<uint64_t>(tp), static_cast<uint64_t>(m)},
                                 {static_cast<uint64_t>(tp)}, {kFp8Block, kBlockM});
  l.b = make_tensor_map_u8_sw128("b", bt, {static_cast<uint64_t>(tp), static_cast<uint64_t>(n)},
                                 {static_cast<uint64_t>(tp)}, {kFp8Block, kBlkN / 2});
  l.tiles = static_cast<int64_t>(experts) * p.m_tiles * p.n_tiles;
  launch_gemm_k(/*fp8_block=*/true, l, stream);
}

// MXFP8 operands (column-wise, blocks of 32 tokens restarting at each group): both are dequantized
// into transient BF16 copies [T, M] and [T, N] (the exact values), which the BF16 kernel reads
// through TMA; the copies are freed (stream-ordered) when the call returns.
void run_mx_dequant(const KGroupedGemmArgs& a, cudaStream_t stream) {
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
  run_bf16(b, stream);
}
}  // namespace

void gemm_k(const KGroupedGemmArgs& a, const detail::StepPlan& plan, void* stream_ptr) {
  const cudaStream_t stream = as_stream(stream_ptr);
  if (std::string why = gemm_k_refusal(a); !why.empty()) throw Error("cuda_sm90", why);
  const Config* c = find_config(plan.config);
  if (c == nullptr) throw Error("cuda_sm90", "internal: a plan with no sm90 configuration '" + plan.config + "'");
  switch (c->route) {
    case Route::bf16: return run_bf16(a, stream);
    case Route::mx_dequant: return run_mx_dequant(a, stream);
    case Route::fp8_block: return run_fp8_block(a, stream);
    case Route::fp8_dequant: return gemm_k_fp8_block(a, stream_ptr, &run_bf16_on);
  }
}

}  // namespace mxmoe::cuda::sm90
