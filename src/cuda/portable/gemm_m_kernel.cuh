// m-grouped GEMM kernel of the portable backend (any GPU from sm_80):
//   acc[t, n] = sum_k A[t, k] * B_e(n, k) for the rows t of expert e, then an epilogue (Epi).
//   A: [T, K] bf16 or MXFP8 row-wise (K-major). B_e: [N, K] (Major::k, fprop) or [K, N] (Major::mn,
//   dgrad), bf16 or MXFP8 (row-wise scales for [N, K], column-wise one-group scales for [K, N]),
//   dense [E, ...] or per-expert pointers (ExpertPtrs).
// Grid: one CTA per (linear m-tile, n-tile) over the upper bound ceil(T/128) + E of m-tiles, grouped
// by kGroupM m-tiles so that CTAs running together share A and B tiles in L2. Each CTA reads its
// (expert, first row) from the device-built schedule and exits if it is past the real tile count.
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuGemmM*:*GpuGlu*' (correctness, per backend);
//      mxmoe bench (every step's time, fc1_fprop / fc2_fprop / fc1_dgrad / fc2_dgrad are this kernel).
#pragma once
#include "src/cuda/common/check.h"
#include "src/cuda/portable/epilogue_glu.cuh"
#include "src/cuda/portable/epilogue_store.cuh"

namespace mxmoe::cuda::portable {

template <bool Fp8, Major BMajor, Epi E>
struct MGemmConfig {
  static constexpr bool kFp8 = Fp8;
  static constexpr Major kBMajor = BMajor;
  static constexpr Epi kEpi = E;
  static constexpr int kStages = kFp8 ? 5 : 4;  // e4m3 tiles wait one stage less (decode ahead)
  static constexpr int kGroupM = 8;  // m-tiles per rasterization group
  using Mainloop = portable::Mainloop<kFp8, Major::k, kBMajor, kStages>;
  // Output columns (N for store / glu_backward, GLU features for glu_forward) per CTA.
  static constexpr int kTileOut = kEpi == Epi::glu_forward ? kGluFwdFeatures : kTileMN;
  static constexpr int kEpiSmem = kEpi == Epi::glu_forward ? kGluFwdSmem : (kEpi == Epi::glu_backward ? kGluBwdSmem : 0);
  static constexpr int kSmemBytes = Mainloop::kSmemBytes > kEpiSmem ? Mainloop::kSmemBytes : kEpiSmem;
};

template <class Cfg>
__global__ void __launch_bounds__(kThreads, 2) gemm_m_kernel(const MGemmParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int kElem = Cfg::kFp8 ? 1 : 2;

  // Grouped rasterization: kGroupM consecutive m-tiles sweep all n-tiles together.
  const int bid = blockIdx.x;
  const int group_size = Cfg::kGroupM * p.n_tiles;
  const int first_m = bid / group_size * Cfg::kGroupM;
  const int group_m = min(p.sched.tiles_bound - first_m, Cfg::kGroupM);
  const int m_tile = first_m + (bid % group_size) % group_m;
  const int n_tile = (bid % group_size) / group_m;

  const TileInfo ti = p.sched.tiles[m_tile];
  if (ti.expert < 0) return;
  const int expert = ti.expert;
  const GroupInfo g = p.sched.groups[expert];
  const int64_t row0 = ti.row0, row_end = min(row0 + kTileMN, static_cast<int64_t>(g.end));
  const int64_t n0 = static_cast<int64_t>(n_tile) * Cfg::kTileOut;

  // B tile column j -> GEMM column (FC1 column for glu_forward), -1 outside.
  auto b_col = [&](int j) -> int64_t {
    if constexpr (Cfg::kEpi == Epi::glu_forward) {
      return glu_forward_b_row(j, n0, p.ffn, p.glu_layout);
    } else {
      return n0 + j < p.n ? n0 + j : -1;
    }
  };
  auto a_row = [&](int r) -> int64_t { return row0 + r < row_end ? row0 + r : -1; };

  typename Cfg::Mainloop::LoadA la;
  la.init(p.a, p.k * kElem, static_cast<int>(p.k), a_row);
  typename Cfg::Mainloop::LoadB lb;
  const uint8_t* b_base = p.b.template at<const uint8_t>(expert);
  lb.init(b_base, (Cfg::kBMajor == Major::k ? p.k : p.n) * kElem, static_cast<int>(p.k), b_col);

  ScaleAddr scale;
  int64_t scale_mn = -1;
  if constexpr (Cfg::kFp8) {
    const int local = threadIdx.x % kTileMN;
    if (threadIdx.x < kTileMN) {
      scale = ScaleAddr{p.a_scales, p.k, 0, 0, BlockAxis::row, p.a_layout};
      scale_mn = a_row(local);
    } else {
      const uint8_t* sb = p.b_scales.template at<const uint8_t>(expert);
      scale = Cfg::kBMajor == Major::k ? ScaleAddr{sb, p.k, 0, 0, BlockAxis::row, p.b_layout}
                                       : ScaleAddr{sb, p.n, 0, p.k, BlockAxis::col, p.b_layout};
      scale_mn = b_col(local);
    }
  }

  Accum acc;
  Cfg::Mainloop::run(acc, smem, la, lb, static_cast<int>((p.k + kTileK - 1) / kTileK), scale, scale_mn);

  if constexpr (Cfg::kEpi == Epi::store) {
    epilogue_store(acc, p, expert, row0, row_end, n0);
  } else if constexpr (Cfg::kEpi == Epi::glu_forward) {
    epilogue_glu_forward(acc, p, smem, expert, g, row0, row_end, n0);
  } else {
    epilogue_glu_backward(acc, p, smem, g, row0, row_end, n0, m_tile, n_tile);
  }
}

template <bool Fp8, Major BMajor, Epi E>
void launch_gemm_m(const MGemmParams& p, cudaStream_t stream) {
  using Cfg = MGemmConfig<Fp8, BMajor, E>;
  const int64_t ctas = static_cast<int64_t>(p.sched.tiles_bound) * p.n_tiles;
  if (ctas == 0) return;
  MXMOE_CUDA_CHECK(cudaFuncSetAttribute(gemm_m_kernel<Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        Cfg::kSmemBytes));
  gemm_m_kernel<Cfg><<<static_cast<unsigned>(ctas), kThreads, Cfg::kSmemBytes, stream>>>(p);
  MXMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace mxmoe::cuda::portable
