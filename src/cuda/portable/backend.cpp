// Registry entry of cuda_portable: every step on any GPU from sm_80 (mma.sync kernels in this
// folder, quantizers in src/cuda/quant/).
#include "src/cuda/common/device_facts.h"
#include "src/cuda/cuda_ops.h"

namespace mxmoe {
namespace cuda::portable {
namespace {

class CudaPortableBackend final : public detail::Backend {
 public:
  const char* name() const override { return "cuda_portable"; }
  detail::Probe probe_device(Device d) const override {
    if (d.type != DeviceType::cuda) return {false, "data is in host memory"};
    const DeviceFacts& f = device_facts(d.index);
    if (!f.ok) return {false, f.problem};
    if (f.major < 8) return {false, f.name + " is " + f.cc() + "; cuda_portable needs sm_80 or newer"};
    return {true, f.name + " (" + f.cc() + "), mma.sync bf16 kernels"};
  }
  detail::Probe probe(const detail::StepQuery& q) const override {
    if (token_routing(q.step)) return {false, kNoRoutingKernels};
    return {true, ""};
  }
  void quantize(Context& c, const QuantizeArgs& a) override { cuda::quantize(a, c.options().stream); }
  void dequantize(Context& c, const DequantizeArgs& a) override { cuda::dequantize(a, c.options().stream); }
  void quantize_experts(Context& c, const detail::QuantizeExpertsStep& s) override {
    cuda::quantize_experts(s, c.options().stream);
  }
  void gemm_m(Context& c, const detail::MGemmStep& s) override { portable::gemm_m(s, c.options().stream); }
  void gemm_k(Context& c, const KGroupedGemmArgs& a) override { portable::gemm_k(a, c.options().stream); }
  void fc2_bias_grads(Context& c, const detail::Fc2BiasGradStep& s) override {
    portable::fc2_bias_grads(s, c.options().stream);
  }
  void route_tokens(Context&, const detail::RouteTokensStep&) override { refuse(detail::Step::route_tokens); }
  void permute_rows(Context&, const PermuteByMapArgs&) override { refuse(detail::Step::permute_rows); }
  void unpermute_rows(Context&, const UnpermuteArgs&) override { refuse(detail::Step::unpermute_rows); }

 private:
  // NOTE: the permute / unpermute kernels are not written yet; the probe refuses them, so dispatch
  // on device data reports that no backend serves the step. A direct call is a bug: an Error.
  static constexpr const char* kNoRoutingKernels = "token permute/unpermute is not implemented on this backend yet";
  static bool token_routing(detail::Step s) {
    return s == detail::Step::route_tokens || s == detail::Step::permute_rows || s == detail::Step::unpermute_rows;
  }
  [[noreturn]] void refuse(detail::Step s) const {
    throw Error("backend", std::string(name()) + " cannot run " + detail::to_string(s) + ": " + kNoRoutingKernels);
  }
};

}  // namespace
}  // namespace cuda::portable

detail::Backend* detail::cuda_portable_backend() {
  static cuda::portable::CudaPortableBackend b;
  return &b;
}

}  // namespace mxmoe
