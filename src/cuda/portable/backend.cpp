// Registry entry of cuda_portable: every step on any GPU from sm_80 (mma.sync kernels in this
// folder, quantizers in src/cuda/quant/, token permute / unpermute in permute_*.cu and unpermute.cu).
#include "src/cuda/common/device_facts.h"
#include "src/cuda/cuda_ops.h"
#include "src/cuda/permute_quantize.h"

namespace mxmoe {
namespace cuda::portable {
namespace {

class CudaPortableBackend final : public detail::Backend {
 public:
  const char* name() const override { return "cuda_portable"; }
  detail::Probe probe_device(const DeviceFacts& f) const override {
    if (f.device.type != DeviceType::cuda) return {false, "data is in host memory"};
    if (!f.ok) return {false, f.problem};
    if (f.major < 8) return {false, f.name + " is " + f.cc() + "; cuda_portable needs sm_80 or newer"};
    return {true, f.name + " (" + f.cc() + "), mma.sync bf16 kernels"};
  }
  // Every step, every shape the entry points accept (the permute steps too: any E, T, K and H), in
  // the bf16 and mxfp8 recipes.
  // fp8_blockwise GEMMs run through the BF16 kernels on dequantized operands, exact only with
  // power-of-two scales (src/cuda/quant/fp8_block_gemm.cu).
  detail::Probe probe(const detail::StepQuery& q) const override {
    const bool gemm = q.step == detail::Step::gemm_m || q.step == detail::Step::gemm_k;
    if (q.recipe == Recipe::fp8_blockwise && gemm && !q.pow2_scales)
      return {false, "fp8_blockwise GEMMs with fp32 (not power-of-two) scales need FP8 MMAs with promotion every 128 "
                     "(cuda_sm90 has them, on a Hopper GPU); power-of-two scales (pow2_scales) run here"};
    return {true, ""};
  }
  detail::StepPlan plan(const detail::StepQuery& q, const std::string& config) const override {
    if (q.gemm_m == nullptr && q.gemm_k == nullptr) return Backend::plan(q, config);
    if (!config.empty() && config != "mma_sync")
      throw Error("options.overrides", "cuda_portable has one GEMM configuration, \"mma_sync\"; not \"" + config + "\"");
    return q.gemm_m != nullptr ? portable::plan_gemm_m(*q.gemm_m) : portable::plan_gemm_k(*q.gemm_k);
  }
  void quantize(Context& c, const QuantizeArgs& a) override { cuda::quantize(a, c.options().stream); }
  void dequantize(Context& c, const DequantizeArgs& a) override { cuda::dequantize(a, c.options().stream); }
  void quantize_experts(Context& c, const detail::QuantizeExpertsStep& s) override {
    cuda::quantize_experts(s, c.options().stream);
  }
  void gemm_m(Context& c, const detail::MGemmStep& s, const detail::StepPlan&) override {
    portable::gemm_m(s, c.options().stream);
  }
  void gemm_k(Context& c, const KGroupedGemmArgs& a, const detail::StepPlan&) override {
    portable::gemm_k(a, c.options().stream);
  }
  void fc2_bias_grads(Context& c, const detail::Fc2BiasGradStep& s) override {
    portable::fc2_bias_grads(s, c.options().stream);
  }
  void route_tokens(Context& c, const detail::RouteTokensStep& s) override {
    portable::route_tokens(s, c.options().stream);
  }
  void permute_rows(Context& c, const PermuteByMapArgs& a) override { portable::permute_rows(a, c.options().stream); }
  void route_and_permute_rows(Context& c, const detail::RouteTokensStep& s, const PermuteByMapArgs& a) override {
    portable::route_and_permute_rows(s, a, c.options().stream);
  }
  void unpermute_rows(Context& c, const UnpermuteArgs& a) override { portable::unpermute_rows(a, c.options().stream); }
  uint64_t check_finite(Context& c, const detail::CheckFiniteStep& s) override {
    return cuda::check_finite(s, c.options().stream);
  }
  // permute_tokens with MXFP8 outputs: the gather fused into the one-pass quantizer.
  void permute_quantize_rows(Context& c, const detail::PermuteQuantizeStep& s) override {
    cuda::permute_quantize_rows(s, c.options().stream);
  }
};

}  // namespace
}  // namespace cuda::portable

detail::Backend* detail::cuda_portable_backend() {
  static cuda::portable::CudaPortableBackend b;
  return &b;
}

}  // namespace mxmoe
