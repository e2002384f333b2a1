// Registry entry of cuda_sm90, the Hopper fast path (TMA + wgmma grouped GEMMs in this folder). It
// is registered ahead of cuda_portable, so dispatch asks it first; a step it does not take
// (per-expert weight pointers, unaligned shapes, fp32-scaled fp8_blockwise GEMMs its FP8 kernels do
// not take, the quantize, permute and bias-gradient steps) is refused by its probe with the reason,
// and the chain runs it on cuda_portable. Its GEMM plans come from gemm_m.cu / gemm_k.cu
// (plan_gemm_m, plan_gemm_k). Built without the sm_90a target or the CUTLASS/CuTe headers, it
// refuses everything, saying which was missing.
#include "src/dispatch/refusing_backend.h"
#if defined(MXMOE_WITH_SM90)
#include "src/cuda/sm90/gemm_m_plan.h"
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

  detail::Probe probe_device(const detail::DeviceFacts& f) const override {
    if (f.device.type != DeviceType::cuda) return {false, "data is in host memory"};
    if (!f.ok) return {false, f.problem};
    if (f.major != 9) return {false, f.name + " is " + f.cc() + "; cuda_sm90 needs sm_90"};
    if (*kBuildProblem) return {false, kBuildProblem};
    return {true, f.name + " (" + f.cc() + "), TMA + wgmma grouped GEMMs"};
  }

  detail::Probe probe(const detail::StepQuery& q) const override {
#if defined(MXMOE_WITH_SM90)
    // fp8_blockwise GEMMs with fp32 scales run only on the FP8-wgmma kernels; with power-of-two
    // scales the others run exactly on the dequantized operands.
    const bool fp8 = q.recipe == Recipe::fp8_blockwise && !q.pow2_scales;
    if (fp8 && q.step == detail::Step::gemm_m && q.gemm_m != nullptr && !fp8_block_kernel_takes(*q.gemm_m) &&
        gemm_m_refusal(*q.gemm_m).empty())
      return {false, kFp32Scales};
    if (fp8 && q.step == detail::Step::gemm_k && q.gemm_k != nullptr && !fp8_block_wgrad_takes(*q.gemm_k) &&
        gemm_k_refusal(*q.gemm_k).empty())
      return {false, kFp32Scales};
    return gemm_only_probe(q, "sm90", gemm_m_refusal, gemm_k_refusal);
#else
    return {false, kBuildProblem};
#endif
  }

#if defined(MXMOE_WITH_SM90)
  detail::StepPlan plan(const detail::StepQuery& q, const std::string& config) const override {
    if (q.gemm_m != nullptr) return plan_gemm_m(*q.gemm_m, q.pow2_scales, config);
    if (q.gemm_k != nullptr) return plan_gemm_k(*q.gemm_k, q.pow2_scales, config);
    return Backend::plan(q, config);
  }
  void gemm_m(Context& c, const detail::MGemmStep& s, const detail::StepPlan& p) override {
    sm90::gemm_m(s, p, c.options().stream);
  }
  void gemm_k(Context& c, const KGroupedGemmArgs& a, const detail::StepPlan& p) override {
    sm90::gemm_k(a, p, c.options().stream);
  }

 private:
  static constexpr const char* kFp32Scales =
      "this fp8_blockwise GEMM has fp32 (not power-of-two) scales and its shape or alignment is not one the "
      "FP8-wgmma kernels take; power-of-two scales (pow2_scales) run on the exactly dequantized operands";
#endif
};

}  // namespace
}  // namespace cuda::sm90

detail::Backend* detail::cuda_sm90_backend() {
  static cuda::sm90::CudaSm90Backend b;
  return &b;
}

}  // namespace mxmoe
