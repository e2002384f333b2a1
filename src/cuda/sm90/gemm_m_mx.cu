// The sm90 m-grouped GEMMs with an MXFP8 A (gemm_kernel.cuh Mx): their kernel configurations, in a
// translation unit of their own so that the BF16 and MXFP8 kernels compile in parallel, and the
// dequantization of MXFP8 weights into the BF16 copy that the Mx::a kernels read.
#include <cuda_runtime.h>

#include "src/cuda/common/check.h"
#include "src/cuda/sm90/gemm_m_plan.h"
#include "src/cuda/sm90/launch.cuh"

namespace mxmoe::cuda::sm90 {
namespace {

constexpr int kWideN = 256, kNarrowN = 128, kPair = 2;
// FP8 A, BF16 B: every epilogue.
using AStoreKK = KernelConfig<kWideN, Major::k, Major::k, Grouping::m, Epi::store, kPair, Mx::a>;
using AStoreKMN = KernelConfig<kWideN, Major::k, Major::mn, Grouping::m, Epi::store, kPair, Mx::a>;
using AStoreKKNarrow = KernelConfig<kNarrowN, Major::k, Major::k, Grouping::m, Epi::store, kPair, Mx::a>;
using AStoreKMNNarrow = KernelConfig<kNarrowN, Major::k, Major::mn, Grouping::m, Epi::store, kPair, Mx::a>;
using AGluFwd = KernelConfig<kWideN, Major::k, Major::k, Grouping::m, Epi::glu_forward, kPair, Mx::a>;
using AGluBwd = KernelConfig<kWideN, Major::k, Major::mn, Grouping::m, Epi::glu_backward, kPair, Mx::a>;
using AGluBwdNarrow = KernelConfig<kNarrowN, Major::k, Major::mn, Grouping::m, Epi::glu_backward, kPair, Mx::a>;
// FP8 A and B (B converted in shared memory): the store epilogue.
using ABStoreKK = KernelConfig<kWideN, Major::k, Major::k, Grouping::m, Epi::store, kPair, Mx::ab>;
using ABStoreKMN = KernelConfig<kWideN, Major::k, Major::mn, Grouping::m, Epi::store, kPair, Mx::ab>;
using ABStoreKKNarrow = KernelConfig<kNarrowN, Major::k, Major::k, Grouping::m, Epi::store, kPair, Mx::ab>;
using ABStoreKMNNarrow = KernelConfig<kNarrowN, Major::k, Major::mn, Grouping::m, Epi::store, kPair, Mx::ab>;

template <class Wide, class Narrow>
void launch_width(const MPlan& plan, bool wide, cudaStream_t stream) {
  if (wide) launch<Wide>(plan.params, plan.launch_tiles, plan.a, plan.b0, plan.b1, stream);
  else launch<Narrow>(plan.params, plan.launch_tiles, plan.a, plan.b0, plan.b1, stream);
}

// Rows of all experts over the grid (blocks stride over the E * rows rows), 8 consecutive values of
// a row per thread and step (cols % 8 == 0): 8 bytes in, 16 bytes out. Index math per row, not per
// value (64-bit divisions made the first version compute-bound).
__global__ void __launch_bounds__(256) dequantize_experts_kernel(const uint8_t* __restrict__ data,
                                                                 const uint8_t* __restrict__ scales, int64_t scale_bytes,
                                                                 int64_t rows, int64_t cols, bool colwise, bool swizzled,
                                                                 int64_t all_rows, uint16_t* __restrict__ dst) {
  const ScaleLayout layout = swizzled ? ScaleLayout::swizzled : ScaleLayout::compact;
  const int32_t chunks = static_cast<int32_t>(cols / 8);
  for (int64_t gr = blockIdx.x; gr < all_rows; gr += gridDim.x) {
    const int64_t e = gr / rows, r = gr - e * rows;
    const uint2* src = reinterpret_cast<const uint2*>(data + gr * cols);
    uint4* out = reinterpret_cast<uint4*>(dst + gr * cols);
    const uint8_t* sc = scales + e * scale_bytes;
    for (int32_t ch = threadIdx.x; ch < chunks; ch += blockDim.x) {
      const int64_t c = static_cast<int64_t>(ch) * 8;
      const uint2 raw = __ldg(src + ch);
      const uint32_t w[2] = {raw.x, raw.y};
      uint32_t o[4];
      const float srow = colwise ? 0.0f : e8m0_f32(__ldg(sc + rowwise_scale_index(r, c / 32, cols, layout)));
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float s0 = srow, s1 = srow;
        if (colwise) {
          s0 = e8m0_f32(__ldg(sc + colwise_scale_index(0, rows, r / 32, c + 2 * j, cols, layout)));
          s1 = e8m0_f32(__ldg(sc + colwise_scale_index(0, rows, r / 32, c + 2 * j + 1, cols, layout)));
        }
        const uint32_t two = w[j / 2] >> (16 * (j % 2));
        uint32_t h;
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(static_cast<uint16_t>(two)));
        float lo, hi;
        asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(static_cast<uint16_t>(h & 0xFFFF)));
        asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(static_cast<uint16_t>(h >> 16)));
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(o[j]) : "f"(hi * s1), "f"(lo * s0));
      }
      out[ch] = make_uint4(o[0], o[1], o[2], o[3]);
    }
  }
}

}  // namespace

void dequantize_expert_weights(const ExpertOperand& b, int64_t experts, int64_t rows, int64_t cols, BlockAxis axis,
                               uint16_t* dst, cudaStream_t stream) {
  if (cols % 8 != 0) throw Error("cuda_sm90", "dequantize_expert_weights: cols = " + std::to_string(cols) + " is not a multiple of 8");
  const bool colwise = axis == BlockAxis::col;
  const int64_t scale_bytes = colwise ? colwise_matrix_scale_bytes(rows, cols) : rowwise_scale_bytes(rows, cols);
  const int64_t all_rows = experts * rows;
  if (all_rows == 0 || cols == 0) return;
  const int64_t cap = 16L * sm_count();
  const int blocks = static_cast<int>(all_rows < cap ? all_rows : cap);
  dequantize_experts_kernel<<<blocks, 256, 0, stream>>>(static_cast<const uint8_t*>(b.data.dense.data),
                                                        static_cast<const uint8_t*>(b.scales.dense.data), scale_bytes,
                                                        rows, cols, colwise, b.layout == ScaleLayout::swizzled, all_rows,
                                                        dst);
  MXMOE_CUDA_CHECK(cudaGetLastError());
}

void launch_gemm_m_mx(const detail::MGemmStep& s, const MPlan& plan, int bn, cudaStream_t stream) {
  const bool wide = bn == kWideN;
  if (s.gemm.b.is_mxfp8()) {
    if (s.gemm.b_kn) launch_width<ABStoreKMN, ABStoreKMNNarrow>(plan, wide, stream);
    else launch_width<ABStoreKK, ABStoreKKNarrow>(plan, wide, stream);
    return;
  }
  switch (s.epilogue) {
    case detail::Epilogue::glu_forward:
      launch<AGluFwd>(plan.params, plan.launch_tiles, plan.a, plan.b0, plan.b1, stream);
      break;
    case detail::Epilogue::glu_backward: launch_width<AGluBwd, AGluBwdNarrow>(plan, wide, stream); break;
    case detail::Epilogue::store:
      if (s.gemm.b_kn) launch_width<AStoreKMN, AStoreKMNNarrow>(plan, wide, stream);
      else launch_width<AStoreKK, AStoreKKNarrow>(plan, wide, stream);
      break;
  }
}

}  // namespace mxmoe::cuda::sm90
