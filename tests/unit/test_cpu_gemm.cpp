// The CPU reference grouped GEMMs (src/cpu/gemm.cpp) against naive fp64 loops: the m-grouped GEMM's
// store epilogue, the k-grouped GEMM and the FC2 bias gradients (glu epilogues:
// test_cpu_glu_epilogues.cpp).
// Run: <build>/tests/mxmoe_unit_tests --gtest_filter='CpuGemm*:CpuFc2*'
#include <gtest/gtest.h>
#include <omp.h>

#include <vector>

#include "cpu_gemm_testing.h"
#include "src/api/layer_steps.h"
#include "src/cpu/cpu_ops.h"

namespace mxmoe {
namespace {

using namespace test;
using detail::Epilogue;
using detail::GradOut;
using detail::MGemmStep;

const std::vector<int> kSizes = {0, 1, 31, 33, 129};

// ---- m-grouped GEMM, store epilogue ----

enum class BiasMode { none, bias, bias_times_probs };

struct StoreCase {
  std::vector<int> sizes;
  int64_t k = 96, n = 40;
  bool mx = false, b_kn = false;
  ScaleLayout layout = ScaleLayout::compact;
  BiasMode bias = BiasMode::none;
  DType out = DType::f32;
};

// Runs gemm_m (dense weights and, when asked, per-expert pointers) and returns the error vs fp64.
double run_store_case(const StoreCase& c, bool check_pointer_layout = false) {
  const int64_t t = total_of(c.sizes), experts = static_cast<int64_t>(c.sizes.size());
  const HostTensor offsets = offsets_from_sizes(c.sizes);
  const HostTensor x = random_bf16({t, c.k});
  const MxTensor xq = c.mx ? quantize_activation(x, BlockAxis::row, c.layout, offsets) : MxTensor{};
  const Weights w(experts, c.b_kn ? c.k : c.n, c.b_kn ? c.n : c.k, c.mx,
                  c.b_kn ? BlockAxis::col : BlockAxis::row, c.layout, -1.f, 1.f);
  const HostTensor bias = random_bf16({experts, c.n}, -0.5f, 0.5f);
  const HostTensor probs = random_f32({t}, 0.f, 1.f);
  HostTensor d = poisoned(c.out, {t, c.n});

  MGemmStep s;
  s.gemm.a = c.mx ? mx_operand(xq) : bf16_operand(x);
  s.gemm.offsets.offsets = offsets.view;
  s.gemm.b = w.dense();
  s.gemm.b_kn = c.b_kn;
  if (c.bias != BiasMode::none) s.gemm.bias = bias.view;
  s.bias_scale_by_probs = c.bias == BiasMode::bias_times_probs;
  s.probs = probs.view;
  s.gemm.d = d.view;
  cpu::gemm_m(s);

  if (check_pointer_layout) {
    HostTensor d2 = poisoned(c.out, {t, c.n});
    s.gemm.b = w.per_expert();
    s.gemm.d = d2.view;
    cpu::gemm_m(s);
    EXPECT_TRUE(bytes_equal(d.view, d2.view)) << "per-expert pointers differ from dense weights";
  }

  std::vector<double> ref = naive_gemm_m(c.mx ? xq.decoded : values(x.view), w, c.sizes, c.k, c.n, c.b_kn);
  const std::vector<int64_t> group = group_of_rows(c.sizes);
  for (int64_t r = 0; r < t; ++r)
    for (int64_t j = 0; j < c.n; ++j) {
      const double b = c.bias == BiasMode::none ? 0.0 : value_at(bias.view, group[r] * c.n + j);
      ref[r * c.n + j] += (c.bias == BiasMode::bias_times_probs ? value_at(probs.view, r) : 1.0) * b;
    }
  return rel(d.view, ref, {t, c.n});
}

TEST(CpuGemmM, StoreMatchesNaiveLoopForBf16Operands) {
  for (bool b_kn : {false, true})
    for (BiasMode bias : {BiasMode::none, BiasMode::bias, BiasMode::bias_times_probs}) {
      StoreCase c{.sizes = kSizes, .b_kn = b_kn, .bias = bias};
      EXPECT_LT(run_store_case(c), 1e-5) << "b_kn=" << b_kn << " bias=" << static_cast<int>(bias);
      c.out = DType::bf16;
      EXPECT_LT(run_store_case(c), 5e-3) << "bf16 out, b_kn=" << b_kn;
    }
}

TEST(CpuGemmM, StoreMatchesNaiveLoopForMxfp8Operands) {
  for (ScaleLayout layout : kLayouts)
    for (bool b_kn : {false, true})
      for (BiasMode bias : {BiasMode::none, BiasMode::bias_times_probs}) {
        const StoreCase c{.sizes = kSizes, .mx = true, .b_kn = b_kn, .layout = layout, .bias = bias};
        EXPECT_LT(run_store_case(c), 1e-5) << "layout=" << static_cast<int>(layout) << " b_kn=" << b_kn
                                           << " bias=" << static_cast<int>(bias);
      }
}

TEST(CpuGemmM, SingleExpertAndWideShapesMatch) {
  EXPECT_LT(run_store_case({.sizes = {300}, .k = 320, .n = 272}), 1e-5);
  EXPECT_LT(run_store_case({.sizes = {70}, .k = 64, .n = 8, .mx = true, .b_kn = true}), 1e-5);
}

TEST(CpuGemmM, AllEmptyGroupsAreValid) {
  EXPECT_EQ(run_store_case({.sizes = {0, 0, 0}}), 0.0);
  EXPECT_EQ(run_store_case({.sizes = {0, 0}, .mx = true}), 0.0);
}

TEST(CpuGemmM, PerExpertPointerWeightsAreBitIdenticalToDense) {
  for (bool mx : {false, true})
    for (bool b_kn : {false, true}) {
      const StoreCase c{.sizes = kSizes,
                        .mx = mx,
                        .b_kn = b_kn,
                        .layout = ScaleLayout::swizzled,
                        .bias = BiasMode::bias,
                        .out = DType::bf16};
      EXPECT_LT(run_store_case(c, /*check_pointer_layout=*/true), 5e-3);
    }
}
TEST(CpuGemmM, ResultDoesNotDependOnThreadCount) {
  const std::vector<int> sizes = {3, 0, 300};
  const int64_t t = total_of(sizes), k = 320, n = 272;
  const HostTensor offsets = offsets_from_sizes(sizes), x = random_bf16({t, k});
  const Weights w(3, n, k, false, BlockAxis::row, ScaleLayout::compact, -1.f, 1.f);
  HostTensor d1 = poisoned(DType::f32, {t, n}), d2 = poisoned(DType::f32, {t, n});
  MGemmStep s;
  s.gemm.a = bf16_operand(x);
  s.gemm.offsets.offsets = offsets.view;
  s.gemm.b = w.dense();
  s.gemm.d = d1.view;
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  cpu::gemm_m(s);
  omp_set_num_threads(std::max(threads, 3));
  s.gemm.d = d2.view;
  cpu::gemm_m(s);
  omp_set_num_threads(threads);
  EXPECT_TRUE(bytes_equal(d1.view, d2.view));
}

TEST(CpuGemmM, OutOfRangeOffsetsStayInBounds) {
  // Device offsets are not validated on the GPU paths; the CPU backend clamps them the same way.
  const int64_t t = 40, k = 64, n = 16;
  HostTensor offsets(DType::i32, {4});
  const int32_t bad[] = {-7, 1000, 12, 40};
  std::memcpy(offsets.bytes.data(), bad, sizeof bad);
  const HostTensor x = random_bf16({t, k});
  const Weights w(3, n, k, false, BlockAxis::row, ScaleLayout::compact, -1.f, 1.f);
  HostTensor d = poisoned(DType::f32, {t, n});
  MGemmStep s;
  s.gemm.a = bf16_operand(x);
  s.gemm.offsets.offsets = offsets.view;
  s.gemm.b = w.dense();
  s.gemm.d = d.view;
  cpu::gemm_m(s);  // clamped groups: [0, 40), [40, 40), [40, 40)
  const std::vector<double> ref = naive_gemm_m(values(x.view), w, {40, 0, 0}, k, n, false);
  EXPECT_LT(rel(d.view, ref, {t, n}), 1e-5);
}

// ---- k-grouped GEMM ----

struct KCase {
  std::vector<int> sizes = {0, 1, 31, 33, 129, 0};
  int64_t m = 40, n = 24;
  bool mx = false;
  ScaleLayout layout = ScaleLayout::compact;
};

struct KRun {
  HostTensor a, b, offsets;
  MxTensor aq, bq;
  std::vector<double> ref;  // [E, M, N]
  KGroupedGemmArgs args;
};

void prepare_k(const KCase& c, KRun& r) {
  const int64_t t = total_of(c.sizes), e = static_cast<int64_t>(c.sizes.size());
  r.offsets = offsets_from_sizes(c.sizes);
  r.a = random_bf16({t, c.m});
  r.b = random_bf16({t, c.n});
  std::vector<double> av = values(r.a.view), bv = values(r.b.view);
  if (c.mx) {
    r.aq = quantize_activation(r.a, BlockAxis::col, c.layout, r.offsets);
    r.bq = quantize_activation(r.b, BlockAxis::col, c.layout, r.offsets);
    av = r.aq.decoded;
    bv = r.bq.decoded;
  }
  r.ref.assign(static_cast<size_t>(e * c.m * c.n), 0.0);
  const std::vector<int64_t> group = group_of_rows(c.sizes);
  for (int64_t x = 0; x < t; ++x)
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j)
        r.ref[(group[x] * c.m + i) * c.n + j] += av[x * c.m + i] * bv[x * c.n + j];
  r.args.a = c.mx ? mx_operand(r.aq) : bf16_operand(r.a);
  r.args.b = c.mx ? mx_operand(r.bq) : bf16_operand(r.b);
  r.args.offsets.offsets = r.offsets.view;
}

TEST(CpuGemmK, OverwritesPoisonedF32OutputAndZeroesEmptyExperts) {
  for (bool mx : {false, true})
    for (ScaleLayout layout : kLayouts) {
      const KCase c{.mx = mx, .layout = layout};
      const int64_t e = static_cast<int64_t>(c.sizes.size());
      KRun r;
      prepare_k(c, r);
      HostTensor d = poisoned(DType::f32, {e, c.m, c.n});
      r.args.d.dense = d.view;
      r.args.d.dtype = DType::f32;
      cpu::gemm_k(r.args);
      EXPECT_LT(rel(d.view, r.ref, {e, c.m, c.n}), 1e-5) << "mx=" << mx;
      for (int64_t i = 0; i < c.m * c.n; ++i) ASSERT_EQ(d.ptr<float>()[i], 0.0f);  // expert 0 is empty
    }
}

TEST(CpuGemmK, AccumulatesIntoF32AndLeavesEmptyExpertsUntouched) {
  const KCase c{.mx = true, .layout = ScaleLayout::swizzled};
  const int64_t e = static_cast<int64_t>(c.sizes.size()), per = c.m * c.n;
  KRun r;
  prepare_k(c, r);
  const HostTensor prior = random_f32({e, c.m, c.n});
  HostTensor d = prior;
  r.args.d.dense = d.view;
  r.args.d.dtype = DType::f32;
  r.args.accumulate = true;
  cpu::gemm_k(r.args);
  std::vector<double> ref = r.ref;
  for (int64_t i = 0; i < e * per; ++i) ref[i] += prior.ptr<float>()[i];
  EXPECT_LT(rel(d.view, ref, {e, c.m, c.n}), 1e-5);
  for (int64_t x : {int64_t{0}, e - 1})  // the empty experts
    EXPECT_EQ(
        std::memcmp(d.ptr<float>() + x * per, prior.ptr<float>() + x * per, static_cast<size_t>(per) * 4), 0);
}

TEST(CpuGemmK, Bf16OutputAndPerExpertPointersMatchDense) {
  for (bool mx : {false, true}) {
    const KCase c{.mx = mx};
    const int64_t e = static_cast<int64_t>(c.sizes.size());
    KRun r;
    prepare_k(c, r);
    HostTensor d = poisoned(DType::bf16, {e, c.m, c.n});
    r.args.d.dense = d.view;
    r.args.d.dtype = DType::bf16;
    cpu::gemm_k(r.args);
    EXPECT_LT(rel(d.view, r.ref, {e, c.m, c.n}), 5e-3);

    std::vector<HostTensor> parts;
    parts.reserve(static_cast<size_t>(e));
    HostTensor ptrs(DType::i64, {e});
    for (int64_t x = 0; x < e; ++x) {
      parts.push_back(poisoned(DType::bf16, {c.m, c.n}));
      ptrs.ptr<int64_t>()[x] = reinterpret_cast<int64_t>(parts.back().bytes.data());
    }
    r.args.d = ExpertMatrices{};
    r.args.d.pointers = ptrs.view;
    r.args.d.dtype = DType::bf16;
    cpu::gemm_k(r.args);
    for (int64_t x = 0; x < e; ++x)
      EXPECT_EQ(std::memcmp(parts[x].bytes.data(), d.bytes.data() + x * c.m * c.n * 2, parts[x].bytes.size()),
                0);
  }
}

TEST(CpuGemmK, AllEmptyGroupsWriteZeros) {
  const KCase c{.sizes = {0, 0}, .mx = true};
  KRun r;
  prepare_k(c, r);
  HostTensor d = poisoned(DType::f32, {2, c.m, c.n});
  r.args.d.dense = d.view;
  r.args.d.dtype = DType::f32;
  cpu::gemm_k(r.args);
  for (int64_t i = 0; i < d.numel(); ++i) ASSERT_EQ(d.ptr<float>()[i], 0.0f) << i;
}

// ---- FC2 bias gradients ----

TEST(CpuFc2BiasGrads, MatchNaiveSumsWithAndWithoutProbScaling) {
  const std::vector<int> sizes = {0, 1, 31, 33, 129};
  const int64_t t = total_of(sizes), e = static_cast<int64_t>(sizes.size()), h = 72;
  const HostTensor offsets = offsets_from_sizes(sizes);
  const HostTensor dy = random_bf16({t, h}), b2 = random_bf16({e, h}), probs = random_f32({t}, 0.f, 1.f);
  const std::vector<int64_t> group = group_of_rows(sizes);
  for (bool scale : {false, true}) {
    SCOPED_TRACE(scale ? "scale_by_probs" : "plain");
    std::vector<double> db2_ref(static_cast<size_t>(e * h), 0.0), dprob_ref(static_cast<size_t>(t), 0.0);
    for (int64_t r = 0; r < t; ++r)
      for (int64_t j = 0; j < h; ++j) {
        const double v = value_at(dy.view, r * h + j);
        db2_ref[group[r] * h + j] += (scale ? value_at(probs.view, r) : 1.0) * v;
        dprob_ref[r] += v * value_at(b2.view, group[r] * h + j);
      }

    Problem p;
    p.hidden = h;
    p.experts = e;
    p.fc2_bias = true;
    p.scale_fc2_bias = scale;
    HostTensor db2 = poisoned(DType::f32, {e, h}), dprob_add = poisoned(DType::f32, {t});
    detail::Fc2BiasGradStep s{.dy = dy.view, .offsets = {offsets.view}, .probs = probs.view, .b2 = b2.view,
                              .db2 = GradOut{db2.view, false}, .dprob_add = dprob_add.view};
    auto run_step = [&] { cpu::fc2_bias_grads(detail::fc2_bias_grads(p, s).fc2_bias_grads()); };
    run_step();
    EXPECT_LT(rel(db2.view, db2_ref, {e, h}), 1e-6);
    for (int64_t j = 0; j < h; ++j) EXPECT_EQ(db2.ptr<float>()[j], 0.0f);  // expert 0 is empty
    if (scale) {
      EXPECT_LT(rel(dprob_add.view, dprob_ref, {t}), 1e-6);
    } else {
      for (int64_t r = 0; r < t; ++r)
        EXPECT_TRUE(std::isnan(dprob_add.ptr<float>()[r])) << "written without scaling";
    }

    const HostTensor prior = random_f32({e, h});
    HostTensor acc = prior;
    s.db2 = GradOut{acc.view, true};
    run_step();
    std::vector<double> acc_ref = db2_ref;
    for (int64_t i = 0; i < e * h; ++i) acc_ref[i] += prior.ptr<float>()[i];
    EXPECT_LT(rel(acc.view, acc_ref, {e, h}), 1e-6);
    EXPECT_EQ(std::memcmp(acc.ptr<float>(), prior.ptr<float>(), static_cast<size_t>(h) * 4), 0);

    HostTensor bf = poisoned(DType::bf16, {e, h});
    s.db2 = GradOut{bf.view, false};
    run_step();
    EXPECT_LT(rel(bf.view, db2_ref, {e, h}), 5e-3);
  }
}

}  // namespace
}  // namespace mxmoe
