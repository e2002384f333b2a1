// Conversions shared by the CUDA backends' MXFP8 code: the bf16 halves of a packed pair, fp32 ->
// E4M3 and scaled E4M3 -> bf16 (hardware from sm_89 on; sm_80 gets the exact software twin of
// mxmoe/numerics.h).
#pragma once
#include <cuda_fp16.h>

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

// Two E4M3 bytes (lo = bits 0-7, hi = bits 8-15) -> exact fp32 values; a NaN comes out as the
// canonical NaN (e4m3x2_f32: as the host's NaN, with the byte's sign, numerics.h e4m3_to_f32).
__device__ __forceinline__ float2 e4m3x2_to_f32(uint32_t two) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h2) : "h"(static_cast<uint16_t>(two)));
  return __half22float2(*reinterpret_cast<const __half2*>(&h2));
#else
  // NOTE: E4M3 magnitude bits (eeee.mmm) placed at fp32 bits 20..26 read as 2^-120 times the E4M3
  // value, subnormals included; one exact multiply restores it. NaN (S.1111.111) is checked apart.
  auto one = [](uint32_t b) {
    const float v = __uint_as_float(((b & 0x7fu) << 20) | ((b & 0x80u) << 24)) * 0x1p120f;
    return (b & 0x7fu) == 0x7fu ? __uint_as_float(0x7fc00000u) : v;
  };
  return make_float2(one(two & 0xffu), one((two >> 8) & 0xffu));
#endif
}
__device__ __forceinline__ void e4m3x2_f32(uint32_t two, float& lo, float& hi) {
  const float2 v = e4m3x2_to_f32(two);
  lo = v.x != v.x ? e4m3_to_f32(static_cast<uint8_t>(two)) : v.x;
  hi = v.y != v.y ? e4m3_to_f32(static_cast<uint8_t>(two >> 8)) : v.y;
}

// Two e4m3 bytes times their f32 block scales (powers of two, or NaN) -> bf16x2 (lo in bits 0-15):
// bf16_from_f32(e4m3_to_f32(q) * s) for every non-NaN result; a NaN in either operand gives a NaN
// (its bits may differ from the host's). The f32 product is the reference's (at most 4 significant
// bits, never below f32's subnormal step) and cvt.rn.bf16x2 rounds it as bf16_from_f32 does.
__device__ __forceinline__ uint32_t e4m3x2_scaled_bf16x2(uint32_t two, float s_lo, float s_hi) {
  const float2 v = e4m3x2_to_f32(two);
  const float lo = v.x * s_lo, hi = v.y * s_hi;
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

}  // namespace mxmoe::cuda
