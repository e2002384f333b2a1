// Bad input gets an mxmoe::Error naming the argument and the value, and nothing the caller owns is
// written (outputs keep their poison).
#include <gtest/gtest.h>

#include <functional>

#include "tests/layer_support.h"

namespace mxmoe::test {
namespace {

struct Fixture {
  Problem p;
  LayerData d;
  Arena m{Device{}, {}};
  ForwardArgs fa;
  HostTensor y_poison;
  TensorView y_buffer;  // the original output, even if a test re-points fa.y
  Fixture(Recipe r = Recipe::mxfp8) {
    p.hidden = 64;
    p.ffn = 32;
    p.experts = 3;
    p.recipe = r;
    p.fc1_bias = true;
    d = make_layer_data(p, {4, 0, 9});
    fa.x = m.put(d.x);
    fa.offsets.offsets = m.put(d.offsets);
    fa.probs = m.put(d.probs);
    fa.w1 = m.experts(m.put(d.w1), false);
    fa.w2 = m.experts(m.put(d.w2), false);
    fa.b1 = m.put(d.b1);
    fa.y = m.poisoned(DType::bf16, {d.tokens, p.hidden});
    y_poison = m.get(fa.y);
    y_buffer = fa.y;
  }
  bool y_untouched() { return bytes_equal(m.get(y_buffer).view, y_poison.view); }
  // Valid backward outputs (dx, dprobs, db1) on poisoned buffers; weight grads left to the test.
  BackwardArgs backward_args() {
    BackwardArgs ba;
    ba.dy = m.put(d.dy);
    ba.dx = m.poisoned(DType::bf16, {d.tokens, p.hidden});
    ba.dprobs = m.poisoned(DType::f32, {d.tokens});
    ba.grads.db1 = m.poisoned(DType::f32, {p.experts, 2 * p.ffn});
    return ba;
  }
};

// Runs forward with one corruption and checks the error's argument and message.
void expect_forward_error(const std::function<void(Fixture&)>& corrupt, const std::string& argument,
                          const std::string& fragment, Recipe r = Recipe::mxfp8) {
  Fixture f(r);
  corrupt(f);
  Context ctx({.backend = "cpu"});
  try {
    forward(ctx, f.p, f.fa);
    ADD_FAILURE() << "no error for " << argument;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
  EXPECT_TRUE(f.y_untouched()) << argument;
}

TEST(Validation, OffsetsMustStartAtZero) {
  expect_forward_error([](Fixture& f) { f.fa.offsets.offsets.ptr<int32_t>()[0] = 1; }, "offsets", "offsets[0]=1");
}
TEST(Validation, OffsetsMustBeMonotone) {
  expect_forward_error([](Fixture& f) { f.fa.offsets.offsets.ptr<int32_t>()[2] = 2; }, "offsets", "offsets[2]=2 < offsets[1]=4");
}
TEST(Validation, OffsetsMustEndAtTokenCount) {
  expect_forward_error([](Fixture& f) { f.fa.offsets.offsets.ptr<int32_t>()[3] = 12; }, "offsets", "offsets[3]=12");
}
TEST(Validation, OffsetsOverrunIsRejected) {
  expect_forward_error([](Fixture& f) { f.fa.offsets.offsets.ptr<int32_t>()[3] = 99; }, "offsets", "99");
}
TEST(Validation, OffsetsLengthMustBeExpertsPlusOne) {
  expect_forward_error([](Fixture& f) { f.fa.offsets.offsets.shape[0] = 3; }, "offsets", "[3]");
}
TEST(Validation, XDtypeMustBeBf16) {
  expect_forward_error([](Fixture& f) { f.fa.x.dtype = DType::f32; }, "x", "dtype f32");
}
TEST(Validation, XShapeMustBeTokensByHidden) {
  expect_forward_error([](Fixture& f) { f.fa.x.shape[1] = 32; }, "x", "[13, 32]");
}
TEST(Validation, NullInputPointerIsRejected) {
  expect_forward_error([](Fixture& f) { f.fa.probs.data = nullptr; }, "probs", "null");
}
TEST(Validation, ProbsMustBeF32) {
  expect_forward_error([](Fixture& f) { f.fa.probs.dtype = DType::bf16; }, "probs", "dtype bf16");
}
TEST(Validation, WeightShapeIsChecked) {
  expect_forward_error([](Fixture& f) { f.fa.w1.dense.shape[1] = 32; }, "w1", "must be [3, 64, 64]");
}
TEST(Validation, HiddenMustBeMultipleOf32ForMxfp8) {
  expect_forward_error([](Fixture& f) { f.p.hidden = 48; }, "problem.hidden", "hidden=48");
}
TEST(Validation, FfnMustBeMultipleOf8ForBf16) {
  expect_forward_error([](Fixture& f) { f.p.ffn = 36; }, "problem.ffn", "ffn=36", Recipe::bf16);
}
TEST(Validation, BiasMustMatchTheProblem) {
  expect_forward_error([](Fixture& f) { f.p.fc1_bias = false; }, "b1", "fc1_bias");
  // A bias the problem asks for but the call lacks is reported as missing, not as a dtype mismatch
  // of the empty view.
  expect_forward_error([](Fixture& f) { f.p.fc2_bias = true; }, "b2",
                       "missing (no data pointer) but problem.fc2_bias is true; expected bf16 [3, 64]");
}
TEST(Validation, MissingTensorIsReportedAsMissing) {
  expect_forward_error([](Fixture& f) { f.fa.y = {}; }, "y", "y: missing (no data pointer); expected bf16 [13, 64]");
  expect_forward_error([](Fixture& f) { f.fa.probs = {}; }, "probs", "probs: missing (no data pointer)");
  expect_forward_error([](Fixture& f) { f.fa.x = {}; }, "x", "x: missing (no data pointer)");
}
TEST(Validation, DeviceMismatchNamesBothTensorsAndBothDevices) {
  const Device gpu{DeviceType::cuda, 0};
  // Everything on cuda:0 but the offsets: the offsets are the odd one out.
  expect_forward_error(
      [&](Fixture& f) {
        for (TensorView* t : {&f.fa.x, &f.fa.probs, &f.fa.w1.dense, &f.fa.w2.dense, &f.fa.b1, &f.fa.y}) t->device = gpu;
      },
      "offsets", "offsets: is on cpu but x is on cuda:0");
  // Only x on cuda:0: x is the odd one out, not the offsets checked after it.
  expect_forward_error([&](Fixture& f) { f.fa.x.device = gpu; }, "x", "x: is on cuda:0 but offsets is on cpu");
  // The message lists every device with its tensors.
  expect_forward_error([&](Fixture& f) { f.fa.y.device = gpu; }, "y", "cpu: x, offsets, probs, w1, b1, w2; cuda:0: y");
}
TEST(Validation, BackwardDeviceMismatchNamesTheForwardsDevice) {
  Fixture f;
  Context ctx({.backend = "cpu"});
  SavedState saved = forward(ctx, f.p, f.fa);
  BackwardArgs ba = f.backward_args();
  ba.dx.device = Device{DeviceType::cuda, 1};
  try {
    backward(ctx, saved, ba);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "dx");
    EXPECT_NE(std::string(e.what()).find("dx: is on cuda:1 but the forward's data (saved) is on cpu"), std::string::npos)
        << e.what();
  }
  ba.dx.device = Device{};
  ba.dy = {};
  try {
    backward(ctx, saved, ba);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "dy");
    EXPECT_NE(std::string(e.what()).find("dy: missing (no data pointer)"), std::string::npos) << e.what();
  }
}
TEST(Validation, OutputAliasingAnInputIsRejected) {
  expect_forward_error([](Fixture& f) { f.fa.y.data = f.fa.x.data; }, "y", "overlaps input x");
}
TEST(Validation, MixedDevicesAreRejected) {
  expect_forward_error([](Fixture& f) { f.fa.probs.device = Device{DeviceType::cuda, 0}; }, "probs", "cuda:0");
}
TEST(Validation, MisalignedDevicePointerIsRejectedBeforeAnyAccess) {
  // Every view claims the GPU; the x pointer is misaligned: the check fires before any dereference.
  expect_forward_error(
      [](Fixture& f) {
        for (TensorView* t : {&f.fa.x, &f.fa.offsets.offsets, &f.fa.probs, &f.fa.w1.dense, &f.fa.w2.dense, &f.fa.b1, &f.fa.y})
          t->device = Device{DeviceType::cuda, 0};
        f.fa.x.data = static_cast<char*>(f.fa.x.data) + 2;
      },
      "x", "not 16-byte aligned");
}
TEST(Validation, WeightLayoutMustMatchTheProblem) {
  expect_forward_error([](Fixture& f) { f.p.weight_layout = WeightLayout::per_expert; }, "w1", "weight_layout=per_expert");
}
TEST(Validation, ScaleFc2BiasNeedsFc2Bias) {
  expect_forward_error([](Fixture& f) { f.p.scale_fc2_bias = true; }, "problem.scale_fc2_bias", "fc2_bias");
}

TEST(Validation, BackwardChecksOutputsAndAccumulateDtype) {
  Fixture f;
  Context ctx({.backend = "cpu"});
  SavedState saved = forward(ctx, f.p, f.fa);
  BackwardArgs ba = f.backward_args();
  ba.grads.dw1 = f.m.experts(f.m.poisoned(DType::bf16, {3, 64, 64}), false);
  ba.grads.dw2 = f.m.experts(f.m.poisoned(DType::bf16, {3, 64, 32}), false);
  ba.grads.accumulate = true;
  HostTensor dx_before = f.m.get(ba.dx);
  try {
    backward(ctx, saved, ba);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "grads.accumulate");
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos);
  }
  EXPECT_TRUE(bytes_equal(f.m.get(ba.dx).view, dx_before.view));
  ba.grads.accumulate = false;
  ba.dprobs.shape[0] = 5;
  EXPECT_THROW(backward(ctx, saved, ba), Error);
  ba.dprobs.shape[0] = f.d.tokens;
  ba.dx.data = ba.dy.data;
  try {
    backward(ctx, saved, ba);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "dx");
  }
}

TEST(Validation, SavedStateCannotBeConsumedTwice) {
  Fixture f;
  Context ctx({.backend = "cpu"});
  SavedState saved = forward(ctx, f.p, f.fa);
  BackwardArgs ba = f.backward_args();
  ba.wgrad = WgradMode::deferred;
  WgradState w = backward(ctx, saved, ba);
  EXPECT_TRUE(w.pending());
  EXPECT_GT(w.bytes(), 0);
  try {
    backward(ctx, saved, ba);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "saved");
  }
  WgradState empty;
  EXPECT_THROW(compute_wgrad(ctx, empty, ba.grads), Error);
}

TEST(Validation, QuantizeRejectsBadShapesAndSmallScaleBuffers) {
  Context ctx({.backend = "cpu"});
  HostTensor src = random_bf16({40, 48});
  HostTensor q(DType::e4m3, {40, 48}), s(DType::e8m0, {rowwise_scale_bytes(40, 64)});
  QuantizeArgs a;
  a.src = src.view;
  a.rowwise = {q.view, s.view, BlockAxis::row, ScaleLayout::compact};
  try {
    quantize_mxfp8(ctx, a);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "src");
    EXPECT_NE(std::string(e.what()).find("48"), std::string::npos);
  }
  HostTensor src2 = random_bf16({40, 64});
  HostTensor q2(DType::e4m3, {40, 64}), s2(DType::e8m0, {10});
  a.src = src2.view;
  a.rowwise = {q2.view, s2.view, BlockAxis::row, ScaleLayout::compact};
  try {
    quantize_mxfp8(ctx, a);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "rowwise.scales");
  }
}

TEST(Validation, GroupedGemmRejectsMixedRecipesAndBadOffsets) {
  Context ctx({.backend = "cpu"});
  HostTensor a = random_bf16({10, 64}), b = random_bf16({2, 32, 64}), d(DType::bf16, {10, 32});
  HostTensor off = offsets_from_sizes({4, 6});
  MGroupedGemmArgs g;
  g.a.bf16 = a.view;
  g.b.data.dense = b.view;
  g.offsets.offsets = off.view;
  g.d = d.view;
  d.poison();
  EXPECT_NO_THROW(grouped_gemm_m(ctx, g));
  off.ptr<int32_t>()[1] = 11;
  try {
    grouped_gemm_m(ctx, g);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "offsets");
  }
  HostTensor bq(DType::e4m3, {2, 32, 64});
  g.b.data.dense = bq.view;
  g.b.data.dtype = DType::e4m3;
  EXPECT_THROW(grouped_gemm_m(ctx, g), Error);
}

// ---- the edges a new user probed (issue 39: D1-D5, D10) ----

// Runs `call`, expects an Error naming `argument` whose message contains every fragment.
void expect_error(const std::function<void()>& call, const std::string& argument,
                  std::initializer_list<std::string> fragments) {
  try {
    call();
    ADD_FAILURE() << "no error for " << argument;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
    for (const std::string& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

TEST(EdgeInputs, PermutedRowsBoundRefusesOutOfRangeArguments) {
  const int64_t huge = int64_t{1} << 62;
  expect_error([&] { permuted_rows_bound(huge, 4, 1, -1); }, "tokens", {"T=" + std::to_string(huge)});
  expect_error([&] { permuted_rows_bound(10, 1, huge, 4); }, "experts", {"E=" + std::to_string(huge)});
  expect_error([] { permuted_rows_bound(-5, 2, 3, -1); }, "tokens", {"T=-5"});
  expect_error([] { permuted_rows_bound(6, 2, 3, -7); }, "capacity", {"C=-7"});
  expect_error([] { permuted_rows_bound(6, 0, 3, -1); }, "top_k", {"K=0"});
  expect_error([] { permuted_rows_bound(int64_t{1} << 30, 4, 3, -1); }, "top_k", {"T*K=4294967296"});
  // In range: T * K, or min(T * K, E * C).
  EXPECT_EQ(permuted_rows_bound(6, 2, 3, -1), 12);
  EXPECT_EQ(permuted_rows_bound(6, 2, 3, 1), 3);
  EXPECT_EQ(permuted_rows_bound(6, 2, 3, 0), 0);
  EXPECT_EQ(permuted_rows_bound(0, 5, 1, -1), 0);
}

TEST(EdgeInputs, CpuDeviceIndexMismatchNamesBothIndices) {
  for (int index : {3, -1, 5})
    expect_forward_error([&](Fixture& f) { f.fa.x.device = Device{DeviceType::cpu, index}; }, "x",
                         "x: is on cpu:" + std::to_string(index) + " but offsets is on cpu (");
}

TEST(EdgeInputs, UnknownDtypeAndDeviceTypeAreNamedWithTheirValue) {
  expect_forward_error([](Fixture& f) { f.fa.x.dtype = static_cast<DType>(99); }, "x", "dtype 99 ");
  expect_forward_error([](Fixture& f) { f.fa.x.device.type = static_cast<DeviceType>(7); }, "x", "device type 7");
}

TEST(EdgeInputs, PerExpertDtypeOutOfRangeIsNamedWithItsValue) {
  expect_forward_error(
      [](Fixture& f) {
        f.p.weight_layout = WeightLayout::per_expert;
        f.fa.w1 = f.m.experts(f.fa.w1.dense, true);
        f.fa.w2 = f.m.experts(f.fa.w2.dense, true);
        f.fa.w1.dtype = static_cast<DType>(99);
      },
      "w1.dtype", "dtype 99 ");
}

TEST(EdgeInputs, ProblemEnumsOutOfRangeAreRefused) {
  expect_forward_error([](Fixture& f) { f.p.activation = static_cast<Activation>(9); }, "problem.activation",
                       "activation=9 is not one of swiglu, clamped_swiglu");
  expect_forward_error([](Fixture& f) { f.p.glu_layout = static_cast<GluLayout>(5); }, "problem.glu_layout",
                       "glu_layout=5 is not one of halves, interleave32");
  expect_forward_error([](Fixture& f) { f.p.weight_layout = static_cast<WeightLayout>(4); }, "problem.weight_layout",
                       "weight_layout=4 is not one of dense, per_expert");
}

TEST(EdgeInputs, OptionsScaleLayoutOutOfRangeIsRefused) {
  expect_error([] { Context ctx({.backend = "cpu", .scale_layout = static_cast<ScaleLayout>(9)}); },
               "options.scale_layout", {"scale_layout=9"});
}

TEST(EdgeInputs, QuantizedViewEnumsOutOfRangeAreRefused) {
  Context ctx({.backend = "cpu"});
  HostTensor src = random_bf16({40, 64}, -3.f, 3.f);
  HostTensor q(DType::e4m3, {40, 64}), s(DType::e8m0, {rowwise_scale_bytes(40, 64)});
  q.poison();
  const HostTensor q_before = q;
  QuantizeArgs a;
  a.src = src.view;
  a.rowwise = {q.view, s.view, BlockAxis::row, static_cast<ScaleLayout>(9)};
  expect_error([&] { quantize_mxfp8(ctx, a); }, "rowwise.layout", {"layout=9"});
  a.rowwise.layout = ScaleLayout::compact;
  a.rowwise.format = static_cast<QuantFormat>(6);
  expect_error([&] { quantize_mxfp8(ctx, a); }, "rowwise.format", {"format=6"});
  a.rowwise.format = QuantFormat::mxfp8;
  a.rowwise.axis = static_cast<BlockAxis>(3);
  expect_error([&] { quantize_mxfp8(ctx, a); }, "rowwise.axis", {"axis=3"});
  EXPECT_TRUE(bytes_equal(q.view, q_before.view));
}

TEST(EdgeInputs, WgradModeOutOfRangeIsRefusedAndTheStateKept) {
  Fixture f;
  Context ctx({.backend = "cpu"});
  SavedState saved = forward(ctx, f.p, f.fa);
  BackwardArgs ba = f.backward_args();
  ba.grads.dw1 = f.m.experts(f.m.poisoned(DType::f32, {3, 64, 64}), false);
  ba.grads.dw2 = f.m.experts(f.m.poisoned(DType::f32, {3, 64, 32}), false);
  const HostTensor dx_before = f.m.get(ba.dx);
  ba.wgrad = static_cast<WgradMode>(7);
  expect_error([&] { backward(ctx, saved, ba); }, "wgrad", {"wgrad=7 is not one of now, deferred"});
  EXPECT_TRUE(bytes_equal(f.m.get(ba.dx).view, dx_before.view));
  ba.wgrad = WgradMode::now;  // the saved state was not consumed by the refused call
  EXPECT_FALSE(backward(ctx, saved, ba).pending());
}

TEST(EdgeInputs, RankBeyondThreeIsRefusedWithoutReadingPastTheShape) {
  for (int rank : {4, -1}) {
    Fixture f;
    f.fa.x.rank = rank;
    Context ctx({.backend = "cpu"});
    try {
      forward(ctx, f.p, f.fa);
      ADD_FAILURE() << "no error for rank " << rank;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "x");
      EXPECT_EQ(std::string(e.what()),
                "x: rank " + std::to_string(rank) + " must be in [1, 3] (a TensorView holds at most 3 dimensions)");
    }
    EXPECT_TRUE(f.y_untouched());
  }
}

TEST(EdgeInputs, HalfSetAllocatorIsRefused) {
  auto alloc = [](int64_t, Device, void*, void*) -> void* { return nullptr; };
  auto release = [](void*, int64_t, Device, void*, void*) {};
  Options o{.backend = "cpu"};
  o.allocator.allocate = alloc;
  expect_error([&] { Context ctx(o); }, "options.allocator", {"allocate is set but release is null"});
  o.allocator = {};
  o.allocator.release = release;
  expect_error([&] { Context ctx(o); }, "options.allocator", {"release is set but allocate is null"});
}

}  // namespace
}  // namespace mxmoe::test
