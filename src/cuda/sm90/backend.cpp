// Registry entry of cuda_sm90, the Hopper fast path (TMA + wgmma grouped GEMMs in this folder). It
// is registered ahead of cuda_portable, so dispatch asks it first; a step it does not take (MXFP8
// operands, per-expert weight pointers, unaligned shapes, the quantize and bias-gradient steps) is
// refused by its probe with the reason, and the chain runs it on cuda_portable. Built without the
// sm_90a target or the CUTLASS/CuTe headers, it refuses everything, saying which was missing.
#include "src/cuda/common/device_facts.h"
#include "src/dispatch/refusing_backend.h"
#if defined(MXMOE_WITH_SM90)
#include "src/cuda/sm90/sm90_ops.h"
#endif

namespace mxmoe {
namespace cuda::sm90 {
namespace {

#if defined(MXMOE_WITH_SM90)
constexpr const char* kBuildProblem = "";
#elif defined(MXMOE_SM90_MISSING)
constexpr const char* kBuildProblem = "not built: " MXMOE_SM90_MISSING;
#else
constexpr const char* kBuildProblem = "not built";
#endif

class CudaSm90Backend final : public detail::RefusingBackend {
 public:
  CudaSm90Backend()
      : RefusingBackend(*kBuildProblem ? kBuildProblem : "no sm90 kernel for this step; cuda_portable serves it") {}
  const char* name() const override { return "cuda_sm90"; }
  // Its MXFP8 GEMMs compute in BF16 on the weights' bf16 copy (gemm_m.cu): the FP8 bytes are not read.
  bool reads_weight_copies() const override { return true; }

  detail::Probe probe_device(Device d) const override {
    if (d.type != DeviceType::cuda) return {false, "data is in host memory"};
    const DeviceFacts& f = device_facts(d.index);
    if (!f.ok) return {false, f.problem};
    if (f.major != 9) return {false, f.name + " is " + f.cc() + "; cuda_sm90 needs sm_90"};
    if (*kBuildProblem) return {false, kBuildProblem};
    return {true, f.name + " (" + f.cc() + "), TMA + wgmma BF16 grouped GEMMs"};
  }

  detail::Probe probe(const detail::StepQuery& q) const override {
#if defined(MXMOE_WITH_SM90)
    // fp8_blockwise GEMMs: every GEMM of the layer on the FP8-wgmma kernels (any scales,
    // gemm_m_blk.cu, gemm_k.cu) where their shape rules take it; the others (and all of them with
    // MXMOE_SM90_FP8_BLOCK=dequant, the backward with =forward) with power-of-two scales through the
    // BF16 kernels on dequantized operands (exact; src/cuda/quant/fp8_block.cu). Its quantizers are
    // cuda_portable's.
    const bool gemm = q.step == detail::Step::gemm_m || q.step == detail::Step::gemm_k;
    const bool fp8_kernel = (q.step == detail::Step::gemm_m && q.gemm_m != nullptr && fp8_block_kernel_takes(*q.gemm_m)) ||
                            (q.step == detail::Step::gemm_k && q.gemm_k != nullptr && fp8_block_wgrad_takes(*q.gemm_k));
    if (q.recipe == Recipe::fp8_blockwise && gemm && !q.pow2_scales && !fp8_kernel)
      return {false, "this fp8_blockwise GEMM with fp32 (not power-of-two) scales needs the FP8-wgmma kernels, which do "
                     "not take it here (shape rules, or MXMOE_SM90_FP8_BLOCK=forward/dequant); power-of-two scales "
                     "(pow2_scales) run on the dequantized BF16 path"};
    return gemm_only_probe(q, "sm90", gemm_m_refusal, gemm_k_refusal);
#else
    return {false, kBuildProblem};
#endif
  }

#if defined(MXMOE_WITH_SM90)
  void gemm_m(Context& c, const detail::MGemmStep& s) override { sm90::gemm_m(s, c.options().stream); }
  void gemm_k(Context& c, const KGroupedGemmArgs& a) override { sm90::gemm_k(a, c.options().stream); }
#endif
};

}  // namespace
}  // namespace cuda::sm90

detail::Backend* detail::cuda_sm90_backend() {
  static cuda::sm90::CudaSm90Backend b;
  return &b;
}

}  // namespace mxmoe
