// The grouped MLP over experts, forward and backward (docs/numerics.md "Layer dataflow").
//
//   C = X W1_e^T (+ b1_e)    A = act(C) * p    Y = A W2_e^T (+ b2_e or p * b2_e)
//
// Lifetimes: forward() references the caller's x, offsets, probs, weights and biases in the
// returned SavedState (it does not copy them); they must stay alive and unchanged until backward()
// (and compute_wgrad(), when deferred) has run, exactly as autograd would keep them.
#pragma once
#include <cstdint>
#include <memory>

#include "mxmoe/context.h"
#include "mxmoe/groups.h"
#include "mxmoe/ops.h"
#include "mxmoe/problem.h"
#include "mxmoe/tensor.h"

namespace mxmoe {

class PreparedWeights;

struct ForwardArgs {
  TensorView x;          // bf16 [T, H] (may be empty when x_row / x_col are given)
  GroupOffsets offsets;  // i32 [E+1]
  TensorView probs;      // f32 [T]
  ExpertMatrices w1;     // bf16 [E, 2F, H]
  TensorView b1;         // bf16 [E, 2F] when problem.fc1_bias
  ExpertMatrices w2;     // bf16 [E, H, F]
  TensorView b2;         // bf16 [E, H] when problem.fc2_bias
  TensorView y;          // out: bf16 [T, H]
  // Optional: the weights quantized once by prepare_weights() from these w1 and w2; forward then
  // reads them instead of quantizing w1 and w2 itself. Must outlive the call.
  const PreparedWeights* prepared = nullptr;
  // Optional, recipe mxfp8: X already quantized, as permute_tokens writes it with
  // PermuteArgs::rowwise / colwise (or quantize_mxfp8(x, groups = offsets)): x_row row-wise
  // [T, H] (FC1's operand), x_col column-wise [T, H] with blocks restarting at each group (kept for
  // the FC1 weight gradient, referenced like x: alive and unchanged until backward / compute_wgrad).
  // Both or neither, scale layout = Options::scale_layout. Given, forward runs no quantize_x step
  // and x may be empty (the mxfp8 backward reads X only through x_col); with StateBuffers,
  // saved.x_col must be x_col itself (forward writes nothing there). Results are bit-identical to
  // passing the bf16 x those bytes were quantized from.
  Mxfp8View x_row;
  Mxfp8View x_col;
};

// Weight- and bias-gradient outputs. dtype f32: D = grad + (accumulate ? D : 0) (main-grad
// buffers); dtype bf16: D = grad, accumulate must be false. Empty experts: zeros or untouched.
struct WeightGrads {
  ExpertMatrices dw1;  // [E, 2F, H]
  ExpertMatrices dw2;  // [E, H, F]
  TensorView db1;      // [E, 2F] when problem.fc1_bias (same dtype as the weight grads)
  TensorView db2;      // [E, H] when problem.fc2_bias
  bool accumulate = false;
};

enum class WgradMode : uint8_t { now, deferred };

struct BackwardArgs {
  TensorView dy;      // bf16 [T, H]
  TensorView dx;      // out: bf16 [T, H]
  TensorView dprobs;  // out: f32 [T]
  WeightGrads grads;  // dW written now, or by compute_wgrad() when deferred; db always now
  WgradMode wgrad = WgradMode::now;
  // Optional: the forward's w1 and w2 quantized once by prepare_weights(); backward then reads
  // their column-wise copies instead of quantizing the weights itself. Must outlive the call.
  const PreparedWeights* prepared = nullptr;
};

namespace detail {
struct SavedImpl;
struct WgradImpl;
struct PreparedImpl;
}

// What forward keeps for backward (docs/numerics.md "Layer dataflow"), owned by the library.
class MXMOE_API SavedState {
 public:
  SavedState();
  explicit SavedState(std::unique_ptr<detail::SavedImpl> impl);
  SavedState(SavedState&&) noexcept;
  SavedState& operator=(SavedState&&) noexcept;
  ~SavedState();
  int64_t bytes() const;  // device (or host) bytes the library holds for backward
  bool valid() const { return impl_ != nullptr; }
  detail::SavedImpl& impl() { return *impl_; }

 private:
  std::unique_ptr<detail::SavedImpl> impl_;
};

// Operands a deferred weight-gradient call needs (col-wise X, dC, A and dY, or their BF16 copies).
class MXMOE_API WgradState {
 public:
  WgradState();
  explicit WgradState(std::unique_ptr<detail::WgradImpl> impl);
  WgradState(WgradState&&) noexcept;
  WgradState& operator=(WgradState&&) noexcept;
  ~WgradState();
  int64_t bytes() const;
  bool pending() const { return impl_ != nullptr; }
  detail::WgradImpl& impl() { return *impl_; }

 private:
  std::unique_ptr<detail::WgradImpl> impl_;
};

// ---- Weights quantized once per version ----
// The weights prepare_weights() reads: the same w1 and w2 forward and backward are given.
struct WeightsArgs {
  ExpertMatrices w1;  // bf16 [E, 2F, H]
  ExpertMatrices w2;  // bf16 [E, H, F]
  // Keep BF16 copies of the dequantized weights (2 bytes per value per orientation, in bytes()) where
  // the GEMMs compute in BF16 on them and do not read the FP8 bytes: mxfp8 where the device's backend
  // reads weight copies (cuda_sm90), which then keeps the copies alone (a GEMM it refuses, e.g. for
  // a call's unaligned activations, quantizes its weight in the call from the call's w1 / w2);
  // fp8_blockwise with power-of-two scales where cuda_sm90 runs its GEMMs on the dequantized
  // weights (one copy per weight, beside the FP8 bytes). false: the FP8 copies, smallest.
  bool bf16_copies = true;
};

// The MXFP8 copies of W1 and W2 the layer's GEMMs read (row-wise for fprop, column-wise for dgrad;
// on cuda_sm90 their bf16 copies alone, WeightsArgs::bf16_copies), made once by prepare_weights()
// and passed to any number of forward()/backward() calls (through ForwardArgs::prepared,
// BackwardArgs::prepared) while the weights do not change. Library memory
// (the context's allocator). For Recipe::bf16 it holds nothing (bytes() == 0): that recipe reads the
// weights as given. Movable, not copyable.
class MXMOE_API PreparedWeights {
 public:
  PreparedWeights();
  explicit PreparedWeights(std::unique_ptr<detail::PreparedImpl> impl);
  PreparedWeights(PreparedWeights&&) noexcept;
  PreparedWeights& operator=(PreparedWeights&&) noexcept;
  ~PreparedWeights();
  int64_t bytes() const;  // device (or host) bytes of the quantized copies
  bool valid() const { return impl_ != nullptr; }
  const detail::PreparedImpl& impl() const { return *impl_; }

 private:
  std::unique_ptr<detail::PreparedImpl> impl_;
};

// Quantizes w1 and w2 (steps "prepare.quantize_w1", "prepare.quantize_w2", "prepare.quantize_w1_col",
// "prepare.quantize_w2_col" in the report) with the same functions forward and backward use, so a
// call given the result is bit-identical to one without it. The result is tied to the problem's
// hidden, ffn, experts, recipe and glu_layout, to the weights' device and to the context's
// scale_layout; a call that differs is an error naming `prepared`. It copies what it needs: w1
// and w2 may change afterwards (then the result is stale and must be prepared again). On CUDA the
// copies are written on the context's stream: a call on another stream must be ordered after it.
MXMOE_API PreparedWeights prepare_weights(Context& ctx, const Problem& problem, const WeightsArgs& weights);

MXMOE_API SavedState forward(Context& ctx, const Problem& problem, const ForwardArgs& args);

// Consumes `saved`. With WgradMode::deferred, returns the operands for compute_wgrad().
MXMOE_API WgradState backward(Context& ctx, SavedState& saved, const BackwardArgs& args);

// Computes dW1 and dW2 from a deferred backward into `grads` (db are not touched here).
MXMOE_API void compute_wgrad(Context& ctx, WgradState& state, const WeightGrads& grads);

// ---- Caller-owned state, for frameworks whose autograd keeps the tensors (PyTorch) ----
// What forward keeps for backward, and a deferred backward for compute_wgrad(), in caller memory.
// T tokens; column-wise scales are colwise_scale_bytes(T, cols, E) bytes, layout as
// Options::scale_layout. Members a recipe does not use stay empty.
struct StateBuffers {
  TensorView c;      // bf16 [T, 2F] FC1 output                forward -> backward
  TensorView a;      // bf16 recipe: A [T, F]                  forward -> wgrad
  Mxfp8View x_col;   // mxfp8: X [T, H] column-wise            forward -> wgrad
  Mxfp8View a_col;   // mxfp8: A [T, F] column-wise            forward -> wgrad
  TensorView dc;     // bf16 recipe: dC [T, 2F]                deferred backward -> wgrad
  Mxfp8View dy_col;  // mxfp8: dY [T, H] column-wise           deferred backward -> wgrad
  Mxfp8View dc_col;  // mxfp8: dC [T, 2F] column-wise          deferred backward -> wgrad
};

// forward() writing what it saves into `saved` (c, a or x_col and a_col); the SavedState it returns
// owns none of that memory.
MXMOE_API SavedState forward(Context& ctx, const Problem& problem, const ForwardArgs& args,
                             const StateBuffers& saved);
// The SavedState of such a forward, rebuilt from its inputs (inputs.y unused; inputs.x may be empty
// for mxfp8, whose backward needs only x_col) and the buffers it filled.
MXMOE_API SavedState restore_saved_state(const Problem& problem, const ForwardArgs& inputs, const StateBuffers& saved);
// backward() with args.wgrad == deferred writing its wgrad operands into `state` (dc, or dy_col and
// dc_col); the WgradState it returns owns none of that memory.
MXMOE_API WgradState backward(Context& ctx, SavedState& saved, const BackwardArgs& args,
                              const StateBuffers& state);
// The WgradState of such a backward: inputs.offsets (and inputs.x and dy for bf16), the forward's
// a / x_col, a_col and the deferred backward's dc / dy_col, dc_col.
MXMOE_API WgradState restore_wgrad_state(const Problem& problem, const ForwardArgs& inputs, const TensorView& dy,
                                         const StateBuffers& state);

}  // namespace mxmoe
