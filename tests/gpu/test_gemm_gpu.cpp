// GPU tests of every device backend's grouped GEMM steps (run once per backend, test names ending
// in /<backend>): the m-grouped GEMM's store epilogue, the k-grouped GEMM and the FC2 bias
// gradients against the CPU reference (src/cpu/gemm.cpp) on fresh random inputs with NaN-poisoned
// outputs; dense vs per-expert weights and repeated runs must be bit-identical. GLU epilogues:
// test_glu_epilogue_gpu.cpp.
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuGemm*:*GpuFc2BiasGrads*'
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "src/common/fp8_block.h"
#include "src/cpu/fp8_block.h"
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

const std::vector<int> kSizes = {0, 1, 31, 33, 129, 0};

Recipe recipe_of(bool mx) { return mx ? Recipe::mxfp8 : Recipe::bf16; }

enum class BiasMode { none, bias, bias_times_probs };

struct StoreCase {
  std::vector<int> sizes = kSizes;
  int64_t k = 96, n = 40;
  bool mx = false, b_kn = false;
  ScaleLayout layout = ScaleLayout::compact;
  BiasMode bias = BiasMode::none;
  DType out = DType::f32;
};

struct StoreResult {
  double error = 0;        // GPU (dense weights) vs CPU reference
  bool pointer_same = false;  // per-expert pointer weights give the same bytes
  bool repeat_same = false;   // a second run gives the same bytes
  detail::Probe dense;        // the backend's answer for the case (dense weights)
  detail::Probe per_expert;   // and for per-expert pointer weights (pointer_same is only checked if served)
};

StoreResult run_store(detail::Backend& backend, const StoreCase& c) {
  const int64_t t = total_of(c.sizes), experts = static_cast<int64_t>(c.sizes.size());
  const HostTensor offsets_h = offsets_from_sizes(c.sizes);
  const Dual offsets(offsets_h);
  const Act a(random_bf16({t, c.k}), c.mx, BlockAxis::row, c.layout, offsets_h);
  const ExpertWeights w(experts, c.b_kn ? c.k : c.n, c.b_kn ? c.n : c.k, c.mx,
                        c.b_kn ? BlockAxis::col : BlockAxis::row, c.layout);
  const Dual bias = random_bf16_dual({experts, c.n}, -0.5f, 0.5f);
  const Dual probs = random_f32_dual({t}, 0.f, 1.f);
  Dual d = poisoned(c.out, {t, c.n});
  Dual d2 = poisoned(c.out, {t, c.n});
  Dual d3 = poisoned(c.out, {t, c.n});

  MGemmStep s;
  s.gemm.b_kn = c.b_kn;
  s.bias_scale_by_probs = c.bias == BiasMode::bias_times_probs;
  // Host step (CPU reference).
  s.gemm.a = a.host();
  s.gemm.offsets.offsets = offsets.hv();
  s.gemm.b = w.host();
  if (c.bias != BiasMode::none) s.gemm.bias = bias.hv();
  s.probs = probs.hv();
  s.gemm.d = d.hv();
  cpu::gemm_m(s);
  // Device steps.
  s.gemm.a = a.dev();
  s.gemm.offsets.offsets = offsets.dv();
  s.gemm.b = w.dev(false);
  if (c.bias != BiasMode::none) s.gemm.bias = bias.dv();
  s.probs = probs.dv();
  const detail::StepQuery q{detail::Step::gemm_m, kGpu0, recipe_of(c.mx), c.n, c.k};
  StoreResult r;
  r.dense = probe_step(backend, q, s);
  if (!r.dense.available) return r;
  Context ctx;
  s.gemm.d = d.dv();
  run_gemm_m(ctx, backend, q, s);
  s.gemm.d = d3.dv();
  run_gemm_m(ctx, backend, q, s);
  s.gemm.b = w.dev(true);
  s.gemm.d = d2.dv();
  r.per_expert = probe_step(backend, q, s);
  if (r.per_expert.available) run_gemm_m(ctx, backend, q, s);
  sync();

  const HostTensor got = d.download(), got2 = d2.download(), got3 = d3.download();
  r.error = rel_error(got.view, d.hv());
  r.pointer_same = bytes_equal(got.view, got2.view);
  r.repeat_same = bytes_equal(got.view, got3.view);
  return r;
}

void expect_store_ok(detail::Backend& backend, const StoreCase& c, double tol) {
  const StoreResult r = run_store(backend, c);
  MXMOE_SKIP_UNLESS_SERVED(backend, r.dense);
  EXPECT_LE(r.error, tol) << "mx=" << c.mx << " b_kn=" << c.b_kn << " k=" << c.k << " n=" << c.n;
  if (r.per_expert.available) {
    EXPECT_TRUE(r.pointer_same) << "per-expert pointer weights differ from dense weights";
  } else {
    note_refused(backend, "per-expert weight pointers", r.per_expert);
  }
  EXPECT_TRUE(r.repeat_same) << "two runs differ";
}
#endif

class GpuGemmM : public test::GpuBackendTest {};
class GpuGemmK : public test::GpuBackendTest {};
class GpuFc2BiasGrads : public test::GpuBackendTest {};
MXMOE_GPU_BACKEND_SUITE(GpuGemmM);
MXMOE_GPU_BACKEND_SUITE(GpuGemmK);
MXMOE_GPU_BACKEND_SUITE(GpuFc2BiasGrads);

TEST_P(GpuGemmM, StoreMatchesCpuForBf16OperandsEveryOrientationAndBias) {
#if defined(MXMOE_WITH_CUDA)
  for (bool b_kn : {false, true})
    for (BiasMode bias : {BiasMode::none, BiasMode::bias, BiasMode::bias_times_probs})
      for (DType out : {DType::f32, DType::bf16})
        expect_store_ok(backend(), StoreCase{.b_kn = b_kn, .bias = bias, .out = out}, out == DType::f32 ? 1e-5 : 1e-2);
#endif
}

TEST_P(GpuGemmM, StoreMatchesCpuForMxfp8OperandsBothScaleLayouts) {
#if defined(MXMOE_WITH_CUDA)
  for (ScaleLayout layout : {ScaleLayout::compact, ScaleLayout::swizzled})
    for (bool b_kn : {false, true})
      expect_store_ok(backend(),
                      StoreCase{.k = 96, .n = 64, .mx = true, .b_kn = b_kn, .layout = layout, .bias = BiasMode::bias},
                      1e-5);
#endif
}

TEST_P(GpuGemmM, StoreHandlesOddModelDimsAndTails) {
#if defined(MXMOE_WITH_CUDA)
  // H = 2880 and F = 1408 are not multiples of the 128-wide tiles; K = 2880 is not a multiple of 64.
  for (bool mx : {false, true})
    for (bool b_kn : {false, true})
      expect_store_ok(backend(), StoreCase{.sizes = {37, 0, 130}, .k = 2880, .n = 1408, .mx = mx, .b_kn = b_kn,
                                .layout = ScaleLayout::swizzled},
                      1e-5);
  expect_store_ok(backend(), StoreCase{.sizes = {5, 70}, .k = 1408, .n = 2880 + 8}, 1e-5);  // BF16: N % 8 only
#endif
}

TEST_P(GpuGemmM, StoreHandlesAllEmptySingleExpertAndSkewedSplits) {
#if defined(MXMOE_WITH_CUDA)
  for (bool mx : {false, true}) {
    expect_store_ok(backend(), StoreCase{.sizes = {0, 0, 0}, .k = 64, .n = 32, .mx = mx}, 1e-5);
    expect_store_ok(backend(), StoreCase{.sizes = {300}, .k = 64, .n = 136, .mx = mx}, 1e-5);
    expect_store_ok(backend(),
                    StoreCase{.sizes = {0, 0, 513, 0, 2, 0, 0, 1}, .k = 160, .n = 96, .mx = mx, .b_kn = true}, 1e-5);
    std::vector<int> many(40, 0);
    many[3] = 7, many[17] = 250, many[39] = 33;
    expect_store_ok(backend(), StoreCase{.sizes = many, .k = 64, .n = 64, .mx = mx}, 1e-5);
  }
#endif
}

#if defined(MXMOE_WITH_CUDA)
// body(pow2) in each of cuda_sm90's fp8_blockwise routes: its own plan (FP8 wgmma; fp32 scales too),
// and the BF16 kernels on the exactly dequantized operands (fp8_dequant: power-of-two scales only).
// Other backends: their plan, power-of-two scales only where they refuse fp32 ones.
template <class F>
void for_each_fp8_route(const detail::Backend& backend, F body) {
  for (const std::string& config : configs_of(backend, {"fp8_dequant"})) {
    SCOPED_TRACE("configuration " + (config.empty() ? std::string("(the plan's)") : config));
    const ScopedStepConfig scoped(config);
    for (bool pow2 : {true, false})
      if (pow2 || config.empty()) body(pow2);
  }
}

// FP8 blockwise (fp32 or power-of-two scales): the store epilogue against the CPU block rule
// (cpu::fp8_gemm_fprop). cuda_sm90 runs it on FP8 wgmma with promotion every 128: the wgmma's partial
// sums differ from the CPU's exact ascending fp32 ones in their order and in the tensor core's own
// accumulation precision (H200, session 9: relative Frobenius error 1.07-1.08e-4 on every case here,
// fp32 and pow2 scales alike; the BF16 path on dequantized operands: below 1e-5), so the check is a
// relative bound of 3e-4 plus an elementwise one; a backend that takes only power-of-two scales skips
// the rest.
// The elementwise bound of an FP8-wgmma result, relative to its sum of |terms| (the magnitude its
// partial sums run through): FP8 wgmma accumulates in about 13-14 mantissa bits (DeepSeek-V3's report,
// "FP8 GEMM accumulation precision"), so a k32 step's sum can be off by up to ~32 x 2^-13 = 2^-8 of
// that magnitude. Random inputs on the H200 missed 1e-3 now and then (session 10: 1.16e-3 in a wgrad
// case, a different output each run); the Frobenius bound of 3e-4 stays the tight check, and a
// stray tile, lost block or swapped scale is off by far more than either.
constexpr double kFp8MmaElementBound = 1.0 / 256;
// The e4m3 bytes with their signs cleared (NaN kept): the block rule on them sums |terms|.
HostTensor abs_e4m3(HostTensor q) {
  for (uint8_t& v : q.bytes)
    if ((v & 0x7f) != 0x7f) v &= 0x7f;
  return q;
}
// Every output within bound(i) of the reference; the first five misses are reported (where(i):
// the index as text).
template <class Bound, class Where>
void expect_within(const float* got, const float* ref, int64_t count, Bound bound, Where where) {
  int64_t bad = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double g = got[i], r = ref[i], b = bound(i);
    if (!(std::fabs(g - r) <= b)) {
      if (bad < 5) ADD_FAILURE() << "d[" << where(i) << "] = " << g << ", reference " << r << ", bound " << b;
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0);
}

// dgrad: B_e given as [K, N] (b_kn, the layer's dgrad orientation; reference cpu::fp8_gemm_dgrad),
// which cuda_sm90 transposes for FP8 wgmma.
struct Fp8Case {
  std::vector<int> sizes;
  int64_t k, n;
  bool pow2;
  bool dgrad = false;
};
void expect_fp8_block_store_ok(detail::Backend& backend, const Fp8Case& c, double tol) {
  SCOPED_TRACE(std::string(c.dgrad ? "fp8_block dgrad" : "fp8_block store") + " k=" + std::to_string(c.k) +
               " n=" + std::to_string(c.n) + (c.pow2 ? " pow2" : ""));
  const int64_t t = total_of(c.sizes), experts = static_cast<int64_t>(c.sizes.size()), k = c.k, n = c.n;
  const int64_t wr = c.dgrad ? k : n, wc = c.dgrad ? n : k;  // W_e [wr, wc] as stored
  const HostTensor offsets_h = offsets_from_sizes(c.sizes);
  const Dual offsets(offsets_h);
  // Inputs of mixed magnitudes per row (scales of many sizes), weights likewise per expert.
  HostTensor x = random_bf16({t, k}, -1.f, 1.f), w = random_bf16({experts, wr, wc}, -1.f, 1.f);
  for (int64_t r = 0; r < t; ++r)
    for (int64_t i = 0; i < k; ++i) {
      uint16_t& v = x.ptr<uint16_t>()[r * k + i];
      v = bf16_from_f32(f32_from_bf16(v) * std::ldexp(1.0f, static_cast<int>((r * 7 + i / 128) % 13) - 6));
    }
  HostTensor qa(DType::e4m3, {t, k}), sa(DType::f32, {fp8_rowwise_scale_count(t, k)});
  HostTensor qw(DType::e4m3, {experts, wr, wc}), sw(DType::f32, {experts * fp8_weight_scale_count(wr, wc)});
  cpu::fp8_quantize_rows(x.ptr<uint16_t>(), t, k, c.pow2, qa.ptr<uint8_t>(), sa.ptr<float>());
  cpu::fp8_quantize_weights(w.ptr<uint16_t>(), experts, wr, wc, c.pow2, qw.ptr<uint8_t>(), sw.ptr<float>());
  // The block rule on (qa, qw) into `out` (D [t, n]).
  auto reference = [&](const HostTensor& a_q, const HostTensor& w_q, HostTensor& out) {
    if (c.dgrad)
      cpu::fp8_gemm_dgrad(a_q.ptr<uint8_t>(), sa.ptr<float>(), t, k, w_q.ptr<uint8_t>(), sw.ptr<float>(), experts, n,
                          offsets_h.ptr<int32_t>(), out.ptr<float>());
    else
      cpu::fp8_gemm_fprop(a_q.ptr<uint8_t>(), sa.ptr<float>(), t, k, w_q.ptr<uint8_t>(), sw.ptr<float>(), experts, n,
                          offsets_h.ptr<int32_t>(), out.ptr<float>());
  };
  HostTensor ref(DType::f32, {t, n});
  reference(qa, qw, ref);
  const Dual dqa(qa), dsa(sa), dqw(qw), dsw(sw);
  Dual d = poisoned(DType::f32, {t, n}), d2 = poisoned(DType::f32, {t, n});
  MGemmStep s;
  s.gemm.a.mx = Mxfp8View{dqa.dv(), dsa.dv(), BlockAxis::row, ScaleLayout::compact, QuantFormat::fp8_block};
  alignas(16) static uint8_t marker[16];  // a T = 0 operand is still an FP8 operand
  if (s.gemm.a.mx.data.data == nullptr) s.gemm.a.mx.data.data = marker;
  s.gemm.b.data.dense = dqw.dv();
  s.gemm.b.data.dtype = DType::e4m3;
  s.gemm.b.scales.dense = dsw.dv();
  s.gemm.b.scales.dtype = DType::f32;
  s.gemm.b.format = QuantFormat::fp8_block;
  s.gemm.b_kn = c.dgrad;
  s.gemm.offsets.offsets = offsets.dv();
  s.gemm.d = d.dv();
  detail::StepQuery q{detail::Step::gemm_m, kGpu0, Recipe::fp8_blockwise, n, k};
  q.pow2_scales = c.pow2;
  MXMOE_SKIP_UNLESS_SERVED(backend, probe_step(backend, q, s));
  Context ctx;
  run_gemm_m(ctx, backend, q, s);
  s.gemm.d = d2.dv();
  run_gemm_m(ctx, backend, q, s);
  sync();
  const HostTensor got = d.download(), got2 = d2.download();
  EXPECT_LE(rel_error(got.view, ref.view), tol);
  EXPECT_TRUE(bytes_equal(got.view, got2.view)) << "two runs differ";
  // Elementwise, against the sum of |terms| (the same block rule on |q|: the magnitude the partial
  // sums run through): within kFp8MmaElementBound of it, so no stray tile, lost block or swapped scale passes,
  // while an output that is a small remainder of large terms may carry the tensor core's rounding
  // (H200, session 9: d = -10.545 vs -10.400 from terms of about 3000).
  HostTensor mag(DType::f32, {t, n});
  reference(abs_e4m3(qa), abs_e4m3(qw), mag);
  expect_within(got.ptr<float>(), ref.ptr<float>(), t * n,
                [&](int64_t i) { return kFp8MmaElementBound * mag.ptr<float>()[i] + 1e-30; },
                [&](int64_t i) { return std::to_string(i / n) + ", " + std::to_string(i % n); });
}
#endif

// fp32 and power-of-two scales on the backend's plan, and on cuda_sm90's dequantized route.
TEST_P(GpuGemmM, Fp8BlockStoreMatchesTheBlockRuleForFp32AndPow2Scales) {
#if defined(MXMOE_WITH_CUDA)
  for_each_fp8_route(backend(), [&](bool pow2) {
    expect_fp8_block_store_ok(backend(), {{0, 1, 127, 129, 300, 0}, 256, 128, pow2}, 3e-4);
    expect_fp8_block_store_ok(backend(), {{37, 0, 130}, 2880, 1408 + 64, pow2}, 3e-4);  // K, N tails of 128
    expect_fp8_block_store_ok(backend(), {{0, 0, 0}, 128, 64, pow2}, 3e-4);
    expect_fp8_block_store_ok(backend(), {{513, 2, 1}, 400, 200, pow2}, 3e-4);
    expect_fp8_block_store_ok(backend(), {{37, 5, 140}, 256, 100, pow2}, 3e-4);  // 200-byte rows (not 16-byte aligned)
  });
#endif
}

// The dgrad orientation: cuda_sm90's FP8-wgmma path on transposed weights (fp32 scales too), and with
// power-of-two scales on every backend that takes them (cuda_sm90 in its fp8_dequant configuration:
// the BF16 kernels on dequantized operands).
TEST_P(GpuGemmM, Fp8BlockDgradMatchesTheBlockRule) {
#if defined(MXMOE_WITH_CUDA)
  for_each_fp8_route(backend(), [&](bool pow2) {
    expect_fp8_block_store_ok(backend(), {{0, 1, 127, 129, 300, 0}, 256, 128, pow2, true}, 3e-4);
    expect_fp8_block_store_ok(backend(), {{37, 0, 130}, 1408 + 64, 2880, pow2, true}, 3e-4);
    expect_fp8_block_store_ok(backend(), {{513, 2, 1}, 400, 208, pow2, true}, 3e-4);
  });
#endif
}

#if defined(MXMOE_WITH_CUDA)
struct KCase {
  std::vector<int> sizes = kSizes;
  int64_t m = 96, n = 72;
  bool mx = false;
  ScaleLayout layout = ScaleLayout::compact;
  DType out = DType::f32;
  bool accumulate = false;
};

void expect_gemm_k_ok(detail::Backend& backend, const KCase& c) {
  const int64_t t = total_of(c.sizes), experts = static_cast<int64_t>(c.sizes.size());
  const HostTensor offsets_h = offsets_from_sizes(c.sizes);
  const Dual offsets(offsets_h);
  const Act a(random_bf16({t, c.m}), c.mx, BlockAxis::col, c.layout, offsets_h);
  const Act b(random_bf16({t, c.n}), c.mx, BlockAxis::col, c.layout, offsets_h);
  // beta = 1 starts from random values (same on both sides); beta = 0 from NaN poison.
  HostTensor init = c.accumulate ? random_f32({experts, c.m, c.n}) : HostTensor(c.out, {experts, c.m, c.n});
  if (!c.accumulate && !init.bytes.empty()) init.poison(kPoison);
  Dual d(init), d2(init), d3(init);

  KGroupedGemmArgs k;
  k.accumulate = c.accumulate;
  k.a = a.host();
  k.b = b.host();
  k.offsets.offsets = offsets.hv();
  k.d.dense = d.hv();
  k.d.dtype = c.out;
  cpu::gemm_k(k);
  k.a = a.dev();
  k.b = b.dev();
  k.offsets.offsets = offsets.dv();
  k.d.dense = d.dv();
  const detail::StepQuery q{detail::Step::gemm_k, kGpu0, recipe_of(c.mx), c.n, c.m};
  MXMOE_SKIP_UNLESS_SERVED(backend, probe_step(backend, q, k));
  Context ctx;
  run_gemm_k(ctx, backend, q, k);
  k.d.dense = d3.dv();
  run_gemm_k(ctx, backend, q, k);
  // Per-expert output pointers into d2.
  HostTensor ptrs(DType::i64, {experts});
  const int64_t elem = c.out == DType::f32 ? 4 : 2;
  for (int64_t e = 0; e < experts; ++e)
    ptrs.ptr<int64_t>()[e] = reinterpret_cast<int64_t>(static_cast<char*>(d2.d->ptr) + e * c.m * c.n * elem);
  const Dual table(ptrs);
  k.d.dense = TensorView{};
  k.d.pointers = table.dv();
  const detail::Probe per_expert = probe_step(backend, q, k);
  if (per_expert.available) run_gemm_k(ctx, backend, q, k);
  sync();

  const HostTensor got = d.download(), got2 = d2.download(), got3 = d3.download();
  const double tol = c.out == DType::f32 ? 1e-5 : 1e-2;
  EXPECT_LE(rel_error(got.view, d.hv()), tol) << "mx=" << c.mx << " accumulate=" << c.accumulate;
  if (per_expert.available) {
    EXPECT_TRUE(bytes_equal(got.view, got2.view)) << "per-expert output pointers differ from dense output";
  } else {
    note_refused(backend, "per-expert output pointers", per_expert);
  }
  EXPECT_TRUE(bytes_equal(got.view, got3.view)) << "two runs differ";
  if (c.accumulate) {  // empty experts untouched
    for (size_t e = 0; e < c.sizes.size(); ++e)
      if (c.sizes[e] == 0) {
        EXPECT_EQ(0, std::memcmp(got.bytes.data() + e * c.m * c.n * 4, init.bytes.data() + e * c.m * c.n * 4,
                                 static_cast<size_t>(c.m * c.n * 4)))
            << "expert " << e;
      }
  }
}
#endif

#if defined(MXMOE_WITH_CUDA)
// FP8 blockwise wgrad: D_e [M, N] = sum over group e's tokens of A[t, :]^T B[t, :], both operands in
// 128-token blocks restarting at every group, against cpu::fp8_gemm_wgrad; fp32 out with beta 0
// (poisoned) or 1 (random start), bf16 out. Relative bound as for the fprop, elementwise against the
// sum of |terms|.
void expect_fp8_block_wgrad_ok(detail::Backend& backend, const std::vector<int>& sizes, int64_t m, int64_t n, bool pow2,
                               bool accumulate, DType out) {
  SCOPED_TRACE("fp8_block wgrad m=" + std::to_string(m) + " n=" + std::to_string(n) + (pow2 ? " pow2" : "") +
               (accumulate ? " beta=1" : "") + (out == DType::bf16 ? " bf16" : ""));
  const int64_t t = total_of(sizes), experts = static_cast<int64_t>(sizes.size());
  const HostTensor offsets_h = offsets_from_sizes(sizes);
  const Dual offsets(offsets_h);
  HostTensor x = random_bf16({t, m}, -1.f, 1.f), y = random_bf16({t, n}, -1.f, 1.f);
  for (int64_t r = 0; r < t; ++r)  // magnitudes that change along the tokens: block scales of many sizes
    for (int64_t i = 0; i < m; ++i) {
      uint16_t& v = x.ptr<uint16_t>()[r * m + i];
      v = bf16_from_f32(f32_from_bf16(v) * std::ldexp(1.0f, static_cast<int>((r / 64 + i) % 11) - 5));
    }
  const int64_t cap = fp8_token_block_rows_capacity(t, experts);
  HostTensor qa(DType::e4m3, {t, m}), sa(DType::f32, {cap * m}), qb(DType::e4m3, {t, n}), sb(DType::f32, {cap * n});
  cpu::fp8_quantize_token_blocks(x.ptr<uint16_t>(), t, m, offsets_h.ptr<int32_t>(), experts, pow2, qa.ptr<uint8_t>(),
                                 sa.ptr<float>(), cap);
  cpu::fp8_quantize_token_blocks(y.ptr<uint16_t>(), t, n, offsets_h.ptr<int32_t>(), experts, pow2, qb.ptr<uint8_t>(),
                                 sb.ptr<float>(), cap);
  auto reference = [&](const HostTensor& a_q, const HostTensor& b_q, HostTensor& d) {
    cpu::fp8_gemm_wgrad(a_q.ptr<uint8_t>(), sa.ptr<float>(), m, b_q.ptr<uint8_t>(), sb.ptr<float>(), n, t,
                        offsets_h.ptr<int32_t>(), experts, d.ptr<float>());
  };
  HostTensor ref(DType::f32, {experts, m, n}), mag(DType::f32, {experts, m, n});
  reference(qa, qb, ref);
  reference(abs_e4m3(qa), abs_e4m3(qb), mag);
  HostTensor init = accumulate ? random_f32({experts, m, n}) : HostTensor(out, {experts, m, n});
  if (!accumulate && !init.bytes.empty()) init.poison(kPoison);
  if (accumulate)
    for (int64_t i = 0; i < experts * m * n; ++i) ref.ptr<float>()[i] += init.ptr<float>()[i];
  const Dual dqa(qa), dsa(sa), dqb(qb), dsb(sb);
  Dual d(init), d2(init);
  KGroupedGemmArgs k;
  k.accumulate = accumulate;
  alignas(16) static uint8_t marker[16];  // T = 0 operands are still FP8 operands
  k.a.mx = Mxfp8View{dqa.dv(), dsa.dv(), BlockAxis::col, ScaleLayout::compact, QuantFormat::fp8_block};
  k.b.mx = Mxfp8View{dqb.dv(), dsb.dv(), BlockAxis::col, ScaleLayout::compact, QuantFormat::fp8_block};
  if (k.a.mx.data.data == nullptr) k.a.mx.data.data = marker;
  if (k.b.mx.data.data == nullptr) k.b.mx.data.data = marker;
  k.offsets.offsets = offsets.dv();
  k.d.dense = d.dv();
  k.d.dtype = out;
  detail::StepQuery q{detail::Step::gemm_k, kGpu0, Recipe::fp8_blockwise, n, m};
  q.pow2_scales = pow2;
  MXMOE_SKIP_UNLESS_SERVED(backend, probe_step(backend, q, k));
  Context ctx;
  run_gemm_k(ctx, backend, q, k);
  k.d.dense = d2.dv();
  run_gemm_k(ctx, backend, q, k);
  sync();
  const HostTensor got = d.download(), got2 = d2.download();
  HostTensor got32(DType::f32, {experts, m, n});
  for (int64_t i = 0; i < experts * m * n; ++i)
    got32.ptr<float>()[i] = out == DType::f32 ? got.ptr<float>()[i] : f32_from_bf16(got.ptr<uint16_t>()[i]);
  EXPECT_LE(rel_error(got32.view, ref.view), out == DType::f32 ? 3e-4 : 1e-2);
  EXPECT_TRUE(bytes_equal(got.view, got2.view)) << "two runs differ";
  const double rel = out == DType::f32 ? kFp8MmaElementBound : 1e-2;  // bf16 output: its rounding, relative to |D|
  expect_within(got32.ptr<float>(), ref.ptr<float>(), experts * m * n,
                [&](int64_t i) {
                  return rel * (mag.ptr<float>()[i] + (accumulate ? std::fabs(init.ptr<float>()[i]) : 0.0)) +
                         (out == DType::bf16 ? std::fabs(ref.ptr<float>()[i]) * 1e-2 : 0.0) + 1e-30;
                },
                [&](int64_t i) {
                  return std::to_string(i / (m * n)) + ", " + std::to_string((i / n) % m) + ", " + std::to_string(i % n);
                });
}
#endif

// cuda_sm90's FP8-wgmma kernel on transposed whole-block operands (fp32 scales too), and with
// power-of-two scales on every backend that takes them (cuda_sm90 in its fp8_dequant configuration:
// the BF16 kernel on dequantized operands).
TEST_P(GpuGemmK, Fp8BlockMatchesTheBlockRule) {
#if defined(MXMOE_WITH_CUDA)
  for_each_fp8_route(backend(), [&](bool pow2) {
    expect_fp8_block_wgrad_ok(backend(), {0, 1, 127, 129, 300, 0}, 128, 256, pow2, false, DType::f32);
    expect_fp8_block_wgrad_ok(backend(), {37, 0, 130, 5}, 200, 136, pow2, true, DType::f32);
    expect_fp8_block_wgrad_ok(backend(), {256, 3}, 64, 72, pow2, false, DType::bf16);
    // 5, 1, 4 and 3 k-blocks per group (several k-blocks per tile, odd and even counts).
    expect_fp8_block_wgrad_ok(backend(), {640, 3, 512, 384}, 136, 128, pow2, false, DType::f32);
    expect_fp8_block_wgrad_ok(backend(), {0, 0, 0}, 64, 64, pow2, false, DType::f32);
  });
#endif
}

TEST_P(GpuGemmK, MatchesCpuBothRecipesLayoutsAndBeta) {
#if defined(MXMOE_WITH_CUDA)
  for (bool mx : {false, true})
    for (ScaleLayout layout : {ScaleLayout::compact, ScaleLayout::swizzled})
      for (bool acc : {false, true})
        expect_gemm_k_ok(backend(), KCase{.m = 96, .n = 160, .mx = mx, .layout = layout, .accumulate = acc});
  for (bool mx : {false, true}) expect_gemm_k_ok(backend(), KCase{.m = 64, .n = 96, .mx = mx, .out = DType::bf16});
#endif
}

TEST_P(GpuGemmK, HandlesOddModelDimsEmptyAndSkewedGroups) {
#if defined(MXMOE_WITH_CUDA)
  for (bool mx : {false, true}) {
    expect_gemm_k_ok(backend(),
                     KCase{.sizes = {45, 0, 100}, .m = 1408, .n = 2880, .mx = mx, .layout = ScaleLayout::swizzled});
    expect_gemm_k_ok(backend(), KCase{.sizes = {0, 0}, .m = 64, .n = 32, .mx = mx});
    expect_gemm_k_ok(backend(), KCase{.sizes = {0, 0}, .m = 64, .n = 32, .mx = mx, .accumulate = true});
    expect_gemm_k_ok(backend(), KCase{.sizes = {0, 777, 0, 1}, .m = 32, .n = 160, .mx = mx, .accumulate = true});
  }
  expect_gemm_k_ok(backend(), KCase{.sizes = {9, 70}, .m = 136, .n = 8});  // BF16: multiples of 8 only
#endif
}

TEST_P(GpuFc2BiasGrads, MatchCpuWithAndWithoutProbScaling) {
#if defined(MXMOE_WITH_CUDA)
  constexpr int64_t h = 2880;
  const detail::StepQuery q{detail::Step::fc2_bias_grads, kGpu0, Recipe::bf16, h, 0};
  MXMOE_SKIP_UNLESS_SERVED(backend(), backend().probe(q));
  for (bool scale : {false, true})
    for (DType out : {DType::f32, DType::bf16})
      for (bool acc : {false, true}) {
        if (out == DType::bf16 && acc) continue;
        const std::vector<int> sizes = {0, 1, 31, 300, 0, 129};
        const int64_t t = total_of(sizes), experts = static_cast<int64_t>(sizes.size());
        const HostTensor offsets_h = offsets_from_sizes(sizes);
        const Dual offsets(offsets_h), dy = random_bf16_dual({t, h}), probs = random_f32_dual({t}, 0.f, 1.f);
        const Dual b2 = random_bf16_dual({experts, h});
        HostTensor init = acc ? random_f32({experts, h}) : HostTensor(out, {experts, h});
        if (!acc) init.poison(kPoison);
        Dual db2(init), db2_again(init);
        Dual dprob = poisoned(DType::f32, {t}), dprob_again = poisoned(DType::f32, {t});

        detail::Fc2BiasGradStep s;
        s.scale_by_probs = scale;
        s.db2.accumulate = acc;
        s.dy = dy.hv(), s.offsets.offsets = offsets.hv(), s.probs = probs.hv(), s.b2 = b2.hv();
        s.db2.dst = db2.hv(), s.dprob_add = dprob.hv();
        cpu::fc2_bias_grads(s);
        s.dy = dy.dv(), s.offsets.offsets = offsets.dv(), s.probs = probs.dv(), s.b2 = b2.dv();
        s.db2.dst = db2.dv(), s.dprob_add = dprob.dv();
        Context ctx;
        backend().fc2_bias_grads(ctx, s);
        s.db2.dst = db2_again.dv(), s.dprob_add = dprob_again.dv();
        if (!acc) backend().fc2_bias_grads(ctx, s);
        sync();
        const HostTensor got = db2.download();
        EXPECT_LE(rel_error(got.view, db2.hv()), out == DType::f32 ? 1e-5 : 1e-2) << "scale=" << scale;
        if (!acc) {
          EXPECT_TRUE(bytes_equal(got.view, db2_again.download().view)) << "two runs differ";
        }
        if (scale) {
          const HostTensor gp = dprob.download();
          EXPECT_LE(rel_error(gp.view, dprob.hv()), 1e-5);
          if (!acc) {
            EXPECT_TRUE(bytes_equal(gp.view, dprob_again.download().view));
          }
        }
      }
#endif
}

}  // namespace
}  // namespace mxmoe
