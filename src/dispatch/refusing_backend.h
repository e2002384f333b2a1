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
  void gemm_m(Context&, const MGemmStep&, const StepPlan&) override { refuse(Step::gemm_m); }
  void gemm_k(Context&, const KGroupedGemmArgs&, const StepPlan&) override { refuse(Step::gemm_k); }
  void fc2_bias_grads(Context&, const Fc2BiasGradStep&) override { refuse(Step::fc2_bias_grads); }
  void route_tokens(Context&, const RouteTokensStep&) override { refuse(Step::route_tokens); }
  void permute_rows(Context&, const PermuteByMapArgs&) override { refuse(Step::permute_rows); }
  void unpermute_rows(Context&, const UnpermuteArgs&) override { refuse(Step::unpermute_rows); }
  void permute_quantize_rows(Context&, const PermuteQuantizeStep&) override { refuse(Step::permute_rows); }
  uint64_t check_finite(Context&, const CheckFiniteStep&) override { refuse(Step::check_finite); }

 protected:
  // The step probe of a backend that runs the grouped GEMMs alone (cuda_sm90, cuda_sm100): gemm_m and
  // gemm_k by its refusal functions (an empty string takes the step), every other step refused with
  // the backend that serves it. arch names the backend's kernels in the reasons ("sm90").
  template <class MRefusal, class KRefusal>
  static Probe gemm_only_probe(const StepQuery& q, const char* arch, MRefusal m_refusal, KRefusal k_refusal) {
    std::string why;
    switch (q.step) {
      case Step::gemm_m:
        if (q.gemm_m == nullptr) return {false, "internal: the dispatch query carries no m-grouped step"};
        why = m_refusal(*q.gemm_m);
        return {why.empty(), why};
      case Step::gemm_k:
        if (q.gemm_k == nullptr) return {false, "internal: the dispatch query carries no k-grouped step"};
        why = k_refusal(*q.gemm_k);
        return {why.empty(), why};
      case Step::quantize:
      case Step::dequantize:
      case Step::quantize_experts:
        return {false,
                std::string("no ") + arch + " quantizer of its own: cuda_portable's one-pass quantizer serves it"};
      case Step::fc2_bias_grads:
        return {false, "a memory-bound column reduction: cuda_portable's kernel serves it"};
      case Step::route_tokens:
      case Step::permute_rows:
      case Step::unpermute_rows:
        return {false, "token permute/unpermute is not implemented on this backend"};
      case Step::check_finite:
        return {false, "a memory-bound scan of an input: cuda_portable's kernel serves it"};
    }
    return {false, "unknown step"};
  }

 private:
  [[noreturn]] void refuse(Step s) const {
    throw Error("backend", std::string(name()) + " cannot run " + to_string(s) + ": " + why_);
  }
  std::string why_;
};

}  // namespace mxmoe::detail
