// Bad arguments to permute_tokens, unpermute_tokens and permute_by_map get an mxmoe::Error naming
// the argument and its value, and nothing the caller owns is written (include/mxmoe/permute.h).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "support.h"

namespace mxmoe::test {
namespace {

constexpr int64_t kT = 6, kK = 2, kE = 4, kH = 16, kR = kT * kK;
const Device kGpu{DeviceType::cuda, 0};

HostTensor filled(DType t, std::initializer_list<int64_t> shape, uint8_t byte) {
  HostTensor h(t, shape);
  h.poison(byte);
  return h;
}

// Every tensor of a valid call, inputs and poisoned outputs alike; a test corrupts the views (or
// an input's values), the buffers are remembered, and after the failed call none may have changed.
struct Fixture {
  std::vector<HostTensor*> all;
  std::vector<HostTensor> before;
  void remember() {
    before.clear();
    for (HostTensor* t : all) before.push_back(*t);
  }
  bool untouched() const {
    for (size_t i = 0; i < all.size(); ++i)
      if (!bytes_equal(all[i]->view, before[i].view)) return false;
    return true;
  }
};

struct PermuteFixture : Fixture {
  HostTensor x = random_bf16({kT, kH}), ids{DType::i32, {kT, kK}}, probs = random_f32({kT, kK});
  HostTensor offsets = filled(DType::i32, {kE + 1}, 0xF9), px = filled(DType::bf16, {kR, kH}, 0xFF),
             row_map = filled(DType::i32, {kT, kK}, 0xF9), pp = filled(DType::f32, {kR}, 0xFF),
             invalid = filled(DType::i32, {1}, 0xF9);
  PermuteArgs a;
  PermuteFixture() {
    for (int64_t i = 0; i < kT * kK; ++i) ids.ptr<int32_t>()[i] = static_cast<int32_t>(i % kE);
    a = {.x = x.view,
         .expert_ids = ids.view,
         .probs = probs.view,
         .experts = kE,
         .offsets = offsets.view,
         .permuted_x = px.view,
         .row_map = row_map.view,
         .permuted_probs = pp.view,
         .invalid = invalid.view};
    all = {&x, &ids, &probs, &offsets, &px, &row_map, &pp, &invalid};
  }
};

// Unpermute's row_map: each token's two slots in rows 2t, 2t + 1.
struct UnpermuteFixture : Fixture {
  HostTensor py = random_bf16({kR, kH}), row_map{DType::i32, {kT, kK}}, pp = random_f32({kR});
  HostTensor y = filled(DType::bf16, {kT, kH}, 0xFF), probs = filled(DType::f32, {kT, kK}, 0xFF);
  UnpermuteArgs a;
  UnpermuteFixture() {
    for (int64_t i = 0; i < kT * kK; ++i) row_map.ptr<int32_t>()[i] = static_cast<int32_t>(i);
    a = {.permuted_y = py.view, .row_map = row_map.view, .permuted_probs = pp.view, .y = y.view, .probs = probs.view};
    all = {&py, &row_map, &pp, &y, &probs};
  }
};

struct ByMapFixture : Fixture {
  HostTensor x = random_bf16({kT, kH}), row_map{DType::i32, {kT, kK}}, probs = random_f32({kT, kK});
  HostTensor px = filled(DType::bf16, {kR, kH}, 0xFF), pp = filled(DType::f32, {kR}, 0xFF);
  PermuteByMapArgs a;
  ByMapFixture() {
    for (int64_t i = 0; i < kT * kK; ++i) row_map.ptr<int32_t>()[i] = static_cast<int32_t>(kR - 1 - i);
    a = {.x = x.view, .row_map = row_map.view, .probs = probs.view, .permuted_x = px.view, .permuted_probs = pp.view};
    all = {&x, &row_map, &probs, &px, &pp};
  }
};

template <class F, class Run>
void expect_error(const std::function<void(F&)>& corrupt, const Run& run, const std::string& argument,
                  const std::string& fragment) {
  F f;
  corrupt(f);
  f.remember();
  Context ctx;
  try {
    run(ctx, f.a);
    ADD_FAILURE() << "no error for " << argument << " (" << fragment << ")";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
  EXPECT_TRUE(f.untouched()) << argument << " (" << fragment << ")";
}

void expect_permute_error(const std::function<void(PermuteFixture&)>& corrupt, const std::string& argument,
                          const std::string& fragment) {
  expect_error<PermuteFixture>(
      corrupt, [](Context& c, const PermuteArgs& a) { permute_tokens(c, a); }, argument, fragment);
}
void expect_unpermute_error(const std::function<void(UnpermuteFixture&)>& corrupt, const std::string& argument,
                            const std::string& fragment) {
  expect_error<UnpermuteFixture>(
      corrupt, [](Context& c, const UnpermuteArgs& a) { unpermute_tokens(c, a); }, argument, fragment);
}
void expect_by_map_error(const std::function<void(ByMapFixture&)>& corrupt, const std::string& argument,
                         const std::string& fragment) {
  expect_error<ByMapFixture>(
      corrupt, [](Context& c, const PermuteByMapArgs& a) { permute_by_map(c, a); }, argument, fragment);
}

TEST(PermuteValidation, TheFixturesAreValidCalls) {
  Context ctx;
  PermuteFixture p;
  EXPECT_NO_THROW(permute_tokens(ctx, p.a));
  UnpermuteFixture u;
  EXPECT_NO_THROW(unpermute_tokens(ctx, u.a));
  ByMapFixture b;
  EXPECT_NO_THROW(permute_by_map(ctx, b.a));
}

TEST(PermuteValidation, XMustBeBf16AndPresent) {
  expect_permute_error([](auto& f) { f.a.x.dtype = DType::f32; }, "x", "dtype f32 is not bf16");
  expect_permute_error([](auto& f) { f.a.x = {}; }, "x", "missing (no data pointer); expected bf16 [T, H]");
  expect_permute_error(
      [](auto& f) {
        f.a.x.shape = {kT, kH, 1};
        f.a.x.rank = 3;
      },
      "x", "must be [T, H]");
}
TEST(PermuteValidation, ExpertIdsMustBeI32OrI64WithTheTokensOfX) {
  expect_permute_error([](auto& f) { f.a.expert_ids.dtype = DType::f32; }, "expert_ids", "dtype f32 is not i32 or i64");
  expect_permute_error([](auto& f) { f.a.expert_ids.shape[0] = kT - 1; }, "expert_ids", "must be [T=6, K] (T from x)");
  expect_permute_error([](auto& f) { f.a.expert_ids.shape[1] = 0; }, "expert_ids", "K=0 must be >= 1");
  expect_permute_error([](auto& f) { f.a.expert_ids = {}; }, "expert_ids", "missing");
}
TEST(PermuteValidation, SlotsMustFitInt32Rows) {
  expect_permute_error(
      [](auto& f) {
        f.a.x.shape[0] = 65536;
        f.a.expert_ids.shape = {65536, 65536, 0};
      },
      "expert_ids", "T*K=4294967296");
}
TEST(PermuteValidation, ExpertsAndCapacityAreBounded) {
  expect_permute_error([](auto& f) { f.a.experts = 0; }, "experts", "E=0 must be in [1, ");
  expect_permute_error([](auto& f) { f.a.experts = -3; }, "experts", "E=-3");
  expect_permute_error([](auto& f) { f.a.capacity = -2; }, "capacity", "C=-2 must be -1 (keep every row) or in [0, ");
  expect_permute_error([](auto& f) { f.a.capacity = int64_t{1} << 40; }, "capacity", "C=1099511627776");
}
TEST(PermuteValidation, OutputShapesAreChecked) {
  expect_permute_error([](auto& f) { f.a.offsets.shape[0] = kE; }, "offsets", "shape [4] must be [5]");
  expect_permute_error([](auto& f) { f.a.offsets = {}; }, "offsets", "missing");
  expect_permute_error([](auto& f) { f.a.permuted_x.shape[0] = kR - 1; }, "permuted_x", "with R >= 12 (T*K)");
  expect_permute_error([](auto& f) { f.a.permuted_x.shape[1] = kH / 2; }, "permuted_x", "must be [R, H=16]");
  expect_permute_error([](auto& f) { f.a.permuted_x.dtype = DType::f32; }, "permuted_x", "dtype f32");
  expect_permute_error([](auto& f) { f.a.row_map.shape[1] = kK + 1; }, "row_map", "shape [6, 3] must be [6, 2]");
  expect_permute_error([](auto& f) { f.a.invalid.shape[0] = 2; }, "invalid", "must be [1]");
  expect_permute_error([](auto& f) { f.a.invalid.dtype = DType::f32; }, "invalid", "dtype f32");
}
TEST(PermuteValidation, CapacityLowersTheRowsPermutedXNeeds) {
  // E * C = 8 < T * K = 12: 8 rows suffice, 7 do not.
  expect_permute_error(
      [](auto& f) {
        f.a.capacity = 2;
        f.a.permuted_x.shape[0] = 7;
        f.a.permuted_probs.shape[0] = 7;
      },
      "permuted_x", "R >= 8 (min(T*K, E*capacity))");
  PermuteFixture f;
  f.a.capacity = 2;
  f.a.permuted_x.shape[0] = 8;
  f.a.permuted_probs.shape[0] = 8;
  Context ctx;
  EXPECT_NO_THROW(permute_tokens(ctx, f.a));
  EXPECT_EQ(f.offsets.ptr<int32_t>()[kE], 8);
}
TEST(PermuteValidation, ProbsAndPermutedProbsComeTogether) {
  expect_permute_error([](auto& f) { f.a.permuted_probs = {}; }, "permuted_probs",
                       "missing (no data pointer) but probs is given");
  expect_permute_error([](auto& f) { f.a.probs = {}; }, "probs",
                       "missing (no data pointer) but permuted_probs is given");
  expect_permute_error([](auto& f) { f.a.probs.shape[1] = 1; }, "probs", "shape [6, 1] must be [6, 2]");
  expect_permute_error([](auto& f) { f.a.probs.dtype = DType::bf16; }, "probs", "dtype bf16 is not f32");
  expect_permute_error([](auto& f) { f.a.permuted_probs.shape[0] = kR + 1; }, "permuted_probs", "must be [12]");
}
TEST(PermuteValidation, DeviceMismatchNamesBothTensors) {
  expect_permute_error([](auto& f) { f.a.row_map.device = kGpu; }, "row_map", "is on cuda:0 but x is on cpu");
  expect_permute_error([](auto& f) { f.a.expert_ids.device = kGpu; }, "expert_ids", "is on cuda:0 but x is on cpu");
  expect_unpermute_error([](auto& f) { f.a.y.device = kGpu; }, "y", "is on cuda:0 but permuted_y is on cpu");
  expect_by_map_error([](auto& f) { f.a.permuted_x.device = kGpu; }, "permuted_x", "is on cuda:0 but x is on cpu");
}
TEST(PermuteValidation, OutputsMustNotAliasInputsOrEachOther) {
  expect_permute_error([](auto& f) { f.a.permuted_x.data = f.x.view.data; }, "permuted_x", "overlaps input x");
  expect_permute_error([](auto& f) { f.a.row_map.data = f.ids.view.data; }, "row_map", "overlaps input expert_ids");
  expect_permute_error([](auto& f) { f.a.invalid.data = f.offsets.view.data; }, "offsets", "overlaps output invalid");
  expect_unpermute_error([](auto& f) { f.a.y.data = f.py.view.data; }, "y", "overlaps input permuted_y");
  expect_by_map_error([](auto& f) { f.a.permuted_probs.data = f.probs.view.data; }, "permuted_probs",
                      "overlaps input probs");
}

TEST(UnpermuteValidation, ShapesAndDtypesAreChecked) {
  expect_unpermute_error([](auto& f) { f.a.permuted_y.dtype = DType::f32; }, "permuted_y", "dtype f32 is not bf16");
  expect_unpermute_error([](auto& f) { f.a.permuted_y = {}; }, "permuted_y", "missing");
  expect_unpermute_error([](auto& f) { f.a.y.shape[0] = kT - 1; }, "y", "shape [5, 16] must be [6, 16]");
  expect_unpermute_error([](auto& f) { f.a.y.shape[1] = kH + 8; }, "y", "must be [6, 16]");
  expect_unpermute_error([](auto& f) { f.a.row_map.shape[1] = 0; }, "row_map", "K=0 must be >= 1");
  expect_unpermute_error([](auto& f) { f.a.row_map.dtype = DType::f32; }, "row_map", "dtype f32 is not i32");
  expect_unpermute_error([](auto& f) { f.a.probs = {}; }, "probs",
                         "missing (no data pointer) but permuted_probs is given");
  expect_unpermute_error([](auto& f) { f.a.permuted_probs.shape[0] = kR - 1; }, "permuted_probs", "must be [12]");
}
TEST(UnpermuteValidation, HostRowMapEntriesMustBeDroppedOrARow) {
  expect_unpermute_error([](auto& f) { f.row_map.template ptr<int32_t>()[5] = 99; }, "row_map",
                         "row_map[2, 1]=99 must be -1 (dropped) or a row in [0, 12)");
  expect_unpermute_error([](auto& f) { f.row_map.template ptr<int32_t>()[0] = -2; }, "row_map", "row_map[0, 0]=-2");
  // Two slots reading one row is a valid gather (unlike permute_by_map's scatter).
  UnpermuteFixture f;
  f.row_map.ptr<int32_t>()[1] = 0;
  Context ctx;
  EXPECT_NO_THROW(unpermute_tokens(ctx, f.a));
}

TEST(PermuteByMapValidation, HostRowMapEntriesMustBeDistinctRows) {
  expect_by_map_error([](auto& f) { f.row_map.template ptr<int32_t>()[3] = f.row_map.template ptr<int32_t>()[8]; },
                      "row_map", "row_map[4, 0]=3 repeats row_map[1, 1]");
  expect_by_map_error([](auto& f) { f.row_map.template ptr<int32_t>()[7] = kR; }, "row_map",
                      "row_map[3, 1]=12 must be -1 (dropped) or a row in [0, 12)");
}
TEST(PermuteByMapValidation, ShapesAreChecked) {
  expect_by_map_error([](auto& f) { f.a.row_map.shape[0] = kT + 1; }, "row_map", "must be [T=6, K] (T from x)");
  expect_by_map_error([](auto& f) { f.a.permuted_x.shape[1] = 8; }, "permuted_x", "must be [R, H=16]");
  expect_by_map_error([](auto& f) { f.a.permuted_probs = {}; }, "permuted_probs", "missing");
  expect_by_map_error([](auto& f) { f.a.x.dtype = DType::i32; }, "x", "dtype i32 is not bf16");
}

}  // namespace
}  // namespace mxmoe::test
