// cuda_sm100's scale-factor placement, on the host: CUTLASS's Sm1xxBlockScaledConfig<32> layouts
// (what the sm100 block-scaled kernels read, src/cuda/sm100/grouped_gemm.cuh) against mxmoe's own
// definitions (include/mxmoe/mxfp8_layout.h, docs/numerics.md "Scale layouts", "Grouped scale
// placement"), including tails (M, N, K not multiples of 128 / 32 x 4) and the per-group chunks of
// the k-grouped (wgrad) scales; and what the prepare kernels assume each group occupies.
// Run: <build>/tests/mxmoe_sm100_layout_tests
#include <gtest/gtest.h>

#include <cute/tensor.hpp>
#include <cutlass/detail/sm100_blockscaled_layout.hpp>
#include <vector>

#include "mxmoe/mxfp8_layout.h"

namespace mxmoe {
namespace {
using Config = cutlass::detail::Sm1xxBlockScaledConfig<32>;

struct Shape3 {
  int m, n, k;
};
const Shape3 kShapes[] = {{1, 64, 32},     {37, 256, 96},     {128, 128, 128}, {200, 512, 4096},
                          {300, 64, 7168}, {1000, 2048, 160}, {129, 300, 2880}};

// Row-wise (m-grouped A and B_e [N, K]): element (i, k) of one matrix -> swizzled_scale_index(i, k / 32).
TEST(Sm100Layout, RowwiseScalesAreTheSwizzledLayout) {
  for (const Shape3& s : kShapes) {
    const auto sfa = Config::tile_atom_to_shape_SFA(cute::make_shape(s.m, s.n, s.k, 1));
    const auto sfb = Config::tile_atom_to_shape_SFB(cute::make_shape(s.m, s.n, s.k, 1));
    const int64_t c_pad = rowwise_scale_cols(s.k);
    for (int i = 0; i < s.m; ++i)
      for (int k = 0; k < s.k; k += 3)
        ASSERT_EQ(static_cast<int64_t>(sfa(i, k, 0)), swizzled_scale_index(i, k / 32, c_pad)) << s.m << " " << s.k;
    for (int i = 0; i < s.n; ++i)
      for (int k = 0; k < s.k; k += 5)
        ASSERT_EQ(static_cast<int64_t>(sfb(i, k, 0)), swizzled_scale_index(i, k / 32, c_pad)) << s.n << " " << s.k;
    // One group's matrix spans its padded tiles: rows to 128, K-blocks to 4 (rowwise_scale_bytes).
    EXPECT_EQ(static_cast<int64_t>(cute::size(cute::filter_zeros(sfa))), rowwise_scale_bytes(s.m, s.k));
    EXPECT_EQ(static_cast<int64_t>(cute::size(cute::filter_zeros(sfb))), rowwise_scale_bytes(s.n, s.k));
  }
}

// k-grouped (wgrad): CUTLASS's SFA of group e (M = output rows, K = the group's tokens) is mxmoe's
// column-wise chunk of the group in the swizzled layout (MN index = column, block j = token / 32),
// starting at the chunk's first byte; the chunks follow one another as colwise_scale_index places them.
TEST(Sm100Layout, ColumnwiseGroupChunksAreTheKGroupedLayout) {
  const int M = 300;  // output rows of D_e = the operand's columns
  const std::vector<int> tokens = {0, 1, 31, 33, 128, 200, 7};
  int64_t chunk_row = 0;
  for (int t : tokens) {
    const auto sf = Config::tile_atom_to_shape_SFA(cute::make_shape(M, 64, t, 1));
    const int64_t base = chunk_row * colwise_scale_row_bytes(M);
    for (int i = 0; i < M; ++i)
      for (int tok = 0; tok < t; ++tok)
        ASSERT_EQ(base + static_cast<int64_t>(sf(i, tok, 0)),
                  colwise_scale_index(chunk_row, t, tok / 32, i, M, ScaleLayout::swizzled))
            << "t " << t << " i " << i << " tok " << tok;
    if (t > 0) {
      EXPECT_EQ(static_cast<int64_t>(cute::size(cute::filter_zeros(sf))),
                colwise_group_scale_rows(t) * colwise_scale_row_bytes(M));
    }
    chunk_row += colwise_group_scale_rows(t);
  }
}

}  // namespace
}  // namespace mxmoe
