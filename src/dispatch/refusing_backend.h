// A registered backend that serves no step: it answers every probe "unavailable" with its reason,
// so dispatch never calls a step on it; a direct call (a test, a bug) throws an Error that says so.
// Used by the CUDA backends of a build without CUDA (no_cuda.cpp), and as the base of cuda_sm90 and
// cuda_sm100, which serve only some steps (or none, built without their kernels).
#pragma once
#include <string>

#include "src/dispatch/backend.h"

namespace mxmoe::detail {

class RefusingBackend : public Backend {
 public:
  // why: the reason every step is refused (also the default step probe's answer).
  explicit RefusingBackend(std::string why) : why_(std::move(why)) {}

  Probe probe(const StepQuery&) const override { return {false, why_}; }
  void quantize(Context&, const QuantizeArgs&) override { refuse(Step::quantize); }
  void dequantize(Context&, const DequantizeArgs&) override { refuse(Step::dequantize); }
  void quantize_experts(Context&, const QuantizeExpertsStep&) override { refuse(Step::quantize_experts); }
  void gemm_m(Context&, const MGemmStep&) override { refuse(Step::gemm_m); }
  void gemm_k(Context&, const KGroupedGemmArgs&) override { refuse(Step::gemm_k); }
  void fc2_bias_grads(Context&, const Fc2BiasGradStep&) override { refuse(Step::fc2_bias_grads); }
  void route_tokens(Context&, const RouteTokensStep&) override { refuse(Step::route_tokens); }
  void permute_rows(Context&, const PermuteByMapArgs&) override { refuse(Step::permute_rows); }
  void unpermute_rows(Context&, const UnpermuteArgs&) override { refuse(Step::unpermute_rows); }
  void permute_quantize_rows(Context&, const PermuteQuantizeStep&) override { refuse(Step::permute_rows); }

 private:
  [[noreturn]] void refuse(Step s) const {
    throw Error("backend", std::string(name()) + " cannot run " + to_string(s) + ": " + why_);
  }
  std::string why_;
};

}  // namespace mxmoe::detail
