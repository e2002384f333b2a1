// The launch interface of the sm90 grouped-GEMM kernels: what the host planner (gemm_m.cu, gemm_k.cu)
// fills in, and one launch function per kernel family, each compiled in its own translation unit
// (gemm_m_bf16.cu, gemm_m_mx.cu, gemm_m_blk.cu, gemm_k_kernels.cu) so the families build in parallel.
// Nothing here knows the dispatch's step types: the planner turns a step into these structs.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include "src/cuda/sm90/params.h"

namespace mxmoe::cuda::sm90 {

// One m-grouped launch: the kernel parameters, the TMA descriptors of A (tokens [T, K]) and of B_e
// (b0 and b1: the a and b halves of W1 for glu_forward; the same map otherwise), and an upper bound of
// the output tiles (the kernel reads the real count on the device; 0: nothing to launch).
struct MLaunch {
  KernelParams params;
  CUtensorMap a{}, b0{}, b1{};
  int64_t tiles = 0;
};

// One k-grouped (wgrad) launch: A [T, M] and B [T, N], token-major.
struct KLaunch {
  KernelParams params;
  CUtensorMap a{}, b{};
  int64_t tiles = 0;
};

// Which mainloop a launch runs (the A and B operands it reads from the ring; kernel_config.cuh).
enum class Mainloop : uint8_t {
  bf16,       // BF16 A and B (mainloop_bf16.cuh)
  mx_a,       // MXFP8 A (e4m3 + E8M0 scales, converted to BF16 fragments in registers), BF16 B (mainloop_mx.cuh)
  fp8_block,  // FP8 blockwise A and B (FP8 wgmma, promotion per 128 values of K; mainloop_fp8_block.cuh)
};

// Tile shape: 128 rows (tokens, or the wgrad's M) by block_n columns, 64 values of K per stage
// (128 for FP8 blockwise).
inline constexpr int kBlockM = 128;
inline constexpr int kBlockK = 64;
// Tile widths the kernels are instantiated for.
inline constexpr int kWideN = 256;
inline constexpr int kNarrowN = 128;
inline constexpr int kBlkN = 128;  // the FP8-blockwise kernels' only width

// One translation unit per family. b_kn: B_e is [K, N] (dgrad) rather than [N, K]; wide: kWideN
// columns per tile, else kNarrowN.
void launch_gemm_m_bf16(Epi epi, bool b_kn, bool wide, const MLaunch& l, cudaStream_t stream);
void launch_gemm_m_mx(Epi epi, bool b_kn, bool wide, const MLaunch& l, cudaStream_t stream);
void launch_gemm_m_blk(Epi epi, const MLaunch& l, cudaStream_t stream);  // B_e [N, K], kBlkN wide

// block_n: kWideN or kNarrowN (kBlkN for fp8_block).
inline void launch_gemm_m(Mainloop kernel, Epi epi, bool b_kn, int block_n, const MLaunch& l, cudaStream_t stream) {
  switch (kernel) {
    case Mainloop::bf16: return launch_gemm_m_bf16(epi, b_kn, block_n == kWideN, l, stream);
    case Mainloop::mx_a: return launch_gemm_m_mx(epi, b_kn, block_n == kWideN, l, stream);
    case Mainloop::fp8_block: return launch_gemm_m_blk(epi, l, stream);
  }
}
// fp8_block: FP8-blockwise operands transposed to token blocks; else BF16.
void launch_gemm_k(bool fp8_block, const KLaunch& l, cudaStream_t stream);

// Number of SMs of the current device (cached per device), the persistent grid size.
int sm_count();

}  // namespace mxmoe::cuda::sm90
