// cuda_sm90's fp8_blockwise switch, read per call both by the backend (src/cuda/sm90/gemm_m.cu: which
// GEMMs run on FP8 wgmma) and by prepare_weights (src/api/grouped_mlp.cpp: which weight copies pay),
// so that the two never disagree:
//   MXMOE_SM90_FP8_BLOCK unset    every fp8_blockwise GEMM on FP8 wgmma (the default)
//                        forward  the backward GEMMs on the dequantized BF16 path (pow2 scales only)
//                        dequant  every GEMM on that path (comparison runs)
// and MXMOE_SM90_MX_WEIGHTS (below).
#pragma once
#include <cstdlib>
#include <cstring>

#include "src/common/env.h"

namespace mxmoe {

enum class Sm90Fp8Block { all, forward, dequant };

inline Sm90Fp8Block sm90_fp8_block_mode() {
  const char* v = std::getenv("MXMOE_SM90_FP8_BLOCK");
  if (v != nullptr && std::strcmp(v, "forward") == 0) return Sm90Fp8Block::forward;
  if (v != nullptr && std::strcmp(v, "dequant") == 0) return Sm90Fp8Block::dequant;
  return Sm90Fp8Block::all;
}

// The layer's per-call MXFP8 weights where the GEMM's backend reads bf16 weight copies (cuda_sm90;
// src/api/grouped_mlp.cpp), read per call: unset, each weight is quantized straight into the bf16
// copy its GEMM reads, made just before that GEMM and freed after it (no FP8 weight bytes kept);
// MXMOE_SM90_MX_WEIGHTS=fp8 keeps FP8 copies for the whole call, each GEMM dequantizing its own into
// a transient bf16 copy (the route before session 15), for comparison runs.
inline bool sm90_mx_weights_fp8() { return env_is("MXMOE_SM90_MX_WEIGHTS", "fp8"); }

}  // namespace mxmoe
