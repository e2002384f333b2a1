// GPU tests of the portable m-grouped GEMM's fused GLU epilogues (src/cuda/portable/epilogue_glu.cuh)
// against the CPU reference (src/cpu/gemm.cpp): FC1 forward (C, A = p * act, BF16 or MXFP8 row +
// column quantized in the epilogue) and FC2 dgrad backward (dC, dprob, db1), both recipes, both
// activations, both GLU layouts, odd dims, empty and skewed groups; dense vs per-expert weights and
// repeated runs bit-identical.
// Run: mxmoe_gpu_tests --gtest_filter='PortableGlu*'
#include <gtest/gtest.h>

#include <vector>

#include "tests/gpu_support.h"

#if defined(MXMOE_WITH_CUDA)
#include "tests/gpu/grouped_gemm_gpu_fixture.h"
#endif

namespace mxmoe {
namespace {

#if defined(MXMOE_WITH_CUDA)
using namespace test;
using namespace test::gg;
using detail::Epilogue;
using detail::MGemmStep;

struct GluCase {
  std::vector<int> sizes = {0, 1, 31, 33, 129, 0, 64};
  int64_t h = 96, f = 64;  // GEMM K = H; FC1 width 2F
  bool mx = false;
  bool mx_out = false;  // quantized A / dC (else bf16)
  bool b_kn = false;
  Activation act = Activation::swiglu;
  GluLayout layout = GluLayout::halves;
  ScaleLayout scale_layout = ScaleLayout::compact;
  bool bias = true;
};

GluParams glu_params(Activation a) {
  GluParams g;
  g.activation = a;
  return g;
}

struct MxOutDual {
  Dual row_data, row_scales, col_data, col_scales;
  MxOutDual(int64_t t, int64_t cols, int64_t experts)
      : row_data(poisoned(DType::e4m3, {t, cols})),
        row_scales(poisoned(DType::e8m0, {rowwise_scale_bytes(t, cols)})),
        col_data(poisoned(DType::e4m3, {t, cols})),
        col_scales(poisoned(DType::e8m0, {colwise_scale_bytes(t, cols, experts)})) {}
  Mxfp8View row(bool dev, ScaleLayout l) const {
    return {dev ? row_data.dv() : row_data.hv(), dev ? row_scales.dv() : row_scales.hv(), BlockAxis::row, l};
  }
  Mxfp8View col(bool dev, ScaleLayout l) const {
    return {dev ? col_data.dv() : col_data.hv(), dev ? col_scales.dv() : col_scales.hv(), BlockAxis::col, l};
  }
};

// Compares an MXFP8 output pair (GPU download vs CPU host tensors) through dequantization.
void expect_mx_close(const MxOutDual& o, ScaleLayout l, const HostTensor& offsets, const char* what) {
  const HostTensor rd = o.row_data.download(), rs = o.row_scales.download();
  const HostTensor cd = o.col_data.download(), cs = o.col_scales.download();
  const HostTensor gr = dequantized(rd, rs, BlockAxis::row, l, offsets);
  const HostTensor cr = dequantized(o.row_data.h, o.row_scales.h, BlockAxis::row, l, offsets);
  const HostTensor gc = dequantized(cd, cs, BlockAxis::col, l, offsets);
  const HostTensor cc = dequantized(o.col_data.h, o.col_scales.h, BlockAxis::col, l, offsets);
  EXPECT_LE(rel_error(gr.view, cr.view), 1e-2) << what << " row-wise";
  EXPECT_LE(rel_error(gc.view, cc.view), 1e-2) << what << " column-wise";
  if (o.row_data.h.numel() == 0) {
    // No rows: the CPU reference writes nothing; every (padding) scale byte must still read 0.
    for (uint8_t b : cs.bytes) ASSERT_EQ(b, 0) << what << " column-wise scale padding";
    return;
  }
  EXPECT_GE(scale_agreement(rs, o.row_scales.h), 0.999) << what << " row-wise scales";
  EXPECT_GE(scale_agreement(cs, o.col_scales.h), 0.999) << what << " column-wise scales";
}

struct Inputs {
  int64_t t, experts;
  HostTensor offsets_h;
  Dual offsets;
  Inputs(const std::vector<int>& sizes)
      : t(total_of(sizes)), experts(static_cast<int64_t>(sizes.size())), offsets_h(offsets_from_sizes(sizes)),
        offsets(offsets_h) {}
};

void expect_glu_forward_ok(const GluCase& c) {
  const Inputs in(c.sizes);
  const int64_t t = in.t, e = in.experts, f = c.f;
  const Act x(random_bf16({t, c.h}), c.mx, BlockAxis::row, c.scale_layout, in.offsets_h);
  const ExpertWeights w(e, c.b_kn ? c.h : 2 * f, c.b_kn ? 2 * f : c.h, c.mx,
                        c.b_kn ? BlockAxis::col : BlockAxis::row, c.scale_layout);
  const Dual b1 = random_bf16_dual({e, 2 * f}, -0.5f, 0.5f), probs = random_f32_dual({t}, 0.f, 1.f);
  Dual cmat = poisoned(DType::bf16, {t, 2 * f}), cmat2 = poisoned(DType::bf16, {t, 2 * f});
  Dual a_bf16 = poisoned(DType::bf16, {t, f}), a_bf16_2 = poisoned(DType::bf16, {t, f});
  MxOutDual amx(t, f, e), amx2(t, f, e);

  MGemmStep s;
  s.epilogue = Epilogue::glu_forward;
  s.glu = glu_params(c.act);
  s.glu_layout = c.layout;
  s.ffn = f;
  s.gemm.b_kn = c.b_kn;
  auto fill = [&](bool dev, bool per_expert, Dual& cm, Dual& ab, MxOutDual& am) {
    s.gemm.a = dev ? x.dev() : x.host();
    s.gemm.offsets.offsets = dev ? in.offsets.dv() : in.offsets.hv();
    s.gemm.b = dev ? w.dev(per_expert) : w.host();
    s.gemm.bias = c.bias ? (dev ? b1.dv() : b1.hv()) : TensorView{};
    s.probs = dev ? probs.dv() : probs.hv();
    s.c = dev ? cm.dv() : cm.hv();
    if (c.mx_out) {
      s.out_row = am.row(dev, c.scale_layout);
      s.out_col = am.col(dev, c.scale_layout);
    } else {
      s.out_bf16 = dev ? ab.dv() : ab.hv();
    }
  };
  fill(false, false, cmat, a_bf16, amx);
  cpu::gemm_m(s);
  fill(true, false, cmat, a_bf16, amx);
  cuda::portable::gemm_m(s, nullptr);
  fill(true, true, cmat2, a_bf16_2, amx2);
  cuda::portable::gemm_m(s, nullptr);
  sync();

  const HostTensor gc = cmat.download();
  EXPECT_LE(rel_error(gc.view, cmat.hv()), 1e-2) << "C";
  EXPECT_TRUE(bytes_equal(gc.view, cmat2.download().view)) << "C: per-expert weights differ from dense";
  if (c.mx_out) {
    expect_mx_close(amx, c.scale_layout, in.offsets_h, "A");
    EXPECT_TRUE(bytes_equal(amx.row_data.download().view, amx2.row_data.download().view));
    EXPECT_TRUE(bytes_equal(amx.col_data.download().view, amx2.col_data.download().view));
    EXPECT_TRUE(bytes_equal(amx.row_scales.download().view, amx2.row_scales.download().view));
    EXPECT_TRUE(bytes_equal(amx.col_scales.download().view, amx2.col_scales.download().view));
  } else {
    const HostTensor ga = a_bf16.download();
    EXPECT_LE(rel_error(ga.view, a_bf16.hv()), 1e-2) << "A";
    EXPECT_TRUE(bytes_equal(ga.view, a_bf16_2.download().view)) << "A: per-expert weights differ from dense";
  }
}

struct BwdOptions {
  DType db1 = DType::f32;
  bool accumulate = false;
  bool dprob_add = true;
};

void expect_glu_backward_ok(const GluCase& c, const BwdOptions& o = {}) {
  const Inputs in(c.sizes);
  const int64_t t = in.t, e = in.experts, f = c.f;
  // GEMM: dA[t, f] = dY[t, :] . W2_e[:, f]; W2_e is [H, F] (b_kn, the real dgrad) or [F, H].
  const Act dy(random_bf16({t, c.h}), c.mx, BlockAxis::row, c.scale_layout, in.offsets_h);
  const ExpertWeights w(e, c.b_kn ? c.h : f, c.b_kn ? f : c.h, c.mx, c.b_kn ? BlockAxis::col : BlockAxis::row,
                        c.scale_layout);
  const Dual cmat = random_bf16_dual({t, 2 * f}, -10.f, 10.f);  // crosses the clamp limits (7)
  const Dual probs = random_f32_dual({t}, 0.f, 1.f), add = random_f32_dual({t});
  HostTensor db1_init = o.accumulate ? random_f32({e, 2 * f}) : HostTensor(o.db1, {e, 2 * f});
  if (!o.accumulate) db1_init.poison(kPoison);
  Dual db1(db1_init), db1_2(db1_init);
  Dual dc = poisoned(DType::bf16, {t, 2 * f}), dc2 = poisoned(DType::bf16, {t, 2 * f});
  Dual dp = poisoned(DType::f32, {t}), dp2 = poisoned(DType::f32, {t});
  MxOutDual dmx(t, 2 * f, e), dmx2(t, 2 * f, e);

  MGemmStep s;
  s.epilogue = Epilogue::glu_backward;
  s.glu = glu_params(c.act);
  s.glu_layout = c.layout;
  s.ffn = f;
  s.gemm.b_kn = c.b_kn;
  s.db1.accumulate = o.accumulate;
  auto fill = [&](bool dev, bool per_expert, Dual& d1, Dual& dcb, Dual& dpr, MxOutDual& dm) {
    s.gemm.a = dev ? dy.dev() : dy.host();
    s.gemm.offsets.offsets = dev ? in.offsets.dv() : in.offsets.hv();
    s.gemm.b = dev ? w.dev(per_expert) : w.host();
    s.probs = dev ? probs.dv() : probs.hv();
    s.c = dev ? cmat.dv() : cmat.hv();
    s.dprobs = dev ? dpr.dv() : dpr.hv();
    s.dprob_add = o.dprob_add ? (dev ? add.dv() : add.hv()) : TensorView{};
    s.db1.dst = dev ? d1.dv() : d1.hv();
    if (c.mx_out) {
      s.out_row = dm.row(dev, c.scale_layout);
      s.out_col = dm.col(dev, c.scale_layout);
    } else {
      s.out_bf16 = dev ? dcb.dv() : dcb.hv();
    }
  };
  fill(false, false, db1, dc, dp, dmx);
  cpu::gemm_m(s);
  fill(true, false, db1, dc, dp, dmx);
  cuda::portable::gemm_m(s, nullptr);
  fill(true, true, db1_2, dc2, dp2, dmx2);
  cuda::portable::gemm_m(s, nullptr);
  sync();

  const HostTensor gdb1 = db1.download(), gdp = dp.download();
  EXPECT_LE(rel_error(gdb1.view, db1.hv()), 1e-2) << "db1";
  EXPECT_LE(rel_error(gdp.view, dp.hv()), 1e-2) << "dprobs";
  EXPECT_TRUE(bytes_equal(gdb1.view, db1_2.download().view)) << "db1 not bit-identical across runs/layouts";
  EXPECT_TRUE(bytes_equal(gdp.view, dp2.download().view)) << "dprobs not bit-identical across runs/layouts";
  if (c.mx_out) {
    expect_mx_close(dmx, c.scale_layout, in.offsets_h, "dC");
    EXPECT_TRUE(bytes_equal(dmx.row_data.download().view, dmx2.row_data.download().view));
    EXPECT_TRUE(bytes_equal(dmx.col_scales.download().view, dmx2.col_scales.download().view));
  } else {
    const HostTensor gdc = dc.download();
    EXPECT_LE(rel_error(gdc.view, dc.hv()), 1e-2) << "dC";
    EXPECT_TRUE(bytes_equal(gdc.view, dc2.download().view));
  }
}
#endif

TEST(PortableGluForward, MatchesCpuBothRecipesActivationsAndLayouts) {
  MXMOE_REQUIRE_GPU();
#if defined(MXMOE_WITH_CUDA)
  for (bool mx : {false, true})
    for (Activation act : {Activation::swiglu, Activation::clamped_swiglu})
      for (GluLayout layout : {GluLayout::halves, GluLayout::interleave32}) {
        SCOPED_TRACE(testing::Message() << "mx=" << mx << " act=" << static_cast<int>(act)
                                        << " layout=" << static_cast<int>(layout));
        expect_glu_forward_ok(GluCase{.h = 512, .f = 96, .mx = mx, .mx_out = mx, .act = act, .layout = layout});
      }
#endif
}

TEST(PortableGluForward, QuantizesInEpilogueWithSwizzledScalesOddDimsAndSkew) {
  MXMOE_REQUIRE_GPU();
#if defined(MXMOE_WITH_CUDA)
  for (GluLayout layout : {GluLayout::halves, GluLayout::interleave32}) {
    expect_glu_forward_ok(GluCase{.sizes = {37, 0, 161}, .h = 2880, .f = 1408, .mx = true, .mx_out = true,
                                  .act = Activation::clamped_swiglu, .layout = layout,
                                  .scale_layout = ScaleLayout::swizzled});
    expect_glu_forward_ok(GluCase{.sizes = {0, 0, 300, 0, 1}, .h = 128, .f = 160, .mx = true, .mx_out = true,
                                  .layout = layout, .scale_layout = ScaleLayout::swizzled});
  }
  expect_glu_forward_ok(GluCase{.sizes = {0, 0}, .mx = true, .mx_out = true});
  expect_glu_forward_ok(GluCase{.sizes = {200}, .h = 64, .f = 32, .mx = false, .mx_out = true, .b_kn = true});
  expect_glu_forward_ok(GluCase{.sizes = {3, 90}, .h = 96, .f = 40, .bias = false});  // BF16: F % 8 only
#endif
}

TEST(PortableGluBackward, MatchesCpuBothRecipesActivationsAndLayouts) {
  MXMOE_REQUIRE_GPU();
#if defined(MXMOE_WITH_CUDA)
  for (bool mx : {false, true})
    for (Activation act : {Activation::swiglu, Activation::clamped_swiglu})
      for (GluLayout layout : {GluLayout::halves, GluLayout::interleave32}) {
        SCOPED_TRACE(testing::Message() << "mx=" << mx << " act=" << static_cast<int>(act)
                                        << " layout=" << static_cast<int>(layout));
        expect_glu_backward_ok(
            GluCase{.h = 256, .f = 96, .mx = mx, .mx_out = mx, .b_kn = true, .act = act, .layout = layout});
      }
#endif
}

TEST(PortableGluBackward, Db1GradOutRulesDprobAddAndOddDims) {
  MXMOE_REQUIRE_GPU();
#if defined(MXMOE_WITH_CUDA)
  const GluCase base{.h = 160, .f = 64, .mx = true, .mx_out = true, .b_kn = true};
  expect_glu_backward_ok(base, BwdOptions{.db1 = DType::f32, .accumulate = true});
  expect_glu_backward_ok(base, BwdOptions{.db1 = DType::bf16, .dprob_add = false});
  expect_glu_backward_ok(GluCase{.sizes = {41, 0, 129}, .h = 1408, .f = 2880 / 2, .mx = true, .mx_out = true,
                                 .b_kn = true, .act = Activation::clamped_swiglu,
                                 .layout = GluLayout::interleave32, .scale_layout = ScaleLayout::swizzled});
  expect_glu_backward_ok(GluCase{.sizes = {0, 0, 0}, .mx = true, .mx_out = true, .b_kn = true});
  expect_glu_backward_ok(GluCase{.sizes = {70, 3}, .h = 96, .f = 40, .b_kn = false});  // BF16, F % 8 only
#endif
}

}  // namespace
}  // namespace mxmoe
