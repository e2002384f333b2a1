// The CPU reference m-grouped GEMM's GLU epilogues (src/cpu/gemm.cpp) against naive fp64 loops:
// glu_forward (C, A = p * act(C), MXFP8 A) and glu_backward (dC, dprob, db1, MXFP8 dC), both
// activations, both GLU layouts, inputs that cross the clamp limits.
// Run: <build>/tests/mxmoe_unit_tests --gtest_filter='CpuGlu*'
#include <gtest/gtest.h>

#include <vector>

#include "cpu_gemm_testing.h"
#include "glu_reference.h"
#include "src/api/layer_steps.h"
#include "src/cpu/cpu_ops.h"

namespace mxmoe {
namespace {

using namespace test;
using detail::Fc1FpropArgs;
using detail::Fc2DgradArgs;
using detail::GradOut;

// ---- glu epilogues ----

struct GluCase {
  std::vector<int> sizes = {0, 5, 33, 70};
  int64_t k = 64, ffn = 64;
  Activation act = Activation::swiglu;
  GluLayout layout = GluLayout::halves;
};
GluParams params_of(const GluCase& c) {
  GluParams p;
  p.activation = c.act;
  return p;
}
// The layer problem whose fc1_fprop / fc2_dgrad steps these cases run (H = k, biases on).
Problem problem_of(const GluCase& c, int64_t experts) {
  Problem p;
  p.hidden = c.k;
  p.ffn = c.ffn;
  p.experts = experts;
  p.activation = c.act;
  p.glu_layout = c.layout;
  p.fc1_bias = true;
  p.recipe = Recipe::bf16;
  return p;
}
const GluCase kGluCases[] = {
    {.act = Activation::swiglu, .layout = GluLayout::halves},
    {.act = Activation::swiglu, .layout = GluLayout::interleave32},
    {.act = Activation::clamped_swiglu, .layout = GluLayout::halves},
    {.act = Activation::clamped_swiglu, .layout = GluLayout::interleave32},
};

// Quantizing the bf16 result must give the bytes the fused MXFP8 output gave (docs/numerics.md "Quantized value").
void expect_quantized_equal(const HostTensor& bf16_out, const HostTensor& offsets, const HostTensor& row,
                            const HostTensor& row_scales, const HostTensor& col, const HostTensor& col_scales) {
  const int64_t m = bf16_out.view.shape[0], k = bf16_out.view.shape[1];
  HostTensor r2(DType::e4m3, {m, k}), rs2(DType::e8m0, {row_scales.numel()});
  HostTensor c2(DType::e4m3, {m, k}), cs2(DType::e8m0, {col_scales.numel()});
  QuantizeArgs q;
  q.src = bf16_out.view;
  q.groups.offsets = offsets.view;
  q.rowwise = Mxfp8View{r2.view, rs2.view, BlockAxis::row, ScaleLayout::swizzled};
  q.colwise = Mxfp8View{c2.view, cs2.view, BlockAxis::col, ScaleLayout::compact};
  cpu::quantize(q);
  EXPECT_TRUE(bytes_equal(row.view, r2.view));
  EXPECT_TRUE(bytes_equal(row_scales.view, rs2.view));
  EXPECT_TRUE(bytes_equal(col.view, c2.view));
  EXPECT_TRUE(bytes_equal(col_scales.view, cs2.view));
}

TEST(CpuGluForward, MatchesNaiveLoopAndMxfp8OutputIsQuantizedBf16) {
  for (const GluCase& c : kGluCases) {
    SCOPED_TRACE(std::string(to_string(c.act)) + " " + to_string(c.layout));
    const int64_t t = total_of(c.sizes), e = static_cast<int64_t>(c.sizes.size()), f = c.ffn;
    const HostTensor offsets = offsets_from_sizes(c.sizes);
    const HostTensor x = random_bf16({t, c.k});
    const Weights w1(e, 2 * f, c.k, false, BlockAxis::row, ScaleLayout::compact, -2.f, 2.f);  // |C| crosses 7
    const HostTensor b1 = random_bf16({e, 2 * f}, -0.5f, 0.5f), probs = random_f32({t}, 0.f, 1.f);
    HostTensor cbuf = poisoned(DType::bf16, {t, 2 * f}), out = poisoned(DType::bf16, {t, f});

    const Problem p = problem_of(c, e);
    Fc1FpropArgs args{.x = bf16_operand(x), .w1 = w1.dense(), .offsets = {offsets.view}, .b1 = b1.view,
                      .probs = probs.view, .c = cbuf.view, .a = {.bf16 = out.view}};
    cpu::gemm_m(detail::fc1_fprop(p, args).gemm_m());

    std::vector<double> cref = naive_gemm_m(values(x.view), w1, c.sizes, c.k, 2 * f, false);
    const std::vector<int64_t> group = group_of_rows(c.sizes);
    std::vector<double> aref(static_cast<size_t>(t * f));
    int64_t clamped = 0;
    for (int64_t r = 0; r < t; ++r) {
      for (int64_t j = 0; j < 2 * f; ++j) cref[r * 2 * f + j] += value_at(b1.view, group[r] * 2 * f + j);
      for (int64_t i = 0; i < f; ++i) {
        const double a = cref[r * 2 * f + glu_a_col(i, f, c.layout)], b = cref[r * 2 * f + glu_b_col(i, f, c.layout)];
        aref[r * f + i] = value_at(probs.view, r) * glu_act_f64(a, b, params_of(c));
        clamped += (a > 7.0) + (std::abs(b) > 7.0);
      }
    }
    EXPECT_GT(clamped, 0) << "inputs must reach the clamp";
    EXPECT_LT(rel(cbuf.view, cref, {t, 2 * f}), 5e-3);
    EXPECT_LT(rel(out.view, aref, {t, f}), 5e-3);

    HostTensor c2 = poisoned(DType::bf16, {t, 2 * f});
    HostTensor row = poisoned(DType::e4m3, {t, f}), col = poisoned(DType::e4m3, {t, f});
    HostTensor row_s = poisoned(DType::e8m0, {rowwise_scale_bytes(t, f)});
    HostTensor col_s = poisoned(DType::e8m0, {colwise_scale_bytes(t, f, e)});
    args.c = c2.view;
    args.a = {.row = Mxfp8View{row.view, row_s.view, BlockAxis::row, ScaleLayout::swizzled},
              .col = Mxfp8View{col.view, col_s.view, BlockAxis::col, ScaleLayout::compact}};
    cpu::gemm_m(detail::fc1_fprop(p, args).gemm_m());
    EXPECT_TRUE(bytes_equal(cbuf.view, c2.view));
    expect_quantized_equal(out, offsets, row, row_s, col, col_s);
  }
}

TEST(CpuGluBackward, MatchesNaiveLoopWithDprobDb1AndMxfp8Output) {
  for (const GluCase& c : kGluCases) {
    SCOPED_TRACE(std::string(to_string(c.act)) + " " + to_string(c.layout));
    const int64_t t = total_of(c.sizes), e = static_cast<int64_t>(c.sizes.size()), f = c.ffn;
    const HostTensor offsets = offsets_from_sizes(c.sizes);
    const HostTensor dy = random_bf16({t, c.k});
    const Weights w2(e, c.k, f, false, BlockAxis::col, ScaleLayout::compact, -1.f, 1.f);  // [K = H, N = F]
    const HostTensor cin = random_bf16({t, 2 * f}, -10.f, 10.f);  // saved pre-activation, crosses +-7
    const HostTensor probs = random_f32({t}, 0.f, 1.f), dprob_add = random_f32({t});
    const HostTensor db1_prior = random_f32({e, 2 * f});
    HostTensor dc = poisoned(DType::bf16, {t, 2 * f}), dprobs = poisoned(DType::f32, {t});
    HostTensor db1_acc = db1_prior, db1_new = poisoned(DType::f32, {e, 2 * f});

    const Problem p = problem_of(c, e);
    Fc2DgradArgs args{.dy = bf16_operand(dy), .w2 = w2.dense(), .offsets = {offsets.view}, .probs = probs.view,
                      .c = cin.view, .dprobs = dprobs.view, .dprob_add = dprob_add.view,
                      .db1 = GradOut{db1_acc.view, /*accumulate=*/true}, .dc = {.bf16 = dc.view}};
    cpu::gemm_m(detail::fc2_dgrad(p, args).gemm_m());

    const std::vector<double> g = naive_gemm_m(values(dy.view), w2, c.sizes, c.k, f, true);
    const std::vector<int64_t> group = group_of_rows(c.sizes);
    std::vector<double> dc_ref(static_cast<size_t>(t * 2 * f)), dprob_ref(static_cast<size_t>(t));
    std::vector<double> db1_ref(static_cast<size_t>(e * 2 * f), 0.0);
    for (int64_t r = 0; r < t; ++r) {
      const double prob = value_at(probs.view, r);
      double dp = value_at(dprob_add.view, r);
      for (int64_t i = 0; i < f; ++i) {
        const int64_t ca = glu_a_col(i, f, c.layout), cb = glu_b_col(i, f, c.layout);
        const GluRef gr = glu_ref_f64(value_at(cin.view, r * 2 * f + ca), value_at(cin.view, r * 2 * f + cb),
                                      g[r * f + i], prob, params_of(c));
        dc_ref[r * 2 * f + ca] = gr.da;
        dc_ref[r * 2 * f + cb] = gr.db;
        dp += g[r * f + i] * gr.act;
      }
      dprob_ref[r] = dp;
      for (int64_t j = 0; j < 2 * f; ++j) db1_ref[group[r] * 2 * f + j] += dc_ref[r * 2 * f + j];
    }
    EXPECT_LT(rel(dc.view, dc_ref, {t, 2 * f}), 5e-3);
    EXPECT_LT(rel(dprobs.view, dprob_ref, {t}), 1e-5);
    std::vector<double> db1_acc_ref = db1_ref;
    for (int64_t i = 0; i < e * 2 * f; ++i) db1_acc_ref[i] += db1_prior.ptr<float>()[i];
    EXPECT_LT(rel(db1_acc.view, db1_acc_ref, {e, 2 * f}), 1e-5);
    // Expert 0 is empty: accumulating leaves its row untouched.
    EXPECT_EQ(std::memcmp(db1_acc.ptr<float>(), db1_prior.ptr<float>(), static_cast<size_t>(2 * f) * 4), 0);

    // Overwrite: db1 written (zeros for the empty expert), dC as MXFP8 row + col.
    HostTensor row = poisoned(DType::e4m3, {t, 2 * f}), col = poisoned(DType::e4m3, {t, 2 * f});
    HostTensor row_s = poisoned(DType::e8m0, {rowwise_scale_bytes(t, 2 * f)});
    HostTensor col_s = poisoned(DType::e8m0, {colwise_scale_bytes(t, 2 * f, e)});
    HostTensor dprobs2 = poisoned(DType::f32, {t});
    args.dc = {.row = Mxfp8View{row.view, row_s.view, BlockAxis::row, ScaleLayout::swizzled},
               .col = Mxfp8View{col.view, col_s.view, BlockAxis::col, ScaleLayout::compact}};
    args.dprobs = dprobs2.view;
    args.db1 = GradOut{db1_new.view, /*accumulate=*/false};
    cpu::gemm_m(detail::fc2_dgrad(p, args).gemm_m());
    EXPECT_LT(rel(db1_new.view, db1_ref, {e, 2 * f}), 1e-5);
    for (int64_t j = 0; j < 2 * f; ++j) EXPECT_EQ(db1_new.ptr<float>()[j], 0.0f);
    EXPECT_TRUE(bytes_equal(dprobs.view, dprobs2.view));
    expect_quantized_equal(dc, offsets, row, row_s, col, col_s);
  }
}

TEST(CpuGluBackward, Bf16Db1AndAllEmptyGroups) {
  GluCase c;
  c.sizes = {0, 0, 0};
  const int64_t f = c.ffn;
  const HostTensor offsets = offsets_from_sizes(c.sizes);
  const HostTensor dy(DType::bf16, {0, c.k}), cin(DType::bf16, {0, 2 * f}), probs(DType::f32, {0});
  const Weights w2(3, c.k, f, false, BlockAxis::col, ScaleLayout::compact, -1.f, 1.f);
  HostTensor dc(DType::bf16, {0, 2 * f}), dprobs(DType::f32, {0});
  HostTensor db1 = poisoned(DType::bf16, {3, 2 * f});
  const Fc2DgradArgs args{.dy = bf16_operand(dy), .w2 = w2.dense(), .offsets = {offsets.view}, .probs = probs.view,
                          .c = cin.view, .dprobs = dprobs.view, .db1 = GradOut{db1.view, false},
                          .dc = {.bf16 = dc.view}};
  cpu::gemm_m(detail::fc2_dgrad(problem_of(c, 3), args).gemm_m());
  for (int64_t i = 0; i < db1.numel(); ++i) EXPECT_EQ(db1.ptr<uint16_t>()[i], 0) << i;
}

}  // namespace
}  // namespace mxmoe
