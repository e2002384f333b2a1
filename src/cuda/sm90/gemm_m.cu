// Host entry of the sm90 m-grouped GEMM (fprop and dgrad with their fused epilogues): checks what
// the kernels take, builds the group schedule on the device (128-row m-tiles), encodes the TMA
// descriptors, launches one persistent kernel and, for glu_backward, the fixed-order dprob and db1
// reductions. No host reads of the offsets, no stream sync (graph-capturable).
#include <cuda_runtime.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "src/common/fp8_block.h"
#include "src/common/sm90_switches.h"
#include "src/cuda/common/check.h"
#include "src/cuda/common/reductions.h"
#include "src/cuda/cuda_ops.h"
#include "src/cuda/sm90/gemm_m_plan.h"
#include "src/cuda/sm90/launch.cuh"
#include "src/cuda/sm90/tensor_map.h"

namespace mxmoe::cuda::sm90 {
namespace {

constexpr int kWideN = 256;    // output tile width
constexpr int kNarrowN = 128;  // narrow outputs (N <= 128)
constexpr int64_t kMxGluBwdNarrowMaxK = 4096;  // MXFP8 GLU backward: 128-wide tiles up to this K
// Every layer configuration runs CTA pairs along M that share B by multicast (gemm_kernel.cuh Tile).
constexpr int kPair = 2;

using StoreKK = KernelConfig<kWideN, Major::k, Major::k, Grouping::m, Epi::store, kPair>;
using StoreKMN = KernelConfig<kWideN, Major::k, Major::mn, Grouping::m, Epi::store, kPair>;
using StoreKKNarrow = KernelConfig<kNarrowN, Major::k, Major::k, Grouping::m, Epi::store, kPair>;
using StoreKMNNarrow = KernelConfig<kNarrowN, Major::k, Major::mn, Grouping::m, Epi::store, kPair>;
using GluFwd = KernelConfig<kWideN, Major::k, Major::k, Grouping::m, Epi::glu_forward, kPair>;
using GluBwd = KernelConfig<kWideN, Major::k, Major::mn, Grouping::m, Epi::glu_backward, kPair>;
using GluBwdNarrow = KernelConfig<kNarrowN, Major::k, Major::mn, Grouping::m, Epi::glu_backward, kPair>;
// The same quantizing dC in the epilogue: the MXFP8 FC2 dgrad on BF16 operands (mx_glu_backward_on_bf16).
using GluBwdQ = KernelConfig<kWideN, Major::k, Major::mn, Grouping::m, Epi::glu_backward, kPair, Mx::q>;
using GluBwdNarrowQ = KernelConfig<kNarrowN, Major::k, Major::mn, Grouping::m, Epi::glu_backward, kPair, Mx::q>;
// Pingpong consumers (gemm_kernel.cuh PP_; session 17, comparison runs; measured slower, session 18):
// MXMOE_SM90_FC1_FPROP=pp, MXMOE_SM90_FC2_DGRAD=pp (where no db1 is summed).
using GluFwdPP = KernelConfig<kWideN, Major::k, Major::k, Grouping::m, Epi::glu_forward, kPair, Mx::none, true>;
using GluBwdPP = KernelConfig<kWideN, Major::k, Major::mn, Grouping::m, Epi::glu_backward, kPair, Mx::none, true>;
using GluBwdNarrowPP = KernelConfig<kNarrowN, Major::k, Major::mn, Grouping::m, Epi::glu_backward, kPair, Mx::none, true>;
// FC2 dgrad with the epilogue on warps 1-3 of the producer warp group (epilogue.cuh "Epilogue
// warps"); when it is taken: epilogue_warps_take.
constexpr int kEwN = 192;
using GluBwdEw = KernelConfig<kEwN, Major::k, Major::mn, Grouping::m, Epi::glu_backward_ew, kPair>;
// The MXFP8 configurations live in gemm_m_mx.cu (launch_gemm_m_mx), a translation unit of their own.

const TensorView& a_view(const detail::MGemmStep& s) { return s.gemm.a.is_mxfp8() ? s.gemm.a.mx.data : s.gemm.a.bf16; }
int64_t a_rows(const detail::MGemmStep& s) { return a_view(s).shape[0]; }

}  // namespace

int sm_count() {
  static PerDevice cache;
  return cache.get([](int dev) {
    int n = 0;
    MXMOE_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  });
}

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
// dequantized operands (src/cuda/quant/fp8_block.cu), in stream-ordered workspace that is 16-byte
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

int default_block_n(const detail::MGemmStep& s) {
  if (s.epilogue == detail::Epilogue::glu_forward) return kWideN;
  // The MXFP8-A GLU backward (FC2 dgrad): 128-wide tiles where K <= 4096, 256-wide above. Session 16
  // (bench/results/2026-12-03-h200-sm90-s16-mxfp8-weights-and-glu-bwd.md, every preset, both splits):
  // 128-wide runs 1.06-1.49x as fast at K = 2048, 2880 and 4096 (qwen3-30b, gptoss-120b, mixtral) and
  // 0.89-0.90x at K = 7168 (dsv3); not profiled (a guess: the long mainloop amortizes the wide tile's
  // epilogue, while narrow tiles convert every A row twice as often).
  // MXMOE_SM90_MX_GLU_BWD_N=128 or 256 (read per call, comparison runs) forces one width.
  if (s.epilogue == detail::Epilogue::glu_backward && s.gemm.a.is_mxfp8()) {
    if (env_is("MXMOE_SM90_MX_GLU_BWD_N", "128")) return kNarrowN;
    const bool wide = env_is("MXMOE_SM90_MX_GLU_BWD_N", "256") || a_view(s).shape[1] > kMxGluBwdNarrowMaxK;
    if (!wide) return kNarrowN;
  }
  return detail::gemm_width(s) > kNarrowN ? kWideN : kNarrowN;
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

MPlan plan_gemm_m(const detail::MGemmStep& s, int bn, Workspace& ws, cudaStream_t stream) {
  const MGroupedGemmArgs& g = s.gemm;
  const TensorView& av = a_view(s);
  const int64_t rows = av.shape[0], k = av.shape[1], experts = g.offsets.experts();
  const int64_t n = detail::gemm_width(s);
  const bool glu_fwd = s.epilogue == detail::Epilogue::glu_forward;
  const bool glu_bwd = s.epilogue == detail::Epilogue::glu_backward;

  const bool blk = g.a.is_fp8_block();  // FP8 wgmma, 128 values of K per stage (gemm_m_blk.cu)
  MPlan plan;
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
    plan.launch_tiles = static_cast<int64_t>(m_tiles_bound(rows, experts, kBlockM)) * p.n_tiles;
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
  plan.launch_tiles = static_cast<int64_t>(m_tiles_bound(rows, experts, kBlockM)) * p.n_tiles;
  if (g.b.is_mxfp8()) {
    // B: e4m3 halves of the tile ([BN/2][64] bytes, 64-byte swizzle; or [64][BN/2] from [K, N]) and
    // the scales, which the scale loaders stage.
    const uint64_t N = static_cast<uint64_t>(n);
    const uint32_t half = static_cast<uint32_t>(bn / 2);
    p.b_scales = static_cast<const uint8_t*>(g.b.scales.dense.data);
    p.b_scale_swizzled = g.b.layout == ScaleLayout::swizzled;
    if (g.b_kn) {
      p.b_load = BLoad::mn_halves;
      p.b_scale_bytes = colwise_matrix_scale_bytes(k, n);
      p.b_scale_cols = static_cast<int32_t>(colwise_scale_row_bytes(n));
      p.b_scale_rows = static_cast<int32_t>(colwise_group_scale_rows(k));
      plan.b0 = make_tensor_map_u8("gemm.b", w, {N, K, E}, {N, K * N}, {half, kBlockK, 1}, false);
    } else {
      p.b_load = BLoad::k_rows;
      p.b_scale_bytes = rowwise_scale_bytes(n, k);
      p.b_scale_cols = static_cast<int32_t>(rowwise_scale_cols(k));
      plan.b0 = make_tensor_map_u8("gemm.b", w, {K, N, E}, {K, N * K}, {kBlockK, half, 1}, true);
    }
    plan.b1 = plan.b0;
    return plan;
  }
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

void finish_gemm_m(const detail::MGemmStep& s, const MPlan& plan, cudaStream_t stream) {
  const KernelParams& p = plan.params;
  if (p.ws_dprob != nullptr)
    launch_reduce_dprob(p.ws_dprob, p.n_tiles, p.rows, s.dprob_add.ptr<const float>(), s.dprobs.ptr<float>(), stream);
  if (p.ws_db1 != nullptr) {
    const GradDst dst{s.db1.dst.data, s.db1.dst.dtype == DType::f32, s.db1.accumulate};
    launch_reduce_expert_tiles(p.ws_db1, 2 * s.ffn, p.sched, dst, stream);
  }
}

namespace {
// MXMOE_SM90_FC2_DGRAD (read per call, as the MXFP8 switches): "ew" takes the epilogue warps wherever
// they can run; "pp" pingpong consumers where no db1 is summed; unset or anything else ("glu"), the
// in-line epilogue.
bool fc2_dgrad_ew_asked() { return env_is("MXMOE_SM90_FC2_DGRAD", "ew"); }
// The epilogue warps load the saved C and store dC in 16-byte pieces of rows. Their tile is
// 128 x 192 (the 128 x 192 fp32 hand-off tile and the ring share the 227 KB); at equal tiles they
// are 7-11% faster than the in-line epilogue, but the in-line 128 x 256 tile is faster still where 256
// divides the width. FC2 dgrad, ms (bench/sm90_kernels.cu, MXMOE_KB_LAYER_ONLY=ew, H200, session 8):
//   preset (F)            128x256 in-line  128x192 in-line  128x192 epilogue warps
//   gptoss-120b (2880)    1.187            1.202            1.101
//   dsv3 (2048)           1.498            1.804            1.682
//   qwen3-30b (768)       0.594            0.632            0.664
//   mixtral (14336)       3.028            3.533            3.152
// So they were taken where 192 divides the width F (the GEMM's N: dH, before the GLU backward makes
// dC [T, 2F] of it) and 256 does not: gptoss-120b, 7% of its FC2 dgrad. Session 18 caught this
// kernel hung on the H200 (`mxmoe bench`, gptoss-120b bf16, about one run in four; cuda-gdb: the
// warps of a consumer warp group out of step after a pair's dummy tile, gemm_kernel.cuh `drain`;
// fixed and verified in session 19, docs/kernels/sm90_gemm.md), so the layer stopped taking it
// unasked; forced everywhere it then made no layer row faster, so it stays MXMOE_SM90_FC2_DGRAD=ew only.
bool epilogue_warps_take(const detail::MGemmStep& s) {
  if (s.epilogue != detail::Epilogue::glu_backward || s.gemm.a.is_mxfp8()) return false;
  if (!(s.ffn % 8 == 0 && tma_aligned(s.c.data) && tma_aligned(s.out_bf16.data))) return false;
  return fc2_dgrad_ew_asked();
}

// The MXFP8 GLU backward with epilogue warps (MXMOE_SM90_MX_GLU_BWD=ew or ew128, comparison runs
// until measured): its tile width where it takes the step (BF16 B, dC written in bf16: the kernel's
// epilogue warps do not quantize, so the MXFP8 outputs go through the quantizer), else 0.
int mx_epilogue_warps_take(const detail::MGemmStep& s) {
  if (s.epilogue != detail::Epilogue::glu_backward || !s.gemm.a.is_mxfp8() || s.gemm.b.is_mxfp8()) return 0;
  if (!(s.ffn % 8 == 0 && tma_aligned(s.c.data) && s.out_bf16.data != nullptr && tma_aligned(s.out_bf16.data))) return 0;
  return mx_epilogue_warps_n();
}

// Runs a step whose B is BF16 (A BF16 or MXFP8) or, with the store epilogue, MXFP8 on both sides;
// mx: MXFP8 outputs the Mx::a GLU epilogues (and the BF16 GLU backward's Mx::q) quantize themselves
// (fused_quantizing_epilogue).
void run_gemm_m(const detail::MGemmStep& s, cudaStream_t stream, const MxOut& mx = {}) {
  if (const int bn = mx_epilogue_warps_take(s); bn > 0) {
    Workspace ws(gemm_m_workspace_bytes(s, bn), stream);
    const MPlan plan = plan_gemm_m(s, bn, ws, stream);
    launch_gemm_m_mx_ew(plan, bn, stream);
    finish_gemm_m(s, plan, stream);
    return;
  }
  if (!mx.any() && epilogue_warps_take(s)) {
    Workspace ws(gemm_m_workspace_bytes(s, kEwN), stream);
    const MPlan plan = plan_gemm_m(s, kEwN, ws, stream);
    launch<GluBwdEw>(plan.params, plan.launch_tiles, plan.a, plan.b0, plan.b1, stream);
    finish_gemm_m(s, plan, stream);
    return;
  }
  const int bn = default_block_n(s);
  Workspace ws(gemm_m_workspace_bytes(s, bn), stream);
  MPlan plan = plan_gemm_m(s, bn, ws, stream);
  plan.params.out_mx = mx;
  const KernelParams& p = plan.params;
  const bool wide = bn == kWideN;
  if (s.gemm.a.is_mxfp8()) {
    launch_gemm_m_mx(s, plan, bn, stream);
  } else {
    switch (s.epilogue) {
      case detail::Epilogue::glu_forward:
        if (env_is("MXMOE_SM90_FC1_FPROP", "pp")) launch<GluFwdPP>(p, plan.launch_tiles, plan.a, plan.b0, plan.b1, stream);
        else launch<GluFwd>(p, plan.launch_tiles, plan.a, plan.b0, plan.b1, stream);
        break;
      case detail::Epilogue::glu_backward:
        if (mx.any()) {
          if (wide) launch<GluBwdQ>(p, plan.launch_tiles, plan.a, plan.b0, plan.b1, stream);
          else launch<GluBwdNarrowQ>(p, plan.launch_tiles, plan.a, plan.b0, plan.b1, stream);
        } else if (env_is("MXMOE_SM90_FC2_DGRAD", "pp") && p.ws_db1 == nullptr) {
          if (wide) launch<GluBwdPP>(p, plan.launch_tiles, plan.a, plan.b0, plan.b1, stream);
          else launch<GluBwdNarrowPP>(p, plan.launch_tiles, plan.a, plan.b0, plan.b1, stream);
        } else if (wide) {
          launch<GluBwd>(p, plan.launch_tiles, plan.a, plan.b0, plan.b1, stream);
        } else {
          launch<GluBwdNarrow>(p, plan.launch_tiles, plan.a, plan.b0, plan.b1, stream);
        }
        break;
      case detail::Epilogue::store:
        if (s.gemm.b_kn) {
          if (wide) launch<StoreKMN>(p, plan.launch_tiles, plan.a, plan.b0, plan.b1, stream);
          else launch<StoreKMNNarrow>(p, plan.launch_tiles, plan.a, plan.b0, plan.b1, stream);
        } else {
          if (wide) launch<StoreKK>(p, plan.launch_tiles, plan.a, plan.b0, plan.b1, stream);
          else launch<StoreKKNarrow>(p, plan.launch_tiles, plan.a, plan.b0, plan.b1, stream);
        }
        break;
    }
  }
  finish_gemm_m(s, plan, stream);
}
}  // namespace

// The backward on FP8 wgmma (dgrads: B_e [K, N] read as its prepared transpose, or transposed into a
// transient [N, K] copy first; wgrads: gemm_k.cu), the default since session 10 (GPU tests
// GpuGemmM.Fp8BlockDgrad*, GpuGemmK.Fp8Block*, GpuLayer.Fp8BlockwiseWithFp8Backward* pass on the
// H200; dsv3: FC2 dgrad kernel 1.11 ms vs 1.45 + 1.09 ms dequant for the BF16 kernel on dequantized
// operands). MXMOE_SM90_FP8_BLOCK (read per call): `forward` keeps the backward on the dequantized
// BF16 path (power-of-two scales only), `dequant` the forward too (src/common/sm90_switches.h).
bool fp8_backward_on() { return sm90_fp8_block_mode() == Sm90Fp8Block::all; }

bool fp8_block_kernel_takes(const detail::MGemmStep& s) {
  const bool off = sm90_fp8_block_mode() == Sm90Fp8Block::dequant;
  const MGroupedGemmArgs& g = s.gemm;
  if (off || !g.a.is_fp8_block() || !fp8_block_refusal(s).empty()) return false;
  if (g.b_kn && !fp8_backward_on()) return false;
  if (!g.b_kn && s.epilogue == detail::Epilogue::glu_backward) return false;
  const int64_t k = g.a.mx.data.shape[1];
  if (k % 16 != 0) return false;  // e4m3 rows: 16-byte TMA strides
  if (!tma_aligned(g.a.mx.data.data) || !tma_aligned(g.b.data.dense.data)) return false;
  // glu_halves: a tile's b rows (F + 64 n ..) lie in one 128-row scale block only when 64 | F.
  if (s.epilogue == detail::Epilogue::glu_forward && s.glu_layout == GluLayout::halves && s.ffn % 64 != 0) return false;
  return true;
}

namespace {
// An fp8_blockwise step on the FP8-wgmma kernel; an FP8 output of glu_forward (A row-wise and in
// token blocks) is written in bf16 (the step's, or a transient one) and quantized from there
// (docs/numerics.md "Quantized value").
void run_gemm_m_blk(const detail::MGemmStep& s0, cudaStream_t stream) {
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
  if (s.gemm.offsets.experts() > 0) {
    Workspace ws(gemm_m_workspace_bytes(s, kBlkN), stream);
    const MPlan plan = plan_gemm_m(s, kBlkN, ws, stream);
    launch_gemm_m_blk(s, plan, stream);
    finish_gemm_m(s, plan, stream);
  }
  if (has_quantized_outputs(s0)) quantize_outputs(s0, s.out_bf16, stream);
}
}  // namespace

// The Mx::a GLU kernels quantize A / dC in their epilogue (MXFP8 row- and column-wise from the
// staged bf16 tile, src/cuda/common/mx_tile_quant.cuh) where the outputs are MXFP8, F is a multiple of
// 32 and the data 16-byte aligned; otherwise (and with MXMOE_SM90_MX_EPILOGUE=unfused, read per call
// for comparison runs) the kernel writes bf16 and the quantizer reads it back.
bool fused_quantizing_epilogue(const detail::MGemmStep& s) {
  if (s.epilogue == detail::Epilogue::store || !s.gemm.a.is_mxfp8() || !has_quantized_outputs(s)) return false;
  if (env_is("MXMOE_SM90_MX_EPILOGUE", "unfused")) return false;
  // The epilogue warps write dC in bf16 only.
  if (s.epilogue == detail::Epilogue::glu_backward && mx_epilogue_warps_n() > 0) return false;
  for (const Mxfp8View* v : {&s.out_row, &s.out_col})
    if (v->data.data != nullptr && (v->format != QuantFormat::mxfp8 || !tma_aligned(v->data.data))) return false;
  return s.ffn % kMxBlock == 0;
}

bool fp8_b_in_kernel() {
  static const bool v = env_is("MXMOE_SM90_FP8_B", "convert");
  return v;
}

// The MXFP8 FC2 dgrad on BF16 operands: dY's dequantized values in a transient bf16 copy
// (cuda::dequantize) beside the weights' bf16 copy, through the BF16 GLU-backward kernel, whose bf16
// dC the quantizer reads (or, with MXMOE_SM90_MX_GLU_BWD=bf16q, which quantizes dC in its epilogue:
// Mx::q, where the fused epilogue takes the step; opt-in: correct on the H200 in session 20 and
// 0.69-0.92x as fast as the default on fc2_dgrad, bench/results/2026-12-03-h200-sm90-s20-mxbf16q.md,
// the spilling epilogue costs more than the quantizer's pass). The GEMM's inputs are the values the
// Mx::a kernel dequantizes in registers, so the outputs are the same up to accumulation order.
// Default where K >= 4096: H200, session 19 (bench/results/2026-12-03-h200-sm90-s19-mxbf16.md, two
// interleaved passes, every preset, both splits), this route runs the step 1.23-1.28x as fast as the
// Mx::a kernel at K = 4096 and 7168 (mixtral, dsv3), 0.99-1.07x at K = 2880 (gptoss-120b) and
// 0.91-0.94x at K = 2048 (qwen3-30b): the Mx::a k-loop converts every A fragment in registers (32
// F2FP, 32 HADD2 and 32 FMUL per k-block beside 4 HGMMA), which a long K pays for longer than one
// dequantizing pass over dY. It costs a transient T x K bf16 copy of dY and a staged bf16 dC.
// MXMOE_SM90_MX_GLU_BWD (read per call): `bf16` takes this route at every K, `bf16q` with Mx::q;
// `mx` (or any of the other values: pp, ew, ew128) keeps A in MXFP8.
namespace {
constexpr int64_t kMxGluBwdBf16MinK = 4096;
bool mx_glu_backward_on_bf16(const detail::MGemmStep& s) {
  if (s.epilogue != detail::Epilogue::glu_backward || !s.gemm.a.is_mxfp8() || s.gemm.a.is_fp8_block()) return false;
  const char* e = std::getenv("MXMOE_SM90_MX_GLU_BWD");
  if (e == nullptr || *e == '\0') return a_view(s).shape[1] >= kMxGluBwdBf16MinK;
  const std::string v(e);
  return v == "bf16" || v == "bf16q";
}
bool mx_glu_backward_quantizes_in_bf16_kernel() { return env_is("MXMOE_SM90_MX_GLU_BWD", "bf16q"); }
}  // namespace

// MXFP8 steps: B (the weights, e4m3) is dequantized into a transient BF16 copy that the FP8-A
// kernels read through TMA as the BF16 kernels do (the values are exactly the dequantized ones);
// MXFP8 outputs of the GLU epilogues (A or dC, row- and column-wise) are written in BF16 (to the
// step's BF16 output, or a transient one) and quantized from there by the CUDA quantizer, which
// gives the bytes a fused quantizing epilogue would (docs/numerics.md "Quantized value").
// MXMOE_SM90_FP8_B=convert keeps B in FP8 for the store epilogue (converted in shared memory).
void gemm_m(const detail::MGemmStep& s0, void* stream_ptr) {
  const cudaStream_t stream = as_stream(stream_ptr);
  const std::string why = gemm_m_refusal(s0);
  if (!why.empty()) throw Error("cuda_sm90", why);
  // FP8 blockwise: the FP8-wgmma kernels where they take the step, else (power-of-two scales: the
  // probe refuses f32 ones) these BF16 kernels on the dequantized operands.
  if (s0.gemm.a.is_fp8_block()) {
    if (fp8_block_kernel_takes(s0)) return run_gemm_m_blk(s0, stream);
    return gemm_m_fp8_block(s0, stream_ptr, &sm90::gemm_m);
  }
  const MGroupedGemmArgs& g = s0.gemm;
  if (s0.b_copy_only && (!g.b.is_mxfp8() || g.b.dequantized.dense.data == nullptr))
    throw Error("b.dequantized", "a step with MXFP8 weights kept only as their bf16 copy needs that copy");
  const int64_t experts = g.offsets.experts();
  if (experts <= 0) return;
  const bool deq_a = mx_glu_backward_on_bf16(s0);  // A dequantized too: the BF16 kernel runs the step
  // deq_a: the BF16 kernel's Mx::q configuration quantizes (opt-in, above), else the quantizer.
  const bool fused = (!deq_a || mx_glu_backward_quantizes_in_bf16_kernel()) && fused_quantizing_epilogue(s0);
  const bool mx_out = has_quantized_outputs(s0) && !fused;
  const bool have_copy = g.b.is_mxfp8() && g.b.dequantized.dense.data != nullptr;
  const bool deq_b = g.b.is_mxfp8() && !have_copy && !(s0.epilogue == detail::Epilogue::store && fp8_b_in_kernel());
  const MxOut mx = fused ? fused_mx_outputs(s0, stream) : MxOut{};
  if (!deq_b && !mx_out && !have_copy && !fused) return run_gemm_m(s0, stream);

  const int64_t k = a_view(s0).shape[1], n = detail::gemm_width(s0);
  const int64_t b_rows = g.b_kn ? k : n, b_cols = g.b_kn ? n : k;
  const int64_t b_elems = experts * b_rows * b_cols;
  detail::MGemmStep s = s0;
  if (fused) s.out_row = s.out_col = Mxfp8View{};
  const int64_t a_elems = deq_a ? a_rows(s0) * k : 0;
  Workspace tmp((deq_b ? Workspace::aligned(b_elems * 2) : 0) + Workspace::aligned(a_elems * 2) + staged_output_bytes(s),
                stream);
  if (deq_a) {
    const Mxfp8View& am = g.a.mx;
    const TensorView a16 = TensorView::of(tmp.take<uint16_t>(a_elems), DType::bf16, {a_rows(s0), k}, am.data.device);
    dequantize(DequantizeArgs{.src = am, .groups = {}, .dst = a16}, stream_ptr);
    s.gemm.a = Operand{};
    s.gemm.a.bf16 = a16;
  }
  if (deq_b || have_copy) {
    uint16_t* wb = have_copy ? g.b.dequantized.dense.ptr<uint16_t>() : tmp.take<uint16_t>(b_elems);
    if (deq_b)
      dequantize_experts(static_cast<const uint8_t*>(g.b.data.dense.data), static_cast<const uint8_t*>(g.b.scales.dense.data),
                         experts, b_rows, b_cols, g.b_kn ? BlockAxis::col : BlockAxis::row, g.b.layout, wb, stream);
    s.gemm.b = ExpertOperand{};
    s.gemm.b.data.dense = TensorView::of(wb, DType::bf16, {experts, b_rows, b_cols}, g.b.data.dense.device);
    s.gemm.b.data.dtype = DType::bf16;
  }
  s = with_bf16_output(s, tmp);
  run_gemm_m(s, stream, mx);
  if (mx_out) quantize_outputs(s0, s.out_bf16, stream);
}

}  // namespace mxmoe::cuda::sm90
