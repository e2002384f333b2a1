// Conversions shared by the CUDA backends' MXFP8 code: the bf16 halves of a packed pair, fp32 ->
// E4M3 and scaled E4M3 -> bf16 (hardware from sm_89 on; sm_80 gets the exact software twin of
// mxmoe/numerics.h).
#pragma once
#include <cstdint>

#include "mxmoe/numerics.h"

namespace mxmoe::cuda {

__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

// Two fp32 -> two E4M3 bytes (lo in bits 0-7): RNE, saturating, NaN -> NaN (numerics.h).
__device__ __forceinline__ uint32_t e4m3x2_from_f32(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return static_cast<uint32_t>(e4m3_from_f32(lo)) | (static_cast<uint32_t>(e4m3_from_f32(hi)) << 8);
#endif
}

// Two e4m3 bytes (lo in bits 0-7) times their f32 block scales (powers of two, or NaN) -> bf16x2
// (lo in bits 0-15): bf16_from_f32(e4m3_to_f32(q) * s) for every non-NaN result; a NaN in either
// operand gives a NaN (its bits may differ from the host's). From sm_89 on: e4m3 -> f16 is exact
// (one F2FP for both), f16 -> f32 exact, the f32 product is the reference's (at most 4 significant
// bits, never below f32's subnormal step), and cvt.rn.bf16x2 rounds it as bf16_from_f32 does.
__device__ __forceinline__ uint32_t e4m3x2_scaled_bf16x2(uint32_t two, float s_lo, float s_hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(static_cast<uint16_t>(two)));
  float lo, hi;
  asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(static_cast<uint16_t>(h & 0xFFFF)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(static_cast<uint16_t>(h >> 16)));
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi * s_hi), "f"(lo * s_lo));
  return r;
#else
  const uint32_t lo = bf16_from_f32(e4m3_to_f32(static_cast<uint8_t>(two & 0xFFu)) * s_lo);
  const uint32_t hi = bf16_from_f32(e4m3_to_f32(static_cast<uint8_t>((two >> 8) & 0xFFu)) * s_hi);
  return lo | (hi << 16);
#endif
}

}  // namespace mxmoe::cuda
