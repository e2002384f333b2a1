// The CPU reference backend: always available for host data; the oracle of every test.
#include "src/cpu/cpu_ops.h"

namespace mxmoe::detail {
namespace {

class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  Probe probe_device(const DeviceFacts& f) const override {
    if (f.device.type != DeviceType::cpu) return {false, "data is on " + device_name(f.device) + ", not host memory"};
    return {true, "reference backend (OpenMP, fp32 accumulation)"};
  }
  Probe probe(const StepQuery&) const override { return {true, ""}; }
  void quantize(Context&, const QuantizeArgs& a) override { cpu::quantize(a); }
  void dequantize(Context&, const DequantizeArgs& a) override { cpu::dequantize(a); }
  void quantize_experts(Context&, const QuantizeExpertsStep& s) override { cpu::quantize_experts(s); }
  void gemm_m(Context&, const MGemmStep& s, const StepPlan&) override { cpu::gemm_m(s); }
  void gemm_k(Context&, const KGroupedGemmArgs& a, const StepPlan&) override { cpu::gemm_k(a); }
  void fc2_bias_grads(Context&, const Fc2BiasGradStep& s) override { cpu::fc2_bias_grads(s); }
  void route_tokens(Context&, const RouteTokensStep& s) override { cpu::route_tokens(s); }
  void permute_rows(Context&, const PermuteByMapArgs& a) override { cpu::permute_rows(a); }
  void unpermute_rows(Context&, const UnpermuteArgs& a) override { cpu::unpermute_rows(a); }
  uint64_t check_finite(Context&, const CheckFiniteStep& s) override { return cpu::check_finite(s); }
};

}  // namespace

Backend* cpu_backend() {
  static CpuBackend b;
  return &b;
}

}  // namespace mxmoe::detail
