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

struct ForwardArgs {
  TensorView x;          // bf16 [T, H]
  GroupOffsets offsets;  // i32 [E+1]
  TensorView probs;      // f32 [T]
  ExpertMatrices w1;     // bf16 [E, 2F, H]
  TensorView b1;         // bf16 [E, 2F] when problem.fc1_bias
  ExpertMatrices w2;     // bf16 [E, H, F]
  TensorView b2;         // bf16 [E, H] when problem.fc2_bias
  TensorView y;          // out: bf16 [T, H]
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
};

namespace detail {
struct SavedImpl;
struct WgradImpl;
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
