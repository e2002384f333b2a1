// The non-finite policy on the CPU reference, every recipe (docs/numerics.md "Non-finite values"),
// and the MXFP8 quantizer's own edge: the largest finite bf16 values.
// Run: <build>/tests/mxmoe_unit_tests --gtest_filter='NonFinite*'
#include <gtest/gtest.h>

#include "src/common/fp8_block.h"
#include "tests/nonfinite_support.h"

namespace mxmoe::test {
namespace {

TEST(NonFinite, Mxfp8KeepsNanAndInfNonFinite) {
  Context ctx({.backend = "cpu"});
  expect_nonfinite_policy(ctx, Device{}, Recipe::mxfp8);
}
TEST(NonFinite, Bf16KeepsNanAndInfNonFinite) {
  Context ctx({.backend = "cpu"});
  expect_nonfinite_policy(ctx, Device{}, Recipe::bf16);
}
TEST(NonFinite, Fp8BlockwiseKeepsNanAndInfNonFinite) {
  Context ctx({.backend = "cpu"});
  expect_nonfinite_policy(ctx, Device{}, Recipe::fp8_blockwise);
}

// Quantized and decoded, a block's values keep what they are: NaN and Inf non-finite (MXFP8: Inf
// gets scale 254 and decodes to Inf; FP8 blockwise: stored as NaN), finite values finite up to
// 3e38. (MXFP8 alone: a bf16 value within 2.7% of FLT_MAX can round up to 256 * 2^120 = 2^128,
// which decodes to Inf; docs/numerics.md says so.)
TEST(NonFinite, QuantizersNeverMakeNonFiniteValuesFinite) {
  Context ctx({.backend = "cpu"});
  HostTensor x = random_bf16({4, 128}, -2.f, 2.f);
  uint16_t* v = x.ptr<uint16_t>();
  v[0 * 128 + 5] = 0x7f80;
  v[1 * 128 + 40] = 0xff80;
  v[2 * 128 + 70] = 0x7fc0;
  v[3 * 128 + 100] = bf16_from_f32(3e38f);
  for (QuantFormat format : {QuantFormat::mxfp8, QuantFormat::fp8_block}) {
    SCOPED_TRACE(format == QuantFormat::mxfp8 ? "mxfp8" : "fp8_block");
    const bool mx = format == QuantFormat::mxfp8;
    HostTensor q(DType::e4m3, {4, 128});
    HostTensor s = mx ? HostTensor(DType::e8m0, {rowwise_scale_bytes(4, 128)})
                      : HostTensor(DType::f32, {fp8_rowwise_scale_count(4, 128)});
    HostTensor back(DType::f32, {4, 128});
    back.poison();
    const Mxfp8View view{q.view, s.view, BlockAxis::row, ScaleLayout::compact, format};
    if (mx) {
      quantize_mxfp8(ctx, {.src = x.view, .rowwise = view});
      dequantize_mxfp8(ctx, {.src = view, .dst = back.view});
    } else {
      for (int64_t r = 0; r < 4; ++r)
        for (int64_t c = 0; c < 128; ++c) {  // one 1x128 block per row
          float amax = 0;
          for (int64_t k = 0; k < 128; ++k) amax = amax_update(amax, f32_from_bf16(v[r * 128 + k]));
          const float scale = fp8_block_scale(amax, false);
          back.ptr<float>()[r * 128 + c] =
              fp8_block_decode(fp8_block_encode(f32_from_bf16(v[r * 128 + c]), scale), fp8_block_scale_inv(scale));
        }
    }
    const float* b = back.ptr<float>();
    EXPECT_TRUE(std::isinf(b[5]) || std::isnan(b[5])) << "+Inf decoded as " << b[5];
    EXPECT_TRUE(std::isinf(b[128 + 40]) || std::isnan(b[128 + 40])) << "-Inf decoded as " << b[128 + 40];
    EXPECT_TRUE(std::isnan(b[256 + 70])) << "NaN decoded as " << b[256 + 70];
    EXPECT_TRUE(std::isfinite(b[384 + 100]) && b[384 + 100] > 2.5e38f) << "3e38 decoded as " << b[384 + 100];
    if (mx) {
      EXPECT_GT(b[5], 0.f);
      EXPECT_LT(b[128 + 40], 0.f);
    }
  }
}

}  // namespace
}  // namespace mxmoe::test
