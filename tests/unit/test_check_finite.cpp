// Options::check_finite on the CPU (docs/numerics.md "Non-finite values"): every input of forward
// and backward, NaN, +Inf and -Inf, the first bad value named with its coordinates, nothing written
// on refusal, nothing changed when every value is finite, and off by default. The same checks run
// on CUDA tensors in tests/gpu/test_check_finite_gpu.cpp.
// Run: <build>/tests/mxmoe_unit_tests --gtest_filter='CheckFinite*'
#include <gtest/gtest.h>

#include "src/common/finite.h"
#include "src/cpu/cpu_ops.h"
#include "tests/check_finite_support.h"

namespace mxmoe::test {
namespace {

Options checked() {
  Options o;
  o.backend = "cpu";
  o.check_finite = true;
  return o;
}

TEST(CheckFinite, RefusesEveryInputNamingItsFirstBadValueAndWritesNothing) {
  for (Recipe r : {Recipe::mxfp8, Recipe::bf16, Recipe::fp8_blockwise}) {
    Context ctx(checked());
    expect_check_finite(ctx, Device{}, r);
  }
}

TEST(CheckFinite, PerExpertWeights) {
  Context ctx(checked());
  expect_check_finite(ctx, Device{}, Recipe::mxfp8, WeightLayout::per_expert);
}

TEST(CheckFinite, FiniteInputsRunBitIdenticallyWithTheStepInTheReport) {
  for (Recipe r : {Recipe::mxfp8, Recipe::bf16, Recipe::fp8_blockwise}) {
    Context on(checked()), off({.backend = "cpu"});
    expect_check_finite_transparent(on, off, Device{}, r);
  }
}

TEST(CheckFinite, OffByDefaultANanPropagates) {
  Context ctx({.backend = "cpu"});
  expect_check_finite_off_by_default(ctx, Device{});
}

TEST(CheckFinite, PrepareWeightsChecksTheWeights) {
  Context ctx(checked());
  const Problem p = finite_problem(Recipe::mxfp8, Device{});
  LayerData d = make_layer_data(p, {7, 0, 9});
  plant(d.w2, {2, 255, 127}, planted_values()[2]);
  const FiniteCase c{"w2", {2, 255, 127}, {}};
  expect_finite_error([&] { prepare_weights(ctx, p, {.w1 = {.dense = d.w1.view}, .w2 = {.dense = d.w2.view}}); }, c,
                      planted_values()[2]);
}

// The scan itself: the smallest index wins wherever the values lie, in f32 and bf16, dense and
// per-expert; an empty tensor is finite.
TEST(CheckFinite, ScanFindsTheFirstOfSeveral) {
  HostTensor f = random_f32({3, 40, 50});
  f.ptr<float>()[2 * 2000 + 7] = -INFINITY;
  f.ptr<float>()[1 * 2000 + 1999] = NAN;
  f.ptr<float>()[1 * 2000 + 1500] = INFINITY;
  detail::CheckFiniteStep s{.src = {.dense = f.view}, .dtype = DType::f32, .experts = 3, .count = 2000};
  uint64_t code = cpu::check_finite(s);
  EXPECT_EQ(nonfinite_index(code), 3500u);
  EXPECT_EQ(nonfinite_kind(code), NonfiniteKind::pos_inf);
  HostTensor b = random_bf16({2, 64});
  b.ptr<uint16_t>()[100] = 0xff80;
  HostTensor table(DType::i64, {2});
  for (int e = 0; e < 2; ++e) table.ptr<int64_t>()[e] = reinterpret_cast<int64_t>(b.ptr<uint16_t>() + 64 * e);
  s = {.src = {.pointers = table.view, .dtype = DType::bf16}, .dtype = DType::bf16, .experts = 2, .count = 64};
  code = cpu::check_finite(s);
  EXPECT_EQ(nonfinite_index(code), 100u);
  EXPECT_EQ(nonfinite_kind(code), NonfiniteKind::neg_inf);
  s.count = 0;
  EXPECT_EQ(cpu::check_finite(s), kAllFinite);
}

}  // namespace
}  // namespace mxmoe::test
