// GPU tests of every device backend's m-grouped GEMM with the fused GLU epilogues (run once per
// backend, test names ending in /<backend>) against the CPU reference (src/cpu/gemm.cpp): the
// fc1_fprop step (C, A = p * act, BF16 or MXFP8 row + column quantized in the epilogue) and the
// fc2_dgrad step (dC, dprob, db1), built by the layer's step constructors (src/api/layer_steps.h)
// and varied beyond the layer where the kernels allow it (B orientation, BF16 input with MXFP8
// output); both recipes, both activations, both GLU layouts, odd dims, empty and skewed groups;
// dense vs per-expert weights and repeated runs bit-identical.
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuGlu*'
#include <gtest/gtest.h>

#include <cstdlib>
#include <utility>
#include <vector>

#include "tests/gpu_support.h"

#if defined(MXMOE_WITH_CUDA)
#include "src/api/layer_steps.h"
#include "tests/gpu/grouped_gemm_gpu_fixture.h"
#endif

namespace mxmoe {
namespace {

#if defined(MXMOE_WITH_CUDA)
using namespace test;
using namespace test::gg;
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

// The layer problem whose step the case is (GEMM K = H).
Problem problem_of(const GluCase& c, int64_t experts) {
  Problem p;
  p.hidden = c.h;
  p.ffn = c.f;
  p.experts = experts;
  p.recipe = c.mx ? Recipe::mxfp8 : Recipe::bf16;
  p.activation = c.act;
  p.glu_layout = c.layout;
  p.fc1_bias = c.bias;
  return p;
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

// A glu step's activation output: bf16, or MXFP8 row-wise and column-wise.
detail::GluOutput glu_output(bool mx, bool dev, ScaleLayout l, const Dual& bf16, const MxOutDual& m) {
  detail::GluOutput o;
  if (mx) {
    o.row = m.row(dev, l);
    o.col = m.col(dev, l);
  } else {
    o.bf16 = dev ? bf16.dv() : bf16.hv();
  }
  return o;
}

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

void expect_glu_forward_ok(detail::Backend& backend, const GluCase& c) {
  const Inputs in(c.sizes);
  const int64_t t = in.t, e = in.experts, f = c.f;
  const Act x(random_bf16({t, c.h}), c.mx, BlockAxis::row, c.scale_layout, in.offsets_h);
  const ExpertWeights w(e, c.b_kn ? c.h : 2 * f, c.b_kn ? 2 * f : c.h, c.mx,
                        c.b_kn ? BlockAxis::col : BlockAxis::row, c.scale_layout);
  const Dual b1 = random_bf16_dual({e, 2 * f}, -0.5f, 0.5f), probs = random_f32_dual({t}, 0.f, 1.f);
  Dual cmat = poisoned(DType::bf16, {t, 2 * f}), cmat2 = poisoned(DType::bf16, {t, 2 * f});
  Dual a_bf16 = poisoned(DType::bf16, {t, f}), a_bf16_2 = poisoned(DType::bf16, {t, f});
  MxOutDual amx(t, f, e), amx2(t, f, e);

  const Problem problem = problem_of(c, e);
  auto step = [&](bool dev, bool per_expert, Dual& cm, Dual& ab, MxOutDual& am) {
    detail::LayerStep st = detail::fc1_fprop(problem, {.x = dev ? x.dev() : x.host(),
                                                       .w1 = dev ? w.dev(per_expert) : w.host(),
                                                       .offsets = {dev ? in.offsets.dv() : in.offsets.hv()},
                                                       .b1 = dev ? b1.dv() : b1.hv(),
                                                       .probs = dev ? probs.dv() : probs.hv(),
                                                       .c = dev ? cm.dv() : cm.hv(),
                                                       .a = glu_output(c.mx_out, dev, c.scale_layout, ab, am)});
    std::get<MGemmStep>(st.args).gemm.b_kn = c.b_kn;  // the layer's W1 is [N, K]; [K, N] works too
    return st;
  };
  cpu::gemm_m(step(false, false, cmat, a_bf16, amx).gemm_m());
  const detail::LayerStep dense = step(true, false, cmat, a_bf16, amx);
  MXMOE_SKIP_UNLESS_SERVED(backend, probe_step(backend, dense));
  Context ctx;
  run_on(ctx, backend, dense);
  const detail::LayerStep per_expert = step(true, true, cmat2, a_bf16_2, amx2);
  const detail::Probe per_expert_served = probe_step(backend, per_expert);
  if (!per_expert_served.available) {
    // A second dense run instead: the checks below then compare two runs (still bit-identical).
    note_refused(backend, "per-expert weight pointers", per_expert_served);
    run_on(ctx, backend, step(true, false, cmat2, a_bf16_2, amx2));
  } else {
    run_on(ctx, backend, per_expert);
  }
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
  bool with_db1 = true;  // false: a problem without FC1 bias, no db1 asked for (cuda_sm90 pingpong)
};

void expect_glu_backward_ok(detail::Backend& backend, const GluCase& c, const BwdOptions& o = {}) {
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

  Problem problem = problem_of(c, e);
  problem.fc1_bias = o.with_db1;  // db1 is checked wherever it is asked for
  auto step = [&](bool dev, bool per_expert, Dual& d1, Dual& dcb, Dual& dpr, MxOutDual& dm) {
    detail::LayerStep st = detail::fc2_dgrad(
        problem, {.dy = dev ? dy.dev() : dy.host(),
                  .w2 = dev ? w.dev(per_expert) : w.host(),
                  .offsets = {dev ? in.offsets.dv() : in.offsets.hv()},
                  .probs = dev ? probs.dv() : probs.hv(),
                  .c = dev ? cmat.dv() : cmat.hv(),
                  .dprobs = dev ? dpr.dv() : dpr.hv(),
                  .dprob_add = o.dprob_add ? (dev ? add.dv() : add.hv()) : TensorView{},
                  .db1 = {o.with_db1 ? (dev ? d1.dv() : d1.hv()) : TensorView{}, o.with_db1 && o.accumulate},
                  .dc = glu_output(c.mx_out, dev, c.scale_layout, dcb, dm)});
    std::get<MGemmStep>(st.args).gemm.b_kn = c.b_kn;  // the layer's W2 is [K, N]; [N, K] works too
    return st;
  };
  cpu::gemm_m(step(false, false, db1, dc, dp, dmx).gemm_m());
  const detail::LayerStep dense = step(true, false, db1, dc, dp, dmx);
  MXMOE_SKIP_UNLESS_SERVED(backend, probe_step(backend, dense));
  Context ctx;
  run_on(ctx, backend, dense);
  const detail::LayerStep per_expert = step(true, true, db1_2, dc2, dp2, dmx2);
  const detail::Probe per_expert_served = probe_step(backend, per_expert);
  if (!per_expert_served.available) {
    // A second dense run instead: the checks below then compare two runs (still bit-identical).
    note_refused(backend, "per-expert weight pointers", per_expert_served);
    run_on(ctx, backend, step(true, false, db1_2, dc2, dp2, dmx2));
  } else {
    run_on(ctx, backend, per_expert);
  }
  sync();

  const HostTensor gdb1 = db1.download(), gdp = dp.download();
  if (o.with_db1) {
    EXPECT_LE(rel_error(gdb1.view, db1.hv()), 1e-2) << "db1";
    EXPECT_TRUE(bytes_equal(gdb1.view, db1_2.download().view)) << "db1 not bit-identical across runs/layouts";
  } else {
    EXPECT_TRUE(bytes_equal(gdb1.view, db1_init.view)) << "db1 was not asked for, yet written";
  }
  EXPECT_LE(rel_error(gdp.view, dp.hv()), 1e-2) << "dprobs";
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

// The MXFP8 bytes the CPU quantizer makes of a bf16 [T, cols] output (column blocks restarting at
// each group), scale padding 0.
struct HostMx {
  HostTensor rd, rs, cd, cs;
};
HostMx cpu_quantized(const HostTensor& bf16, const HostTensor& offsets, int64_t experts, ScaleLayout l) {
  const int64_t t = bf16.view.shape[0], cols = bf16.view.shape[1];
  HostMx m{HostTensor(DType::e4m3, {t, cols}), HostTensor(DType::e8m0, {rowwise_scale_bytes(t, cols)}),
           HostTensor(DType::e4m3, {t, cols}), HostTensor(DType::e8m0, {colwise_scale_bytes(t, cols, experts)})};
  QuantizeArgs q;
  q.src = bf16.view;
  q.groups.offsets = offsets.view;
  q.rowwise = {m.rd.view, m.rs.view, BlockAxis::row, l};
  q.colwise = {m.cd.view, m.cs.view, BlockAxis::col, l};
  cpu::quantize(q);
  return m;
}

void expect_mx_bytes(const MxOutDual& got, const HostMx& want, const char* what) {
  EXPECT_TRUE(bytes_equal(got.row_data.download().view, want.rd.view)) << what << ": row-wise data";
  EXPECT_TRUE(bytes_equal(got.row_scales.download().view, want.rs.view)) << what << ": row-wise scales";
  EXPECT_TRUE(bytes_equal(got.col_data.download().view, want.cd.view)) << what << ": column-wise data";
  EXPECT_TRUE(bytes_equal(got.col_scales.download().view, want.cs.view)) << what << ": column-wise scales";
}

// docs/numerics.md "Quantized value": a GLU step's MXFP8 output (A or dC) is the quantization of the
// bf16 values the same step writes. Two device runs of one step: bf16 and MXFP8 outputs together
// (their MXFP8 bytes must equal the CPU quantizer applied to that bf16 output), and MXFP8 only
// (cuda_sm90: the fused quantizing epilogue, nothing bf16 written): bit-identical.
template <class MakeStep>
void expect_quantized_output_exact(detail::Backend& backend, const Inputs& in, int64_t cols, ScaleLayout l,
                                   MakeStep make_step) {
  const int64_t t = in.t, e = in.experts;
  Dual both_bf16 = poisoned(DType::bf16, {t, cols});
  MxOutDual both(t, cols, e), fused(t, cols, e);
  const detail::LayerStep first = make_step(glu_output(true, true, l, both_bf16, both));
  MXMOE_SKIP_UNLESS_SERVED(backend, probe_step(backend, first));
  Context ctx;
  detail::LayerStep with_bf16 = first;
  std::get<MGemmStep>(with_bf16.args).out_bf16 = both_bf16.dv();
  run_on(ctx, backend, with_bf16);
  run_on(ctx, backend, make_step(glu_output(true, true, l, both_bf16, fused)));
  sync();
  const HostTensor bf16 = both_bf16.download();
  const HostMx want = cpu_quantized(bf16, in.offsets_h, e, l);
  expect_mx_bytes(both, want, "bf16 and MXFP8 outputs together");
  expect_mx_bytes(fused, want, "MXFP8 output only");
}

void expect_glu_forward_quantized_exact(detail::Backend& backend, const GluCase& c) {
  const Inputs in(c.sizes);
  const int64_t t = in.t, e = in.experts, f = c.f;
  const Act x(random_bf16({t, c.h}), true, BlockAxis::row, c.scale_layout, in.offsets_h);
  const ExpertWeights w(e, 2 * f, c.h, true, BlockAxis::row, c.scale_layout);
  const Dual b1 = random_bf16_dual({e, 2 * f}, -0.5f, 0.5f), probs = random_f32_dual({t}, 0.f, 1.f);
  Dual cmat = poisoned(DType::bf16, {t, 2 * f});
  const Problem problem = problem_of(c, e);
  expect_quantized_output_exact(backend, in, f, c.scale_layout, [&](const detail::GluOutput& out) {
    return detail::fc1_fprop(problem, {.x = x.dev(), .w1 = w.dev(false), .offsets = {in.offsets.dv()},
                                       .b1 = b1.dv(), .probs = probs.dv(), .c = cmat.dv(), .a = out});
  });
}

void expect_glu_backward_quantized_exact(detail::Backend& backend, const GluCase& c) {
  const Inputs in(c.sizes);
  const int64_t t = in.t, e = in.experts, f = c.f;
  const Act dy(random_bf16({t, c.h}), true, BlockAxis::row, c.scale_layout, in.offsets_h);
  const ExpertWeights w(e, c.h, f, true, BlockAxis::col, c.scale_layout);
  const Dual cmat = random_bf16_dual({t, 2 * f}, -10.f, 10.f), probs = random_f32_dual({t}, 0.f, 1.f);
  Dual db1 = poisoned(DType::f32, {e, 2 * f}), dp = poisoned(DType::f32, {t});
  Problem problem = problem_of(c, e);
  problem.fc1_bias = true;
  expect_quantized_output_exact(backend, in, 2 * f, c.scale_layout, [&](const detail::GluOutput& out) {
    return detail::fc2_dgrad(problem, {.dy = dy.dev(), .w2 = w.dev(false), .offsets = {in.offsets.dv()},
                                       .probs = probs.dv(), .c = cmat.dv(), .dprobs = dp.dv(), .db1 = {db1.dv(), false},
                                       .dc = out});
  });
}
#endif

class GpuGluForward : public test::GpuBackendTest {};
class GpuGluBackward : public test::GpuBackendTest {};
MXMOE_GPU_BACKEND_SUITE(GpuGluForward);
MXMOE_GPU_BACKEND_SUITE(GpuGluBackward);

TEST_P(GpuGluForward, MatchesCpuBothRecipesActivationsAndLayouts) {
#if defined(MXMOE_WITH_CUDA)
  for (bool mx : {false, true})
    for (Activation act : {Activation::swiglu, Activation::clamped_swiglu})
      for (GluLayout layout : {GluLayout::halves, GluLayout::interleave32}) {
        SCOPED_TRACE(testing::Message() << "mx=" << mx << " act=" << static_cast<int>(act)
                                        << " layout=" << static_cast<int>(layout));
        expect_glu_forward_ok(backend(),
                              GluCase{.h = 512, .f = 96, .mx = mx, .mx_out = mx, .act = act, .layout = layout});
      }
#endif
}

TEST_P(GpuGluForward, QuantizesInEpilogueWithSwizzledScalesOddDimsAndSkew) {
#if defined(MXMOE_WITH_CUDA)
  for (GluLayout layout : {GluLayout::halves, GluLayout::interleave32}) {
    expect_glu_forward_ok(backend(), GluCase{.sizes = {37, 0, 161}, .h = 2880, .f = 1408, .mx = true, .mx_out = true,
                                  .act = Activation::clamped_swiglu, .layout = layout,
                                  .scale_layout = ScaleLayout::swizzled});
    expect_glu_forward_ok(backend(), GluCase{.sizes = {0, 0, 300, 0, 1}, .h = 128, .f = 160, .mx = true, .mx_out = true,
                                  .layout = layout, .scale_layout = ScaleLayout::swizzled});
  }
  expect_glu_forward_ok(backend(), GluCase{.sizes = {0, 0}, .mx = true, .mx_out = true});
  expect_glu_forward_ok(backend(),
                        GluCase{.sizes = {200}, .h = 64, .f = 32, .mx = false, .mx_out = true, .b_kn = true});
  expect_glu_forward_ok(backend(), GluCase{.sizes = {3, 90}, .h = 96, .f = 40, .bias = false});  // BF16: F % 8 only
  // BF16, several 64-feature C passes of cuda_sm90's tiles and partial last tiles (F = 1440, 1400).
  expect_glu_forward_ok(backend(), GluCase{.sizes = {41, 0, 129, 300}, .h = 320, .f = 1440,
                                           .act = Activation::clamped_swiglu, .layout = GluLayout::interleave32});
  expect_glu_forward_ok(backend(), GluCase{.sizes = {200, 77, 0, 5}, .h = 192, .f = 1400});
#endif
}

// Shapes with rows past 32-row blocks inside 128-row tiles, groups ending inside a tile, several
// tiles along F, a last tile past F, empty groups; both GLU layouts and scale layouts.
TEST_P(GpuGluForward, QuantizedOutputIsTheQuantizationOfItsBf16) {
#if defined(MXMOE_WITH_CUDA)
  for (GluLayout layout : {GluLayout::halves, GluLayout::interleave32})
    for (ScaleLayout sl : {ScaleLayout::compact, ScaleLayout::swizzled}) {
      SCOPED_TRACE(testing::Message() << "layout=" << static_cast<int>(layout) << " scales=" << static_cast<int>(sl));
      expect_glu_forward_quantized_exact(backend(), GluCase{.sizes = {37, 0, 161, 300, 1}, .h = 192, .f = 416,
                                                            .act = Activation::clamped_swiglu, .layout = layout,
                                                            .scale_layout = sl});
      expect_glu_forward_quantized_exact(backend(), GluCase{.sizes = {128, 64, 95}, .h = 64, .f = 96, .layout = layout,
                                                            .scale_layout = sl});
    }
  expect_glu_forward_quantized_exact(backend(), GluCase{.sizes = {0, 0}, .h = 64, .f = 64});
#endif
}

TEST_P(GpuGluBackward, QuantizedOutputIsTheQuantizationOfItsBf16) {
#if defined(MXMOE_WITH_CUDA)
  for (GluLayout layout : {GluLayout::halves, GluLayout::interleave32})
    for (ScaleLayout sl : {ScaleLayout::compact, ScaleLayout::swizzled}) {
      SCOPED_TRACE(testing::Message() << "layout=" << static_cast<int>(layout) << " scales=" << static_cast<int>(sl));
      expect_glu_backward_quantized_exact(backend(), GluCase{.sizes = {37, 0, 161, 300, 1}, .h = 192, .f = 416,
                                                             .act = Activation::clamped_swiglu, .layout = layout,
                                                             .scale_layout = sl});
      expect_glu_backward_quantized_exact(backend(), GluCase{.sizes = {128, 64, 95}, .h = 64, .f = 320,
                                                             .layout = layout, .scale_layout = sl});
    }
  // F = 272, halves: a row-wise block of dC holds a's last 16 columns and b's first 16.
  for (ScaleLayout sl : {ScaleLayout::compact, ScaleLayout::swizzled})
    expect_glu_backward_quantized_exact(backend(),
                                        GluCase{.sizes = {41, 0, 97}, .h = 256, .f = 272, .scale_layout = sl});
  expect_glu_backward_quantized_exact(backend(), GluCase{.sizes = {0, 0}, .h = 64, .f = 64});
#endif
}

TEST_P(GpuGluBackward, MatchesCpuBothRecipesActivationsAndLayouts) {
#if defined(MXMOE_WITH_CUDA)
  for (bool mx : {false, true})
    for (Activation act : {Activation::swiglu, Activation::clamped_swiglu})
      for (GluLayout layout : {GluLayout::halves, GluLayout::interleave32}) {
        SCOPED_TRACE(testing::Message() << "mx=" << mx << " act=" << static_cast<int>(act)
                                        << " layout=" << static_cast<int>(layout));
        expect_glu_backward_ok(
            backend(), GluCase{.h = 256, .f = 96, .mx = mx, .mx_out = mx, .b_kn = true, .act = act, .layout = layout});
      }
#endif
}

// cuda_sm90's MXFP8 GLU-backward configurations (src/cuda/sm90/gemm_m.cu), each run by name besides
// the plan's own choice: A converted in registers (mxfp8_regs, the choice below K = 4096) and A
// dequantized first through the BF16 kernel and the quantizer (mxfp8_dequant, the choice from
// K = 4096), 128- and 256-wide tiles. Several n-tiles and a partial last one, groups ending inside
// tiles, both GLU and scale layouts, MXFP8 and bf16 dC. Other backends run their plan.
TEST_P(GpuGluBackward, Mxfp8TileVariantsMatchCpu) {
#if defined(MXMOE_WITH_CUDA)
  for (const std::string& config : configs_of(backend(), {"mxfp8_regs_n128", "mxfp8_regs_n256", "mxfp8_dequant_n128",
                                                        "mxfp8_dequant_n256"})) {
    SCOPED_TRACE("configuration " + (config.empty() ? std::string("(the plan's)") : config));
    const ScopedStepConfig scoped(config);
    expect_glu_backward_ok(backend(),
                           GluCase{.sizes = {41, 0, 129, 300}, .h = 320, .f = 1440, .mx = true, .mx_out = true,
                                   .b_kn = true, .act = Activation::clamped_swiglu, .layout = GluLayout::interleave32},
                           BwdOptions{.db1 = DType::f32, .accumulate = true});
    expect_glu_backward_ok(backend(), GluCase{.sizes = {37, 0, 161, 300, 1}, .h = 192, .f = 416, .mx = true,
                                              .mx_out = false, .b_kn = true});
    expect_glu_backward_ok(backend(), GluCase{.sizes = {41, 0, 129}, .h = 1408, .f = 2880 / 2, .mx = true,
                                              .mx_out = true, .b_kn = true, .act = Activation::clamped_swiglu,
                                              .layout = GluLayout::interleave32, .scale_layout = ScaleLayout::swizzled},
                           BwdOptions{.db1 = DType::bf16, .dprob_add = false});
    expect_glu_backward_ok(backend(), GluCase{.sizes = {41, 0, 97}, .h = 4160, .f = 288, .mx = true, .mx_out = true,
                                              .b_kn = true, .scale_layout = ScaleLayout::swizzled},
                           BwdOptions{.db1 = DType::f32});
  }
#endif
}

TEST_P(GpuGluBackward, Db1GradOutRulesDprobAddAndOddDims) {
#if defined(MXMOE_WITH_CUDA)
  const GluCase base{.h = 160, .f = 64, .mx = true, .mx_out = true, .b_kn = true};
  expect_glu_backward_ok(backend(), base, BwdOptions{.db1 = DType::f32, .accumulate = true});
  expect_glu_backward_ok(backend(), base, BwdOptions{.db1 = DType::bf16, .dprob_add = false});
  expect_glu_backward_ok(backend(), GluCase{.sizes = {41, 0, 129}, .h = 1408, .f = 2880 / 2, .mx = true, .mx_out = true,
                                 .b_kn = true, .act = Activation::clamped_swiglu,
                                 .layout = GluLayout::interleave32, .scale_layout = ScaleLayout::swizzled});
  expect_glu_backward_ok(backend(), GluCase{.sizes = {0, 0, 0}, .mx = true, .mx_out = true, .b_kn = true});
  expect_glu_backward_ok(backend(), GluCase{.sizes = {70, 3}, .h = 96, .f = 40, .b_kn = false});  // BF16, F % 8 only
  // BF16 with the layer's W2 orientation and F = 1440: several 128-feature passes of cuda_sm90's
  // 256-wide tiles and a partial last one (1440 = 5 x 256 + 160), groups ending inside tiles.
  expect_glu_backward_ok(backend(),
                         GluCase{.sizes = {41, 0, 129, 300}, .h = 320, .f = 1440, .b_kn = true,
                                 .act = Activation::clamped_swiglu, .layout = GluLayout::interleave32},
                         BwdOptions{.db1 = DType::f32, .accumulate = true});
  expect_glu_backward_ok(backend(), GluCase{.sizes = {200, 77, 0, 5}, .h = 192, .f = 1400, .b_kn = true},
                         BwdOptions{.db1 = DType::bf16, .dprob_add = false});
#endif
}

}  // namespace
}  // namespace mxmoe
