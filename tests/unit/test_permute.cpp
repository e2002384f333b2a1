// Token permute and unpermute (include/mxmoe/permute.h) against an independent reference written
// here: the (token, slot) pairs with a valid id are stable-sorted by expert (an argsort), each expert
// keeps its first C, rows are numbered along that order. Inputs are drawn fresh (the seed is printed
// on failure), every output is poisoned (NaN bf16 / NaN f32 / -7 ints) and the rows past offsets[E]
// must keep their poison. The backward pairs are checked through their adjoint identities in f64,
// validation through the argument and value each error names (docs/numerics.md "Permute and
// unpermute").
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "src/dispatch/backend.h"
#include "support.h"

namespace mxmoe::test {
namespace {

constexpr uint16_t kBf16Nan = 0xFFFF;
constexpr int32_t kIntPoison = -7;
const Device kGpu{DeviceType::cuda, 0};

HostTensor poisoned(DType t, std::initializer_list<int64_t> shape) {
  HostTensor h(t, shape);
  for (int64_t i = 0; i < h.numel(); ++i) {
    if (t == DType::bf16)
      h.ptr<uint16_t>()[i] = kBf16Nan;
    else if (t == DType::f32)
      h.ptr<float>()[i] = NAN;
    else
      h.ptr<int32_t>()[i] = kIntPoison;
  }
  return h;
}

// ---------------- independent reference ----------------

struct RefRouting {
  std::vector<int32_t> offsets, row_map;
  std::vector<int64_t> source;  // the slot t * K + k each kept row comes from, in row order
  int32_t invalid = 0;
};

RefRouting ref_route(const HostTensor& ids, int64_t E, int64_t capacity) {
  const int64_t slots = ids.numel();
  std::vector<std::pair<int32_t, int64_t>> entries;  // (expert, slot) of every valid id
  RefRouting r;
  for (int64_t i = 0; i < slots; ++i) {
    const int32_t e = ids.ptr<int32_t>()[i];
    if (e >= 0 && e < E)
      entries.emplace_back(e, i);
    else
      ++r.invalid;
  }
  std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<int64_t> per_expert(static_cast<size_t>(E), 0);
  r.row_map.assign(static_cast<size_t>(slots), -1);
  for (const auto& [e, slot] : entries) {
    if (capacity >= 0 && per_expert[e] == capacity) continue;
    ++per_expert[e];
    r.row_map[slot] = static_cast<int32_t>(r.source.size());
    r.source.push_back(slot);
  }
  r.offsets.assign(static_cast<size_t>(E) + 1, 0);
  for (int64_t e = 0; e < E; ++e) r.offsets[e + 1] = r.offsets[e] + static_cast<int32_t>(per_expert[e]);
  return r;
}

// y[t] = bf16(sum over k in slot order of fp32 rows[row_map[t, k]]), from +0.
HostTensor ref_unpermute(const HostTensor& rows, const std::vector<int32_t>& row_map, int64_t T, int64_t K) {
  const int64_t H = rows.view.shape[1];
  HostTensor y(DType::bf16, {T, H});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k)
        if (const int32_t r = row_map[t * K + k]; r >= 0) acc += f32_from_bf16(rows.ptr<uint16_t>()[r * H + h]);
      y.ptr<uint16_t>()[t * H + h] = bf16_from_f32(acc);
    }
  return y;
}

// ---------------- inputs ----------------

struct Case {
  int64_t T, K, E, capacity, H;
  double invalid_fraction = 0;  // share of ids replaced by -1, E or a large value
};

struct Inputs {
  HostTensor x, ids, probs;
};

// Ids from a random half of the experts (so some stay empty), distinct per token where possible.
Inputs make_inputs(const Case& c, std::mt19937_64& gen) {
  Inputs in{HostTensor(DType::bf16, {c.T, c.H}), HostTensor(DType::i32, {c.T, c.K}),
            HostTensor(DType::f32, {c.T, c.K})};
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t i = 0; i < in.x.numel(); ++i) in.x.ptr<uint16_t>()[i] = bf16_from_f32(u(gen));
  for (int64_t i = 0; i < in.probs.numel(); ++i) in.probs.ptr<float>()[i] = u(gen);
  std::vector<int32_t> active(static_cast<size_t>(c.E));
  for (int64_t e = 0; e < c.E; ++e) active[e] = static_cast<int32_t>(e);
  std::shuffle(active.begin(), active.end(), gen);
  active.resize(static_cast<size_t>(std::max<int64_t>(1, c.E / 2)));
  std::bernoulli_distribution bad(c.invalid_fraction);
  const int32_t bad_ids[] = {-1, static_cast<int32_t>(c.E), 1 << 30};
  for (int64_t t = 0; t < c.T; ++t) {
    std::shuffle(active.begin(), active.end(), gen);
    for (int64_t k = 0; k < c.K; ++k) {
      int32_t id = active[k % active.size()];
      if (k >= static_cast<int64_t>(active.size()))
        id = active[std::uniform_int_distribution<size_t>(0, active.size() - 1)(gen)];
      if (bad(gen)) id = bad_ids[std::uniform_int_distribution<int>(0, 2)(gen)];
      in.ids.ptr<int32_t>()[t * c.K + k] = id;
    }
  }
  return in;
}

// Bf16 rows of small integers: sums of up to 8 of them are exact in bf16, so unpermute is exact
// and the adjoint identities hold to f64 rounding.
HostTensor integer_bf16(int64_t rows, int64_t cols, std::mt19937_64& gen) {
  HostTensor t(DType::bf16, {rows, cols});
  std::uniform_int_distribution<int> d(-4, 4);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<uint16_t>()[i] = bf16_from_f32(static_cast<float>(d(gen)));
  return t;
}

struct Permuted {
  HostTensor offsets, permuted_x, row_map, permuted_probs, invalid;
};

Permuted run_permute(const Inputs& in, const Case& c, int64_t rows, Context& ctx, bool zero_unused = false) {
  Permuted p{poisoned(DType::i32, {c.E + 1}), poisoned(DType::bf16, {rows, c.H}), poisoned(DType::i32, {c.T, c.K}),
             poisoned(DType::f32, {rows}), poisoned(DType::i32, {1})};
  permute_tokens(ctx, {.x = in.x.view,
                       .expert_ids = in.ids.view,
                       .probs = in.probs.view,
                       .experts = c.E,
                       .capacity = c.capacity,
                       .offsets = p.offsets.view,
                       .permuted_x = p.permuted_x.view,
                       .row_map = p.row_map.view,
                       .permuted_probs = p.permuted_probs.view,
                       .invalid = p.invalid.view,
                       .zero_unused_rows = zero_unused});
  return p;
}

struct Unpermuted {
  HostTensor y, probs;
};

Unpermuted run_unpermute(const HostTensor& rows, const HostTensor& row_map, const HostTensor& row_probs, Context& ctx) {
  const int64_t T = row_map.view.shape[0], K = row_map.view.shape[1];
  Unpermuted u{poisoned(DType::bf16, {T, rows.view.shape[1]}), poisoned(DType::f32, {T, K})};
  unpermute_tokens(ctx, {.permuted_y = rows.view,
                         .row_map = row_map.view,
                         .permuted_probs = row_probs.view,
                         .y = u.y.view,
                         .probs = row_probs.view.defined() ? u.probs.view : TensorView{}});
  return u;
}

std::string describe(const Case& c) {
  return "T=" + std::to_string(c.T) + " K=" + std::to_string(c.K) + " E=" + std::to_string(c.E) +
         " C=" + std::to_string(c.capacity) + " H=" + std::to_string(c.H) +
         " invalid=" + std::to_string(c.invalid_fraction);
}

void PrintTo(const Case& c, std::ostream* os) { *os << describe(c); }

const Case kCases[] = {
    {.T = 37, .K = 1, .E = 5, .capacity = -1, .H = 24},
    {.T = 37, .K = 2, .E = 16, .capacity = -1, .H = 40},
    {.T = 50, .K = 8, .E = 16, .capacity = -1, .H = 8},
    {.T = 64, .K = 2, .E = 8, .capacity = 5, .H = 16},  // capacity drops (E*C < T*K)
    {.T = 64, .K = 8, .E = 32, .capacity = 3, .H = 16},
    {.T = 9, .K = 8, .E = 8, .capacity = 0, .H = 8},    // capacity 0: every slot dropped
    {.T = 0, .K = 2, .E = 3, .capacity = -1, .H = 16},  // no tokens
    {.T = 30, .K = 4, .E = 6, .capacity = 4, .H = 8, .invalid_fraction = 0.2},
    {.T = 2048, .K = 8, .E = 64, .capacity = -1, .H = 64},  // large enough for the OpenMP loops
};

// A case's inputs from a fresh seed (the trace names the case and the seed), and the permuted rows
// with 3 rows of slack past the bound.
// gen continues the seed's sequence for whatever else a test draws.
struct Drawn {
  std::string trace;
  std::mt19937_64 gen;
  Inputs in;
  int64_t rows;
};
Drawn draw(const Case& c) {
  const uint64_t seed = rng()();
  std::mt19937_64 gen(seed);
  Inputs in = make_inputs(c, gen);
  return {describe(c) + " seed=" + std::to_string(seed), gen, std::move(in),
          permuted_rows_bound(c.T, c.K, c.E, c.capacity) + 3};
}

class PermuteCases : public ::testing::TestWithParam<Case> {};

TEST_P(PermuteCases, MatchesTheArgsortReferenceAndLeavesRowsPastTheKeptOnesUntouched) {
  const Case c = GetParam();
  Drawn dr = draw(c);
  SCOPED_TRACE(dr.trace);
  const Inputs& in = dr.in;
  const int64_t rows = dr.rows;
  Context ctx;
  const Permuted p = run_permute(in, c, rows, ctx);
  const RefRouting ref = ref_route(in.ids, c.E, c.capacity);
  const int64_t kept = ref.offsets[c.E];

  EXPECT_EQ(std::vector<int32_t>(p.offsets.ptr<int32_t>(), p.offsets.ptr<int32_t>() + c.E + 1), ref.offsets);
  EXPECT_EQ(std::vector<int32_t>(p.row_map.ptr<int32_t>(), p.row_map.ptr<int32_t>() + c.T * c.K), ref.row_map);
  EXPECT_EQ(p.invalid.ptr<int32_t>()[0], ref.invalid);
  for (int64_t r = 0; r < rows; ++r) {
    const bool written = r < kept;
    const int64_t t = written ? ref.source[r] / c.K : 0;
    for (int64_t h = 0; h < c.H; ++h)
      ASSERT_EQ(p.permuted_x.ptr<uint16_t>()[r * c.H + h], written ? in.x.ptr<uint16_t>()[t * c.H + h] : kBf16Nan)
          << "row " << r << " of " << kept << " kept, column " << h;
    const float want = written ? in.probs.ptr<float>()[ref.source[r]] : NAN;
    const float got = p.permuted_probs.ptr<float>()[r];
    ASSERT_TRUE(written ? got == want : std::isnan(got)) << "permuted_probs[" << r << "]=" << got;
  }
}

TEST_P(PermuteCases, ZeroUnusedRowsWritesZerosPastTheKeptRowsAndNothingElseChanges) {
  const Case c = GetParam();
  Drawn dr = draw(c);
  SCOPED_TRACE(dr.trace);
  const Inputs& in = dr.in;
  const int64_t rows = dr.rows;
  Context ctx;
  const Permuted plain = run_permute(in, c, rows, ctx), zeroed = run_permute(in, c, rows, ctx, true);
  const int64_t kept = plain.offsets.ptr<int32_t>()[c.E];
  for (int64_t i = 0; i < rows * c.H; ++i)
    ASSERT_EQ(zeroed.permuted_x.ptr<uint16_t>()[i], i < kept * c.H ? plain.permuted_x.ptr<uint16_t>()[i] : 0) << i;
  for (int64_t r = 0; r < rows; ++r) {
    const float got = zeroed.permuted_probs.ptr<float>()[r];
    ASSERT_TRUE(r < kept ? got == plain.permuted_probs.ptr<float>()[r] : got == 0.0f && !std::signbit(got)) << r;
  }
  EXPECT_TRUE(bytes_equal(zeroed.row_map.view, plain.row_map.view));
}

TEST_P(PermuteCases, UnpermuteIsTheFp32SlotOrderSumRoundedOnceAndGathersProbs) {
  const Case c = GetParam();
  Drawn dr = draw(c);
  SCOPED_TRACE(dr.trace);
  const Inputs& in = dr.in;
  const int64_t rows = dr.rows;
  Context ctx;
  const Permuted p = run_permute(in, c, rows, ctx);
  // Rows of arbitrary bf16 values (not the permuted x): the sum's rounding is exercised.
  HostTensor py(DType::bf16, {rows, c.H}), pp(DType::f32, {rows});
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t i = 0; i < py.numel(); ++i) py.ptr<uint16_t>()[i] = bf16_from_f32(u(dr.gen));
  for (int64_t i = 0; i < pp.numel(); ++i) pp.ptr<float>()[i] = u(dr.gen);
  const Unpermuted out = run_unpermute(py, p.row_map, pp, ctx);

  const std::vector<int32_t> map(p.row_map.ptr<int32_t>(), p.row_map.ptr<int32_t>() + c.T * c.K);
  EXPECT_TRUE(bytes_equal(out.y.view, ref_unpermute(py, map, c.T, c.K).view));
  for (int64_t i = 0; i < c.T * c.K; ++i)
    ASSERT_EQ(out.probs.ptr<float>()[i], map[i] < 0 ? 0.0f : pp.ptr<float>()[map[i]]) << "probs slot " << i;
}

TEST_P(PermuteCases, PermuteByMapMovesTheSameRowsAsPermuteTokens) {
  const Case c = GetParam();
  Drawn dr = draw(c);
  SCOPED_TRACE(dr.trace);
  const Inputs& in = dr.in;
  const int64_t rows = dr.rows;
  Context ctx;
  const Permuted p = run_permute(in, c, rows, ctx);
  HostTensor px = poisoned(DType::bf16, {rows, c.H}), pp = poisoned(DType::f32, {rows});
  permute_by_map(ctx, {.x = in.x.view,
                       .row_map = p.row_map.view,
                       .probs = in.probs.view,
                       .permuted_x = px.view,
                       .permuted_probs = pp.view});
  EXPECT_TRUE(bytes_equal(px.view, p.permuted_x.view));
  EXPECT_TRUE(bytes_equal(pp.view, p.permuted_probs.view));
  // zero_unused_rows: the rows no slot names (here those past offsets[E]) become zeros, as
  // permute_tokens' own zero_unused_rows writes them.
  const Permuted z = run_permute(in, c, rows, ctx, /*zero_unused=*/true);
  HostTensor zx = poisoned(DType::bf16, {rows, c.H}), zp = poisoned(DType::f32, {rows});
  permute_by_map(ctx, {.x = in.x.view,
                       .row_map = p.row_map.view,
                       .probs = in.probs.view,
                       .permuted_x = zx.view,
                       .permuted_probs = zp.view,
                       .zero_unused_rows = true});
  EXPECT_TRUE(bytes_equal(zx.view, z.permuted_x.view));
  EXPECT_TRUE(bytes_equal(zp.view, z.permuted_probs.view));
}

// permute_tokens' backward is unpermute_tokens: <P x, g> = <x, U g> and, for the probs,
// <P p, q> = <p, U q>, both over the kept rows only (P writes nothing past offsets[E]).
TEST_P(PermuteCases, UnpermuteIsTheAdjointOfPermute) {
  const Case c = GetParam();
  Drawn dr = draw(c);
  SCOPED_TRACE(dr.trace);
  const Inputs& in = dr.in;
  const int64_t rows = dr.rows;
  Context ctx;
  const Permuted p = run_permute(in, c, rows, ctx);
  const int64_t kept = p.offsets.ptr<int32_t>()[c.E];
  const HostTensor g = integer_bf16(rows, c.H, dr.gen);
  HostTensor q(DType::f32, {rows});
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t r = 0; r < rows; ++r) q.ptr<float>()[r] = u(dr.gen);
  const Unpermuted ug = run_unpermute(g, p.row_map, q, ctx);

  double lhs = 0, rhs = 0, lhs_p = 0, rhs_p = 0, scale = 0;
  for (int64_t i = 0; i < kept * c.H; ++i) {
    lhs += double{f32_from_bf16(p.permuted_x.ptr<uint16_t>()[i])} * f32_from_bf16(g.ptr<uint16_t>()[i]);
    scale += std::fabs(double{f32_from_bf16(p.permuted_x.ptr<uint16_t>()[i])} * f32_from_bf16(g.ptr<uint16_t>()[i]));
  }
  for (int64_t i = 0; i < c.T * c.H; ++i)
    rhs += double{f32_from_bf16(in.x.ptr<uint16_t>()[i])} * f32_from_bf16(ug.y.ptr<uint16_t>()[i]);
  for (int64_t r = 0; r < kept; ++r) lhs_p += double{p.permuted_probs.ptr<float>()[r]} * q.ptr<float>()[r];
  for (int64_t i = 0; i < c.T * c.K; ++i) rhs_p += double{in.probs.ptr<float>()[i]} * ug.probs.ptr<float>()[i];
  EXPECT_NEAR(lhs, rhs, 1e-12 * (scale + 1));
  EXPECT_NEAR(lhs_p, rhs_p, 1e-12 * (static_cast<double>(c.T * c.K) + 1));
}

// unpermute_tokens' backward is permute_by_map: <U y', dy> = <y', B dy> over the kept rows.
TEST_P(PermuteCases, PermuteByMapIsTheAdjointOfUnpermute) {
  const Case c = GetParam();
  Drawn dr = draw(c);
  SCOPED_TRACE(dr.trace);
  const Inputs& in = dr.in;
  const int64_t rows = dr.rows;
  Context ctx;
  const Permuted p = run_permute(in, c, rows, ctx);
  const int64_t kept = p.offsets.ptr<int32_t>()[c.E];
  const HostTensor py = integer_bf16(rows, c.H, dr.gen);
  const Unpermuted y = run_unpermute(py, p.row_map, HostTensor(), ctx);
  const HostTensor dy = make_inputs(c, dr.gen).x;
  HostTensor bdy = poisoned(DType::bf16, {rows, c.H});
  permute_by_map(ctx, {.x = dy.view, .row_map = p.row_map.view, .permuted_x = bdy.view});

  double lhs = 0, rhs = 0, scale = 0;
  for (int64_t i = 0; i < c.T * c.H; ++i) {
    const double v = double{f32_from_bf16(y.y.ptr<uint16_t>()[i])} * f32_from_bf16(dy.ptr<uint16_t>()[i]);
    lhs += v;
    scale += std::fabs(v);
  }
  for (int64_t i = 0; i < kept * c.H; ++i)
    rhs += double{f32_from_bf16(py.ptr<uint16_t>()[i])} * f32_from_bf16(bdy.ptr<uint16_t>()[i]);
  EXPECT_NEAR(lhs, rhs, 1e-12 * (scale + 1));
  for (int64_t i = kept * c.H; i < rows * c.H; ++i) ASSERT_EQ(bdy.ptr<uint16_t>()[i], kBf16Nan) << "element " << i;
}

INSTANTIATE_TEST_SUITE_P(Permute, PermuteCases, ::testing::ValuesIn(kCases));

TEST(Permute, CapacityKeepsEachExpertsFirstRowsInTokenThenSlotOrder) {
  // Expert 1 is asked for by (0,1), (1,0), (2,1), (3,0), (3,1); with C = 2 only (0,1) and (1,0)
  // stay. Expert 0: (0,0), (2,0), both kept. Expert 2: (1,1), kept.
  HostTensor x(DType::bf16, {4, 2}), ids(DType::i32, {4, 2});
  for (int64_t i = 0; i < 8; ++i) x.ptr<uint16_t>()[i] = bf16_from_f32(static_cast<float>(i));
  const int32_t id_values[] = {0, 1, 1, 2, 0, 1, 1, 1};
  std::copy(std::begin(id_values), std::end(id_values), ids.ptr<int32_t>());
  const Case c{.T = 4, .K = 2, .E = 3, .capacity = 2, .H = 2};
  Context ctx;
  const Permuted p = run_permute({x, ids, HostTensor(DType::f32, {4, 2})}, c, 6, ctx);
  EXPECT_EQ(std::vector<int32_t>(p.offsets.ptr<int32_t>(), p.offsets.ptr<int32_t>() + 4),
            (std::vector<int32_t>{0, 2, 4, 5}));
  EXPECT_EQ(std::vector<int32_t>(p.row_map.ptr<int32_t>(), p.row_map.ptr<int32_t>() + 8),
            (std::vector<int32_t>{0, 2, 3, 4, 1, -1, -1, -1}));
  EXPECT_EQ(p.invalid.ptr<int32_t>()[0], 0);
  // Permuted rows come from tokens 0, 2 (expert 0), 0, 1 (expert 1), 1 (expert 2); row 5 untouched.
  const int64_t from[] = {0, 2, 0, 1, 1};
  for (int64_t r = 0; r < 5; ++r)
    for (int64_t h = 0; h < 2; ++h)
      EXPECT_EQ(p.permuted_x.ptr<uint16_t>()[r * 2 + h], x.ptr<uint16_t>()[from[r] * 2 + h]);
  EXPECT_EQ(p.permuted_x.ptr<uint16_t>()[10], kBf16Nan);
}

TEST(Permute, OutOfRangeIdsAreDroppedCountedAndTakeNoCapacity) {
  HostTensor x(DType::bf16, {3, 8}), ids(DType::i32, {3, 2});
  for (int64_t i = 0; i < x.numel(); ++i) x.ptr<uint16_t>()[i] = bf16_from_f32(0.5f * static_cast<float>(i));
  const int32_t id_values[] = {-1, 0, 2, 0, 1000, 0};  // E = 2: -1, 2 and 1000 are invalid
  std::copy(std::begin(id_values), std::end(id_values), ids.ptr<int32_t>());
  const Case c{.T = 3, .K = 2, .E = 2, .capacity = 2, .H = 8};
  Context ctx;
  const Permuted p = run_permute({x, ids, HostTensor(DType::f32, {3, 2})}, c, 4, ctx);
  EXPECT_EQ(p.invalid.ptr<int32_t>()[0], 3);
  EXPECT_EQ(std::vector<int32_t>(p.row_map.ptr<int32_t>(), p.row_map.ptr<int32_t>() + 6),
            (std::vector<int32_t>{-1, 0, -1, 1, -1, -1}));
  EXPECT_EQ(std::vector<int32_t>(p.offsets.ptr<int32_t>(), p.offsets.ptr<int32_t>() + 3),
            (std::vector<int32_t>{0, 2, 2}));
}

// int64 ids (torch.topk's dtype) route exactly as the same values in int32; a value past int32
// (2^32 would wrap to expert 0) is an id outside [0, E): dropped and counted.
TEST(Permute, Int64IdsRouteAsInt32AndValuesPastInt32AreInvalid) {
  const Case c{.T = 40, .K = 3, .E = 5, .capacity = 20, .H = 8};
  HostTensor x(DType::bf16, {c.T, c.H}), ids32(DType::i32, {c.T, c.K}), ids64(DType::i64, {c.T, c.K});
  for (int64_t i = 0; i < x.numel(); ++i) x.ptr<uint16_t>()[i] = bf16_from_f32(0.25f * static_cast<float>(i % 97));
  std::mt19937 gen(7);
  const int64_t wide[] = {int64_t{1} << 32, (int64_t{1} << 32) + 2, INT64_MIN, INT64_MAX, -1, 5};
  for (int64_t i = 0; i < ids32.numel(); ++i) {
    const int32_t id = static_cast<int32_t>(gen() % 5);
    const bool bad = gen() % 6 == 0;
    ids32.ptr<int32_t>()[i] = bad ? -1 : id;
    ids64.ptr<int64_t>()[i] = bad ? wide[gen() % 6] : id;
  }
  Context ctx;
  const HostTensor probs = random_f32({c.T, c.K});
  const Permuted want = run_permute({x, ids32, probs}, c, c.T * c.K, ctx);
  const Permuted got = run_permute({x, ids64, probs}, c, c.T * c.K, ctx);
  EXPECT_GT(want.invalid.ptr<int32_t>()[0], 0);
  EXPECT_EQ(got.invalid.bytes, want.invalid.bytes);
  EXPECT_EQ(got.offsets.bytes, want.offsets.bytes);
  EXPECT_EQ(got.row_map.bytes, want.row_map.bytes);
  EXPECT_EQ(got.permuted_x.bytes, want.permuted_x.bytes);
  EXPECT_EQ(got.permuted_probs.bytes, want.permuted_probs.bytes);
}

TEST(Unpermute, OfPermuteIsKTimesXWhenEverySlotIsKept) {
  for (int64_t K : {1, 2, 8}) {
    const Case c{.T = 33, .K = K, .E = 8, .capacity = -1, .H = 24};
    const uint64_t seed = rng()();
    SCOPED_TRACE(describe(c) + " seed=" + std::to_string(seed));
    std::mt19937_64 gen(seed);
    const Inputs in = make_inputs(c, gen);
    Context ctx;
    const Permuted p = run_permute(in, c, c.T * c.K, ctx);
    ASSERT_EQ(p.offsets.ptr<int32_t>()[c.E], c.T * c.K);
    const Unpermuted y = run_unpermute(p.permuted_x, p.row_map, HostTensor(), ctx);
    for (int64_t i = 0; i < c.T * c.H; ++i)  // K * x is exact in fp32 and, K a power of two, in bf16
      ASSERT_EQ(y.y.ptr<uint16_t>()[i], bf16_from_f32(static_cast<float>(K) * f32_from_bf16(in.x.ptr<uint16_t>()[i])))
          << "element " << i;
  }
}

TEST(Permute, RepeatedRunsAndThreadCountsGiveIdenticalBytes) {
  const Case c{.T = 2048, .K = 8, .E = 64, .capacity = 200, .H = 64, .invalid_fraction = 0.01};
  const uint64_t seed = rng()();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 gen(seed);
  const Inputs in = make_inputs(c, gen);
  const int64_t rows = c.T * c.K;
  Context ctx;
  const Permuted a = run_permute(in, c, rows, ctx);
  const Unpermuted ya = run_unpermute(a.permuted_x, a.row_map, a.permuted_probs, ctx);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const Permuted b = run_permute(in, c, rows, ctx);
  const Unpermuted yb = run_unpermute(b.permuted_x, b.row_map, b.permuted_probs, ctx);
  omp_set_num_threads(threads);
  const std::vector<std::pair<const HostTensor*, const HostTensor*>> pairs{
      {&a.offsets, &b.offsets}, {&a.permuted_x, &b.permuted_x},
      {&a.row_map, &b.row_map}, {&a.permuted_probs, &b.permuted_probs},
      {&a.invalid, &b.invalid}, {&ya.y, &yb.y},
      {&ya.probs, &yb.probs}};
  for (const auto& [first, second] : pairs) EXPECT_TRUE(bytes_equal(first->view, second->view));
}

TEST(Permute, HostDataRunsEveryStepOnTheCpuAndTheReportSaysSo) {
  const Case c{.T = 5, .K = 2, .E = 3, .capacity = -1, .H = 8};
  std::mt19937_64 gen(rng()());
  const Inputs in = make_inputs(c, gen);
  Context ctx;
  const Permuted p = run_permute(in, c, 10, ctx);
  run_unpermute(p.permuted_x, p.row_map, HostTensor(), ctx);
  for (const char* step : {"route_tokens", "permute_rows", "unpermute_rows"}) {
    auto it =
        std::find_if(ctx.report().begin(), ctx.report().end(), [&](const StepRecord& r) { return r.step == step; });
    ASSERT_NE(it, ctx.report().end()) << step;
    EXPECT_EQ(it->backend, "cpu") << step;
  }
}

// On device data with no GPU backend left (cuda_portable denied here; on a machine without a GPU
// none is usable anyway) dispatch reports that no backend serves the step, naming every backend's
// reason, writes nothing and never touches the data. cuda_sm90 refuses the steps in its probe and
// on a direct call; cuda_portable serves them (tests/gpu/test_permute_gpu.cpp runs it).
TEST(Permute, DeviceDataWithoutAGpuBackendIsRefusedWithEveryReason) {
  HostTensor x(DType::bf16, {4, 8}), ids(DType::i32, {4, 2});
  HostTensor offsets = poisoned(DType::i32, {4}), px = poisoned(DType::bf16, {8, 8}),
             row_map = poisoned(DType::i32, {4, 2});
  std::fill(ids.ptr<int32_t>(), ids.ptr<int32_t>() + 8, 1);
  const HostTensor px_before = px, row_map_before = row_map;
  auto gpu = [](TensorView v) {
    v.device = kGpu;
    return v;
  };
  Context ctx(Options{.deny = {"cuda_portable"}});
  try {
    permute_tokens(ctx, {.x = gpu(x.view),
                         .expert_ids = gpu(ids.view),
                         .experts = 3,
                         .offsets = gpu(offsets.view),
                         .permuted_x = gpu(px.view),
                         .row_map = gpu(row_map.view)});
    ADD_FAILURE() << "permute_tokens ran on device data";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "backend");
    const std::string what = e.what();
    EXPECT_NE(what.find("no backend can run step route_tokens on cuda:0"), std::string::npos) << what;
    for (detail::Backend* b : detail::backends())
      EXPECT_NE(what.find(std::string(b->name()) + ": "), std::string::npos) << what;
  }
  EXPECT_TRUE(bytes_equal(px.view, px_before.view));
  EXPECT_TRUE(bytes_equal(row_map.view, row_map_before.view));
  HostTensor y = poisoned(DType::bf16, {4, 8});
  EXPECT_THROW(unpermute_tokens(ctx, {.permuted_y = gpu(px.view), .row_map = gpu(row_map.view), .y = gpu(y.view)}),
               Error);
  EXPECT_THROW(permute_by_map(ctx, {.x = gpu(x.view), .row_map = gpu(row_map.view), .permuted_x = gpu(px.view)}),
               Error);

  for (detail::Step s : {detail::Step::route_tokens, detail::Step::permute_rows, detail::Step::unpermute_rows}) {
    const detail::Probe sm90 = detail::cuda_sm90_backend()->probe({s, kGpu});
    EXPECT_FALSE(sm90.available) << detail::to_string(s);
    EXPECT_FALSE(sm90.reason.empty()) << detail::to_string(s);
#if defined(MXMOE_WITH_CUDA)
    EXPECT_TRUE(detail::cuda_portable_backend()->probe({s, kGpu, Recipe::bf16, 8, 2}).available)
        << detail::to_string(s);
#endif
  }
  detail::Backend* sm90 = detail::cuda_sm90_backend();
  EXPECT_THROW(sm90->route_tokens(ctx, {.expert_ids = ids.view, .experts = 3}), Error);
  EXPECT_THROW(sm90->permute_rows(ctx, {}), Error);
  EXPECT_THROW(sm90->unpermute_rows(ctx, {}), Error);
}

}  // namespace
}  // namespace mxmoe::test
