// cuda_sm100's scale repack on the CPU (src/cuda/sm100/scale_repack.h, the math of the kernels in
// grouped_operands.cu): the kernels' loops replayed on the host over fresh random scales in both of
// mxmoe's layouts, then every scale of every group checked against the layout definition
// (include/mxmoe/mxfp8_layout.h) at the place CUTLASS reads it: each group's swizzled matrix at its
// own 128 x 4 tile (row-wise activations), each expert's at e * rowwise_scale_bytes (weights, both
// axes), each group's column-wise chunk in mxmoe's own swizzled placement (wgrad). Group tails,
// empty groups (first, middle, last) and a group over two tiles; padding must come out zero and
// bytes past the used part untouched (the destination is poisoned). No GPU needed.
// Run: <build>/tests/mxmoe_unit_tests --gtest_filter='Sm100ScaleRepack.*'
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "src/cuda/sm100/scale_repack.h"

namespace mxmoe::cuda::sm100 {
namespace {

constexpr uint8_t kPoison = 0xA5;

// What the device group schedule holds for each group (src/cuda/common/group_schedule.h), stated
// here from the definition: rows [begin, end), tile_start = sum ceil(m / 128), col_chunk = sum of
// the column-wise chunk heights.
struct Group {
  int64_t begin, end, tile_start, col_chunk;
};
std::vector<Group> schedule_of(const std::vector<int64_t>& rows) {
  std::vector<Group> s;
  int64_t begin = 0, tiles = 0, chunk = 0;
  for (int64_t m : rows) {
    s.push_back({begin, begin + m, tiles, chunk});
    begin += m;
    tiles += (m + 127) / 128;
    chunk += m == 0 ? 0 : ((m + 31) / 32 + 3) / 4 * 4;
  }
  return s;
}
int64_t total_of(const std::vector<int64_t>& rows) {
  int64_t t = 0;
  for (int64_t m : rows) t += m;
  return t;
}

std::vector<uint8_t> random_bytes(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> v(static_cast<size_t>(n));
  for (uint8_t& b : v) b = static_cast<uint8_t>(1 + gen() % 254);  // never 0: padding must be told apart
  return v;
}

void store_word(std::vector<uint8_t>& dst, int64_t at, uint32_t w) {
  ASSERT_EQ(at % 4, 0);
  ASSERT_LE(at + 4, static_cast<int64_t>(dst.size()));
  for (int b = 0; b < 4; ++b) dst[at + b] = static_cast<uint8_t>(w >> (8 * b));
}

// repack_token_rows_kernel, replayed: every padded row of every m-tile of every group.
std::vector<uint8_t> repack_token_rows(const std::vector<uint8_t>& src, ScaleLayout layout,
                                       const std::vector<int64_t>& rows, int64_t k) {
  const std::vector<Group> s = schedule_of(rows);
  const int64_t c_pad = rowwise_scale_cols(k);
  std::vector<uint8_t> dst(token_rows_capacity(total_of(rows), static_cast<int64_t>(rows.size()), k), kPoison);
  for (const Group& g : s) {
    const int64_t m = g.end - g.begin;
    for (int64_t local = 0; local < round_up(m, 128); ++local)
      for (int64_t q = 0; q < c_pad / 4; ++q) {
        const int64_t r = g.tile_start * 128 + local;
        store_word(dst, word_offset(r, q, c_pad),
                   pack_word(
                       src.data(), [&](int64_t j) { return token_rows_source(g.begin, m, local, j, k, layout); }, q));
      }
  }
  return dst;
}

const ScaleLayout kLayouts[] = {ScaleLayout::compact, ScaleLayout::swizzled};

TEST(Sm100ScaleRepack, TokenRowScalesStartEveryGroupAtItsOwnTile) {
  const std::vector<int64_t> rows = {0, 37, 128, 200, 0, 1, 129, 0};
  const int64_t t = total_of(rows), k = 160, kblocks = k / 32, c_pad = rowwise_scale_cols(k);
  for (ScaleLayout layout : kLayouts) {
    const std::vector<uint8_t> src = random_bytes(rowwise_scale_bytes(t, k), 7);
    const std::vector<uint8_t> dst = repack_token_rows(src, layout, rows, k);
    std::vector<bool> real(dst.size(), false);
    int64_t base = 0, begin = 0;  // group g's matrix: after the padded rows of the groups before it
    const std::vector<Group> s = schedule_of(rows);
    for (size_t g = 0; g < rows.size(); ++g) {
      EXPECT_EQ(token_rows_offset(s[g].tile_start, k), base) << "group " << g;  // the prepare kernel's pointer
      for (int64_t row = begin; row < begin + rows[g]; ++row)
        for (int64_t j = 0; j < kblocks; ++j) {
          const int64_t at = base + swizzled_scale_index(row - begin, j, c_pad);
          ASSERT_EQ(dst[at], src[rowwise_scale_index(row, j, k, layout)])
              << "group " << g << " row " << row << " j " << j;
          real[at] = true;
        }
      base += round_up(rows[g], 128) * c_pad;
      begin += rows[g];
    }
    for (int64_t i = 0; i < static_cast<int64_t>(dst.size()); ++i) {
      if (real[i]) continue;
      ASSERT_EQ(dst[i], i < base ? 0 : kPoison) << "byte " << i << " of " << base << " used";
    }
  }
}

TEST(Sm100ScaleRepack, TokenRowCapacityHoldsEverySplit) {
  std::mt19937 gen(3);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t experts = 1 + gen() % 40, t = gen() % 5000, k = 32 * (1 + gen() % 10);
    std::vector<int64_t> rows(static_cast<size_t>(experts), 0);
    for (int64_t i = 0; i < t; ++i) ++rows[trial % 2 ? gen() % experts : 0];  // spread, or all in one group
    int64_t used = 0;
    for (int64_t m : rows) used += round_up(m, 128) * rowwise_scale_cols(k);
    EXPECT_LE(used, token_rows_capacity(t, experts, k)) << t << " rows, " << experts << " groups";
  }
}

TEST(Sm100ScaleRepack, ExpertScalesOfBothAxesAreOneSwizzledMatrixPerExpert) {
  const int64_t experts = 3, n = 200, k = 160, kblocks = k / 32, c_pad = rowwise_scale_cols(k);
  for (BlockAxis axis : {BlockAxis::row, BlockAxis::col}) {
    for (ScaleLayout layout : kLayouts) {
      // Row-wise B_e [N, K] or column-wise B_e [K, N]: one scale matrix per expert, dense [E, bytes].
      const int64_t per_expert = axis == BlockAxis::row ? rowwise_scale_bytes(n, k) : colwise_matrix_scale_bytes(k, n);
      EXPECT_EQ(rowwise_scale_bytes(n, k), colwise_matrix_scale_bytes(k, n));  // what the prepare kernel assumes
      const std::vector<uint8_t> src = random_bytes(experts * per_expert, 11);
      std::vector<uint8_t> dst(static_cast<size_t>(experts * rowwise_scale_bytes(n, k)), kPoison);
      // repack_expert_kernel, replayed.
      for (int64_t e = 0; e < experts; ++e)
        for (int64_t i = 0; i < round_up(n, 128); ++i)
          for (int64_t q = 0; q < c_pad / 4; ++q) {
            const uint8_t* m = src.data() + e * per_expert;
            store_word(dst, word_offset(e * round_up(n, 128) + i, q, c_pad),
                       pack_word(
                           m,
                           [&](int64_t j) {
                             return axis == BlockAxis::row ? expert_rows_source(i, j, n, k, layout)
                                                           : expert_cols_source(i, j, n, k, layout);
                           },
                           q));
          }
      std::vector<bool> real(dst.size(), false);
      for (int64_t e = 0; e < experts; ++e)
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < kblocks; ++j) {
            const int64_t at = expert_matrix_offset(e, n, k) + swizzled_scale_index(i, j, c_pad);
            const int64_t from = e * per_expert + (axis == BlockAxis::row ? rowwise_scale_index(i, j, k, layout)
                                                                          : colwise_scale_index(0, k, j, i, n, layout));
            ASSERT_EQ(dst[at], src[from]) << "expert " << e << " i " << i << " j " << j;
            real[at] = true;
          }
      for (size_t i = 0; i < dst.size(); ++i) {
        if (!real[i]) {
          ASSERT_EQ(dst[i], 0) << "padding byte " << i;
        }
      }
    }
  }
}

// The wgrad's column-wise chunks: the repacked buffer is mxmoe's own swizzled column-wise layout
// (each chunk is already CUTLASS's per-group layout, test_sm100_layout.cu) with zero padding.
TEST(Sm100ScaleRepack, TokenColumnChunksAreTheSwizzledPlacementWithZeroPadding) {
  const std::vector<int64_t> rows = {0, 1, 31, 33, 128, 0, 200, 7, 0};
  const int64_t t = total_of(rows), experts = static_cast<int64_t>(rows.size()), mn = 300;
  const int64_t row_bytes = colwise_scale_row_bytes(mn);
  const std::vector<Group> s = schedule_of(rows);
  for (ScaleLayout layout : kLayouts) {
    const std::vector<uint8_t> src = random_bytes(colwise_scale_bytes(t, mn, experts), 5);
    std::vector<uint8_t> dst(src.size(), kPoison);
    // repack_token_cols_kernel, replayed: every quad of scale rows of the capacity, every column.
    for (int64_t quad = 0; quad < ceil_div(colwise_scale_rows_capacity(t, experts), 4); ++quad)
      for (int64_t i = 0; i < row_bytes; ++i) {
        const int64_t row = quad * 4;
        const Group& g = s[chunk_group(s.data(), static_cast<int>(experts), row)];
        const int64_t m = g.end - g.begin, c_pad = colwise_group_scale_rows(m);
        if (row < g.col_chunk || row >= g.col_chunk + c_pad) continue;
        const int64_t q = (row - g.col_chunk) / 4;
        store_word(dst, token_cols_offset(g.col_chunk, mn) + word_offset(i, q, c_pad),
                   pack_word(
                       src.data(), [&](int64_t j) { return token_cols_source(g.col_chunk, m, i, j, mn, layout); }, q));
      }
    std::vector<bool> real(dst.size(), false);
    int64_t chunk = 0;
    for (size_t g = 0; g < rows.size(); ++g) {
      const int64_t m = rows[g];
      EXPECT_EQ(s[g].col_chunk, chunk);
      for (int64_t j = 0; j < ceil_div(m, 32); ++j)
        for (int64_t i = 0; i < mn; ++i) {
          const int64_t at = colwise_scale_index(chunk, m, j, i, mn, ScaleLayout::swizzled);
          ASSERT_EQ(dst[at], src[colwise_scale_index(chunk, m, j, i, mn, layout)]) << "group " << g << " j " << j;
          real[at] = true;
        }
      chunk += colwise_group_scale_rows(m);
    }
    const int64_t used = chunk * row_bytes;
    for (int64_t i = 0; i < static_cast<int64_t>(dst.size()); ++i) {
      if (real[i]) continue;
      ASSERT_EQ(dst[i], i < used ? 0 : kPoison) << "byte " << i << " of " << used << " used";
    }
  }
}

}  // namespace
}  // namespace mxmoe::cuda::sm100
