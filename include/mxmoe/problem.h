// The grouped-MLP problem description (docs/numerics.md "GLU layouts", "SwiGLU",
// "Clamped SwiGLU", "Biases").
#pragma once
#include <cstdint>
#include <string>

#include "mxmoe/export.h"

namespace mxmoe {

enum class Activation : uint8_t { swiglu, clamped_swiglu };
enum class GluLayout : uint8_t { halves, interleave32 };
// bf16: no quantization. mxfp8: E4M3 + one E8M0 scale per 32 values. fp8_blockwise: E4M3 + one
// fp32 scale per 128 values (activations 1x128, wgrad operands 128x1 along the tokens, weights
// 128x128; docs/numerics.md "FP8 blockwise").
enum class Recipe : uint8_t { bf16, mxfp8, fp8_blockwise };
enum class WeightLayout : uint8_t { dense, per_expert };

// GPT-OSS clamped SwiGLU: h = p * min(a,L) * sigmoid(alpha*min(a,L)) * (clamp(b,-L,L) + offset).
struct ClampedSwiglu {
  float limit = 7.0f;
  float alpha = 1.702f;
  float linear_offset = 1.0f;
};

// Bounds of every dimension (checked by validate_problem() and the entry points, which also check
// every size they derive with overflow-checked arithmetic). Far above any real MoE layer; they keep
// every element count and byte size of the layer's tensors inside int64 and the token count inside
// the int32 group offsets.
inline constexpr int64_t kMaxHidden = int64_t{1} << 20;   // H
inline constexpr int64_t kMaxFfn = int64_t{1} << 20;      // F (FC1 produces 2F)
inline constexpr int64_t kMaxExperts = int64_t{1} << 20;  // E
inline constexpr int64_t kMaxTokens = INT32_MAX;          // T (routed tokens of one call)
// Columns of one operand of the low-level ops (ops.h): 2F at most.
inline constexpr int64_t kMaxColumns = 2 * kMaxFfn;

struct Problem {
  int64_t hidden = 0;   // H: FC1 input / FC2 output features
  int64_t ffn = 0;      // F: FC1 produces 2F (GLU), FC2 consumes F
  int64_t experts = 0;  // E
  Activation activation = Activation::swiglu;
  ClampedSwiglu clamp{};
  GluLayout glu_layout = GluLayout::halves;
  bool fc1_bias = false;
  bool fc2_bias = false;
  bool scale_fc2_bias = false;  // FC2 adds p_t * b2 instead of b2
  Recipe recipe = Recipe::mxfp8;
  // fp8_blockwise only: every scale rounded down to a power of two (TransformerEngine's
  // force_pow_2_scales), so that scaling and unscaling are exact.
  bool pow2_scales = false;
  WeightLayout weight_layout = WeightLayout::dense;
};

MXMOE_API const char* to_string(Activation a);
MXMOE_API const char* to_string(GluLayout g);
MXMOE_API const char* to_string(Recipe r);
MXMOE_API const char* to_string(WeightLayout w);
MXMOE_API std::string describe(const Problem& p);

// Throws mxmoe::Error naming the field when the problem cannot be computed (docs/numerics.md "Dimensions": H, F
// multiples of 32 for MXFP8, of 16 for FP8 blockwise and of 8 for BF16; interleave32 needs F % 32 == 0; E >= 1) or exceeds
// the bounds above (H <= kMaxHidden, F <= kMaxFfn, E <= kMaxExperts).
MXMOE_API void validate_problem(const Problem& p);

// FLOPs of one forward (6 T H F) and one backward with wgrad (12 T H F).
inline double forward_flops(const Problem& p, int64_t tokens) {
  return 6.0 * static_cast<double>(tokens) * static_cast<double>(p.hidden) * static_cast<double>(p.ffn);
}
inline double backward_flops(const Problem& p, int64_t tokens) { return 2.0 * forward_flops(p, tokens); }

}  // namespace mxmoe
