// Sizes and memory: every dimension is bounded, every derived size is overflow-checked (an error
// naming the argument, never a wrapped product), and a call whose memory cannot be had is refused
// with an OutOfMemoryError that says what the whole call needs.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "src/common/checked.h"
#include "tests/layer_support.h"

namespace mxmoe::test {
namespace {

bool contains(const std::string& s, const std::string& frag) { return s.find(frag) != std::string::npos; }

TEST(Sizes, CheckedArithmeticThrowsNamingTheArgument) {
  EXPECT_EQ(detail::checked_mul(int64_t{1} << 31, int64_t{1} << 31, "w1"), int64_t{1} << 62);
  try {
    detail::checked_mul({int64_t{1} << 31, int64_t{1} << 32, 2}, "w1");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "w1");
    EXPECT_TRUE(contains(e.what(), "overflows int64")) << e.what();
  }
  EXPECT_THROW(detail::checked_add(INT64_MAX, 1, "x"), Error);
  TensorView v = TensorView::of(nullptr, DType::f32, {int64_t{1} << 40, int64_t{1} << 30});
  try {
    detail::checked_bytes(v, "scales");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "scales");
  }
  v.shape[1] = -3;
  EXPECT_THROW(detail::checked_numel(v, "scales"), Error);
}

// A problem of 2^31 hidden and ffn (from the C ABI issue) is refused by its bounds, before any
// tensor size is computed from it.
TEST(Sizes, ProblemDimensionsAreBounded) {
  Problem p;
  p.hidden = p.ffn = int64_t{1} << 31;
  p.experts = 4;
  try {
    validate_problem(p);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "problem.hidden");
    EXPECT_TRUE(contains(e.what(), "hidden=2147483648 exceeds the bound 1048576")) << e.what();
  }
  p.hidden = 4096;
  try {
    validate_problem(p);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "problem.ffn");
  }
  p.ffn = kMaxFfn;
  p.hidden = kMaxHidden;
  p.experts = kMaxExperts;
  EXPECT_NO_THROW(validate_problem(p));  // the bounds themselves are fine

  // Through forward, with views whose shapes match the huge problem: still the problem is named.
  Context ctx({.backend = "cpu"});
  p.hidden = p.ffn = int64_t{1} << 31;
  p.experts = 4;
  ForwardArgs a;
  a.x = TensorView::of(reinterpret_cast<void*>(0x1000), DType::bf16, {8, p.hidden});
  EXPECT_THROW(forward(ctx, p, a), Error);
}

TEST(Sizes, TokenCountIsBounded) {
  Problem p;
  p.hidden = 64;
  p.ffn = 32;
  p.experts = 3;
  LayerData d = make_layer_data(p, {4, 0, 9});
  ForwardArgs a;
  a.x = d.x.view;
  a.x.shape[0] = -4;
  a.offsets.offsets = d.offsets.view;
  a.probs = d.probs.view;
  a.w1.dense = d.w1.view;
  a.w2.dense = d.w2.view;
  HostTensor y(DType::bf16, {13, 64});
  a.y = y.view;
  Context ctx({.backend = "cpu"});
  try {
    forward(ctx, p, a);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "x");
    EXPECT_TRUE(contains(e.what(), "T=-4 must be in [0, 2147483647]")) << e.what();
  }
}

// A scale buffer whose own shape overflows int64 is an error naming it, not a wrapped size.
TEST(Sizes, OverflowingCallerShapeIsAnError) {
  Context ctx({.backend = "cpu"});
  HostTensor src = random_bf16({40, 64});
  HostTensor q(DType::e4m3, {40, 64}), s(DType::e8m0, {rowwise_scale_bytes(40, 64)});
  QuantizeArgs a;
  a.src = src.view;
  a.rowwise = {q.view, s.view, BlockAxis::row, ScaleLayout::compact};
  a.rowwise.scales.rank = 3;
  a.rowwise.scales.shape = {int64_t{1} << 40, int64_t{1} << 20, int64_t{1} << 10};
  try {
    quantize_mxfp8(ctx, a);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "rowwise.scales");
    EXPECT_TRUE(contains(e.what(), "overflows int64")) << e.what();
  }
  // Columns beyond the bound of the low-level ops.
  a.rowwise.scales = s.view;
  a.src.shape = {1, int64_t{1} << 40, 0};
  try {
    quantize_mxfp8(ctx, a);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "src");
    EXPECT_TRUE(contains(e.what(), "columns=")) << e.what();
  }
}

// A forward whose library memory exceeds the machine is refused before any allocation, with the
// estimate. The caller's views are never dereferenced by validation (only the host offsets), so
// they can be addresses of nothing.
TEST(Memory, ForwardBeyondTheDeviceIsRefusedWithTheEstimate) {
  Problem p;
  p.hidden = 4096;
  p.ffn = 4096;
  p.experts = 3;
  p.recipe = Recipe::bf16;
  const int64_t T = int64_t{1} << 30;  // c and a alone: 24 TiB
  std::vector<int32_t> offsets = {0, 1 << 29, 1 << 29, 1 << 30};
  auto fake = [](int k) { return reinterpret_cast<void*>(static_cast<uintptr_t>(k) << 45); };
  ForwardArgs a;
  a.x = TensorView::of(fake(1), DType::bf16, {T, p.hidden});
  a.offsets.offsets = TensorView::of(offsets.data(), DType::i32, {4});
  a.probs = TensorView::of(fake(2), DType::f32, {T});
  a.w1.dense = TensorView::of(fake(3), DType::bf16, {3, 2 * p.ffn, p.hidden});
  a.w2.dense = TensorView::of(fake(4), DType::bf16, {3, p.hidden, p.ffn});
  a.y = TensorView::of(fake(5), DType::bf16, {T, p.hidden});
  Context ctx({.backend = "cpu"});
  try {
    forward(ctx, p, a);
    FAIL();
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.argument(), "memory");
    EXPECT_TRUE(contains(e.what(), "forward (T=1073741824, H=4096 F=4096 E=3")) << e.what();
    EXPECT_TRUE(contains(e.what(), "needs about 24.00 TiB")) << e.what();
    EXPECT_TRUE(contains(e.what(), "has in all")) << e.what();
  }
}

// The caller's allocator, failing on demand, with live-byte accounting.
struct FailingAllocator {
  bool fail = false;
  int64_t live = 0, calls = 0;
  static void* allocate(int64_t bytes, Device, void*, void* user) {
    auto* self = static_cast<FailingAllocator*>(user);
    ++self->calls;
    if (self->fail) return nullptr;
    self->live += bytes;
    return std::malloc(static_cast<size_t>(bytes));
  }
  static void release(void* p, int64_t bytes, Device, void*, void* user) {
    static_cast<FailingAllocator*>(user)->live -= bytes;
    std::free(p);
  }
  Allocator allocator() { return {&allocate, &release, this}; }
};

TEST(Memory, AllocationFailureIsOutOfMemoryWithTheEstimateAndWritesNothing) {
  Problem p;
  p.hidden = 64;
  p.ffn = 32;
  p.experts = 3;
  LayerData d = make_layer_data(p, {4, 0, 9});
  FailingAllocator alloc;
  Context ctx({.backend = "cpu", .allocator = alloc.allocator()});
  HostTensor y(DType::bf16, {13, 64}), dx(DType::bf16, {13, 64}), dprobs(DType::f32, {13});
  std::memset(y.view.data, 0x5A, static_cast<size_t>(y.view.bytes()));
  std::memset(dx.view.data, 0x5A, static_cast<size_t>(dx.view.bytes()));
  const HostTensor y0 = y, dx0 = dx;
  ForwardArgs a;
  a.x = d.x.view;
  a.offsets.offsets = d.offsets.view;
  a.probs = d.probs.view;
  a.w1.dense = d.w1.view;
  a.w2.dense = d.w2.view;
  a.y = y.view;

  alloc.fail = true;
  try {
    forward(ctx, p, a);
    FAIL();
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.argument(), "options.allocator");
    EXPECT_TRUE(contains(e.what(), "forward (T=13, H=64 F=32 E=3")) << e.what();
    EXPECT_TRUE(contains(e.what(), "needs about")) << e.what();
    EXPECT_TRUE(contains(e.what(), "the caller's allocator returned null")) << e.what();
  }
  EXPECT_TRUE(bytes_equal(y.view, y0.view));
  EXPECT_EQ(alloc.live, 0);

  alloc.fail = false;
  SavedState saved = forward(ctx, p, a);
  BackwardArgs b;
  b.dy = d.dy.view;
  b.dx = dx.view;
  b.dprobs = dprobs.view;
  b.wgrad = WgradMode::deferred;
  alloc.fail = true;
  try {
    backward(ctx, saved, b);
    FAIL();
  } catch (const OutOfMemoryError& e) {
    EXPECT_TRUE(contains(e.what(), "backward (T=13, H=64 F=32 E=3")) << e.what();
  }
  EXPECT_TRUE(bytes_equal(dx.view, dx0.view));
  // The saved state was not consumed: once memory is back, backward runs.
  alloc.fail = false;
  WgradState w = backward(ctx, saved, b);
  EXPECT_TRUE(w.pending());
  w = WgradState();
  saved = SavedState();
  EXPECT_EQ(alloc.live, 0);
}

}  // namespace
}  // namespace mxmoe::test
