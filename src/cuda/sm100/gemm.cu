// Host entries of the sm100 MXFP8 grouped GEMMs (sm100_ops.h): what the kernels take, then per call
// the group schedule on the device (128-row m-tiles for the m-grouped GEMM, row ranges and scale
// chunks for the k-grouped one), the repack of every scale operand into CUTLASS's per-group layout
// (grouped_operands.cu), and one CUTLASS grouped GEMM (gemm_m_*.cu, gemm_k_1sm.cu). No host reads
// of the offsets, no stream sync. Host code only; no CUTLASS headers here.
// Run (Blackwell only): MXMOE_BACKEND=cuda_sm100 <build>/tests/mxmoe_gpu_tests --gtest_filter='*cuda_sm100*'
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include "src/cuda/common/check.h"
#include "src/cuda/common/group_schedule.h"
#include "src/cuda/common/workspace.h"
#include "src/cuda/sm100/kernels.h"
#include "src/cuda/sm100/scale_repack.h"
#include "src/cuda/sm100/sm100_ops.h"

namespace mxmoe::cuda::sm100 {
namespace {

constexpr int64_t kTmaAlign = 16;      // bytes: TMA base addresses and row pitches
constexpr int64_t kMnMajorAlign = 16;  // e4m3 elements along a contiguous MN axis (one 16-byte TMA row piece)

// Quantized operands whose scales are not E8M0 per 32 values (FP8 blockwise: f32 per 128).
constexpr const char* kNotMxfp8 =
    "scales that are not E8M0: cuda_sm100 runs MXFP8 GEMMs only (block-scaled tcgen05 MMA, E8M0 scales per 32)";

bool tma_aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kTmaAlign == 0; }
bool fits_int(int64_t v) { return v <= std::numeric_limits<int>::max(); }

}  // namespace

std::string gemm_m_refusal(const detail::MGemmStep& s) {
  const MGroupedGemmArgs& g = s.gemm;
  if (g.a.is_mxfp8() != g.b.is_mxfp8()) return "one MXFP8 operand and one BF16 operand";
  if (!g.a.is_mxfp8()) return "BF16 operands: cuda_sm100 runs MXFP8 GEMMs only (block-scaled tcgen05 MMA)";
  const DType b_scales = g.b.scales.per_expert() ? g.b.scales.dtype : g.b.scales.dense.dtype;
  if (g.a.mx.scales.dtype != DType::e8m0 || b_scales != DType::e8m0) return kNotMxfp8;
  if (s.epilogue == detail::Epilogue::glu_forward)
    return "the glu_forward epilogue (activation, probabilities, bf16/MXFP8 A) is not expressed in cuda_sm100's "
           "CUTLASS epilogue yet";
  if (s.epilogue == detail::Epilogue::glu_backward)
    return "the glu_backward epilogue (activation gradient, dprob, db1) is not expressed in cuda_sm100's CUTLASS "
           "epilogue yet";
  if (g.bias.data != nullptr)
    return "a bias in the store epilogue is not expressed in cuda_sm100's CUTLASS epilogue yet";
  if (s.out_row.data.data != nullptr || s.out_col.data.data != nullptr) return "MXFP8 outputs of the store epilogue";
  if (g.d.data == nullptr) return "store epilogue without an output";
  if (g.d.dtype != DType::bf16) return "an f32 output: the sm100 m-grouped kernels store bf16";
  if (g.a.mx.axis != BlockAxis::row) return "MXFP8 A must be row-wise (blocks along K)";
  if (g.b.data.per_expert())
    return "per-expert weight pointers: the sm100 kernels read one dense [E, ...] weight tensor (whose 16-byte "
           "alignment the host can check)";
  const int64_t rows = g.a.mx.data.shape[0], k = g.a.mx.data.shape[1], n = g.d.shape[1];
  if (!fits_int(rows) || !fits_int(n) || !fits_int(k))
    return "a GEMM extent past 2^31 - 1 (CUTLASS's int problem shapes)";
  if (k % kScaleBlock != 0) return "K = " + std::to_string(k) + " is not a multiple of 32 (whole MXFP8 blocks)";
  if (!g.b_kn && n % 8 != 0)
    return "N = " + std::to_string(n) + " is not a multiple of 8 (bf16 D rows must be 16-byte multiples for TMA)";
  if (g.b_kn && n % kMnMajorAlign != 0)
    return "B_e [K, N] with N = " + std::to_string(n) + " not a multiple of 16 (TMA rows of e4m3 bytes)";
  if (!tma_aligned(g.a.mx.data.data) || !tma_aligned(g.b.data.dense.data) || !tma_aligned(g.d.data))
    return "an operand's address is not 16-byte aligned (TMA)";
  return {};
}

std::string gemm_k_refusal(const KGroupedGemmArgs& a) {
  if (a.a.is_mxfp8() != a.b.is_mxfp8()) return "one MXFP8 operand and one BF16 operand";
  if (!a.a.is_mxfp8()) return "BF16 operands: cuda_sm100 runs MXFP8 GEMMs only (block-scaled tcgen05 MMA)";
  if (a.a.mx.scales.dtype != DType::e8m0 || a.b.mx.scales.dtype != DType::e8m0) return kNotMxfp8;
  if (a.a.mx.axis != BlockAxis::col || a.b.mx.axis != BlockAxis::col)
    return "MXFP8 A and B must be column-wise (blocks along the tokens)";
  if (a.d.per_expert())
    return "per-expert output pointers: the sm100 kernel writes one dense [E, M, N] tensor (whose 16-byte alignment "
           "the host can check)";
  if (a.d.dense.dtype != DType::f32) return "a bf16 output: the sm100 k-grouped kernel stores f32 (beta 0 or 1)";
  const int64_t rows = a.a.mx.data.shape[0], m = a.a.mx.data.shape[1], n = a.b.mx.data.shape[1];
  if (!fits_int(rows) || !fits_int(m) || !fits_int(n))
    return "a GEMM extent past 2^31 - 1 (CUTLASS's int problem shapes)";
  if (m % kMnMajorAlign != 0 || n % kMnMajorAlign != 0)
    return "M = " + std::to_string(m) + ", N = " + std::to_string(n) +
           ": both must be multiples of 16 (TMA rows of e4m3 bytes along the contiguous axis)";
  if (!tma_aligned(a.a.mx.data.data) || !tma_aligned(a.b.mx.data.data) || !tma_aligned(a.d.dense.data))
    return "an operand's address is not 16-byte aligned (TMA)";
  return {};
}

void gemm_m(const detail::MGemmStep& s, void* stream_ptr) {
  if (const std::string why = gemm_m_refusal(s); !why.empty()) throw Error("cuda_sm100", why);
  const cudaStream_t stream = as_stream(stream_ptr);
  const MGroupedGemmArgs& g = s.gemm;
  const int64_t experts = g.offsets.experts();
  const int64_t rows = g.a.mx.data.shape[0], k = g.a.mx.data.shape[1], n = g.d.shape[1];
  if (experts <= 0 || rows == 0 || n == 0) return;

  const int64_t sfa_bytes = token_rows_capacity(rows, experts, k), sfb_bytes = experts * rowwise_scale_bytes(n, k);
  Workspace ws(
      group_schedule_bytes(experts, rows, kSwizzleRows) + Workspace::aligned(sfa_bytes) + Workspace::aligned(sfb_bytes),
      stream);
  const GroupSchedule sched = build_group_schedule(g.offsets.data(), experts, rows, kSwizzleRows, ws, stream);
  uint8_t* sfa = ws.take<uint8_t>(sfa_bytes);
  uint8_t* sfb = ws.take<uint8_t>(sfb_bytes);
  repack_token_row_scales(g.a.mx.scales.ptr<const uint8_t>(), g.a.mx.layout, sched, k, sfa, stream);
  const int64_t b_scale_bytes = g.b_kn ? colwise_matrix_scale_bytes(k, n) : rowwise_scale_bytes(n, k);
  repack_expert_scales(expert_ptrs(g.b.scales, b_scale_bytes, 1), g.b_kn ? BlockAxis::col : BlockAxis::row, g.b.layout,
                       experts, n, k, sfb, stream);

  const MGroupedOperands op{.groups = sched.groups,
                            .experts = static_cast<int>(experts),
                            .n = static_cast<int>(n),
                            .k = static_cast<int>(k),
                            .a = g.a.mx.data.ptr<const uint8_t>(),
                            .sfa = sfa,
                            .b = g.b.data.dense.ptr<const uint8_t>(),
                            .sfb = sfb,
                            .d = g.d.ptr<uint16_t>()};
  if (g.b_kn) run_mgrouped_kn_1sm(op, stream);
  else run_mgrouped_1sm(op, stream);
}

void gemm_k(const KGroupedGemmArgs& a, void* stream_ptr) {
  if (const std::string why = gemm_k_refusal(a); !why.empty()) throw Error("cuda_sm100", why);
  const cudaStream_t stream = as_stream(stream_ptr);
  const int64_t experts = a.offsets.experts();
  const int64_t rows = a.a.mx.data.shape[0], m = a.a.mx.data.shape[1], n = a.b.mx.data.shape[1];
  if (experts <= 0 || m == 0 || n == 0) return;

  const int64_t sfa_bytes = colwise_scale_bytes(rows, m, experts), sfb_bytes = colwise_scale_bytes(rows, n, experts);
  Workspace ws(group_schedule_bytes(experts, rows, /*block_m=*/0) + Workspace::aligned(sfa_bytes) +
                   Workspace::aligned(sfb_bytes),
               stream);
  const GroupSchedule sched = build_group_schedule(a.offsets.data(), experts, rows, /*block_m=*/0, ws, stream);
  float* d = a.d.dense.ptr<float>();
  // An empty group gets no tile (grouped_gemm.cuh, CUTLASS #2674): its D_e is 0, or left as it is.
  if (!a.accumulate) zero_empty_groups(sched.groups, experts, m * n, d, stream);
  if (rows == 0) return;
  uint8_t* sfa = ws.take<uint8_t>(sfa_bytes);
  uint8_t* sfb = ws.take<uint8_t>(sfb_bytes);
  repack_token_col_scales(a.a.mx.scales.ptr<const uint8_t>(), a.a.mx.layout, sched, rows, m, sfa, stream);
  repack_token_col_scales(a.b.mx.scales.ptr<const uint8_t>(), a.b.mx.layout, sched, rows, n, sfb, stream);
  run_kgrouped_1sm({.groups = sched.groups,
                    .experts = static_cast<int>(experts),
                    .m = static_cast<int>(m),
                    .n = static_cast<int>(n),
                    .a = a.a.mx.data.ptr<const uint8_t>(),
                    .sfa = sfa,
                    .b = a.b.mx.data.ptr<const uint8_t>(),
                    .sfb = sfb,
                    .d = d,
                    .accumulate = a.accumulate},
                   stream);
}

}  // namespace mxmoe::cuda::sm100
