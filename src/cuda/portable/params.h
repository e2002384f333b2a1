// Device-side parameters of the portable grouped GEMM kernels, built on the host from the step
// arguments (gemm_m.cu, gemm_k.cu). Plain structs passed by value as kernel parameters.
#pragma once
#include <cstdint>

#include "mxmoe/mxfp8_layout.h"
#include "src/common/experts.h"
#include "src/common/glu.h"
#include "src/cuda/common/group_schedule.h"
#include "src/cuda/common/mx_tile_quant.cuh"

namespace mxmoe::cuda::portable {

// Which axis of an operand tile is contiguous in memory: K (A of gemm_m, B_e [N, K]) or MN
// (B_e [K, N] of dgrad, both operands of gemm_k).
enum class Major : uint8_t { k, mn };

// Epilogue of an m-grouped GEMM kernel (detail::Epilogue, as a compile-time choice).
enum class Epi : uint8_t { store, glu_forward, glu_backward };


struct MGemmParams {
  GroupSchedule sched;  // block_m = kTileMN
  int32_t n_tiles = 0;  // CTA columns
  int64_t rows = 0;     // T
  int64_t n = 0;        // GEMM width: N (store), 2F (glu_forward), F (glu_backward)
  int64_t k = 0;
  int64_t ffn = 0;      // F (glu epilogues)

  const uint8_t* a = nullptr;         // [T, K] bf16 or e4m3
  const uint8_t* a_scales = nullptr;  // row-wise
  ScaleLayout a_layout = ScaleLayout::compact;
  ExpertPtrs b;                       // B_e [N, K] or [K, N]
  ExpertPtrs b_scales;                // row-wise [N, K] or column-wise [K, N] (one group)
  ScaleLayout b_layout = ScaleLayout::compact;

  const uint16_t* bias = nullptr;  // bf16 [E, n]
  bool bias_by_probs = false;
  const float* probs = nullptr;    // f32 [T] (nullptr: p = 1)

  void* d = nullptr;  // store: [T, n]
  bool d_f32 = false;

  GluParams glu{};
  GluLayout glu_layout = GluLayout::halves;
  uint16_t* c_out = nullptr;        // glu_forward: bf16 [T, 2F] (optional)
  const uint16_t* c_in = nullptr;   // glu_backward: bf16 [T, 2F]
  uint16_t* out_bf16 = nullptr;     // A [T, F] or dC [T, 2F]
  MxOut out_mx;
  float* ws_dprob = nullptr;        // glu_backward: (n_tiles, T) row partial sums
  float* ws_db1 = nullptr;          // glu_backward: (tiles_bound, 2F) column partial sums
};

struct KGemmParams {
  const GroupInfo* groups = nullptr;
  int64_t m = 0, n = 0;  // D_e is [m, n]
  int32_t m_tiles = 0, n_tiles = 0;
  const uint8_t* a = nullptr;  // [T, m]
  const uint8_t* b = nullptr;  // [T, n]
  const uint8_t* a_scales = nullptr;
  const uint8_t* b_scales = nullptr;
  ScaleLayout a_layout = ScaleLayout::compact, b_layout = ScaleLayout::compact;
  ExpertPtrs d;
  bool d_f32 = true;
  bool accumulate = false;
};

}  // namespace mxmoe::cuda::portable
