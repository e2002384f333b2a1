// Host entry of the sm90 m-grouped GEMM (fprop and dgrad with their fused epilogues): checks what
// the kernels take, builds the group schedule on the device (128-row m-tiles), encodes the TMA
// descriptors, launches one persistent kernel and, for glu_backward, the fixed-order dprob and db1
// reductions. No host reads of the offsets, no stream sync (graph-capturable).
#include <cuda_runtime.h>

#include <mutex>
#include <string>
#include <vector>

#include "src/cuda/common/check.h"
#include "src/cuda/common/reductions.h"
#include "src/cuda/sm90/launch.cuh"
#include "src/cuda/sm90/tensor_map.h"

namespace mxmoe::cuda::sm90 {
namespace {

constexpr int kWideN = 256;    // output tile width of store / glu_forward
constexpr int kNarrowN = 128;  // glu_backward (more live registers per column), and narrow outputs

using StoreKK = KernelConfig<kWideN, Major::k, Major::k, Grouping::m, Epi::store>;
using StoreKMN = KernelConfig<kWideN, Major::k, Major::mn, Grouping::m, Epi::store>;
using StoreKKNarrow = KernelConfig<kNarrowN, Major::k, Major::k, Grouping::m, Epi::store>;
using StoreKMNNarrow = KernelConfig<kNarrowN, Major::k, Major::mn, Grouping::m, Epi::store>;
using GluFwd = KernelConfig<kWideN, Major::k, Major::k, Grouping::m, Epi::glu_forward>;
using GluBwd = KernelConfig<kNarrowN, Major::k, Major::mn, Grouping::m, Epi::glu_backward>;

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int64_t gemm_width(const detail::MGemmStep& s) {
  switch (s.epilogue) {
    case detail::Epilogue::glu_forward: return 2 * s.ffn;
    case detail::Epilogue::glu_backward: return s.ffn;
    case detail::Epilogue::store: break;
  }
  return s.gemm.d.shape[1];
}

}  // namespace

int sm_count() {
  static std::mutex mu;
  static std::vector<int> cache;
  int dev = 0;
  MXMOE_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() <= static_cast<size_t>(dev)) cache.resize(dev + 1, 0);
  if (cache[dev] == 0) MXMOE_CUDA_CHECK(cudaDeviceGetAttribute(&cache[dev], cudaDevAttrMultiProcessorCount, dev));
  return cache[dev];
}

std::string gemm_m_refusal(const detail::MGemmStep& s) {
  const MGroupedGemmArgs& g = s.gemm;
  if (g.a.is_mxfp8() || g.b.is_mxfp8()) return "MXFP8 operands: the sm90 MXFP8 kernels are not in this build yet";
  if (g.b.data.per_expert())
    return "per-expert weight pointers: the sm90 kernels read one dense [E, ...] weight tensor through TMA";
  if (s.out_row.data.data != nullptr || s.out_col.data.data != nullptr)
    return "MXFP8 epilogue outputs: the sm90 quantizing epilogues are not in this build yet";
  const int64_t k = g.a.bf16.shape[1], n = gemm_width(s);
  if (k % 8 != 0) return "K = " + std::to_string(k) + " is not a multiple of 8 (TMA rows must be 16-byte aligned)";
  if (n % 8 != 0) return "N = " + std::to_string(n) + " is not a multiple of 8 (TMA rows must be 16-byte aligned)";
  if (!aligned16(g.a.bf16.data) || !aligned16(g.b.data.dense.data))
    return "an operand's address is not 16-byte aligned (TMA)";
  if (s.epilogue == detail::Epilogue::glu_forward && s.out_bf16.data == nullptr)
    return "glu_forward without a BF16 output";
  if (s.epilogue == detail::Epilogue::glu_forward && g.b_kn)
    return "glu_forward with B_e as [K, N]: the sm90 kernel reads W1 as [2F, K] (the layer's layout)";
  if (s.epilogue == detail::Epilogue::glu_backward && !g.b_kn)
    return "glu_backward with B_e as [N, K]: the sm90 kernel reads W2 as [K, N] (the layer's layout)";
  if (s.epilogue == detail::Epilogue::store && g.d.data == nullptr) return "store epilogue without an output";
  return {};
}

void gemm_m(const detail::MGemmStep& s, void* stream_ptr) {
  const cudaStream_t stream = as_stream(stream_ptr);
  const std::string why = gemm_m_refusal(s);
  if (!why.empty()) throw Error("cuda_sm90", why);
  const MGroupedGemmArgs& g = s.gemm;
  const TensorView& av = g.a.bf16;
  const int64_t rows = av.shape[0], k = av.shape[1], experts = g.offsets.experts();
  const int64_t n = gemm_width(s);
  if (experts <= 0) return;

  const bool glu_fwd = s.epilogue == detail::Epilogue::glu_forward;
  const bool glu_bwd = s.epilogue == detail::Epilogue::glu_backward;
  const bool wide = glu_fwd || (!glu_bwd && n > kNarrowN);
  const int bn = wide ? kWideN : kNarrowN;

  KernelParams p;
  p.experts = static_cast<int32_t>(experts);
  p.rows = rows;
  p.n = n;
  p.k_blocks = static_cast<int32_t>((k + kBlockK - 1) / kBlockK);
  p.ffn = s.ffn;
  p.glu = s.glu;
  p.glu_layout = s.glu_layout;
  p.probs = s.probs.ptr<const float>();
  p.bias = g.bias.ptr<const uint16_t>();
  p.bias_by_probs = s.bias_scale_by_probs;
  p.d = g.d.data;
  p.d_f32 = g.d.dtype == DType::f32;
  const int64_t out_cols = glu_fwd ? s.ffn : n;  // features (glu_forward: BN/2 per tile) or columns
  const int64_t out_per_tile = glu_fwd ? bn / 2 : bn;
  p.n_tiles = static_cast<int32_t>((out_cols + out_per_tile - 1) / out_per_tile);
  if (glu_fwd) p.c_out = s.c.ptr<uint16_t>();
  if (glu_bwd) p.c_in = s.c.ptr<const uint16_t>();
  if (!(s.epilogue == detail::Epilogue::store)) p.out_bf16 = s.out_bf16.ptr<uint16_t>();

  const int32_t tiles_bound = m_tiles_bound(rows, experts, kBlockM);
  const bool want_dprob = glu_bwd && s.dprobs.data != nullptr;
  const bool want_db1 = glu_bwd && s.db1.dst.data != nullptr;
  const int64_t dprob_floats = want_dprob ? static_cast<int64_t>(p.n_tiles) * rows : 0;
  const int64_t db1_floats = want_db1 ? static_cast<int64_t>(tiles_bound) * 2 * s.ffn : 0;
  Workspace ws(group_schedule_bytes(experts, rows, kBlockM) + Workspace::aligned(dprob_floats * 4) +
                   Workspace::aligned(db1_floats * 4),
               stream);
  p.sched = build_group_schedule(g.offsets.data(), experts, rows, kBlockM, ws, stream);
  if (want_dprob) {
    p.ws_dprob = ws.take<float>(dprob_floats);
    // Rows outside every group (only with bad offsets) then still read defined zeros.
    MXMOE_CUDA_CHECK(cudaMemsetAsync(p.ws_dprob, 0, static_cast<size_t>(dprob_floats) * 4, stream));
  }
  if (want_db1) p.ws_db1 = ws.take<float>(db1_floats);

  if (rows > 0) {
    const uint64_t K = static_cast<uint64_t>(k), E = static_cast<uint64_t>(experts);
    const CUtensorMap ma = make_tensor_map_bf16("gemm.a", av.data, {K, static_cast<uint64_t>(rows)}, {K * 2},
                                                {kBlockK, kBlockM});
    const void* w = g.b.data.dense.data;
    CUtensorMap mb0{}, mb1{};
    // Upper bound of the tile pairs (the real count is read on the device).
    const int64_t launch_tiles = static_cast<int64_t>((tiles_bound + 1) / 2) * p.n_tiles;
    if (glu_fwd) {
      const uint64_t F = static_cast<uint64_t>(s.ffn);
      const char* lin = static_cast<const char*>(w);
      if (s.glu_layout == GluLayout::halves) {
        p.b_load = BLoad::glu_halves;
        mb0 = make_tensor_map_bf16("gemm.b", w, {K, F, E}, {K * 2, 2 * F * K * 2}, {kBlockK, kWideN / 2, 1});
        mb1 = make_tensor_map_bf16("gemm.b", lin + F * K * 2, {K, F, E}, {K * 2, 2 * F * K * 2},
                                   {kBlockK, kWideN / 2, 1});
      } else {
        p.b_load = BLoad::glu_interleave32;
        const uint64_t I = kGluInterleave;
        mb0 = make_tensor_map_bf16("gemm.b", w, {K, I, F / I, E}, {K * 2, 2 * I * K * 2, 2 * F * K * 2},
                                   {kBlockK, static_cast<uint32_t>(I), kWideN / 2 / kGluInterleave, 1});
        mb1 = make_tensor_map_bf16("gemm.b", lin + I * K * 2, {K, I, F / I, E}, {K * 2, 2 * I * K * 2, 2 * F * K * 2},
                                   {kBlockK, static_cast<uint32_t>(I), kWideN / 2 / kGluInterleave, 1});
      }
      launch<GluFwd>(p, launch_tiles, ma, mb0, mb1, stream);
    } else if (g.b_kn) {
      p.b_load = BLoad::mn_boxes;
      const uint64_t N = static_cast<uint64_t>(n);
      mb0 = make_tensor_map_bf16("gemm.b", w, {N, K, E}, {N * 2, K * N * 2}, {64, kBlockK, 1});
      if (glu_bwd) launch<GluBwd>(p, launch_tiles, ma, mb0, mb0, stream);
      else if (wide) launch<StoreKMN>(p, launch_tiles, ma, mb0, mb0, stream);
      else launch<StoreKMNNarrow>(p, launch_tiles, ma, mb0, mb0, stream);
    } else {
      p.b_load = BLoad::k_rows;
      const uint64_t N = static_cast<uint64_t>(n);
      mb0 = make_tensor_map_bf16("gemm.b", w, {K, N, E}, {K * 2, N * K * 2},
                                 {kBlockK, static_cast<uint32_t>(bn / 2), 1});  // half tiles (pairs)
      if (wide) launch<StoreKK>(p, launch_tiles, ma, mb0, mb0, stream);
      else launch<StoreKKNarrow>(p, launch_tiles, ma, mb0, mb0, stream);
    }
  }

  if (want_dprob)
    launch_reduce_dprob(p.ws_dprob, p.n_tiles, rows, s.dprob_add.ptr<const float>(), s.dprobs.ptr<float>(), stream);
  if (want_db1) {
    const GradDst dst{s.db1.dst.data, s.db1.dst.dtype == DType::f32, s.db1.accumulate};
    launch_reduce_expert_tiles(p.ws_db1, 2 * s.ffn, p.sched, dst, stream);
  }
}

}  // namespace mxmoe::cuda::sm90
