// The CPU reference FP8-blockwise quantizer (src/cpu/fp8_block.cpp) against an independent
// statement written here (docs/numerics.md "FP8 blockwise"): block walks of the test's own,
// std::isnan for the amax, std::frexp / std::ldexp for power-of-two scales, every output poisoned
// first and checked byte for byte; the round trip against the E4M3 error bound; NaN and Inf; and
// every argument error, which names the argument and writes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "mxmoe/numerics.h"
#include "src/common/fp8_block.h"
#include "src/cpu/fp8_block.h"

namespace mxmoe {
namespace {

// ---------------- independent statement ----------------

// s = 448 / amax (fp32 division); 1 for amax 0 or Inf; FLT_MAX when the quotient overflows; pow2:
// the largest power of two <= s.
float ref_scale(float amax, bool pow2) {
  if (amax == 0.0f || std::isinf(amax)) return 1.0f;
  float s = 448.0f / amax;
  if (std::isinf(s)) s = FLT_MAX;
  if (pow2) {
    int e = 0;
    std::frexp(s, &e);  // s = m * 2^e, m in [0.5, 1)
    s = std::ldexp(1.0f, e - 1);
  }
  return s;
}
float ref_amax(const std::vector<float>& v) {
  float a = 0.0f;
  for (float x : v)
    if (!std::isnan(x)) a = std::max(a, std::fabs(x));
  return a;
}

std::vector<uint16_t> random_bf16(size_t n, uint64_t seed, float spread = 3.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::uniform_real_distribution<float> ex(-spread, spread);
  std::vector<uint16_t> v(n);
  // Magnitudes over several octaves, so that blocks get different scales.
  for (auto& x : v) x = bf16_from_f32(d(g) * std::exp2(ex(g)));
  return v;
}
float bf(const std::vector<uint16_t>& v, int64_t i) { return f32_from_bf16(v[static_cast<size_t>(i)]); }
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
constexpr uint8_t kPoisonQ = 0xA5;
const float kPoisonS = std::nanf("");

// ---------------- scale rule ----------------

TEST(Fp8Block, ScaleRule) {
  EXPECT_EQ(fp8_block_scale(448.0f, false), 1.0f);
  EXPECT_EQ(fp8_block_scale(1.0f, false), 448.0f);
  EXPECT_EQ(fp8_block_scale(3.0f, false), 448.0f / 3.0f);
  EXPECT_EQ(fp8_block_scale(0.0f, false), 1.0f);
  EXPECT_EQ(fp8_block_scale(INFINITY, false), 1.0f);
  EXPECT_EQ(fp8_block_scale(1e-43f, false), FLT_MAX);  // 448 / subnormal overflows
  EXPECT_EQ(fp8_block_scale(3.0f, true), 128.0f);      // 149.3 -> 128
  EXPECT_EQ(fp8_block_scale(1.0f, true), 256.0f);      // 448 -> 256
  EXPECT_EQ(fp8_block_scale(1e-43f, true), std::ldexp(1.0f, 127));
  for (float amax : {1e-30f, 1e-5f, 0.37f, 2.0f, 447.0f, 5000.0f, 3e38f})
    for (bool pow2 : {false, true}) {
      const float s = fp8_block_scale(amax, pow2);
      EXPECT_EQ(bits(s), bits(ref_scale(amax, pow2))) << amax << " " << pow2;
      // The block's largest value never exceeds 448 after scaling (no finite value clips)...
      EXPECT_LE(amax * s, 448.0f * (1.0f + 1e-6f)) << amax;
      // ...and pow2 scales invert exactly.
      if (pow2) {
        EXPECT_EQ(s * fp8_block_scale_inv(s), 1.0f);
      }
    }
}

// ---------------- row-wise 1x128 ----------------

TEST(Fp8Block, RowsMatchTheDefinition) {
  for (bool pow2 : {false, true})
    for (auto [rows, k] : {std::pair<int64_t, int64_t>{5, 300}, {1, 128}, {9, 7}, {0, 256}, {3, 0}}) {
      const auto x = random_bf16(static_cast<size_t>(rows * k), 11 + rows);
      std::vector<uint8_t> q(static_cast<size_t>(rows * k), kPoisonQ);
      std::vector<float> s(static_cast<size_t>(fp8_rowwise_scale_count(rows, k)), kPoisonS);
      cpu::fp8_quantize_rows(x.data(), rows, k, pow2, q.data(), s.data());
      const int64_t pitch = (rows + 3) / 4 * 4, kbs = (k + 127) / 128;
      ASSERT_EQ(static_cast<int64_t>(s.size()), kbs * pitch);
      for (int64_t kb = 0; kb < kbs; ++kb) {
        for (int64_t r = 0; r < pitch; ++r) {
          const float got = s[static_cast<size_t>(kb * pitch + r)];
          if (r >= rows) {
            EXPECT_EQ(bits(got), 0u) << "padding, kb " << kb << " row " << r;
            continue;
          }
          std::vector<float> blk;
          for (int64_t c = kb * 128; c < std::min<int64_t>(k, kb * 128 + 128); ++c) blk.push_back(bf(x, r * k + c));
          const float sc = ref_scale(ref_amax(blk), pow2);
          EXPECT_EQ(bits(got), bits(1.0f / sc)) << "row " << r << " kb " << kb;
          for (size_t i = 0; i < blk.size(); ++i)
            ASSERT_EQ(q[static_cast<size_t>(r * k + kb * 128) + i], e4m3_from_f32(blk[i] * sc)) << r << " " << i;
        }
      }
    }
}

// ---------------- token blocks (128 x 1, restarting per group) ----------------

TEST(Fp8Block, TokenBlocksRestartAtEveryGroup) {
  const std::vector<int32_t> sizes = {0, 1, 127, 128, 129, 300, 0};
  std::vector<int32_t> off = {0};
  for (int32_t m : sizes) off.push_back(off.back() + m);
  const int64_t rows = off.back(), k = 37, E = static_cast<int64_t>(sizes.size());
  const int64_t need = 0 + 1 + 1 + 1 + 2 + 3 + 0;
  const int64_t cap = fp8_token_block_rows_capacity(rows, E);
  ASSERT_GE(cap, need);
  for (bool pow2 : {false, true}) {
    const auto x = random_bf16(static_cast<size_t>(rows * k), 5);
    std::vector<uint8_t> q(static_cast<size_t>(rows * k), kPoisonQ);
    std::vector<float> s(static_cast<size_t>(cap * k), kPoisonS);
    EXPECT_EQ(cpu::fp8_quantize_token_blocks(x.data(), rows, k, off.data(), E, pow2, q.data(), s.data(), cap), need);
    int64_t srow = 0;
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t r0 = off[e]; r0 < off[e + 1]; r0 += 128, ++srow) {
        const int64_t r1 = std::min<int64_t>(off[e + 1], r0 + 128);  // never past the group
        for (int64_t c = 0; c < k; ++c) {
          std::vector<float> blk;
          for (int64_t r = r0; r < r1; ++r) blk.push_back(bf(x, r * k + c));
          const float sc = ref_scale(ref_amax(blk), pow2);
          ASSERT_EQ(bits(s[static_cast<size_t>(srow * k + c)]), bits(1.0f / sc)) << e << " " << r0 << " " << c;
          for (int64_t r = r0; r < r1; ++r)
            ASSERT_EQ(q[static_cast<size_t>(r * k + c)], e4m3_from_f32(bf(x, r * k + c) * sc)) << r << " " << c;
        }
      }
    }
    EXPECT_EQ(srow, need);
    for (int64_t i = need * k; i < cap * k; ++i) ASSERT_EQ(bits(s[static_cast<size_t>(i)]), 0u) << "padding " << i;
    // No groups: one group of every row.
    std::vector<uint8_t> q1(q.size(), kPoisonQ);
    std::vector<float> s1(static_cast<size_t>(fp8_token_block_rows_capacity(rows, 1) * k), kPoisonS);
    EXPECT_EQ(cpu::fp8_quantize_token_blocks(x.data(), rows, k, nullptr, 1, pow2, q1.data(), s1.data(),
                                             fp8_token_block_rows_capacity(rows, 1)),
              (rows + 127) / 128);
  }
}

// ---------------- weights 128 x 128 ----------------

TEST(Fp8Block, WeightsMatchTheDefinition) {
  const int64_t E = 2, n = 200, k = 300;
  for (bool pow2 : {false, true}) {
    const auto w = random_bf16(static_cast<size_t>(E * n * k), 3);
    std::vector<uint8_t> q(w.size(), kPoisonQ);
    std::vector<float> s(static_cast<size_t>(E * fp8_weight_scale_count(n, k)), kPoisonS);
    cpu::fp8_quantize_weights(w.data(), E, n, k, pow2, q.data(), s.data());
    const int64_t nbs = 2, kbs = 3;
    ASSERT_EQ(static_cast<int64_t>(s.size()), E * nbs * kbs);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t nb = 0; nb < nbs; ++nb)
        for (int64_t kb = 0; kb < kbs; ++kb) {
          std::vector<float> blk;
          for (int64_t r = nb * 128; r < std::min<int64_t>(n, nb * 128 + 128); ++r)
            for (int64_t c = kb * 128; c < std::min<int64_t>(k, kb * 128 + 128); ++c)
              blk.push_back(bf(w, (e * n + r) * k + c));
          const float sc = ref_scale(ref_amax(blk), pow2);
          ASSERT_EQ(bits(s[static_cast<size_t>((e * nbs + nb) * kbs + kb)]), bits(1.0f / sc));
          size_t i = 0;
          for (int64_t r = nb * 128; r < std::min<int64_t>(n, nb * 128 + 128); ++r)
            for (int64_t c = kb * 128; c < std::min<int64_t>(k, kb * 128 + 128); ++c, ++i)
              ASSERT_EQ(q[static_cast<size_t>((e * n + r) * k + c)], e4m3_from_f32(blk[i] * sc));
        }
  }
}

// ---------------- round trip ----------------

// |x - x^| <= |x| 2^-4 (half the spacing of normal E4M3, relative) or 2^-10 / s (half the
// subnormal step), with a hair for the rounding of x * s and of q / s in fp32.
void expect_round_trip(const std::vector<uint16_t>& x, const std::vector<float>& got,
                       const std::vector<float>& sinv_of) {
  for (size_t i = 0; i < x.size(); ++i) {
    const float v = f32_from_bf16(x[i]);
    const float bound = std::max(std::fabs(v) * 0.0625f, sinv_of[i] * std::ldexp(1.0f, -10)) * (1.0f + 1e-5f);
    ASSERT_LE(std::fabs(got[i] - v), bound) << i << " x " << v << " got " << got[i];
  }
}

TEST(Fp8Block, DequantizeRoundTripsWithinTheE4m3Bound) {
  const int64_t rows = 70, k = 260, E = 3;
  const std::vector<int32_t> off = {0, 20, 20, 70};
  const auto x = random_bf16(static_cast<size_t>(rows * k), 9, 6.0f);
  for (bool pow2 : {false, true}) {
    std::vector<uint8_t> q(x.size());
    std::vector<float> out(x.size(), kPoisonS), sinv_of(x.size());
    std::vector<float> s(static_cast<size_t>(fp8_rowwise_scale_count(rows, k)));
    cpu::fp8_quantize_rows(x.data(), rows, k, pow2, q.data(), s.data());
    cpu::fp8_dequantize_rows(q.data(), s.data(), rows, k, out.data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < k; ++c) sinv_of[r * k + c] = s[fp8_rowwise_scale_index(r, c / 128, rows)];
    expect_round_trip(x, out, sinv_of);

    const int64_t cap = fp8_token_block_rows_capacity(rows, E);
    std::vector<float> st(static_cast<size_t>(cap * k));
    cpu::fp8_quantize_token_blocks(x.data(), rows, k, off.data(), E, pow2, q.data(), st.data(), cap);
    std::fill(out.begin(), out.end(), kPoisonS);
    cpu::fp8_dequantize_token_blocks(q.data(), st.data(), rows, k, off.data(), E, out.data());
    for (int64_t r = 0; r < rows; ++r)  // groups of 20 and 50 rows: one block row each
      for (int64_t c = 0; c < k; ++c) sinv_of[r * k + c] = st[(r < 20 ? 0 : 1) * k + c];
    expect_round_trip(x, out, sinv_of);

    std::vector<float> sw(static_cast<size_t>(fp8_weight_scale_count(rows, k)));
    cpu::fp8_quantize_weights(x.data(), 1, rows, k, pow2, q.data(), sw.data());
    std::fill(out.begin(), out.end(), kPoisonS);
    cpu::fp8_dequantize_weights(q.data(), sw.data(), 1, rows, k, out.data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < k; ++c) sinv_of[r * k + c] = sw[c / 128];  // rows < 128: one block row
    expect_round_trip(x, out, sinv_of);
  }
}

// ---------------- NaN and Inf ----------------

// docs/numerics.md "Non-finite values": E4M3 has no Inf, so an Inf is stored as NaN with its sign,
// never as a finite +-448 that would hide the overflow.
TEST(Fp8Block, NanStaysInItsSlotAndInfBecomesNan) {
  std::vector<uint16_t> x(256);
  for (int i = 0; i < 256; ++i) x[i] = bf16_from_f32(0.01f * static_cast<float>(i % 17 - 8));
  x[3] = 0x7fc0;    // NaN in block 0: skipped by the amax
  x[5] = 0xffc0;    // -NaN: keeps its sign (the bytes do not depend on the machine's NaN rules)
  x[200] = 0x7f80;  // +Inf in block 1: amax Inf, scale 1
  x[210] = 0xff80;  // -Inf
  std::vector<uint8_t> q(256);
  std::vector<float> s(fp8_rowwise_scale_count(1, 256));
  cpu::fp8_quantize_rows(x.data(), 1, 256, false, q.data(), s.data());
  EXPECT_EQ(q[3], 0x7f);  // +NaN
  EXPECT_EQ(q[5], 0xff);  // -NaN
  EXPECT_TRUE(std::isnan(fp8_block_decode(q[5], 0.5f)) && std::signbit(fp8_block_decode(q[5], 0.5f)));
  const float amax0 = f32_from_bf16(bf16_from_f32(0.08f));
  EXPECT_EQ(s[0], 1.0f / (448.0f / amax0));                 // amax of the finite values
  EXPECT_EQ(s[fp8_rowwise_scale_index(0, 1, 1)], 1.0f);     // Inf: scale 1
  EXPECT_EQ(q[200], 0x7f);                                  // +Inf -> +NaN, not +448
  EXPECT_EQ(q[210], 0xff);                                  // -Inf -> -NaN
  EXPECT_TRUE(std::isnan(fp8_block_decode(q[200], s[fp8_rowwise_scale_index(0, 1, 1)])));
  EXPECT_EQ(q[201], e4m3_from_f32(f32_from_bf16(x[201])));  // finite values of that block at scale 1
}

// ---------------- GEMMs ----------------

// The same sums in double from the dequantized operands (what the blockwise rule equals up to
// fp32 rounding: q s_inv summed per block is q summed per block times s_inv), and the bound
// 2e-5 * sum |terms| + tiny for fp32 partial sums and fma accumulation.
struct Ref {
  std::vector<double> v, mag;
};
void expect_near_ref(const std::vector<float>& got, const Ref& r, const char* what) {
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::fabs(static_cast<double>(got[i]) - r.v[i]), 2e-5 * r.mag[i] + 1e-30) << what << " " << i;
}

struct GemmCase {
  std::vector<int32_t> off;
  int64_t rows, experts;
};
GemmCase gemm_case() {
  GemmCase c{{0, 5, 5, 145}, 145, 3};  // an empty group, a group of two blocks (128 + 12)
  return c;
}

TEST(Fp8Block, FpropAndDgradFollowTheBlockRule) {
  const GemmCase gc = gemm_case();
  const int64_t T = gc.rows, E = gc.experts, N = 200, K = 300;
  for (bool pow2 : {false, true}) {
    const auto x = random_bf16(static_cast<size_t>(T * K), 21), w = random_bf16(static_cast<size_t>(E * N * K), 22);
    const auto g = random_bf16(static_cast<size_t>(T * N), 23);
    std::vector<uint8_t> qx(x.size()), qw(w.size()), qg(g.size());
    std::vector<float> sx(fp8_rowwise_scale_count(T, K)), sw(E * fp8_weight_scale_count(N, K)),
        sg(fp8_rowwise_scale_count(T, N));
    cpu::fp8_quantize_rows(x.data(), T, K, pow2, qx.data(), sx.data());
    cpu::fp8_quantize_weights(w.data(), E, N, K, pow2, qw.data(), sw.data());
    cpu::fp8_quantize_rows(g.data(), T, N, pow2, qg.data(), sg.data());
    std::vector<float> dx(x.size()), dw(w.size()), dg(g.size());
    cpu::fp8_dequantize_rows(qx.data(), sx.data(), T, K, dx.data());
    cpu::fp8_dequantize_weights(qw.data(), sw.data(), E, N, K, dw.data());
    cpu::fp8_dequantize_rows(qg.data(), sg.data(), T, N, dg.data());
    auto expert_of = [&](int64_t t) {
      int64_t e = 0;
      while (t >= gc.off[e + 1]) ++e;
      return e;
    };
    // Non-pow2 scales: the dequantized values are fp32-rounded products; compare with the rule in
    // double instead (per block: exact partial x s_inv_a x s_inv_b).
    auto xq = [&](int64_t t, int64_t i) {
      return static_cast<double>(e4m3_to_f32(qx[t * K + i])) * sx[fp8_rowwise_scale_index(t, i / 128, T)];
    };
    auto wq = [&](int64_t e, int64_t r, int64_t c) {
      return static_cast<double>(e4m3_to_f32(qw[(e * N + r) * K + c])) * sw[(e * 2 + r / 128) * 3 + c / 128];
    };
    auto gq = [&](int64_t t, int64_t j) {
      return static_cast<double>(e4m3_to_f32(qg[t * N + j])) * sg[fp8_rowwise_scale_index(t, j / 128, T)];
    };
    Ref fr{std::vector<double>(T * N), std::vector<double>(T * N)},
        dr{std::vector<double>(T * K), std::vector<double>(T * K)};
    for (int64_t t = 0; t < T; ++t) {
      const int64_t e = expert_of(t);
      for (int64_t c = 0; c < N; ++c)
        for (int64_t i = 0; i < K; ++i) {
          const double p = xq(t, i) * wq(e, c, i);
          fr.v[t * N + c] += p, fr.mag[t * N + c] += std::fabs(p);
        }
      for (int64_t c = 0; c < K; ++c)
        for (int64_t j = 0; j < N; ++j) {
          const double p = gq(t, j) * wq(e, j, c);
          dr.v[t * K + c] += p, dr.mag[t * K + c] += std::fabs(p);
        }
    }
    std::vector<float> y(T * N, kPoisonS), dxg(T * K, kPoisonS);
    cpu::fp8_gemm_fprop(qx.data(), sx.data(), T, K, qw.data(), sw.data(), E, N, gc.off.data(), y.data());
    cpu::fp8_gemm_dgrad(qg.data(), sg.data(), T, N, qw.data(), sw.data(), E, K, gc.off.data(), dxg.data());
    expect_near_ref(y, fr, "fprop");
    expect_near_ref(dxg, dr, "dgrad");
    if (pow2) {  // then the dequantized operands are exact and the same sums come from them
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < K; ++i) ASSERT_EQ(static_cast<double>(dx[t * K + i]), xq(t, i));
    }
  }
}

TEST(Fp8Block, WgradSumsEachGroupsTokenBlocks) {
  const GemmCase gc = gemm_case();
  const int64_t T = gc.rows, E = gc.experts, M = 70, N = 50;
  for (bool pow2 : {false, true}) {
    const auto a = random_bf16(static_cast<size_t>(T * M), 31), b = random_bf16(static_cast<size_t>(T * N), 32);
    const int64_t cap = fp8_token_block_rows_capacity(T, E);
    std::vector<uint8_t> qa(a.size()), qb(b.size());
    std::vector<float> sa(cap * M), sb(cap * N);
    const int64_t used =
        cpu::fp8_quantize_token_blocks(a.data(), T, M, gc.off.data(), E, pow2, qa.data(), sa.data(), cap);
    cpu::fp8_quantize_token_blocks(b.data(), T, N, gc.off.data(), E, pow2, qb.data(), sb.data(), cap);
    ASSERT_EQ(used, 1 + 0 + 2);
    auto srow = [&](int64_t t) { return t < 5 ? 0 : (t < 5 + 128 ? 1 : 2); };  // block row of token t
    Ref r{std::vector<double>(E * M * N), std::vector<double>(E * M * N)};
    for (int64_t t = 0; t < T; ++t) {
      const int64_t e = t < 5 ? 0 : 2;
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          const double p = static_cast<double>(e4m3_to_f32(qa[t * M + i])) * sa[srow(t) * M + i] *
                           static_cast<double>(e4m3_to_f32(qb[t * N + j])) * sb[srow(t) * N + j];
          r.v[(e * M + i) * N + j] += p, r.mag[(e * M + i) * N + j] += std::fabs(p);
        }
    }
    std::vector<float> d(E * M * N, kPoisonS);
    cpu::fp8_gemm_wgrad(qa.data(), sa.data(), M, qb.data(), sb.data(), N, T, gc.off.data(), E, d.data());
    expect_near_ref(d, r, "wgrad");
    for (int64_t i = 0; i < M * N; ++i) ASSERT_EQ(bits(d[M * N + i]), 0u) << "empty group " << i;  // +0, not poison
  }
}

// ---------------- errors ----------------

template <class F>
void expect_error(const char* argument, F f) {
  try {
    f();
    ADD_FAILURE() << "no error for " << argument;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
  }
}

TEST(Fp8Block, BadArgumentsNameTheArgumentAndWriteNothing) {
  const int64_t rows = 10, k = 8;
  const auto x = random_bf16(rows * k, 1);
  std::vector<uint8_t> q(rows * k, kPoisonQ);
  std::vector<float> s(64, 7.0f);
  expect_error("rows", [&] { cpu::fp8_quantize_rows(x.data(), -1, k, false, q.data(), s.data()); });
  expect_error("k", [&] { cpu::fp8_quantize_rows(x.data(), rows, -3, false, q.data(), s.data()); });
  expect_error("x", [&] { cpu::fp8_quantize_rows(nullptr, rows, k, false, q.data(), s.data()); });
  expect_error("scale_inv", [&] { cpu::fp8_quantize_rows(x.data(), rows, k, false, q.data(), nullptr); });
  const std::vector<int32_t> not_monotone = {0, 6, 4, 10}, bad_start = {1, 5, 10}, bad_end = {0, 5, 9};
  expect_error("offsets", [&] {
    cpu::fp8_quantize_token_blocks(x.data(), rows, k, not_monotone.data(), 3, false, q.data(), s.data(), 8);
  });
  expect_error("offsets", [&] {
    cpu::fp8_quantize_token_blocks(x.data(), rows, k, bad_start.data(), 2, false, q.data(), s.data(), 8);
  });
  expect_error("offsets", [&] {
    cpu::fp8_quantize_token_blocks(x.data(), rows, k, bad_end.data(), 2, false, q.data(), s.data(), 8);
  });
  const std::vector<int32_t> two = {0, 4, 10};
  expect_error("scale_rows",
               [&] { cpu::fp8_quantize_token_blocks(x.data(), rows, k, two.data(), 2, false, q.data(), s.data(), 1); });
  expect_error("experts", [&] { cpu::fp8_quantize_weights(x.data(), -1, rows, k, false, q.data(), s.data()); });
  std::vector<float> d(rows * rows, 7.0f);
  expect_error("offsets",
               [&] { cpu::fp8_gemm_fprop(q.data(), s.data(), rows, k, q.data(), s.data(), 1, k, nullptr, d.data()); });
  expect_error("offsets", [&] {
    cpu::fp8_gemm_wgrad(q.data(), s.data(), k, q.data(), s.data(), k, rows, not_monotone.data(), 3, d.data());
  });
  for (float v : d) ASSERT_EQ(v, 7.0f);
  for (uint8_t b : q) ASSERT_EQ(b, kPoisonQ);
  for (float v : s) ASSERT_EQ(v, 7.0f);
}

}  // namespace
}  // namespace mxmoe
