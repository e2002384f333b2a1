// Host entry of the portable m-grouped GEMM (cuda_ops.h): builds MGemmParams from the step, clears
// the MXFP8 scale outputs (padding bytes must read 0), builds the group schedule on the device,
// launches the kernel variant and, for glu_backward, the fixed-order dprob and db1 reductions.
// Nothing here reads the offsets on the host or synchronises the stream (graph-capturable).
#include "src/cuda/common/check.h"
#include "src/cuda/cuda_ops.h"
#include "src/cuda/portable/launch.h"
#include "src/cuda/common/reductions.h"

namespace mxmoe::cuda::portable {
namespace {

constexpr int kBlockM = 128;   // rows of an m-tile (gemm_m_kernel.cuh)
constexpr int kBlockN = 128;   // GEMM columns of an n-tile
constexpr int kGluFwdF = 64;   // GLU features of a glu_forward n-tile

const TensorView& operand_view(const Operand& a) { return a.mx.data.rank > 0 ? a.mx.data : a.bf16; }

Epi to_epi(detail::Epilogue e) {
  switch (e) {
    case detail::Epilogue::glu_forward: return Epi::glu_forward;
    case detail::Epilogue::glu_backward: return Epi::glu_backward;
    case detail::Epilogue::store: break;
  }
  return Epi::store;
}

template <bool Fp8, Major BMajor>
void launch_by_epilogue(Epi epi, const MGemmParams& p, cudaStream_t stream) {
  switch (epi) {
    case Epi::store: launch_gemm_m<Fp8, BMajor, Epi::store>(p, stream); break;
    case Epi::glu_forward: launch_gemm_m<Fp8, BMajor, Epi::glu_forward>(p, stream); break;
    case Epi::glu_backward: launch_gemm_m<Fp8, BMajor, Epi::glu_backward>(p, stream); break;
  }
}

}  // namespace

detail::StepPlan plan_gemm_m(const detail::MGemmStep& s) {
  detail::StepPlan p;
  p.config = "mma_sync";
  const MGroupedGemmArgs& g = s.gemm;
  const bool fp8_block = g.a.mx.data.rank > 0 && g.a.mx.format == QuantFormat::fp8_block;
  const bool fp8 = g.a.mx.data.rank > 0 && !fp8_block;
  const TensorView& av = operand_view(g.a);
  const int64_t rows = av.rank == 2 ? av.shape[0] : 0, k = av.rank == 2 ? av.shape[1] : 0;
  const int64_t experts = g.offsets.experts();
  const Epi epi = to_epi(s.epilogue);
  p.weights = g.b.is_mxfp8() ? detail::WeightForm::quantized : detail::WeightForm::given;
  if (fp8_block) {  // both operands dequantized (exact for power-of-two scales), then the BF16 kernel
    const TensorView& bd = g.b.data.dense;
    const bool copy = g.b.dequantized.dense.data != nullptr;
    p.launches.push_back({"dequantize_a", ""});
    if (!copy) p.launches.push_back({"dequantize_b", ""});
    p.workspace += Workspace::aligned(rows * k * 2) + (copy ? 0 : Workspace::aligned(bd.numel() * 2));
  }
  const char* epilogue = epi == Epi::store ? "store" : epi == Epi::glu_forward ? "glu_forward" : "glu_backward";
  p.launches.push_back({"group_schedule", ""});
  p.launches.push_back({"gemm", std::string(fp8 ? "mxfp8" : "bf16") + " mma.sync " + epilogue});
  const int64_t out_cols_per_tile = epi == Epi::glu_forward ? kGluFwdF : kBlockN;
  const int64_t n_tiles = ((epi == Epi::store ? detail::gemm_width(s) : s.ffn) + out_cols_per_tile - 1) / out_cols_per_tile;
  const bool bwd = epi == Epi::glu_backward;
  const int64_t dprob_floats = bwd && s.dprobs.data != nullptr ? n_tiles * rows : 0;
  const int64_t db1_floats =
      bwd && s.db1.dst.data != nullptr ? static_cast<int64_t>(m_tiles_bound(rows, experts, kBlockM)) * 2 * s.ffn : 0;
  p.workspace += group_schedule_bytes(experts, rows, kBlockM) + Workspace::aligned(dprob_floats * 4) +
                 Workspace::aligned(db1_floats * 4);
  if (dprob_floats > 0) p.launches.push_back({"reduce_dprob", ""});
  if (db1_floats > 0) p.launches.push_back({"reduce_db1", ""});
  // Quantized outputs: in the epilogue, except where a row-wise block of dC straddles its two halves.
  const bool after = has_quantized_outputs(s) && (fp8_block || (bwd && s.ffn % kMxBlock != 0));
  if (after) {
    p.launches.push_back({"quantize_out", ""});
    p.workspace += staged_output_bytes(s);
  }
  return p;
}

void gemm_m(const detail::MGemmStep& s, void* stream_ptr) {
  // FP8 blockwise: through these BF16 kernels (src/cuda/quant/fp8_block_gemm.cu).
  if (s.gemm.a.mx.data.rank > 0 && s.gemm.a.mx.format == QuantFormat::fp8_block)
    return gemm_m_fp8_block(s, stream_ptr, &portable::gemm_m);
  const cudaStream_t stream = as_stream(stream_ptr);
  const MGroupedGemmArgs& g = s.gemm;
  const bool fp8 = g.a.mx.data.rank > 0;
  if (fp8 != g.b.is_mxfp8())
    throw Error("gemm.b", "cuda_portable needs A and B in the same format (both BF16 or both MXFP8)");
  const TensorView& av = operand_view(g.a);
  const int64_t rows = av.shape[0], k = av.shape[1], experts = g.offsets.experts();
  const int64_t n = detail::gemm_width(s);
  const Epi epi = to_epi(s.epilogue);
  if (experts <= 0) return;

  MGemmParams p;
  p.rows = rows;
  p.n = n;
  p.k = k;
  p.ffn = s.ffn;
  p.a = static_cast<const uint8_t*>(av.data);
  const int64_t elem = fp8 ? 1 : 2;
  p.b = expert_ptrs(g.b.data, n * k, elem);
  p.b_layout = g.b.layout;
  if (fp8) {
    p.a_scales = g.a.mx.scales.ptr<const uint8_t>();
    p.a_layout = g.a.mx.layout;
    const int64_t sb = g.b_kn ? colwise_matrix_scale_bytes(k, n) : rowwise_scale_bytes(n, k);
    p.b_scales = expert_ptrs(g.b.scales, sb, 1);
  }
  p.bias = g.bias.ptr<const uint16_t>();
  p.bias_by_probs = s.bias_scale_by_probs;
  p.probs = s.probs.ptr<const float>();
  p.d = g.d.data;
  p.d_f32 = g.d.dtype == DType::f32;
  p.glu = s.glu;
  p.glu_layout = s.glu_layout;
  if (epi == Epi::glu_forward) p.c_out = s.c.ptr<uint16_t>();
  if (epi == Epi::glu_backward) p.c_in = s.c.ptr<const uint16_t>();
  // The GLU backward quantizes dC in its epilogue from two staged halves (a- and b-columns); with the
  // halves layout and F not a multiple of 32, a row-wise 32-column block of dC straddles the two
  // (columns F-16..F+15 for F = 272), so there the kernel writes bf16 dC (into a transient copy when
  // the step asked for none) and the CUDA quantizer reads it, as on cuda_sm90.
  const bool unfused = epi == Epi::glu_backward && s.ffn % kMxBlock != 0 && has_quantized_outputs(s);
  Workspace staged(unfused ? staged_output_bytes(s) : 0, stream);
  const detail::MGemmStep su = unfused ? with_bf16_output(s, staged) : s;
  if (epi != Epi::store) {
    p.out_bf16 = su.out_bf16.ptr<uint16_t>();
    if (!unfused) p.out_mx = fused_mx_outputs(s, stream);
  }
  const int64_t out_cols_per_tile = epi == Epi::glu_forward ? kGluFwdF : kBlockN;
  const int64_t out_cols = epi == Epi::store ? n : s.ffn;
  p.n_tiles = static_cast<int32_t>((out_cols + out_cols_per_tile - 1) / out_cols_per_tile);

  const int32_t tiles_bound = m_tiles_bound(rows, experts, kBlockM);
  const bool bwd = epi == Epi::glu_backward;
  const bool want_dprob = bwd && s.dprobs.data != nullptr;
  const bool want_db1 = bwd && s.db1.dst.data != nullptr;
  const int64_t dprob_floats = want_dprob ? static_cast<int64_t>(p.n_tiles) * rows : 0;
  const int64_t db1_floats = want_db1 ? static_cast<int64_t>(tiles_bound) * 2 * s.ffn : 0;
  Workspace ws(group_schedule_bytes(experts, rows, kBlockM) + Workspace::aligned(dprob_floats * 4) +
                   Workspace::aligned(db1_floats * 4),
               stream);
  if (want_dprob) {
    p.ws_dprob = ws.take<float>(dprob_floats);
    // Rows outside every group (only with bad offsets) then still read defined zeros.
    MXMOE_CUDA_CHECK(cudaMemsetAsync(p.ws_dprob, 0, static_cast<size_t>(dprob_floats) * 4, stream));
  }
  if (want_db1) p.ws_db1 = ws.take<float>(db1_floats);

  p.sched = build_group_schedule(g.offsets.data(), experts, rows, kBlockM, ws, stream);

  if (fp8) {
    if (g.b_kn) launch_by_epilogue<true, Major::mn>(epi, p, stream);
    else launch_by_epilogue<true, Major::k>(epi, p, stream);
  } else {
    if (g.b_kn) launch_by_epilogue<false, Major::mn>(epi, p, stream);
    else launch_by_epilogue<false, Major::k>(epi, p, stream);
  }

  if (want_dprob)
    launch_reduce_dprob(p.ws_dprob, p.n_tiles, rows, s.dprob_add.ptr<const float>(), s.dprobs.ptr<float>(), stream);
  if (want_db1) {
    const GradDst dst{s.db1.dst.data, s.db1.dst.dtype == DType::f32, s.db1.accumulate};
    launch_reduce_expert_tiles(p.ws_db1, 2 * s.ffn, p.sched, dst, stream);
  }
  if (unfused) quantize_outputs(s, su.out_bf16, stream_ptr);
}

}  // namespace mxmoe::cuda::portable
