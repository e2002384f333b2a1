// Device-side parameters of the sm90 grouped GEMM kernels, built on the host by gemm_m.cu /
// gemm_k.cu from the step arguments. Plain structs, passed by value (the TMA descriptors travel
// separately as __grid_constant__ kernel parameters).
#pragma once
#include <cstdint>

#include "src/common/experts.h"
#include "src/common/glu.h"
#include "src/cuda/common/group_schedule.h"
#include "src/cuda/common/mx_out.h"

namespace mxmoe::cuda::sm90 {

// Which axis of an operand's shared-memory tile is contiguous: K (tokens x K activations, weights
// [N, K] in fprop) or MN (weights [K, N] in dgrad; both wgrad operands, which run over tokens).
enum class Major : uint8_t { k, mn };

// m-grouped: rows of A are tokens, the group decides B_e. k-grouped: the group is the K range.
enum class Grouping : uint8_t { m, k };

enum class Epi : uint8_t {
  store,         // D[t, n] = acc (+ bias_e[n], or p_t * bias_e[n])
  glu_forward,   // C = acc + b1 -> bf16 [T, 2F]; A = p_t * act(a, b) -> bf16 [T, F]
  glu_backward,  // g = acc; dC = act'(C, g, p) -> bf16 [T, 2F]; dprob / db1 partials
  wgrad,         // D_e[m, n] = acc (+ D_e when accumulating into fp32)
};

// How the producer fetches B: one [BN, 64] box of B_e [N, K] (k_rows); the a and b halves of a GLU
// tile as two [BN/2, 64] boxes (glu_halves / glu_interleave32: FC1 rows of features f0..f0+BN/2);
// BN/64 boxes of [64 k, 64 n] from B_e [K, N] (mn_boxes). FP8 blockwise: the same boxes of 128 e4m3
// values of K (k_rows, glu_halves, glu_interleave32).
enum class BLoad : uint8_t { k_rows, glu_halves, glu_interleave32, mn_boxes };

struct KernelParams {
  GroupSchedule sched;    // group ranges; m-grouped: the linear 128-row m-tile table too
  int32_t experts = 0;
  int32_t n_tiles = 0;    // output tiles along N
  int32_t m_tiles = 0;    // k-grouped: tiles along M per expert
  int32_t k_blocks = 0;   // m-grouped: ceil(K / 64)
  int64_t rows = 0;       // T
  int64_t m = 0, n = 0;   // k-grouped D_e [m, n]; m-grouped n = the output width
  BLoad b_load = BLoad::k_rows;

  // MXFP8 A (Mainloop::mx_a): e4m3 tokens through the A tensor map, their row-wise E8M0 scales here
  // (mxfp8_layout.h: row * cols + k-block, or the swizzled 128 x 4 tiles), cols = roundup(K/32, 4).
  const uint8_t* a_scales = nullptr;
  int32_t a_scale_cols = 0;
  int32_t a_k32 = 0;  // K / 32: scale columns past it are padding (any byte), read as 1
  bool a_scale_swizzled = false;

  // FP8 blockwise (Mainloop::fp8_block): A's f32 inverse scales MN-major [ceil(K/128)][a_sinv_pitch]
  // (row r, k-block kb at kb * a_sinv_pitch + r); B's [E][b_nbs][b_kbs] (128x128 blocks of B_e
  // [N, K]); the 128-row blocks of B_e holding the tile's two column halves (glu_halves: the a and b
  // rows of W1 are F rows apart) come from b_load and ffn.
  const float* a_sinv = nullptr;
  int64_t a_sinv_pitch = 0;
  const float* b_sinv = nullptr;
  int32_t b_nbs = 0, b_kbs = 0;
  // k-grouped FP8 blockwise (wgrad): both operands are token blocks transposed to [M or N, Tp]
  // (transpose_token_blocks), group e's k-blocks the 128-column blocks tile_start_e .. (tile_at's
  // kTiles128); A's scales [block rows][a_sinv_pitch = M], B's [block rows][b_sinv_pitch = N].
  int64_t b_sinv_pitch = 0;

  // store / wgrad
  void* d = nullptr;      // m-grouped store: [T, n] (bf16 or f32)
  ExpertPtrs d_experts;   // wgrad: D_e [m, n]
  bool d_f32 = false;
  bool accumulate = false;
  const uint16_t* bias = nullptr;  // bf16 [E, n]
  bool bias_by_probs = false;
  const float* probs = nullptr;    // f32 [T] (nullptr: p = 1)

  // GLU epilogues
  int64_t ffn = 0;
  GluParams glu{};
  GluLayout glu_layout = GluLayout::halves;
  uint16_t* c_out = nullptr;       // glu_forward: bf16 [T, 2F] (optional)
  const uint16_t* c_in = nullptr;  // glu_backward: bf16 [T, 2F]
  uint16_t* out_bf16 = nullptr;    // A [T, F] or dC [T, 2F] (optional with out_mx)
  MxOut out_mx;                    // mx_a kernels: A or dC quantized by the epilogue (MXFP8 row / col)
  float* ws_dprob = nullptr;       // glu_backward: (n_tiles, T) row partial sums
  float* ws_db1 = nullptr;         // glu_backward: (m-tiles, 2F) column partial sums
};

}  // namespace mxmoe::cuda::sm90
