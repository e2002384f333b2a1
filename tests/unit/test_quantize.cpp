// The CPU reference MXFP8 quantizer (src/cpu/quant.cpp) against an independent reference written
// here: scales from ceil(log2(amax/448)) in double, scale placement from the test's own group and
// swizzle arithmetic, every output byte poisoned and checked (docs/numerics.md "Scale rule", "E4M3 cast",
// "Group restarts", "Scale layouts", "Grouped scale placement").
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "src/cpu/cpu_ops.h"
#include "support.h"

namespace mxmoe {
namespace {

using test::HostTensor;

constexpr ScaleLayout kLayouts[] = {ScaleLayout::compact, ScaleLayout::swizzled};

// ---------------- independent reference ----------------

// e - 127 = clamp(ceil(log2(amax / 448)), -127, 127): the smallest n with amax <= 448 * 2^n
// (multiplying by 2^n is exact in double, so no log2 rounding can decide a boundary).
int ref_scale(double amax) {
  if (std::isnan(amax)) return 255;
  if (std::isinf(amax)) return 254;
  if (amax == 0) return 0;
  int n = static_cast<int>(std::ceil(std::log2(amax / 448.0)));
  while (amax > std::ldexp(448.0, n)) ++n;
  while (amax <= std::ldexp(448.0, n - 1)) --n;
  return std::clamp(n, -127, 127) + 127;
}

uint8_t ref_code(float x, int e) { return e4m3_from_f32(static_cast<float>(std::ldexp(double{x}, 127 - e))); }

// Where compact element (r, c) of an [R, C] scale matrix lands after viewing the matrix as
// [R/128, 4, 32, C/4, 4] and making the (0, 3, 2, 1, 4) permutation contiguous, done literally.
std::vector<int64_t> swizzle_positions(int64_t rows, int64_t cols) {
  const std::array<int64_t, 5> dims{rows / 128, 4, 32, cols / 4, 4};
  const std::array<int, 5> perm{0, 3, 2, 1, 4};
  std::vector<int64_t> pos(static_cast<size_t>(rows * cols));
  std::array<int64_t, 5> idx{};  // coordinates in the permuted order
  for (int64_t out = 0; out < rows * cols; ++out) {
    std::array<int64_t, 5> src{};  // coordinates in the original view
    for (int d = 0; d < 5; ++d) src[perm[d]] = idx[d];
    int64_t lin = 0;
    for (int d = 0; d < 5; ++d) lin = lin * dims[d] + src[d];
    pos[lin] = out;
    for (int d = 4; d >= 0; --d) {  // odometer over the permuted shape
      if (++idx[d] < dims[perm[d]]) break;
      idx[d] = 0;
    }
  }
  return pos;
}

struct RefOut {
  std::vector<uint8_t> data, scales;
};

// One block: elements at `idx` of src; writes codes, returns the scale.
int ref_block(const uint16_t* src, const std::vector<int64_t>& idx, std::vector<uint8_t>& data) {
  double amax = 0;
  for (int64_t i : idx) {
    const double v = f32_from_bf16(src[i]);
    if (!std::isnan(v)) amax = std::max(amax, std::fabs(v));
  }
  const int e = ref_scale(amax);
  for (int64_t i : idx) data[i] = ref_code(f32_from_bf16(src[i]), e);
  return e;
}

RefOut ref_rowwise(const HostTensor& src, ScaleLayout layout) {
  const int64_t m = src.view.size(0), k = src.view.size(1);
  const int64_t rows = (m + 127) / 128 * 128, cols = (k / 32 + 3) / 4 * 4;
  const std::vector<int64_t> swz = swizzle_positions(rows, cols);
  RefOut out{std::vector<uint8_t>(m * k), std::vector<uint8_t>(rows * cols, 0)};
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t kb = 0; kb < k / 32; ++kb) {
      std::vector<int64_t> idx;
      for (int t = 0; t < 32; ++t) idx.push_back(r * k + kb * 32 + t);
      const int64_t pos = layout == ScaleLayout::compact ? r * cols + kb : swz[r * cols + kb];
      out.scales[pos] = static_cast<uint8_t>(ref_block(src.ptr<uint16_t>(), idx, out.data));
    }
  }
  return out;
}

// Group e's chunk: rows s_e .. s_e + roundup(ceil(m_e/32), 4) of roundup(K, 128) bytes each; inside it
// the local matrix [block j, column i] (compact), or its swizzle with the column as the MN index.
RefOut ref_colwise(const HostTensor& src, const std::vector<int>& sizes, ScaleLayout layout, int64_t bytes) {
  const int64_t m = src.view.size(0), k = src.view.size(1);
  const int64_t row_bytes = (k + 127) / 128 * 128;
  RefOut out{std::vector<uint8_t>(m * k), std::vector<uint8_t>(bytes, 0)};
  int64_t first_row = 0, chunk = 0;
  for (int size : sizes) {
    const int64_t blocks = (size + 31) / 32, chunk_rows = (blocks + 3) / 4 * 4;
    const std::vector<int64_t> swz = swizzle_positions(row_bytes, chunk_rows);
    for (int64_t j = 0; j < blocks; ++j) {
      for (int64_t i = 0; i < k; ++i) {
        std::vector<int64_t> idx;
        for (int64_t r = first_row + 32 * j;
             r < std::min<int64_t>(first_row + 32 * (j + 1), first_row + size); ++r)
          idx.push_back(r * k + i);
        const int64_t local = layout == ScaleLayout::compact ? j * row_bytes + i : swz[i * chunk_rows + j];
        out.scales[chunk * row_bytes + local] =
            static_cast<uint8_t>(ref_block(src.ptr<uint16_t>(), idx, out.data));
      }
    }
    first_row += size;
    chunk += chunk_rows;
  }
  return out;
}

// ---------------- running the quantizer ----------------

struct MxOut {
  HostTensor data, scales;
};

int64_t scale_bytes(BlockAxis axis, int64_t m, int64_t k, const HostTensor* offsets) {
  if (axis == BlockAxis::row) return rowwise_scale_bytes(m, k);
  return offsets ? colwise_scale_bytes(m, k, offsets->numel() - 1) : colwise_matrix_scale_bytes(m, k);
}

MxOut quantize_once(const HostTensor& src, BlockAxis axis, ScaleLayout layout, const HostTensor* offsets,
                    uint8_t poison) {
  const int64_t m = src.view.size(0), k = src.view.size(1);
  MxOut o{HostTensor(DType::e4m3, {m, k}), HostTensor(DType::e8m0, {scale_bytes(axis, m, k, offsets)})};
  o.data.poison(poison);
  o.scales.poison(poison);
  QuantizeArgs a;
  a.src = src.view;
  if (offsets) a.groups.offsets = offsets->view;
  (axis == BlockAxis::row ? a.rowwise : a.colwise) = Mxfp8View{o.data.view, o.scales.view, axis, layout};
  cpu::quantize(a);
  return o;
}

// Runs with two different poisons: a byte the quantizer did not write would differ.
MxOut quantize(const HostTensor& src, BlockAxis axis, ScaleLayout layout,
               const HostTensor* offsets = nullptr) {
  MxOut a = quantize_once(src, axis, layout, offsets, 0xA5);
  const MxOut b = quantize_once(src, axis, layout, offsets, 0x5A);
  EXPECT_TRUE(test::bytes_equal(a.data.view, b.data.view)) << "data not fully written";
  EXPECT_TRUE(test::bytes_equal(a.scales.view, b.scales.view)) << "scales not fully written";
  return a;
}

HostTensor dequantize(const MxOut& q, BlockAxis axis, ScaleLayout layout, DType dtype,
                      const HostTensor* offsets = nullptr) {
  HostTensor out(dtype, {q.data.view.size(0), q.data.view.size(1)});
  out.poison(0xFF);  // NaN in both f32 and bf16
  DequantizeArgs a;
  a.src = Mxfp8View{q.data.view, q.scales.view, axis, layout};
  if (offsets) a.groups.offsets = offsets->view;
  a.dst = out.view;
  cpu::dequantize(a);
  return out;
}

// Values u * 2^s, u in (-1, 1), s per element in [-6, 6] plus a per-row offset in [-30, 30]: block
// scales vary, and elements of one block span several binades down into the E4M3 subnormals.
HostTensor varied_bf16(int64_t m, int64_t k) {
  HostTensor t(DType::bf16, {m, k});
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::uniform_int_distribution<int> s(-6, 6), row_s(-30, 30);
  for (int64_t r = 0; r < m; ++r) {
    const int base = row_s(test::rng());
    for (int64_t c = 0; c < k; ++c)
      t.ptr<uint16_t>()[r * k + c] = bf16_from_f32(std::ldexp(u(test::rng()), base + s(test::rng())));
  }
  return t;
}

std::vector<uint8_t> bytes_of(const HostTensor& t) { return t.bytes; }

// ---------------- tests ----------------

TEST(QuantRowwise, MatchesIndependentReferenceBitExact) {
  for (int64_t m : {1, 127, 128, 300}) {
    for (int64_t k : {32, 96, 256}) {
      const HostTensor x = varied_bf16(m, k);
      for (ScaleLayout layout : kLayouts) {
        const MxOut q = quantize(x, BlockAxis::row, layout);
        const RefOut ref = ref_rowwise(x, layout);
        ASSERT_EQ(bytes_of(q.data), ref.data) << "m=" << m << " k=" << k;
        ASSERT_EQ(bytes_of(q.scales), ref.scales) << "m=" << m << " k=" << k << " layout " << int(layout);
      }
    }
  }
}

TEST(QuantScale, EqualsCeilLog2OfAmaxOver448ForEveryBf16Amax) {
  // One block per positive finite bf16 value (0x0001 .. 0x7F7F), the amax at a random position.
  const int64_t k = 32 * 32, blocks = 0x7F7F, m = (blocks + 31) / 32;
  HostTensor x(DType::bf16, {m, k});
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::uniform_int_distribution<int> where(0, 31);
  for (int64_t b = 0; b < m * 32; ++b) {
    const float amax = b < blocks ? f32_from_bf16(static_cast<uint16_t>(b + 1)) : 0.f;
    uint16_t* blk = x.ptr<uint16_t>() + b * 32;
    for (int t = 0; t < 32; ++t) blk[t] = bf16_from_f32(amax * u(test::rng()));
    blk[where(test::rng())] = bf16_from_f32(u(test::rng()) < 0 ? -amax : amax);
  }
  for (ScaleLayout layout : kLayouts) {
    const MxOut q = quantize(x, BlockAxis::row, layout);
    int64_t bad = 0;
    for (int64_t b = 0; b < m * 32; ++b) {
      const int64_t r = b / 32, kb = b % 32;
      const double amax = b < blocks ? f32_from_bf16(static_cast<uint16_t>(b + 1)) : 0.0;
      const int e = q.scales.ptr<uint8_t>()[rowwise_scale_index(r, kb, k, layout)];
      if (e != ref_scale(amax) && ++bad <= 5)
        ADD_FAILURE() << "amax=" << amax << " e=" << e << " want " << ref_scale(amax);
      // No finite value clips, and unless e is clamped the amax lands in (224, 448] after scaling.
      if (e > 0) {
        const double scaled = amax * std::ldexp(1.0, 127 - e);
        if ((scaled <= 224 || scaled > 448) && ++bad <= 5)
          ADD_FAILURE() << "amax=" << amax << " scaled " << scaled;
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

// Half an E4M3 ulp of the scaled value y, in the units of y.
double half_ulp(double y) {
  const double a = std::fabs(y);
  if (a < std::ldexp(1.0, -6)) return std::ldexp(1.0, -10);
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(a))) - 4);
}

TEST(QuantRoundTrip, DequantizedWithinHalfUlpAtBlockScale) {
  const std::vector<int> sizes{5, 64, 0, 40};
  const HostTensor offsets = test::offsets_from_sizes(sizes);
  const HostTensor x = varied_bf16(109, 96);
  const int64_t k = 96;
  for (BlockAxis axis : {BlockAxis::row, BlockAxis::col}) {
    for (ScaleLayout layout : kLayouts) {
      const HostTensor* off = axis == BlockAxis::col ? &offsets : nullptr;
      const MxOut q = quantize(x, axis, layout, off);
      const HostTensor f = dequantize(q, axis, layout, DType::f32, off);
      const HostTensor h = dequantize(q, axis, layout, DType::bf16, off);
      // Scale of each element from the reference, to bound the error independently of the layout.
      const RefOut ref = axis == BlockAxis::row
                             ? ref_rowwise(x, ScaleLayout::compact)
                             : ref_colwise(x, sizes, ScaleLayout::compact, q.scales.numel());
      for (int64_t i = 0; i < x.numel(); ++i) {
        const int64_t r = i / k, c = i % k;
        int64_t row_in_group = r, chunk = 0;
        for (size_t g = 0; axis == BlockAxis::col && row_in_group >= sizes[g]; ++g) {
          row_in_group -= sizes[g];
          chunk += ((sizes[g] + 31) / 32 + 3) / 4 * 4;
        }
        // Compact scale matrices: row-wise [*, roundup(96/32, 4) = 4], column-wise [*, roundup(96, 128)].
        const int e = axis == BlockAxis::row ? ref.scales[r * 4 + c / 32]
                                             : ref.scales[(chunk + row_in_group / 32) * 128 + c];
        const double xv = f32_from_bf16(x.ptr<uint16_t>()[i]);
        const double got = f.ptr<float>()[i];
        const double y = std::ldexp(xv, 127 - e);
        ASSERT_LE(std::fabs(y), 448.0);
        ASSERT_LE(std::fabs(got - xv), std::ldexp(half_ulp(y), e - 127)) << "i=" << i << " x=" << xv;
        ASSERT_EQ(h.ptr<uint16_t>()[i], bf16_from_f32(static_cast<float>(got))) << i;
      }
    }
  }
}

TEST(QuantRoundTrip, RepresentableValuesAreExact) {
  const std::vector<int> sizes{33, 0, 31, 64};
  const HostTensor offsets = test::offsets_from_sizes(sizes);
  for (BlockAxis axis : {BlockAxis::row, BlockAxis::col}) {
    const HostTensor* off = axis == BlockAxis::col ? &offsets : nullptr;
    const HostTensor x = varied_bf16(128, 64);
    const HostTensor once = dequantize(quantize(x, axis, ScaleLayout::compact, off), axis,
                                       ScaleLayout::compact, DType::bf16, off);
    for (ScaleLayout layout : kLayouts) {
      const HostTensor twice = dequantize(quantize(once, axis, layout, off), axis, layout, DType::bf16, off);
      EXPECT_EQ(bytes_of(twice), bytes_of(once)) << "axis " << int(axis) << " layout " << int(layout);
    }
  }
}

TEST(QuantSwizzle, MatchesPermutationViewAndIsBijection) {
  for (int64_t rows : {128, 256, 384}) {
    for (int64_t cols : {4, 8, 12, 20}) {
      const std::vector<int64_t> want = swizzle_positions(rows, cols);
      std::vector<int> seen(rows * cols, 0);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t got = swizzled_scale_index(r, c, cols);
          ASSERT_EQ(got, want[r * cols + c]) << "r=" << r << " c=" << c << " R=" << rows << " C=" << cols;
          ASSERT_GE(got, 0);
          ASSERT_LT(got, rows * cols);
          ++seen[got];
        }
      }
      EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
    }
  }
}

TEST(QuantColwise, GroupBlocksRestartAtEachGroupWithPartialLastBlock) {
  const std::vector<int> base{0, 1, 31, 32, 33, 127, 128, 129};
  std::vector<int> shuffled = base;
  std::shuffle(shuffled.begin(), shuffled.end(), test::rng());
  for (const std::vector<int>& sizes : {base, shuffled}) {
    const HostTensor offsets = test::offsets_from_sizes(sizes);
    const int64_t t = offsets.ptr<int32_t>()[sizes.size()];
    for (int64_t k : {40, 128, 200}) {
      HostTensor x = varied_bf16(t, k);
      // Make each group's first row dominate: a block that read past its group's end would take
      // the next group's large amax.
      for (size_t e = 0; e + 1 < sizes.size(); ++e) {
        const int64_t first = offsets.ptr<int32_t>()[e];
        for (int64_t c = 0; sizes[e] > 0 && c < k; ++c)
          x.ptr<uint16_t>()[first * k + c] = bf16_from_f32(1e6f);
      }
      for (ScaleLayout layout : kLayouts) {
        const MxOut q = quantize(x, BlockAxis::col, layout, &offsets);
        const RefOut ref = ref_colwise(x, sizes, layout, q.scales.numel());
        ASSERT_EQ(bytes_of(q.data), ref.data) << "k=" << k << " layout " << int(layout);
        ASSERT_EQ(bytes_of(q.scales), ref.scales) << "k=" << k << " layout " << int(layout);
        // A group's one-row block (m=1) gets exactly its own row's scale.
        const int64_t one = std::find(sizes.begin(), sizes.end(), 1) - sizes.begin();
        int64_t chunk = 0;
        for (int64_t e = 0; e < one; ++e) chunk += colwise_group_scale_rows(sizes[e]);
        const int64_t row = offsets.ptr<int32_t>()[one];
        for (int64_t c = 0; c < k; ++c) {
          const float v = f32_from_bf16(x.ptr<uint16_t>()[row * k + c]);
          ASSERT_EQ(q.scales.ptr<uint8_t>()[colwise_scale_index(chunk, 1, 0, c, k, layout)],
                    ref_scale(std::fabs(v)));
        }
      }
    }
  }
}

TEST(QuantLayouts, CompactAndSwizzledHoldTheSameScales) {
  const std::vector<int> sizes{70, 0, 200, 3};
  const HostTensor offsets = test::offsets_from_sizes(sizes);
  const int64_t k = 160;
  const HostTensor x = varied_bf16(273, k);
  const MxOut rc = quantize(x, BlockAxis::row, ScaleLayout::compact);
  const MxOut rs = quantize(x, BlockAxis::row, ScaleLayout::swizzled);
  EXPECT_EQ(bytes_of(rc.data), bytes_of(rs.data));
  for (int64_t r = 0; r < 273; ++r)
    for (int64_t kb = 0; kb < k / 32; ++kb)
      ASSERT_EQ(rc.scales.ptr<uint8_t>()[rowwise_scale_index(r, kb, k, ScaleLayout::compact)],
                rs.scales.ptr<uint8_t>()[rowwise_scale_index(r, kb, k, ScaleLayout::swizzled)]);
  const MxOut cc = quantize(x, BlockAxis::col, ScaleLayout::compact, &offsets);
  const MxOut cs = quantize(x, BlockAxis::col, ScaleLayout::swizzled, &offsets);
  EXPECT_EQ(bytes_of(cc.data), bytes_of(cs.data));
  int64_t chunk = 0;
  for (int m : sizes) {
    for (int64_t j = 0; j < (m + 31) / 32; ++j)
      for (int64_t i = 0; i < k; ++i)
        ASSERT_EQ(cc.scales.ptr<uint8_t>()[colwise_scale_index(chunk, m, j, i, k, ScaleLayout::compact)],
                  cs.scales.ptr<uint8_t>()[colwise_scale_index(chunk, m, j, i, k, ScaleLayout::swizzled)]);
    chunk += colwise_group_scale_rows(m);
  }
  // Same multiset of bytes: the swizzle only moves scales, padding included.
  std::vector<uint8_t> a = bytes_of(rc.scales), b = bytes_of(rs.scales), c = bytes_of(cc.scales),
                       d = bytes_of(cs.scales);
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  std::sort(c.begin(), c.end());
  std::sort(d.begin(), d.end());
  EXPECT_EQ(a, b);
  EXPECT_EQ(c, d);
}

// Four blocks with special contents; block b is row b, columns [32b, 32b+32) (row-wise) or
// column b, rows [32b, 32b+32) (column-wise).
TEST(QuantSpecialValues, ZeroInfAndNaNBlocksFollowTheScaleRule) {
  const uint16_t kNaN = 0x7FC0, kNegNaN = 0xFFC0, kInf = 0x7F80, kNegInf = 0xFF80;
  for (BlockAxis axis : {BlockAxis::row, BlockAxis::col}) {
    const bool row = axis == BlockAxis::row;
    const int64_t m = row ? 4 : 128, k = row ? 128 : 4;
    HostTensor x = varied_bf16(m, k);
    auto at = [&](int b, int t) -> uint16_t& {
      return x.ptr<uint16_t>()[row ? b * k + 32 * b + t : (32 * b + t) * k + b];
    };
    for (int t = 0; t < 32; ++t) at(0, t) = 0;  // all zero
    at(1, 3) = kInf;                            // Inf among finite values
    at(1, 5) = kNegInf;
    at(2, 7) = kNaN;  // NaN among finite values
    at(2, 9) = kNegNaN;
    for (int t = 0; t < 32; ++t) at(3, t) = kNaN;  // all NaN
    for (ScaleLayout layout : kLayouts) {
      const MxOut q = quantize(x, axis, layout);
      auto code = [&](int b, int t) { return q.data.ptr<uint8_t>()[&at(b, t) - x.ptr<uint16_t>()]; };
      auto scale = [&](int b) {
        return q.scales.ptr<uint8_t>()[row ? rowwise_scale_index(b, b, k, layout)
                                           : colwise_scale_index(0, m, b, b, k, layout)];
      };
      EXPECT_EQ(scale(0), 0);
      for (int t = 0; t < 32; ++t) EXPECT_EQ(code(0, t), 0x00);

      EXPECT_EQ(scale(1), 254);
      EXPECT_EQ(code(1, 3), 0x7E);
      EXPECT_EQ(code(1, 5), 0xFE);
      for (int t = 0; t < 32; ++t) {
        if (t != 3 && t != 5) {
          EXPECT_EQ(code(1, t) & 0x7F, 0) << t;  // finite values underflow to +-0
        }
      }

      double amax = 0;
      for (int t = 0; t < 32; ++t)
        if (t != 7 && t != 9) amax = std::max(amax, std::fabs(double{f32_from_bf16(at(2, t))}));
      ASSERT_GT(amax, 0);
      EXPECT_EQ(scale(2), ref_scale(amax));
      EXPECT_EQ(code(2, 7), 0x7F);
      EXPECT_EQ(code(2, 9), 0xFF);
      for (int t = 0; t < 32; ++t) {
        if (t != 7 && t != 9) {
          EXPECT_EQ(code(2, t), ref_code(f32_from_bf16(at(2, t)), scale(2))) << t;
        }
      }

      EXPECT_EQ(scale(3), 0);  // amax skips every NaN: amax = 0
      for (int t = 0; t < 32; ++t) EXPECT_EQ(code(3, t), 0x7F);

      // Dequantize: Inf came back as +-448 * 2^127, NaN stays NaN.
      const HostTensor f = dequantize(q, axis, layout, DType::f32);
      EXPECT_TRUE(std::isnan(f.ptr<float>()[&at(2, 7) - x.ptr<uint16_t>()]));
      EXPECT_EQ(f.ptr<float>()[&at(1, 3) - x.ptr<uint16_t>()], std::ldexp(448.0f, 127));
    }
  }
}

TEST(QuantExperts, DenseAndPerExpertPointersAreBitIdenticalAndMatchQuantize) {
  const int64_t experts = 3, rows = 70;
  for (BlockAxis axis : {BlockAxis::row, BlockAxis::col}) {
    const int64_t cols = axis == BlockAxis::row ? 64 : 72, elems = rows * cols;
    const int64_t bytes =
        axis == BlockAxis::row ? rowwise_scale_bytes(rows, cols) : colwise_matrix_scale_bytes(rows, cols);
    std::vector<HostTensor> mats;
    HostTensor dense(DType::bf16, {experts, rows, cols});
    HostTensor table(DType::i64, {experts});
    for (int64_t e = 0; e < experts; ++e) {
      mats.push_back(varied_bf16(rows, cols));
      std::memcpy(dense.ptr<uint16_t>() + e * elems, mats.back().ptr<uint16_t>(), elems * 2);
    }
    for (int64_t e = 0; e < experts; ++e)
      table.ptr<int64_t>()[e] = reinterpret_cast<int64_t>(mats[e].bytes.data());
    for (ScaleLayout layout : kLayouts) {
      auto run = [&](bool per_expert, uint8_t poison) {
        MxOut o{HostTensor(DType::e4m3, {experts, rows, cols}), HostTensor(DType::e8m0, {experts, bytes})};
        o.data.poison(poison);
        o.scales.poison(poison);
        detail::QuantizeExpertsStep s;
        if (per_expert)
          s.src.pointers = table.view;
        else
          s.src.dense = dense.view;
        s.src.dtype = DType::bf16;
        s.experts = experts;
        s.rows = rows;
        s.cols = cols;
        s.data = o.data.view;
        s.scales = o.scales.view;
        s.axis = axis;
        s.layout = layout;
        cpu::quantize_experts(s);
        return o;
      };
      const MxOut d1 = run(false, 0xA5), d2 = run(false, 0x5A), p1 = run(true, 0xA5), p2 = run(true, 0x5A);
      EXPECT_EQ(bytes_of(d1.data), bytes_of(d2.data)) << "data not fully written";
      EXPECT_EQ(bytes_of(d1.scales), bytes_of(d2.scales)) << "scales not fully written";
      EXPECT_EQ(bytes_of(p1.data), bytes_of(p2.data));
      EXPECT_EQ(bytes_of(p1.scales), bytes_of(p2.scales));
      EXPECT_EQ(bytes_of(d1.data), bytes_of(p1.data));
      EXPECT_EQ(bytes_of(d1.scales), bytes_of(p1.scales));
      for (int64_t e = 0; e < experts; ++e) {
        const MxOut one = quantize(mats[e], axis, layout);
        ASSERT_EQ(one.scales.numel(), bytes);
        EXPECT_EQ(0, std::memcmp(one.data.bytes.data(), d1.data.bytes.data() + e * elems, elems)) << e;
        EXPECT_EQ(0, std::memcmp(one.scales.bytes.data(), d1.scales.bytes.data() + e * bytes, bytes)) << e;
      }
    }
  }
}

// Only the bf16 copy asked for (data null: the layer's per-call weights where cuda_sm90 runs the
// GEMMs) gives the same copy as quantizing with FP8 outputs and the copy, and writes all of it.
TEST(QuantExperts, CopyAloneEqualsTheCopyOfTheFullQuantize) {
  const int64_t experts = 3, rows = 70, cols = 96, elems = rows * cols;
  HostTensor dense(DType::bf16, {experts, rows, cols});
  for (int64_t e = 0; e < experts; ++e) {
    const HostTensor m = varied_bf16(rows, cols);
    std::memcpy(dense.ptr<uint16_t>() + e * elems, m.ptr<uint16_t>(), elems * 2);
  }
  for (BlockAxis axis : {BlockAxis::row, BlockAxis::col}) {
    const int64_t bytes =
        axis == BlockAxis::row ? rowwise_scale_bytes(rows, cols) : colwise_matrix_scale_bytes(rows, cols);
    for (ScaleLayout layout : kLayouts) {
      detail::QuantizeExpertsStep full;
      full.src.dense = dense.view;
      full.src.dtype = DType::bf16;
      full.experts = experts;
      full.rows = rows;
      full.cols = cols;
      full.axis = axis;
      full.layout = layout;
      HostTensor data(DType::e4m3, {experts, rows, cols}), scales(DType::e8m0, {experts, bytes});
      HostTensor copy(DType::bf16, {experts, rows, cols});
      copy.poison(0xA5);
      full.data = data.view;
      full.scales = scales.view;
      full.dequantized = copy.view;
      cpu::quantize_experts(full);
      for (uint8_t poison : {0xA5, 0x5A}) {
        HostTensor alone(DType::bf16, {experts, rows, cols});
        alone.poison(poison);
        detail::QuantizeExpertsStep only = full;
        only.data = TensorView::of(nullptr, DType::e4m3, {experts, rows, cols});
        only.scales = TensorView{};
        only.dequantized = alone.view;
        cpu::quantize_experts(only);
        EXPECT_EQ(bytes_of(alone), bytes_of(copy)) << "axis " << static_cast<int>(axis) << " poison " << int{poison};
      }
      EXPECT_TRUE(std::any_of(copy.bytes.begin(), copy.bytes.end(), [](uint8_t b) { return b != 0; }));
    }
  }
}

TEST(QuantDeterminism, SameBytesForAnyThreadCount) {
  const std::vector<int> sizes{100, 1, 0, 155};
  const HostTensor offsets = test::offsets_from_sizes(sizes);
  const HostTensor x = varied_bf16(256, 96);
  const int saved = omp_get_max_threads();
  std::vector<std::vector<uint8_t>> runs;
  for (int threads : {1, 3, 7}) {
    omp_set_num_threads(threads);
    for (BlockAxis axis : {BlockAxis::row, BlockAxis::col}) {
      const MxOut q = quantize(x, axis, ScaleLayout::swizzled, axis == BlockAxis::col ? &offsets : nullptr);
      runs.push_back(bytes_of(q.data));
      runs.push_back(bytes_of(q.scales));
    }
  }
  omp_set_num_threads(saved);
  for (size_t i = 4; i < runs.size(); ++i) EXPECT_EQ(runs[i], runs[i % 4]) << i;
}

TEST(QuantBothOutputs, OneCallEqualsTwoSeparateCalls) {
  const std::vector<int> sizes{40, 88};
  const HostTensor offsets = test::offsets_from_sizes(sizes);
  const HostTensor x = varied_bf16(128, 64);
  const MxOut r = quantize(x, BlockAxis::row, ScaleLayout::swizzled);
  const MxOut c = quantize(x, BlockAxis::col, ScaleLayout::swizzled, &offsets);
  MxOut r2{HostTensor(DType::e4m3, {128, 64}), HostTensor(DType::e8m0, {r.scales.numel()})};
  MxOut c2{HostTensor(DType::e4m3, {128, 64}), HostTensor(DType::e8m0, {c.scales.numel()})};
  for (HostTensor* t : {&r2.data, &r2.scales, &c2.data, &c2.scales}) t->poison();
  QuantizeArgs a;
  a.src = x.view;
  a.groups.offsets = offsets.view;
  a.rowwise = Mxfp8View{r2.data.view, r2.scales.view, BlockAxis::row, ScaleLayout::swizzled};
  a.colwise = Mxfp8View{c2.data.view, c2.scales.view, BlockAxis::col, ScaleLayout::swizzled};
  cpu::quantize(a);
  EXPECT_EQ(bytes_of(r2.data), bytes_of(r.data));
  EXPECT_EQ(bytes_of(r2.scales), bytes_of(r.scales));
  EXPECT_EQ(bytes_of(c2.data), bytes_of(c.data));
  EXPECT_EQ(bytes_of(c2.scales), bytes_of(c.scales));
}

}  // namespace
}  // namespace mxmoe
