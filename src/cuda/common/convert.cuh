// Conversions shared by the CUDA backends' MXFP8 code: the bf16 halves of a packed pair, and fp32 ->
// E4M3 (hardware from sm_89 on; sm_80 gets the exact software twin of mxmoe/numerics.h).
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

}  // namespace mxmoe::cuda
