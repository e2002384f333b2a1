// Host planner and runner of the sm90 m-grouped GEMM (fprop and dgrad with their fused epilogues).
// plan_gemm_m() is the one place that decides how a step runs on this backend: the route (which
// operands are dequantized first, which kernel runs, whether the GLU outputs are quantized by the
// epilogue or after it), the tile width, the launches in order and the workspace they take, as a
// pure function of the step. gemm_m() runs a plan and decides nothing. The group schedule is built
// on the device: no host reads of the offsets, no stream sync (graph-capturable).
#include <cuda_runtime.h>

#include <string>

#include "src/common/fp8_block.h"
#include "src/cuda/common/check.h"
#include "src/cuda/common/reductions.h"
#include "src/cuda/cuda_ops.h"
#include "src/cuda/sm90/gemm_m_plan.h"
#include "src/cuda/sm90/tensor_map.h"

namespace mxmoe::cuda::sm90 {
namespace {

const TensorView& a_view(const detail::MGemmStep& s) { return s.gemm.a.is_mxfp8() ? s.gemm.a.mx.data : s.gemm.a.bf16; }
int64_t a_rows(const detail::MGemmStep& s) { return a_view(s).shape[0]; }

}  // namespace

namespace {
// What every sm90 m-grouped kernel needs of the shapes (16-byte TMA rows) and of the epilogue's
// outputs and B orientation (the layer's layouts).
std::string width_refusal(int64_t k, int64_t n) {
  if (k % 8 != 0) return "K = " + std::to_string(k) + " is not a multiple of 8 (TMA rows must be 16-byte aligned)";
  if (n % 8 != 0) return "N = " + std::to_string(n) + " is not a multiple of 8 (TMA rows must be 16-byte aligned)";
  return {};
}
std::string epilogue_refusal(const detail::MGemmStep& s, bool quantized_out) {
  const MGroupedGemmArgs& g = s.gemm;
  if (s.epilogue == detail::Epilogue::glu_forward && s.out_bf16.data == nullptr && !quantized_out)
    return "glu_forward without an output";
  if (s.epilogue == detail::Epilogue::glu_forward && g.b_kn)
    return "glu_forward with B_e as [K, N]: the sm90 kernel reads W1 as [2F, K] (the layer's layout)";
  if (s.epilogue == detail::Epilogue::glu_backward && !g.b_kn)
    return "glu_backward with B_e as [N, K]: the sm90 kernel reads W2 as [K, N] (the layer's layout)";
  if (s.epilogue == detail::Epilogue::store && g.d.data == nullptr) return "store epilogue without an output";
  return {};
}
}  // namespace

// FP8 blockwise (pow2 scales; the probe refuses fp32 ones): the step runs as the BF16 step on
// dequantized operands (src/cuda/quant/fp8_block_gemm.cu), in stream-ordered workspace that is 16-byte
// aligned, so only the shapes and the epilogue's orientation decide.
std::string fp8_block_refusal(const detail::MGemmStep& s) {
  const MGroupedGemmArgs& g = s.gemm;
  if (!g.b.is_fp8_block()) return "an fp8_block A needs fp8_block weights";
  if (g.b.data.per_expert() || g.b.scales.per_expert()) return "per-expert fp8_block weight pointers";
  if (const TensorView& t = g.b.transposed.dense; t.data != nullptr) {
    const TensorView& d = g.b.data.dense;
    const TensorView& ts = g.b.transposed_scales.dense;
    if (g.b.transposed.per_expert() || g.b.transposed_scales.per_expert() || t.dtype != DType::e4m3 || t.rank != 3 ||
        d.rank != 3 || t.shape[0] != d.shape[0] || t.shape[1] != d.shape[2] || t.shape[2] != d.shape[1])
      return "b.transposed must be a dense e4m3 tensor [E, cols, rows] of B's [E, rows, cols]";
    if (ts.data == nullptr || ts.dtype != DType::f32 || ts.numel() != d.shape[0] * fp8_weight_scale_count(d.shape[2], d.shape[1]))
      return "b.transposed_scales must be f32 [E, fp8_weight_scale_count(cols, rows)]";
    if (!tma_aligned(t.data)) return "b.transposed's address is not 16-byte aligned (TMA)";
  }
  const bool mx_out = s.out_row.data.data != nullptr || s.out_col.data.data != nullptr;
  if (mx_out && s.epilogue == detail::Epilogue::store) return "quantized outputs of the store epilogue";
  if (std::string why = width_refusal(g.a.mx.data.shape[1], detail::gemm_width(s)); !why.empty()) return why;
  return epilogue_refusal(s, mx_out);
}

std::string gemm_m_refusal(const detail::MGemmStep& s) {
  const MGroupedGemmArgs& g = s.gemm;
  if (g.a.is_fp8_block()) return fp8_block_refusal(s);
  if (g.b.is_fp8_block()) return "fp8_block weights with a BF16 A";
  if (g.a.is_mxfp8() != g.b.is_mxfp8()) return "one MXFP8 operand and one BF16 operand";
  if (g.a.is_mxfp8()) {
    if (g.a.mx.axis != BlockAxis::row) return "MXFP8 A must be row-wise (blocks along K)";
    const int64_t k = g.a.mx.data.shape[1];
    if (k % 32 != 0) return "MXFP8 K = " + std::to_string(k) + " is not a multiple of 32";
    if (!tma_aligned(g.a.mx.data.data)) return "MXFP8 A's address is not 16-byte aligned (TMA)";
    if (reinterpret_cast<uintptr_t>(g.a.mx.scales.data) % 2 != 0) return "MXFP8 A's scales are not 2-byte aligned";
    if (g.b.scales.per_expert()) return "per-expert MXFP8 weight scales: the sm90 path reads one [E, bytes] tensor";
    if (const TensorView& c = g.b.dequantized.dense; c.data != nullptr) {
      const TensorView& d = g.b.data.dense;
      if (g.b.dequantized.per_expert() || c.dtype != DType::bf16 || c.rank != 3 || c.shape != d.shape)
        return "b.dequantized must be a dense bf16 tensor of B's shape [E, rows, cols]";
      if (!tma_aligned(c.data)) return "b.dequantized's address is not 16-byte aligned (TMA)";
    }
    if (!tma_aligned(g.b.data.dense.data)) return "MXFP8 B's address is not 16-byte aligned (TMA)";
    const int64_t n = detail::gemm_width(s);
    if (g.b_kn && n % 16 != 0)
      return "MXFP8 B_e [K, N] with N = " + std::to_string(n) + " not a multiple of 16 (TMA rows of e4m3 bytes)";
    if (g.b_kn && g.b.layout == ScaleLayout::compact && reinterpret_cast<uintptr_t>(g.b.scales.dense.data) % 16 != 0)
      return "MXFP8 B's column-wise scales are not 16-byte aligned";
    if (!g.b_kn && reinterpret_cast<uintptr_t>(g.b.scales.dense.data) % 2 != 0)
      return "MXFP8 B's row-wise scales are not 2-byte aligned";
  }
  if (g.b.data.per_expert())
    return "per-expert weight pointers: the sm90 kernels read one dense [E, ...] weight tensor through TMA";
  const bool mx_out = s.out_row.data.data != nullptr || s.out_col.data.data != nullptr;
  if (mx_out && s.epilogue == detail::Epilogue::store) return "MXFP8 outputs of the store epilogue";
  if (std::string why = width_refusal(a_view(s).shape[1], detail::gemm_width(s)); !why.empty()) return why;
  if (!g.a.is_mxfp8() && (!tma_aligned(g.a.bf16.data) || !tma_aligned(g.b.data.dense.data)))
    return "an operand's address is not 16-byte aligned (TMA)";
  return epilogue_refusal(s, mx_out);
}

bool fp8_block_kernel_takes(const detail::MGemmStep& s) {
  const MGroupedGemmArgs& g = s.gemm;
  if (!g.a.is_fp8_block() || !fp8_block_refusal(s).empty()) return false;
  if (!g.b_kn && s.epilogue == detail::Epilogue::glu_backward) return false;
  const int64_t k = g.a.mx.data.shape[1];
  if (k % 16 != 0) return false;  // e4m3 rows: 16-byte TMA strides
  if (!tma_aligned(g.a.mx.data.data) || !tma_aligned(g.b.data.dense.data)) return false;
  // glu_halves: a tile's b rows (F + 64 n ..) lie in one 128-row scale block only when 64 | F.
  if (s.epilogue == detail::Epilogue::glu_forward && s.glu_layout == GluLayout::halves && s.ffn % 64 != 0) return false;
  return true;
}

namespace {
int32_t out_tiles(const detail::MGemmStep& s, int bn) {
  const bool glu_fwd = s.epilogue == detail::Epilogue::glu_forward;
  const int64_t out_cols = glu_fwd ? s.ffn : detail::gemm_width(s);  // features (glu_forward: BN/2 per tile) or columns
  const int64_t per_tile = glu_fwd ? bn / 2 : bn;
  return static_cast<int32_t>((out_cols + per_tile - 1) / per_tile);
}
int64_t dprob_floats(const detail::MGemmStep& s, int bn) {
  const bool want = s.epilogue == detail::Epilogue::glu_backward && s.dprobs.data != nullptr;
  return want ? static_cast<int64_t>(out_tiles(s, bn)) * a_rows(s) : 0;
}
int64_t db1_floats(const detail::MGemmStep& s) {
  const bool want = s.epilogue == detail::Epilogue::glu_backward && s.db1.dst.data != nullptr;
  const int64_t rows = a_rows(s), experts = s.gemm.offsets.experts();
  return want ? static_cast<int64_t>(m_tiles_bound(rows, experts, kBlockM)) * 2 * s.ffn : 0;
}
}  // namespace

int64_t gemm_m_workspace_bytes(const detail::MGemmStep& s, int bn) {
  const int64_t rows = a_rows(s), experts = s.gemm.offsets.experts();
  return group_schedule_bytes(experts, rows, kBlockM) + Workspace::aligned(dprob_floats(s, bn) * 4) +
         Workspace::aligned(db1_floats(s) * 4);
}

MLaunch make_launch(const detail::MGemmStep& s, int bn, Workspace& ws, cudaStream_t stream) {
  const MGroupedGemmArgs& g = s.gemm;
  const TensorView& av = a_view(s);
  const int64_t rows = av.shape[0], k = av.shape[1], experts = g.offsets.experts();
  const int64_t n = detail::gemm_width(s);
  const bool glu_fwd = s.epilogue == detail::Epilogue::glu_forward;
  const bool glu_bwd = s.epilogue == detail::Epilogue::glu_backward;

  const bool blk = g.a.is_fp8_block();  // FP8 wgmma, 128 values of K per stage (gemm_m_blk.cu)
  MLaunch plan;
  KernelParams& p = plan.params;
  p.experts = static_cast<int32_t>(experts);
  p.rows = rows;
  p.n = n;
  p.k_blocks = static_cast<int32_t>(blk ? (k + kFp8Block - 1) / kFp8Block : (k + kBlockK - 1) / kBlockK);
  p.ffn = s.ffn;
  p.glu = s.glu;
  p.glu_layout = s.glu_layout;
  p.probs = s.probs.ptr<const float>();
  p.bias = g.bias.ptr<const uint16_t>();
  p.bias_by_probs = s.bias_scale_by_probs;
  p.d = g.d.data;
  p.d_f32 = g.d.dtype == DType::f32;
  p.n_tiles = out_tiles(s, bn);
  if (glu_fwd) p.c_out = s.c.ptr<uint16_t>();
  if (glu_bwd) p.c_in = s.c.ptr<const uint16_t>();
  if (s.epilogue != detail::Epilogue::store) p.out_bf16 = s.out_bf16.ptr<uint16_t>();
  if (experts <= 0) return plan;

  p.sched = build_group_schedule(g.offsets.data(), experts, rows, kBlockM, ws, stream);
  if (const int64_t nd = dprob_floats(s, bn); nd > 0) {
    p.ws_dprob = ws.take<float>(nd);
    // Rows outside every group (only with bad offsets) then still read defined zeros.
    MXMOE_CUDA_CHECK(cudaMemsetAsync(p.ws_dprob, 0, static_cast<size_t>(nd) * 4, stream));
  }
  if (const int64_t nb = db1_floats(s); nb > 0) p.ws_db1 = ws.take<float>(nb);
  if (rows == 0) return plan;

  const uint64_t K = static_cast<uint64_t>(k), E = static_cast<uint64_t>(experts);
  const void* w = g.b.data.dense.data;
  if (blk) {
    // A: [128 rows][128 bytes] boxes, 128-byte swizzle; B: two [BN/2][128]-byte halves (the a and b
    // rows of W1 for glu_forward, as the BF16 maps load them), f32 scales read by the consumers.
    const uint32_t half = static_cast<uint32_t>(bn / 2);
    const TensorView& bd = g.b.data.dense;
    plan.a = make_tensor_map_u8_sw128("gemm.a", av.data, {K, static_cast<uint64_t>(rows)}, {K}, {kFp8Block, kBlockM});
    p.a_sinv = static_cast<const float*>(g.a.mx.scales.data);
    p.a_sinv_pitch = fp8_rowwise_pitch(rows);
    p.b_sinv = static_cast<const float*>(g.b.scales.dense.data);
    p.b_nbs = static_cast<int32_t>(ceil_div(bd.shape[1], kFp8Block));
    p.b_kbs = static_cast<int32_t>(ceil_div(bd.shape[2], kFp8Block));
    plan.tiles = static_cast<int64_t>(m_tiles_bound(rows, experts, kBlockM)) * p.n_tiles;
    const char* lin = static_cast<const char*>(w);
    if (glu_fwd && s.glu_layout == GluLayout::halves) {
      const uint64_t F = static_cast<uint64_t>(s.ffn);
      p.b_load = BLoad::glu_halves;
      plan.b0 = make_tensor_map_u8_sw128("gemm.b", w, {K, F, E}, {K, 2 * F * K}, {kFp8Block, half, 1});
      plan.b1 = make_tensor_map_u8_sw128("gemm.b", lin + F * K, {K, F, E}, {K, 2 * F * K}, {kFp8Block, half, 1});
    } else if (glu_fwd) {
      const uint64_t F = static_cast<uint64_t>(s.ffn), I = kGluInterleave;
      p.b_load = BLoad::glu_interleave32;
      const uint32_t chunks = half / kGluInterleave;
      plan.b0 = make_tensor_map_u8_sw128("gemm.b", w, {K, I, F / I, E}, {K, 2 * I * K, 2 * F * K},
                                         {kFp8Block, static_cast<uint32_t>(I), chunks, 1});
      plan.b1 = make_tensor_map_u8_sw128("gemm.b", lin + I * K, {K, I, F / I, E}, {K, 2 * I * K, 2 * F * K},
                                         {kFp8Block, static_cast<uint32_t>(I), chunks, 1});
    } else {
      const uint64_t N = static_cast<uint64_t>(n);
      p.b_load = BLoad::k_rows;
      plan.b0 = make_tensor_map_u8_sw128("gemm.b", w, {K, N, E}, {K, N * K}, {kFp8Block, half, 1});
      plan.b1 = plan.b0;
    }
    return plan;
  }
  if (g.a.is_mxfp8()) {
    plan.a = make_tensor_map_u8("gemm.a", av.data, {K, static_cast<uint64_t>(rows)}, {K}, {kBlockK, kBlockM}, true);
    p.a_scales = static_cast<const uint8_t*>(g.a.mx.scales.data);
    p.a_scale_cols = static_cast<int32_t>(rowwise_scale_cols(k));
    p.a_k32 = static_cast<int32_t>(k / 32);
    p.a_scale_swizzled = g.a.mx.layout == ScaleLayout::swizzled;
  } else {
    plan.a = make_tensor_map_bf16("gemm.a", av.data, {K, static_cast<uint64_t>(rows)}, {K * 2}, {kBlockK, kBlockM});
  }
  // Upper bound of the tiles (pairs, for clusters of 2); the real count is read on the device.
  plan.tiles = static_cast<int64_t>(m_tiles_bound(rows, experts, kBlockM)) * p.n_tiles;
  const uint32_t half = static_cast<uint32_t>(bn / 2);  // B is loaded in two halves (pairs share them)
  if (glu_fwd) {
    const uint64_t F = static_cast<uint64_t>(s.ffn);
    const char* lin = static_cast<const char*>(w);
    if (s.glu_layout == GluLayout::halves) {
      p.b_load = BLoad::glu_halves;
      plan.b0 = make_tensor_map_bf16("gemm.b", w, {K, F, E}, {K * 2, 2 * F * K * 2}, {kBlockK, half, 1});
      plan.b1 = make_tensor_map_bf16("gemm.b", lin + F * K * 2, {K, F, E}, {K * 2, 2 * F * K * 2}, {kBlockK, half, 1});
    } else {
      p.b_load = BLoad::glu_interleave32;
      const uint64_t I = kGluInterleave;
      const uint32_t chunks = half / kGluInterleave;
      plan.b0 = make_tensor_map_bf16("gemm.b", w, {K, I, F / I, E}, {K * 2, 2 * I * K * 2, 2 * F * K * 2},
                                     {kBlockK, static_cast<uint32_t>(I), chunks, 1});
      plan.b1 = make_tensor_map_bf16("gemm.b", lin + I * K * 2, {K, I, F / I, E},
                                     {K * 2, 2 * I * K * 2, 2 * F * K * 2},
                                     {kBlockK, static_cast<uint32_t>(I), chunks, 1});
    }
  } else if (g.b_kn) {
    p.b_load = BLoad::mn_boxes;
    const uint64_t N = static_cast<uint64_t>(n);
    plan.b0 = make_tensor_map_bf16("gemm.b", w, {N, K, E}, {N * 2, K * N * 2}, {64, kBlockK, 1});
    plan.b1 = plan.b0;
  } else {
    p.b_load = BLoad::k_rows;
    const uint64_t N = static_cast<uint64_t>(n);
    plan.b0 = make_tensor_map_bf16("gemm.b", w, {K, N, E}, {K * 2, N * K * 2}, {kBlockK, half, 1});
    plan.b1 = plan.b0;
  }
  return plan;
}

void finish_gemm_m(const detail::MGemmStep& s, const MLaunch& plan, cudaStream_t stream) {
  const KernelParams& p = plan.params;
  if (p.ws_dprob != nullptr)
    launch_reduce_dprob(p.ws_dprob, p.n_tiles, p.rows, s.dprob_add.ptr<const float>(), s.dprobs.ptr<float>(), stream);
  if (p.ws_db1 != nullptr) {
    const GradDst dst{s.db1.dst.data, s.db1.dst.dtype == DType::f32, s.db1.accumulate};
    launch_reduce_expert_tiles(p.ws_db1, 2 * s.ffn, p.sched, dst, stream);
  }
}

// The mx_a GLU kernels quantize A / dC in their epilogue (MXFP8 row- and column-wise from the
// staged bf16 tile, src/cuda/common/mx_tile_quant.cuh) where the outputs are MXFP8, F is a multiple
// of 32 and the data 16-byte aligned; otherwise the kernel writes bf16 and the quantizer reads it.
bool fused_quantizing_epilogue(const detail::MGemmStep& s) {
  if (s.epilogue == detail::Epilogue::store || !s.gemm.a.is_mxfp8() || !has_quantized_outputs(s)) return false;
  for (const Mxfp8View* v : {&s.out_row, &s.out_col})
    if (v->data.data != nullptr && (v->format != QuantFormat::mxfp8 || !tma_aligned(v->data.data))) return false;
  return s.ffn % kMxBlock == 0;
}

// ---- The configurations, and the choice among them ----

namespace {

enum class Route : uint8_t {
  bf16,         // BF16 A and B: the BF16 kernel
  mx_regs,      // MXFP8 A converted to BF16 in registers (the mx_a kernel); B the weights' bf16 copy
  mx_dequant,   // MXFP8 A dequantized into a bf16 copy first; the BF16 kernel
  fp8_block,    // FP8 wgmma with promotion per 128 values of K (dgrad: on B transposed)
  fp8_dequant,  // fp8_blockwise with power-of-two scales: both operands dequantized (exact); the BF16 kernel
};

struct Config {
  const char* name;
  Route route;
  int block_n;  // output columns per tile (fp8_dequant: the BF16 default's)
};

// Every configuration a step can be run in here: what Options::overrides may name.
constexpr Config kConfigs[] = {
    {"bf16_n256", Route::bf16, kWideN},
    {"bf16_n128", Route::bf16, kNarrowN},
    {"mxfp8_regs_n256", Route::mx_regs, kWideN},
    {"mxfp8_regs_n128", Route::mx_regs, kNarrowN},
    {"mxfp8_dequant_n256", Route::mx_dequant, kWideN},
    {"mxfp8_dequant_n128", Route::mx_dequant, kNarrowN},
    {"fp8_block_n128", Route::fp8_block, kBlkN},
    {"fp8_dequant", Route::fp8_dequant, 0},
};

const Config* find_config(const std::string& name) {
  for (const Config& c : kConfigs)
    if (name == c.name) return &c;
  return nullptr;
}

std::string config_names() {
  std::string s;
  for (const Config& c : kConfigs) s += (s.empty() ? "" : ", ") + std::string(c.name);
  return s;
}

const Config& named(const char* name) { return *find_config(name); }

// The MXFP8 FC2 dgrad (GLU backward) dequantizes its A first from this K on
// (docs/kernels/sm90_mxfp8.md "FC2 dgrad"): the register conversion of every A fragment costs a
// long mainloop more than one dequantizing pass over dY.
constexpr int64_t kMxDequantMinK = 4096;

// The width of the BF16 tiles: 256 columns except for outputs of at most 128.
bool wide_output(const detail::MGemmStep& s) {
  return s.epilogue == detail::Epilogue::glu_forward || detail::gemm_width(s) > kNarrowN;
}

// The measured winners (docs/kernels/sm90_gemm.md "The plan's choices").
const Config& choose(const detail::MGemmStep& s) {
  const MGroupedGemmArgs& g = s.gemm;
  if (g.a.is_fp8_block()) return named(fp8_block_kernel_takes(s) ? "fp8_block_n128" : "fp8_dequant");
  const bool wide = wide_output(s);
  if (!g.a.is_mxfp8()) return named(wide ? "bf16_n256" : "bf16_n128");
  if (s.epilogue == detail::Epilogue::glu_backward) {
    if (a_view(s).shape[1] >= kMxDequantMinK) return named(wide ? "mxfp8_dequant_n256" : "mxfp8_dequant_n128");
    return named("mxfp8_regs_n128");
  }
  return named(wide ? "mxfp8_regs_n256" : "mxfp8_regs_n128");
}

// Why configuration c cannot run step s (empty: it can).
std::string config_refusal(const detail::MGemmStep& s, const Config& c, bool pow2_scales) {
  const MGroupedGemmArgs& g = s.gemm;
  const bool fp8 = g.a.is_fp8_block(), mx = g.a.is_mxfp8() && !fp8;
  if (s.epilogue == detail::Epilogue::glu_forward && c.block_n == kNarrowN)
    return "the GLU forward runs 256-wide tiles only (the a and b halves of 128 features)";
  switch (c.route) {
    case Route::bf16:
      return g.a.is_mxfp8() ? "its A is quantized; this configuration reads BF16 operands" : "";
    case Route::mx_regs:
    case Route::mx_dequant:
      return mx ? "" : "this configuration reads an MXFP8 A";
    case Route::fp8_block:
      return fp8_block_kernel_takes(s) ? "" : "the FP8-wgmma kernel does not take this step (operands, shape or alignment)";
    case Route::fp8_dequant:
      if (!fp8) return "this configuration reads fp8_blockwise operands";
      return pow2_scales ? "" : "dequantizing is exact only with power-of-two scales (pow2_scales)";
  }
  return "unknown route";
}

bool b_copy_given(const detail::MGemmStep& s) { return s.b_copy_only || s.gemm.b.dequantized.dense.data != nullptr; }
int64_t b_elems(const detail::MGemmStep& s) {
  const TensorView& b = s.gemm.b.data.dense;
  return b.rank == 3 ? b.shape[0] * b.shape[1] * b.shape[2] : 0;
}

}  // namespace


namespace {
detail::Epilogue epilogue_of(const detail::MGemmStep& s) { return s.epilogue; }
const char* epilogue_name(detail::Epilogue e) {
  switch (e) {
    case detail::Epilogue::store: return "store";
    case detail::Epilogue::glu_forward: return "glu_forward";
    case detail::Epilogue::glu_backward: return "glu_backward";
  }
  return "?";
}

// The kernel launch of a route and what follows it: the fixed-order dprob and db1 reductions.
void add_kernel(detail::StepPlan& p, const detail::MGemmStep& s, const char* kernel, int bn) {
  p.launches.push_back({"group_schedule", ""});
  p.launches.push_back({"gemm", std::string(kernel) + " " + epilogue_name(epilogue_of(s)) + " 128x" + std::to_string(bn)});
  p.workspace += gemm_m_workspace_bytes(s, bn);
  if (dprob_floats(s, bn) > 0) p.launches.push_back({"reduce_dprob", ""});
  if (db1_floats(s) > 0) p.launches.push_back({"reduce_db1", ""});
}
}  // namespace

detail::StepPlan plan_gemm_m(const detail::MGemmStep& s, bool pow2_scales, const std::string& override) {
  const Config* c = &choose(s);
  if (!override.empty()) {
    c = find_config(override);
    if (c == nullptr) throw Error("options.overrides", "cuda_sm90 has no m-grouped configuration '" + override +
                                                           "' (known: " + config_names() + ")");
    if (std::string why = config_refusal(s, *c, pow2_scales); !why.empty())
      throw Error("options.overrides", std::string(c->name) + " cannot run this step: " + why);
  }
  detail::StepPlan p;
  p.config = c->name;
  const MGroupedGemmArgs& g = s.gemm;
  const bool quantized_out = has_quantized_outputs(s);
  const int64_t T = a_rows(s), K = a_view(s).shape[1];
  switch (c->route) {
    case Route::bf16:
      p.weights = detail::WeightForm::given;
      add_kernel(p, s, "bf16", c->block_n);
      break;
    case Route::mx_regs:
    case Route::mx_dequant: {
      const bool copy = b_copy_given(s);
      p.weights = copy ? detail::WeightForm::bf16_copy : detail::WeightForm::quantized;
      if (c->route == Route::mx_dequant) {
        p.launches.push_back({"dequantize_a", ""});
        p.workspace += Workspace::aligned(T * K * 2);
      }
      if (!copy) {
        p.launches.push_back({"dequantize_b", ""});
        p.workspace += Workspace::aligned(b_elems(s) * 2);
      }
      if (c->route == Route::mx_regs && fused_quantizing_epilogue(s)) {
        p.launches.push_back({"clear_out_scales", ""});
        add_kernel(p, s, "mxfp8_regs+quantize", c->block_n);
        return p;
      }
      add_kernel(p, s, c->route == Route::mx_regs ? "mxfp8_regs" : "bf16", c->block_n);
      break;
    }
    case Route::fp8_block:
      p.weights = !g.b_kn ? detail::WeightForm::quantized
                  : g.b.transposed.dense.data != nullptr ? detail::WeightForm::transposed
                                                         : detail::WeightForm::quantized;
      if (g.b_kn && g.b.transposed.dense.data == nullptr) {
        p.launches.push_back({"transpose_b", ""});
        const TensorView& bd = g.b.data.dense;
        p.workspace += Workspace::aligned(b_elems(s)) +
                       Workspace::aligned(bd.shape[0] * ceil_div(bd.shape[1], kFp8Block) * ceil_div(bd.shape[2], kFp8Block) * 4);
      }
      add_kernel(p, s, "fp8_block", kBlkN);
      break;
    case Route::fp8_dequant: {
      const bool copy = g.b.dequantized.dense.data != nullptr;
      p.weights = detail::WeightForm::quantized;
      p.launches.push_back({"dequantize_a", ""});
      p.workspace += Workspace::aligned(T * K * 2);
      if (!copy) {
        p.launches.push_back({"dequantize_b", ""});
        p.workspace += Workspace::aligned(b_elems(s) * 2);
      }
      add_kernel(p, s, "bf16", wide_output(s) ? kWideN : kNarrowN);
      break;
    }
  }
  if (quantized_out) {
    p.launches.push_back({"quantize_out", ""});
    p.workspace += staged_output_bytes(s);
  }
  return p;
}


// ---- Running a plan ----

Epi kernel_epi(const detail::MGemmStep& s) {
  switch (s.epilogue) {
    case detail::Epilogue::store: return Epi::store;
    case detail::Epilogue::glu_forward: return Epi::glu_forward;
    case detail::Epilogue::glu_backward: return Epi::glu_backward;
  }
  return Epi::store;
}

namespace {

// One kernel over step s (every operand in the kernel's formats): schedule, launch, reductions.
// mx: the MXFP8 outputs the mx_a GLU epilogues quantize themselves.
void run_kernel(const detail::MGemmStep& s, Mainloop kernel, int bn, cudaStream_t stream, const MxOut& mx = {}) {
  Workspace ws(gemm_m_workspace_bytes(s, bn), stream);
  MLaunch l = make_launch(s, bn, ws, stream);
  l.params.out_mx = mx;
  launch_gemm_m(kernel, kernel_epi(s), s.gemm.b_kn, bn, l, stream);
  finish_gemm_m(s, l, stream);
}

// The BF16 route at its default width: the fp8_dequant route's inner GEMM.
void run_bf16_default(const detail::MGemmStep& s, void* stream) {
  run_kernel(s, Mainloop::bf16, wide_output(s) ? kWideN : kNarrowN, as_stream(stream));
}

// An fp8_blockwise step on the FP8-wgmma kernel; an FP8 output of glu_forward (A row-wise and in
// token blocks) is written in bf16 (the step's, or a transient one) and quantized from there
// (docs/numerics.md "Quantized value").
void run_fp8_block(const detail::MGemmStep& s0, cudaStream_t stream) {
  // A dgrad: B_e [K, N] as stored -> [N, K] (K-major, what FP8 wgmma reads) with its block scales:
  // the prepared transpose (ExpertOperand::transposed, prepare_weights) or a transient one.
  const TensorView& bd = s0.gemm.b.data.dense;
  const bool transpose = s0.gemm.b_kn && s0.gemm.b.transposed.dense.data == nullptr;
  const int64_t E = bd.shape[0], br = bd.shape[1], bc = bd.shape[2];
  const int64_t scale_count = E * ceil_div(br, kFp8Block) * ceil_div(bc, kFp8Block);
  Workspace tmp(staged_output_bytes(s0) +
                    (transpose ? Workspace::aligned(E * br * bc) + Workspace::aligned(scale_count * 4) : 0),
                stream);
  detail::MGemmStep s = with_bf16_output(s0, tmp);
  if (s0.gemm.b_kn) {
    if (transpose) {
      uint8_t* qt = tmp.take<uint8_t>(E * br * bc);
      float* st = tmp.take<float>(scale_count);
      transpose_fp8_block_weights(bd.ptr<uint8_t>(), static_cast<const float*>(s0.gemm.b.scales.dense.data), E, br, bc,
                                  qt, st, stream);
      s.gemm.b.data.dense = TensorView::of(qt, DType::e4m3, {E, bc, br}, bd.device);
      s.gemm.b.scales.dense = TensorView::of(st, DType::f32, {scale_count}, bd.device);
    } else {
      s.gemm.b.data.dense = s0.gemm.b.transposed.dense;
      s.gemm.b.scales.dense = s0.gemm.b.transposed_scales.dense;
    }
    s.gemm.b.dequantized = ExpertMatrices{};
    s.gemm.b_kn = false;
  }
  run_kernel(s, Mainloop::fp8_block, kBlkN, stream);
  if (has_quantized_outputs(s0)) quantize_outputs(s0, s.out_bf16, stream);
}

// The MXFP8 routes: B is the weights' exact bf16 copy (given, or dequantized here into workspace);
// mx_dequant dequantizes A too and runs the BF16 kernel. GLU outputs in MXFP8 are quantized by the
// mx_a epilogue where it can (fused_quantizing_epilogue), else written in bf16 (to the step's bf16
// output, or a transient one) and quantized after, which gives the same bytes (docs/numerics.md
// "Quantized value").
void run_mx(const detail::MGemmStep& s0, bool dequantize_a, int bn, cudaStream_t stream) {
  const MGroupedGemmArgs& g = s0.gemm;
  const int64_t experts = g.offsets.experts();
  const bool fused = !dequantize_a && fused_quantizing_epilogue(s0);
  const bool quantize_after = has_quantized_outputs(s0) && !fused;
  const bool have_copy = g.b.dequantized.dense.data != nullptr;
  const int64_t k = a_view(s0).shape[1], n = detail::gemm_width(s0);
  const int64_t b_rows = g.b_kn ? k : n, b_cols = g.b_kn ? n : k;
  const int64_t a_elems = dequantize_a ? a_rows(s0) * k : 0;
  const MxOut mx = fused ? fused_mx_outputs(s0, stream) : MxOut{};
  detail::MGemmStep s = s0;
  if (fused) s.out_row = s.out_col = Mxfp8View{};
  Workspace tmp((have_copy ? 0 : Workspace::aligned(b_elems(s0) * 2)) + Workspace::aligned(a_elems * 2) +
                    staged_output_bytes(s),
                stream);
  if (dequantize_a) {
    const Mxfp8View& am = g.a.mx;
    const TensorView a16 = TensorView::of(tmp.take<uint16_t>(a_elems), DType::bf16, {a_rows(s0), k}, am.data.device);
    dequantize(DequantizeArgs{.src = am, .groups = {}, .dst = a16}, stream);
    s.gemm.a = Operand{};
    s.gemm.a.bf16 = a16;
  }
  uint16_t* wb = have_copy ? g.b.dequantized.dense.ptr<uint16_t>() : tmp.take<uint16_t>(b_elems(s0));
  if (!have_copy)
    dequantize_experts(static_cast<const uint8_t*>(g.b.data.dense.data), static_cast<const uint8_t*>(g.b.scales.dense.data),
                       experts, b_rows, b_cols, g.b_kn ? BlockAxis::col : BlockAxis::row, g.b.layout, wb, stream);
  s.gemm.b = ExpertOperand{};
  s.gemm.b.data.dense = TensorView::of(wb, DType::bf16, {experts, b_rows, b_cols}, g.b.data.dense.device);
  s.gemm.b.data.dtype = DType::bf16;
  s = with_bf16_output(s, tmp);
  run_kernel(s, dequantize_a ? Mainloop::bf16 : Mainloop::mx_a, bn, stream, mx);
  if (quantize_after) quantize_outputs(s0, s.out_bf16, stream);
}

}  // namespace

void gemm_m(const detail::MGemmStep& s0, const detail::StepPlan& plan, void* stream_ptr) {
  const cudaStream_t stream = as_stream(stream_ptr);
  if (std::string why = gemm_m_refusal(s0); !why.empty()) throw Error("cuda_sm90", why);
  const Config* c = find_config(plan.config);
  if (c == nullptr) throw Error("cuda_sm90", "internal: a plan with no sm90 configuration '" + plan.config + "'");
  const MGroupedGemmArgs& g = s0.gemm;
  if (s0.b_copy_only && (!g.b.is_mxfp8() || g.b.dequantized.dense.data == nullptr))
    throw Error("b.dequantized", "a step with MXFP8 weights kept only as their bf16 copy needs that copy");
  if (g.offsets.experts() <= 0) return;
  switch (c->route) {
    case Route::bf16: {
      // BF16 operands; quantized outputs (none in the layer's bf16 recipe) through the quantizer.
      Workspace tmp(staged_output_bytes(s0), stream);
      const detail::MGemmStep s = with_bf16_output(s0, tmp);
      run_kernel(s, Mainloop::bf16, c->block_n, stream);
      if (has_quantized_outputs(s0)) quantize_outputs(s0, s.out_bf16, stream);
      return;
    }
    case Route::mx_regs: return run_mx(s0, /*dequantize_a=*/false, c->block_n, stream);
    case Route::mx_dequant: return run_mx(s0, /*dequantize_a=*/true, c->block_n, stream);
    case Route::fp8_block: return run_fp8_block(s0, stream);
    case Route::fp8_dequant: return gemm_m_fp8_block(s0, stream_ptr, &run_bf16_default);
  }
}

}  // namespace mxmoe::cuda::sm90
