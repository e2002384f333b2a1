#include <cmath>
#include <string>

#include "mxmoe/problem.h"
#include "mxmoe/types.h"

namespace mxmoe {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::e4m3: return 1;
    case DType::e8m0: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::e4m3: return "e4m3";
    case DType::e8m0: return "e8m0";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "?";
}

// A CPU device is "cpu" at index 0 (what the library writes); any other index is named, so two CPU
// views that differ only in index are told apart in a message.
std::string device_name(Device d) {
  switch (d.type) {
    case DeviceType::cpu: return d.index == 0 ? std::string("cpu") : "cpu:" + std::to_string(d.index);
    case DeviceType::cuda: return "cuda:" + std::to_string(d.index);
  }
  return "device type " + std::to_string(static_cast<int>(d.type)) + ":" + std::to_string(d.index);
}

const char* to_string(Activation a) { return a == Activation::swiglu ? "swiglu" : "clamped_swiglu"; }
const char* to_string(GluLayout g) { return g == GluLayout::halves ? "halves" : "interleave32"; }
const char* to_string(Recipe r) {
  switch (r) {
    case Recipe::bf16: return "bf16";
    case Recipe::mxfp8: return "mxfp8";
    case Recipe::fp8_blockwise: return "fp8_blockwise";
  }
  return "?";
}
const char* to_string(WeightLayout w) { return w == WeightLayout::dense ? "dense" : "per_expert"; }

std::string describe(const Problem& p) {
  std::string s = "H=" + std::to_string(p.hidden) + " F=" + std::to_string(p.ffn) +
                  " E=" + std::to_string(p.experts) + " recipe=" + to_string(p.recipe) +
                  " activation=" + to_string(p.activation);
  if (p.activation == Activation::clamped_swiglu)
    s += "(limit=" + std::to_string(p.clamp.limit) + ",alpha=" + std::to_string(p.clamp.alpha) +
         ",offset=" + std::to_string(p.clamp.linear_offset) + ")";
  if (p.recipe == Recipe::fp8_blockwise && p.pow2_scales) s += " pow2_scales=yes";
  s += std::string(" glu=") + to_string(p.glu_layout) + " weights=" + to_string(p.weight_layout);
  s += std::string(" fc1_bias=") + (p.fc1_bias ? "yes" : "no") + " fc2_bias=" + (p.fc2_bias ? "yes" : "no");
  if (p.fc2_bias) s += std::string(" scale_fc2_bias=") + (p.scale_fc2_bias ? "yes" : "no");
  return s;
}

void validate_problem(const Problem& p) {
  const int64_t align = p.recipe == Recipe::mxfp8 ? 32 : p.recipe == Recipe::fp8_blockwise ? 16 : 8;
  const char* why = p.recipe == Recipe::mxfp8           ? "must be a positive multiple of 32 for the mxfp8 recipe"
                    : p.recipe == Recipe::fp8_blockwise ? "must be a positive multiple of 16 for the fp8_blockwise recipe"
                                                        : "must be a positive multiple of 8 for the bf16 recipe";
  if (p.recipe != Recipe::bf16 && p.recipe != Recipe::mxfp8 && p.recipe != Recipe::fp8_blockwise)
    throw Error("problem.recipe", "recipe=" + std::to_string(static_cast<int>(p.recipe)) +
                                      " is not one of bf16, mxfp8, fp8_blockwise");
  if (p.activation != Activation::swiglu && p.activation != Activation::clamped_swiglu)
    throw Error("problem.activation", "activation=" + std::to_string(static_cast<int>(p.activation)) +
                                          " is not one of swiglu, clamped_swiglu");
  if (p.glu_layout != GluLayout::halves && p.glu_layout != GluLayout::interleave32)
    throw Error("problem.glu_layout", "glu_layout=" + std::to_string(static_cast<int>(p.glu_layout)) +
                                          " is not one of halves, interleave32");
  if (p.weight_layout != WeightLayout::dense && p.weight_layout != WeightLayout::per_expert)
    throw Error("problem.weight_layout", "weight_layout=" + std::to_string(static_cast<int>(p.weight_layout)) +
                                             " is not one of dense, per_expert");
  if (p.pow2_scales && p.recipe != Recipe::fp8_blockwise)
    throw Error("problem.pow2_scales", std::string("pow2_scales=true applies to the fp8_blockwise recipe only, not ") +
                                           to_string(p.recipe));
  if (p.hidden <= 0 || p.hidden % align != 0)
    throw Error("problem.hidden", "hidden=" + std::to_string(p.hidden) + " " + why);
  if (p.hidden > kMaxHidden)
    throw Error("problem.hidden", "hidden=" + std::to_string(p.hidden) + " exceeds the bound " +
                                      std::to_string(kMaxHidden) + " (2^20)");
  if (p.ffn <= 0 || p.ffn % align != 0)
    throw Error("problem.ffn", "ffn=" + std::to_string(p.ffn) + " " + why);
  if (p.ffn > kMaxFfn)
    throw Error("problem.ffn", "ffn=" + std::to_string(p.ffn) + " exceeds the bound " + std::to_string(kMaxFfn) +
                                   " (2^20)");
  if (p.glu_layout == GluLayout::interleave32 && p.ffn % 32 != 0)
    throw Error("problem.ffn", "ffn=" + std::to_string(p.ffn) + " must be a multiple of 32 for glu_layout=interleave32");
  if (p.experts <= 0 || p.experts > kMaxExperts)
    throw Error("problem.experts", "experts=" + std::to_string(p.experts) + " must be in [1, 2^20]");
  if (p.scale_fc2_bias && !p.fc2_bias)
    throw Error("problem.scale_fc2_bias", "scale_fc2_bias=true requires fc2_bias=true");
  if (p.activation == Activation::clamped_swiglu) {
    if (!(p.clamp.limit > 0) || !std::isfinite(p.clamp.limit))
      throw Error("problem.clamp.limit", "limit=" + std::to_string(p.clamp.limit) + " must be finite and > 0");
    if (!std::isfinite(p.clamp.alpha) || !std::isfinite(p.clamp.linear_offset))
      throw Error("problem.clamp", "alpha and linear_offset must be finite");
  }
}

}  // namespace mxmoe
