// The host side of the sm90 grouped GEMMs split in two, so that the layer (gemm_m.cu) and the
// kernel benchmark (bench/sm90_kernels.cu) launch the same prepared problem with any configuration:
// plan_gemm_*() turns a step into kernel parameters, TMA descriptors and the device schedule for a
// tile width; finish_gemm_m() runs the fixed-order dprob / db1 reductions of glu_backward.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include "src/common/env.h"
#include "src/cuda/common/workspace.h"
#include "src/cuda/sm90/params.h"
#include "src/dispatch/backend.h"

namespace mxmoe::cuda::sm90 {

struct MPlan {
  KernelParams params;
  CUtensorMap a{}, b0{}, b1{};  // tokens [T, K]; B_e (a and b rows of W1 for glu_forward)
  int64_t launch_tiles = 0;     // upper bound of the tile (pair) count; 0: nothing to launch
};

// The layer's tile width for the step (256, or 128 for glu_backward and narrow outputs).
int default_block_n(const detail::MGemmStep& s);
int64_t gemm_m_workspace_bytes(const detail::MGemmStep& s, int bn);
// Enqueues the device schedule (and clears the dprob partials) on `stream`; `ws` must hold
// gemm_m_workspace_bytes(s, bn). Requires gemm_m_refusal(s) to be empty.
MPlan plan_gemm_m(const detail::MGemmStep& s, int bn, Workspace& ws, cudaStream_t stream);
void finish_gemm_m(const detail::MGemmStep& s, const MPlan& plan, cudaStream_t stream);

// gemm_m_mx.cu: the kernel of a planned step whose A is MXFP8: B BF16 (any epilogue) or MXFP8
// (store epilogue, converted in shared memory).
void launch_gemm_m_mx(const detail::MGemmStep& s, const MPlan& plan, int bn, cudaStream_t stream);
// The MXFP8 FC2 dgrad (glu_backward) with epilogue warps and the A scales loaded by the consumers
// from L2 (gemm_kernel.cuh kScalesL2), tile width kMxEwN or 128 (mx_epilogue_warps_n).
inline constexpr int kMxEwN = 192;
void launch_gemm_m_mx_ew(const MPlan& plan, int bn, cudaStream_t stream);
// MXMOE_SM90_MX_GLU_BWD (read per call, comparison runs): `ew` (192-wide tiles) or `ew128` runs the
// MXFP8 GLU backward with epilogue warps; 0 otherwise (the in-line epilogue kernels).
int mx_epilogue_warps_n();
// MXMOE_SM90_FP8_B=convert: MXFP8 B of the store epilogue stays FP8 (gemm_kernel.cuh Mx::ab).
bool fp8_b_in_kernel();
// fp8_blockwise dgrads and wgrads on FP8 wgmma (read per call: off with MXMOE_SM90_FP8_BLOCK=forward
// or dequant).
bool fp8_backward_on();

// gemm_m_blk.cu: the FP8-wgmma kernel of a planned fp8_blockwise step (plan_gemm_m with kBlkN):
// store, glu_forward or glu_backward, B_e [N, K] (a dgrad's weights transposed first).
inline constexpr int kBlkN = 128;
// The FP8-blockwise mainloop (MXMOE_SM90_FP8_MAINLOOP, read per call): the scales staged in shared
// memory by the producer's warps 1-3 (default, gemm_kernel.cuh Mx::blk_staged; 8-22% less time per GEMM than l2
// on dsv3, session 10), or each consumer loading its own from L2 (`l2`, Mx::blk).
enum class Fp8Mainloop { staged, l2 };
Fp8Mainloop fp8_mainloop();
void launch_gemm_m_blk(const detail::MGemmStep& s, const MPlan& plan, cudaStream_t stream);

// The k-grouped (wgrad) GEMM, likewise: tile width `bn` along N, 128 along M.
struct KPlan {
  KernelParams params;
  CUtensorMap a{}, b{};      // A [T, M], B [T, N], token-major
  int64_t launch_tiles = 0;  // 0: nothing to launch
};
int64_t gemm_k_workspace_bytes(const KGroupedGemmArgs& a);
KPlan plan_gemm_k(const KGroupedGemmArgs& a, int bn, Workspace& ws, cudaStream_t stream);

}  // namespace mxmoe::cuda::sm90
