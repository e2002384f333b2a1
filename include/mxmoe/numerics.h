// Bit-level numerics shared by the CPU reference and the CUDA kernels (docs/numerics.md "Scale rule",
// "E4M3 cast", "Decoding"):
// BF16 round-to-nearest-even, E4M3 saturating RNE cast, E8M0 block scale rounded up, and the decode
// multipliers. Every function is host+device and pure, so the GPU kernels and the CPU reference
// compute the same bits from the same fp32 input.
#pragma once
#include <cstdint>
#include <cstring>

#include "mxmoe/types.h"

namespace mxmoe {

inline constexpr int kMxBlock = 32;          // values sharing one E8M0 scale
inline constexpr float kE4m3Max = 448.0f;    // largest finite E4M3 magnitude
inline constexpr uint8_t kE4m3NaN = 0x7F;    // E4M3 has no Inf; S.1111.111 is NaN
inline constexpr uint8_t kE8m0NaN = 255;

MXMOE_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
MXMOE_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// ---- BF16 (stored as raw uint16 bits) ----
MXMOE_HD uint16_t bf16_from_f32(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}
MXMOE_HD float f32_from_bf16(uint16_t b) { return f32_from_bits(static_cast<uint32_t>(b) << 16); }
MXMOE_HD float round_bf16(float f) { return f32_from_bf16(bf16_from_f32(f)); }

// ---- E8M0 block scale ("Scale rule"): e - 127 = clamp(ceil(log2(amax / 448)), -127, 127) ----
// v = fp32(amax * fp32(1/448)); NaN -> 255, +Inf -> 254, 0 -> 0, else exponent rounded up.
MXMOE_HD uint8_t e8m0_from_amax(float amax) {
  constexpr float kRcpMax = 1.0f / kE4m3Max;
  const float v = amax * kRcpMax;
  const uint32_t u = f32_bits(v) & 0x7fffffffu;
  if (u > 0x7f800000u) return kE8m0NaN;
  if (u == 0x7f800000u) return 254;
  if (u == 0) return 0;
  const uint32_t exp = u >> 23;
  const uint32_t mant = u & 0x7fffffu;
  if (exp == 0) return u <= 0x00400000u ? 0 : 1;  // subnormal v: <= 2^-127 -> 2^-127, else 2^-126
  if (mant != 0 && exp != 254) return static_cast<uint8_t>(exp + 1);
  return static_cast<uint8_t>(exp);
}

// Decode multiplier 2^(e-127); e = 255 is NaN.
MXMOE_HD float e8m0_to_f32(uint8_t e) {
  if (e == kE8m0NaN) return f32_from_bits(0x7fc00000u);
  if (e == 0) return f32_from_bits(0x00400000u);  // 2^-127, subnormal
  return f32_from_bits(static_cast<uint32_t>(e) << 23);
}

// Encode multiplier r = 2^(127-e), built exactly ("E4M3 cast"): e=0 -> 2^127, e=254 -> 2^-127, 255 -> NaN.
MXMOE_HD float e8m0_encode_multiplier(uint8_t e) {
  if (e == kE8m0NaN) return f32_from_bits(0x7fc00000u);
  const int biased = 254 - static_cast<int>(e);
  if (biased == 0) return f32_from_bits(0x00400000u);
  return f32_from_bits(static_cast<uint32_t>(biased) << 23);
}

// ---- E4M3 (bias 7, max 448, subnormal step 2^-9, no Inf) ----
// cvt.rn.satfinite.e4m3x2.f32: RNE, |x| > 448 and +-Inf saturate to +-448, NaN -> NaN.
MXMOE_HD uint8_t e4m3_from_f32(float x) {
  const uint32_t u = f32_bits(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | kE4m3NaN);
  if (a >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7e);  // |x| >= 448 (Inf too)
  const uint32_t exp = a >> 23;                                     // fp32 biased exponent
  if (exp < 121) {                                                  // |x| < 2^-6: E4M3 subnormal
    // value = m * 2^-9, m = RNE(|x| * 2^9) in [0, 8]; 8 carries into the smallest normal (0x08).
    if (exp < 126 - 9 - 1) return sign;  // |x| < 2^-11: rounds to 0 (below half the step 2^-10)
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u;  // 24-bit significand, value = mant * 2^(exp-150)
    const int shift = 150 - 9 - static_cast<int>(exp);  // bits dropped to get units of 2^-9
    const uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    const uint32_t r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    return static_cast<uint8_t>(sign | r);
  }
  // Normal: keep 3 mantissa bits with RNE on the 20 dropped bits.
  uint32_t m = a & 0x7fffffu;
  uint32_t e = exp - 127 + 7;
  const uint32_t q = m >> 20;
  const uint32_t rem = m & 0xfffffu;
  uint32_t r = q + ((rem > 0x80000u || (rem == 0x80000u && (q & 1u))) ? 1u : 0u);
  if (r == 8) {
    r = 0;
    e += 1;
  }
  return static_cast<uint8_t>(sign | (e << 3) | r);  // e <= 15, and (15, 7) excluded by the 448 test
}

MXMOE_HD float e4m3_to_f32(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xfu;
  const uint32_t m = b & 0x7u;
  if (exp == 15 && m == 7) return f32_from_bits(sign | 0x7fc00000u);
  if (exp == 0) {
    const float v = static_cast<float>(m) * (1.0f / 512.0f);
    return sign ? -v : v;
  }
  return f32_from_bits(sign | ((exp - 7 + 127) << 23) | (m << 20));
}

// amax that ignores NaN (max returns the non-NaN operand).
MXMOE_HD float amax_update(float amax, float x) {
  const float a = x < 0 ? -x : x;
  return a > amax ? a : amax;  // NaN compares false and is skipped
}

}  // namespace mxmoe
