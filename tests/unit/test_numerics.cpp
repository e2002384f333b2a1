// Bit-level conversions of include/mxmoe/numerics.h against hand-computed vectors and an independent
// slow nearest-even reference (docs/numerics.md "Scale rule", "E4M3 cast").
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "mxmoe/numerics.h"
#include "support.h"

namespace mxmoe {
namespace {

float bits(uint32_t u) { return f32_from_bits(u); }
float pow2(int k) { return std::ldexp(1.0f, k); }
float up(float x) { return std::nextafter(x, INFINITY); }
float down(float x) { return std::nextafter(x, -INFINITY); }

// ---------------- BF16 ----------------

TEST(Numerics, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_from_f32(1.0f), 0x3F80);
  EXPECT_EQ(bf16_from_f32(-0.0f), 0x8000);
  EXPECT_EQ(bf16_from_f32(bits(0x3F808000u)), 0x3F80);  // tie, 0x3F80 is even
  EXPECT_EQ(bf16_from_f32(bits(0x3F818000u)), 0x3F82);  // tie, 0x3F82 is even
  EXPECT_EQ(bf16_from_f32(bits(0x3F808001u)), 0x3F81);  // just above the tie
  EXPECT_EQ(bf16_from_f32(bits(0x3F807FFFu)), 0x3F80);  // just below the tie
  EXPECT_EQ(bf16_from_f32(bits(0xBF818000u)), 0xBF82);  // sign does not change the rounding
  EXPECT_EQ(bf16_from_f32(INFINITY), 0x7F80);
  EXPECT_EQ(bf16_from_f32(-INFINITY), 0xFF80);
  EXPECT_EQ(bf16_from_f32(FLT_MAX), 0x7F80);            // rounds up past the largest bf16
  EXPECT_EQ(bf16_from_f32(bits(0x00010000u)), 0x0001);  // bf16 subnormal, exact
  EXPECT_EQ(bf16_from_f32(bits(0x00008000u)), 0x0000);  // tie to even zero
  EXPECT_EQ(bf16_from_f32(bits(0x00018000u)), 0x0002);  // tie to even 2
}

TEST(Numerics, Bf16KeepsNaNQuiet) {
  EXPECT_EQ(bf16_from_f32(bits(0x7FC00000u)), 0x7FC0);
  EXPECT_EQ(bf16_from_f32(bits(0x7F800001u)), 0x7FC0);  // signalling NaN whose payload is dropped
  EXPECT_EQ(bf16_from_f32(bits(0xFF800001u)), 0xFFC0);
  EXPECT_EQ(bf16_from_f32(bits(0x7FFFFFFFu)), 0x7FFF);  // rounding must not carry into the sign
  EXPECT_TRUE(std::isnan(round_bf16(NAN)));
}

// ---------------- E8M0 ----------------

TEST(Numerics, E8m0FromAmaxSpecialValues) {
  EXPECT_EQ(e8m0_from_amax(0.0f), 0);
  EXPECT_EQ(e8m0_from_amax(NAN), 255);
  EXPECT_EQ(e8m0_from_amax(INFINITY), 254);
  EXPECT_EQ(e8m0_from_amax(448.0f), 127);
  EXPECT_EQ(e8m0_from_amax(1.0f), 119);                      // ceil(log2(1/448)) = ceil(-8.807) = -8
  EXPECT_EQ(e8m0_from_amax(FLT_MAX), 247);                   // ceil(log2(2^128/448)) = 120
  EXPECT_EQ(e8m0_from_amax(pow2(-130)), 0);                  // subnormal amax: v far below 2^-127
  EXPECT_EQ(e8m0_from_amax(1e-38f), 0);                      // normal amax, subnormal v < 2^-127
  EXPECT_EQ(e8m0_from_amax(bits(1)), 0);                     // smallest subnormal
  EXPECT_EQ(e8m0_from_amax(448.0f * pow2(-126)), 1);         // v = 2^-126 exactly
  EXPECT_EQ(e8m0_from_amax(448.0f * 1.5f * pow2(-127)), 1);  // subnormal v > 2^-127 rounds up
}

TEST(Numerics, E8m0FromAmaxRoundsUpAtEveryPowerOfTwoBoundary) {
  for (int k = -126; k <= 119; ++k) {
    const float boundary = 448.0f * pow2(k);  // amax/448 = 2^k exactly: e - 127 = k
    ASSERT_EQ(e8m0_from_amax(boundary), 127 + k) << "k=" << k;
    ASSERT_EQ(e8m0_from_amax(up(boundary)), 128 + k) << "k=" << k;
    ASSERT_EQ(e8m0_from_amax(down(boundary)), 127 + k) << "k=" << k;
  }
}

TEST(Numerics, E8m0MultipliersAreExactPowersOfTwo) {
  EXPECT_EQ(f32_bits(e8m0_to_f32(0)), 0x00400000u);  // 2^-127, subnormal
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(254), pow2(127));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
  EXPECT_EQ(e8m0_encode_multiplier(0), pow2(127));
  EXPECT_EQ(e8m0_encode_multiplier(127), 1.0f);
  EXPECT_EQ(f32_bits(e8m0_encode_multiplier(254)), 0x00400000u);
  EXPECT_TRUE(std::isnan(e8m0_encode_multiplier(255)));
  for (int e = 0; e < 255; ++e) {
    ASSERT_EQ(static_cast<double>(e8m0_to_f32(static_cast<uint8_t>(e))), std::ldexp(1.0, e - 127)) << e;
    ASSERT_EQ(static_cast<double>(e8m0_encode_multiplier(static_cast<uint8_t>(e))), std::ldexp(1.0, 127 - e))
        << e;
  }
}

// ---------------- E4M3 ----------------

TEST(Numerics, E4m3FromF32HandVectors) {
  EXPECT_EQ(e4m3_from_f32(0.0f), 0x00);
  EXPECT_EQ(e4m3_from_f32(-0.0f), 0x80);
  EXPECT_EQ(e4m3_from_f32(1.0f), 0x38);
  EXPECT_EQ(e4m3_from_f32(-1.0f), 0xB8);
  EXPECT_EQ(e4m3_from_f32(448.0f), 0x7E);
  EXPECT_EQ(e4m3_from_f32(-448.0f), 0xFE);
  EXPECT_EQ(e4m3_from_f32(down(448.0f)), 0x7E);
  EXPECT_EQ(e4m3_from_f32(416.0f), 0x7D);
  EXPECT_EQ(e4m3_from_f32(432.0f), 0x7E);  // tie between 416 (odd) and 448 (even)
  EXPECT_EQ(e4m3_from_f32(240.0f), 0x77);
  EXPECT_EQ(e4m3_from_f32(248.0f), 0x78);  // tie between 240 (odd) and 256 (even, next binade)
}

TEST(Numerics, E4m3SaturatesAndKeepsNaN) {
  for (float x : {449.0f, 463.0f, 464.0f, 465.0f, 480.0f, 1e9f, FLT_MAX, INFINITY}) {
    EXPECT_EQ(e4m3_from_f32(x), 0x7E) << x;
    EXPECT_EQ(e4m3_from_f32(-x), 0xFE) << -x;
  }
  EXPECT_EQ(e4m3_from_f32(NAN), 0x7F);
  EXPECT_EQ(e4m3_from_f32(-NAN), 0xFF);
  EXPECT_EQ(e4m3_from_f32(bits(0x7F800001u)), 0x7F);
}

TEST(Numerics, E4m3SubnormalsRoundToNearestEven) {
  EXPECT_EQ(e4m3_from_f32(pow2(-9)), 0x01);  // smallest subnormal
  EXPECT_EQ(e4m3_from_f32(-pow2(-9)), 0x81);
  EXPECT_EQ(e4m3_from_f32(pow2(-10)), 0x00);  // tie between 0 and 2^-9 -> 0
  EXPECT_EQ(e4m3_from_f32(-pow2(-10)), 0x80);
  EXPECT_EQ(e4m3_from_f32(up(pow2(-10))), 0x01);  // just above the tie
  EXPECT_EQ(e4m3_from_f32(pow2(-11)), 0x00);
  EXPECT_EQ(e4m3_from_f32(3 * pow2(-10)), 0x02);   // tie between 1 and 2 steps -> 2
  EXPECT_EQ(e4m3_from_f32(5 * pow2(-10)), 0x02);   // tie between 2 and 3 steps -> 2
  EXPECT_EQ(e4m3_from_f32(7 * pow2(-9)), 0x07);    // largest subnormal
  EXPECT_EQ(e4m3_from_f32(15 * pow2(-10)), 0x08);  // tie 7 / 8 steps -> smallest normal
  EXPECT_EQ(e4m3_from_f32(pow2(-6)), 0x08);        // smallest normal
  EXPECT_EQ(e4m3_from_f32(down(pow2(-6))), 0x08);
  EXPECT_EQ(e4m3_from_f32(bits(1)), 0x00);  // fp32 subnormal input
}

TEST(Numerics, E4m3NormalsRoundToNearestEven) {
  EXPECT_EQ(e4m3_from_f32(1.0625f), 0x38);  // tie 1.0 (even) / 1.125 -> 1.0
  EXPECT_EQ(e4m3_from_f32(1.1875f), 0x3A);  // tie 1.125 / 1.25 (even) -> 1.25
  EXPECT_EQ(e4m3_from_f32(up(1.0625f)), 0x39);
  EXPECT_EQ(e4m3_from_f32(down(1.1875f)), 0x39);
  EXPECT_EQ(e4m3_from_f32(1.9375f), 0x40);  // tie 1.875 / 2.0 -> 2.0 (carries into the exponent)
  EXPECT_EQ(e4m3_from_f32(-1.1875f), 0xBA);
}

TEST(Numerics, E4m3DecodeRoundTripsEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    const float v = e4m3_to_f32(code);
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    ASSERT_EQ(e4m3_from_f32(v), code) << "code " << c << " value " << v;
    ASSERT_EQ(std::signbit(v), (c & 0x80) != 0) << c;
  }
  EXPECT_EQ(e4m3_to_f32(0x01), pow2(-9));
  EXPECT_EQ(e4m3_to_f32(0x07), 7 * pow2(-9));
  EXPECT_EQ(e4m3_to_f32(0x08), pow2(-6));
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xFE), -448.0f);
}

// Independent slow reference: decode each finite code from its fields in double, then search all
// 254 finite codes for the nearest one; ties go to the even code (mantissa LSB 0). Searching only
// finite codes saturates by itself: nothing is nearer to a large x than +-448.
double slow_e4m3_value(int c) {
  const int exp = (c >> 3) & 0xF, man = c & 7;
  const double mag = exp == 0 ? man * std::ldexp(1.0, -9) : (1.0 + man / 8.0) * std::ldexp(1.0, exp - 7);
  return (c & 0x80) ? -mag : mag;
}

uint8_t slow_e4m3_from_f32(float x) {
  int best = -1;
  double best_d = INFINITY;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    if (((c & 0x80) != 0) != std::signbit(x)) continue;  // +-0 share a value; keep x's sign
    const double d = std::fabs(slow_e4m3_value(c) - static_cast<double>(x));
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return static_cast<uint8_t>(best);
}

TEST(Numerics, E4m3MatchesSlowNearestEvenSearch) {
  std::vector<float> xs;
  // Every code value, every midpoint between neighbours, and a few ulps around each.
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = static_cast<float>(slow_e4m3_value(c));
    const float mid = static_cast<float>((slow_e4m3_value(c) + slow_e4m3_value(c + 1)) / 2);
    for (float p : {lo, mid}) {
      float a = p, b = p;
      xs.push_back(p);
      for (int s = 0; s < 4; ++s) {
        a = up(a);
        b = down(b);
        xs.push_back(a);
        xs.push_back(b);
      }
    }
  }
  for (float x : {448.0f, 456.0f, 464.0f, 472.0f, 480.0f, 1e6f, FLT_MAX}) {
    xs.push_back(x);
    xs.push_back(up(x));
    xs.push_back(down(x));
  }
  // Random magnitudes over the whole range that matters (2^-14 .. 2^10).
  std::uniform_real_distribution<float> expo(-14.0f, 10.0f);
  for (int i = 0; i < 200000; ++i) xs.push_back(std::exp2(expo(test::rng())));
  const size_t n = xs.size();
  for (size_t i = 0; i < n; ++i) xs.push_back(-xs[i]);

  int64_t mismatches = 0;
  for (float x : xs) {
    const uint8_t got = e4m3_from_f32(x), want = slow_e4m3_from_f32(x);
    if (got != want && ++mismatches <= 10) {
      ADD_FAILURE() << "x=" << x << " (bits 0x" << std::hex << f32_bits(x) << ") got 0x" << int(got)
                    << " want 0x" << int(want) << std::dec;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

}  // namespace
}  // namespace mxmoe
