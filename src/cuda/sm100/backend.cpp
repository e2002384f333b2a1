// Registry entry of cuda_sm100, the Blackwell MXFP8 path (CUTLASS block-scaled grouped GEMMs in this
// folder). Registered first, so dispatch asks it first; everything it does not take (BF16, the GLU
// epilogues and biases, the quantizers, permute) is refused by its probe with the reason and runs on
// the next backend. These kernels have never run on Blackwell hardware in this project, so on a
// compute capability 10.0 device the first probe runs a small fixed problem through them and through
// cuda_portable (self_check.cpp) and the backend is available only if they agree; the verdict, with
// its numbers, is cached per device and is the reason `mxmoe info` and every report show. Any other
// device, or a build without the kernels, is refused up front, saying why.
#include "src/cuda/common/device_facts.h"
#include "src/cuda/sm100/probe.h"
#include "src/dispatch/refusing_backend.h"
#if defined(MXMOE_WITH_SM100)
#include "src/cuda/sm100/sm100_ops.h"
#endif

namespace mxmoe {
namespace cuda::sm100 {
namespace {

#if defined(MXMOE_WITH_SM100)
constexpr const char* kBuildProblem = "";
#elif defined(MXMOE_SM100_MISSING)
constexpr const char* kBuildProblem = "not built: " MXMOE_SM100_MISSING;
#else
constexpr const char* kBuildProblem = "not built";
#endif

class CudaSm100Backend final : public detail::RefusingBackend {
 public:
  CudaSm100Backend()
      : RefusingBackend(*kBuildProblem ? kBuildProblem : "no sm100 kernel for this step; the next backend serves it") {}
  const char* name() const override { return "cuda_sm100"; }

  detail::Probe probe_device(const DeviceFacts& f) const override {
    if (f.device.type != DeviceType::cuda) return {false, "data is in host memory"};
    if (std::string why = device_refusal(f, kBuildProblem); !why.empty()) return {false, why};
#if defined(MXMOE_WITH_SM100)
    // A planned device runs nothing: its self-check is assumed to pass.
    if (f.planned) return {true, f.name + ", CUTLASS block-scaled MXFP8 grouped GEMMs (self-check not run)"};
    const Device d = f.device;
    if (std::string why = kernel_image_problem(d.index); !why.empty()) return {false, why};
    const detail::Probe v = verdicts_.get(d.index, [&] { return run_self_check(d.index); });
    if (!v.available) return v;
    return {true, f.name + " (" + f.cc() + "), CUTLASS block-scaled MXFP8 grouped GEMMs; " + v.reason};
#else
    return {false, kBuildProblem};
#endif
  }

  detail::Probe probe(const detail::StepQuery& q) const override {
#if defined(MXMOE_WITH_SM100)
    const bool gemm = q.step == detail::Step::gemm_m || q.step == detail::Step::gemm_k;
    if (gemm && q.recipe != Recipe::mxfp8)
      return {false, std::string("the ") + to_string(q.recipe) +
                         " recipe: cuda_sm100 runs MXFP8 GEMMs only (block-scaled tcgen05 MMA, E8M0 scales per 32)"};
    return gemm_only_probe(q, "sm100", gemm_m_refusal, gemm_k_refusal);
#else
    return {false, kBuildProblem};
#endif
  }

#if defined(MXMOE_WITH_SM100)
  void gemm_m(Context& c, const detail::MGemmStep& s, const detail::StepPlan&) override {
    sm100::gemm_m(s, c.options().stream);
  }
  void gemm_k(Context& c, const KGroupedGemmArgs& a, const detail::StepPlan&) override {
    sm100::gemm_k(a, c.options().stream);
  }

 private:
  mutable VerdictCache verdicts_;
#endif
};

}  // namespace
}  // namespace cuda::sm100

detail::Backend* detail::cuda_sm100_backend() {
  static cuda::sm100::CudaSm100Backend b;
  return &b;
}

}  // namespace mxmoe
