// The non-finite policy (docs/numerics.md "Non-finite values"), checked the same way on every
// device: a NaN or Inf in x is never made finite on its way through the layer, in any recipe, and
// rows without one stay finite. Used by the CPU unit test and the GPU suite (one per backend).
#pragma once
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "tests/layer_support.h"

namespace mxmoe::test {

// Counts the non-finite values of row t of a bf16 [T, H] output.
inline int nonfinite_in_row(const HostTensor& out, int64_t t, int64_t H) {
  int n = 0;
  for (int64_t h = 0; h < H; ++h) n += !std::isfinite(f32_from_bf16(out.ptr<uint16_t>()[t * H + h]));
  return n;
}

// The problem of the non-finite suites (this one and check_finite_support.h): H = 256, F = 128,
// E = 3; fp8_blockwise with power-of-two scales on a GPU, where any backend serves those.
inline Problem nonfinite_problem(Recipe recipe, Device device) {
  Problem p;
  p.hidden = 256;
  p.ffn = 128;
  p.experts = 3;
  p.recipe = recipe;
  p.pow2_scales = recipe == Recipe::fp8_blockwise && device.type == DeviceType::cuda;
  return p;
}

// x[row, col] = `bits` (a bf16 NaN, +-Inf, or a finite value so large the fp32 math overflows):
// y[row] holds a non-finite value, and dx[row] too when x itself held one (the backward of a finite
// x reads the finite saved C, where the forward's overflow was only in the activation's product);
// every other row of y is finite.
inline void expect_nonfinite_kept(Context& ctx, Device device, Recipe recipe, uint16_t bits, const char* what) {
  SCOPED_TRACE(std::string(to_string(recipe)) + ", x holds " + what);
  const Problem p = nonfinite_problem(recipe, device);
  const std::vector<int> sizes = {7, 0, 9};
  LayerData d = make_layer_data(p, sizes);
  const int64_t row = 9, H = p.hidden, T = d.tokens;
  d.x.ptr<uint16_t>()[row * H + 37] = bits;
  const LayerOutputs o = run_layer(ctx, device, d);
  for (int64_t t = 0; t < T; ++t) {
    if (t == row) {
      EXPECT_GT(nonfinite_in_row(o.y, t, H), 0) << "y row " << t << " was made finite";
      if (!std::isfinite(f32_from_bf16(bits))) {
        EXPECT_GT(nonfinite_in_row(o.dx, t, H), 0) << "dx row " << t << " was made finite";
      }
    } else {
      EXPECT_EQ(nonfinite_in_row(o.y, t, H), 0) << "y row " << t;
    }
  }
}

inline void expect_nonfinite_policy(Context& ctx, Device device, Recipe recipe) {
  expect_nonfinite_kept(ctx, device, recipe, 0x7f80, "+Inf");
  expect_nonfinite_kept(ctx, device, recipe, 0xff80, "-Inf");
  expect_nonfinite_kept(ctx, device, recipe, 0x7fc0, "NaN");
  // Finite, but a(x) * b(x) in the activation exceeds FLT_MAX: the overflow shows, in every recipe.
  expect_nonfinite_kept(ctx, device, recipe, bf16_from_f32(3e38f), "3e38");
}

}  // namespace mxmoe::test
