// CPU reference MXFP8 quantize / dequantize (docs/numerics.md "Scale rule",
// "E4M3 cast", "Quantized value", "Group restarts").
//
// Computes, from bf16 src [M, K] (row-major):
//   row-wise    e4m3 data [M, K] + one E8M0 scale per 1x32 block along K (rowwise_scale_index);
//   column-wise e4m3 data [M, K] (not transposed) + one E8M0 scale per 32x1 block along M. Blocks
//               restart at every group's first row and a group's last block may be partial (its
//               amax covers only the rows that exist); group e's scale chunk starts at scale row
//               s_e = sum_{h<e} colwise_group_scale_rows(m_h) (colwise_scale_index).
// Per block: amax over the bf16 values ignoring NaN, e = e8m0_from_amax(amax),
//   q = e4m3_from_f32(x * 2^(127-e)); dequantize is x = e4m3(q) * 2^(e-127).
// Every byte of a scale buffer is written: padding is zero. All paths share quantize_block and
// dequantize_block; OpenMP splits rows, column blocks or (expert, row) pairs, each written by
// exactly one thread, so the result does not depend on the thread count.
// Run: <build>/tests/mxmoe_unit_tests --gtest_filter='Quant*'
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "mxmoe/numerics.h"
#include "src/common/experts.h"
#include "src/common/fp8_block.h"
#include "src/cpu/cpu_ops.h"
#include "src/cpu/fp8_block.h"
#include "src/cpu/gemm_core.h"

namespace mxmoe::cpu {
using gemm_detail::parallel_worth;

namespace {

// ---- the block routines every path uses: n <= 32 values, element i at offset i * stride ----

uint8_t quantize_block(const uint16_t* src, int64_t stride, int64_t n, uint8_t* dst) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = amax_update(amax, f32_from_bf16(src[i * stride]));
  const uint8_t e = e8m0_from_amax(amax);
  const float r = e8m0_encode_multiplier(e);  // a power of two, so x * r is exact
  for (int64_t i = 0; i < n; ++i) dst[i * stride] = e4m3_from_f32(f32_from_bf16(src[i * stride]) * r);
  return e;
}

// Destination of dequantized values: f32 or bf16 (rounded to nearest even).
struct DequantOut {
  void* base = nullptr;
  bool bf16 = false;
  void put(int64_t idx, float v) const {
    if (bf16) {
      static_cast<uint16_t*>(base)[idx] = bf16_from_f32(v);
    } else {
      static_cast<float*>(base)[idx] = v;
    }
  }
};

void dequantize_block(const uint8_t* src, int64_t stride, int64_t n, uint8_t e, const DequantOut& out,
                      int64_t out_idx) {
  const float s = e8m0_to_f32(e);
  for (int64_t i = 0; i < n; ++i) out.put(out_idx + i * stride, e4m3_to_f32(src[i * stride]) * s);
}

// ---- row-wise: one matrix row, K / 32 blocks ----

void quantize_row(const uint16_t* src, uint8_t* dst, int64_t row, int64_t k, uint8_t* scales,
                  ScaleLayout layout) {
  for (int64_t kb = 0; kb < k / kMxBlock; ++kb) {
    scales[rowwise_scale_index(row, kb, k, layout)] =
        quantize_block(src + kb * kMxBlock, 1, kMxBlock, dst + kb * kMxBlock);
  }
}

void check_rowwise(int64_t m, int64_t k, int64_t scale_bytes, const char* what) {
  if (k % kMxBlock != 0) throw Error(what, "row-wise MXFP8 needs K % 32 == 0, got K=" + std::to_string(k));
  if (scale_bytes < rowwise_scale_bytes(m, k)) {
    throw Error(what, "scale buffer has " + std::to_string(scale_bytes) + " bytes, needs " +
                          std::to_string(rowwise_scale_bytes(m, k)));
  }
}

// ---- column-wise: one 32x1 block row (up to 32 rows x all K columns) of one group ----

struct ColBlock {
  int64_t row;         // first row of the block, relative to the matrix
  int64_t rows;        // 1..32 (fewer only for a group's last block)
  int64_t group_rows;  // m of the block's group
  int64_t chunk_row;   // s_e of the block's group
  int64_t j;           // block index inside the group
  int64_t matrix;      // which matrix (quantize_experts: expert index; else 0)
};

struct Group {
  int64_t begin, rows;
};

// Groups from host offsets (clamped to [0, total] and kept monotone), else one group of all rows.
std::vector<Group> groups_of(const GroupOffsets& g, int64_t total) {
  if (g.offsets.data == nullptr) return {{0, total}};
  std::vector<Group> out;
  const int32_t* off = g.data();
  int64_t prev = clamp_offset(off[0], total);
  for (int64_t e = 0; e < g.experts(); ++e) {
    const int64_t hi = std::max(prev, clamp_offset(off[e + 1], total));
    out.push_back({prev, hi - prev});
    prev = hi;
  }
  return out;
}

// Appends the blocks of the groups of one matrix; returns the scale rows they occupy.
int64_t append_col_blocks(const std::vector<Group>& groups, int64_t matrix, std::vector<ColBlock>& out) {
  int64_t chunk_row = 0;
  for (const Group& g : groups) {
    for (int64_t j = 0; j * kMxBlock < g.rows; ++j) {
      const int64_t rows = std::min<int64_t>(kMxBlock, g.rows - j * kMxBlock);
      out.push_back({g.begin + j * kMxBlock, rows, g.rows, chunk_row, j, matrix});
    }
    chunk_row += colwise_group_scale_rows(g.rows);
  }
  return chunk_row;
}

void check_colwise(int64_t scale_rows, int64_t k, int64_t scale_bytes, const char* what) {
  if (scale_bytes < scale_rows * colwise_scale_row_bytes(k)) {
    throw Error(what, "scale buffer has " + std::to_string(scale_bytes) + " bytes, needs " +
                          std::to_string(scale_rows * colwise_scale_row_bytes(k)));
  }
}

// src and dst point at the matrix's first element; scales at its scale buffer.
void quantize_col_block(const uint16_t* src, uint8_t* dst, int64_t k, const ColBlock& b, uint8_t* scales,
                        ScaleLayout layout) {
  const int64_t first = b.row * k;
  for (int64_t i = 0; i < k; ++i) {
    scales[colwise_scale_index(b.chunk_row, b.group_rows, b.j, i, k, layout)] =
        quantize_block(src + first + i, k, b.rows, dst + first + i);
  }
}

void check_fp8_count(int64_t have, int64_t need, const char* what) {
  if (have < need)
    throw Error(what, "scale buffer has " + std::to_string(have) + " floats, needs " + std::to_string(need));
}

// FP8 blockwise outputs of quantize() (docs/numerics.md "FP8 blockwise").
void quantize_fp8_block(const QuantizeArgs& a) {
  const int64_t m = a.src.size(0), k = a.src.size(1);
  const auto* src = a.src.ptr<const uint16_t>();
  if (a.rowwise.data.data != nullptr) {
    check_fp8_count(a.rowwise.scales.numel(), fp8_rowwise_scale_count(m, k), "rowwise.scales");
    fp8_quantize_rows(src, m, k, a.pow2_scales, a.rowwise.data.ptr<uint8_t>(), a.rowwise.scales.ptr<float>());
  }
  if (a.colwise.data.data != nullptr) {
    const std::vector<int32_t> off = gemm_detail::fp8_offsets(a.groups, m);
    const int64_t experts = off.empty() ? 1 : static_cast<int64_t>(off.size()) - 1;
    const int64_t scale_rows = k > 0 ? a.colwise.scales.numel() / k : 0;
    fp8_quantize_token_blocks(src, m, k, off.empty() ? nullptr : off.data(), experts, a.pow2_scales,
                              a.colwise.data.ptr<uint8_t>(), a.colwise.scales.ptr<float>(), scale_rows);
  }
}

}  // namespace

void quantize(const QuantizeArgs& a) {
  const int64_t m = a.src.size(0), k = a.src.size(1);
  const auto* src = a.src.ptr<const uint16_t>();
  const bool fp8_row = a.rowwise.data.data != nullptr && a.rowwise.format == QuantFormat::fp8_block;
  const bool fp8_col = a.colwise.data.data != nullptr && a.colwise.format == QuantFormat::fp8_block;
  if (fp8_row || fp8_col) {
    if ((a.rowwise.data.data != nullptr && !fp8_row) || (a.colwise.data.data != nullptr && !fp8_col))
      throw Error("colwise", "rowwise and colwise outputs of one quantize must have the same format");
    quantize_fp8_block(a);
    return;
  }

  if (a.rowwise.data.data != nullptr) {
    const Mxfp8View& out = a.rowwise;
    check_rowwise(m, k, out.scales.numel(), "rowwise.scales");
    auto* data = out.data.ptr<uint8_t>();
    auto* scales = out.scales.ptr<uint8_t>();
    std::memset(scales, 0, static_cast<size_t>(out.scales.numel()));
#pragma omp parallel for schedule(static) if (parallel_worth(m * k))
    for (int64_t r = 0; r < m; ++r) quantize_row(src + r * k, data + r * k, r, k, scales, out.layout);
  }

  if (a.colwise.data.data != nullptr) {
    const Mxfp8View& out = a.colwise;
    std::vector<ColBlock> blocks;
    const int64_t scale_rows = append_col_blocks(groups_of(a.groups, m), 0, blocks);
    check_colwise(scale_rows, k, out.scales.numel(), "colwise.scales");
    auto* data = out.data.ptr<uint8_t>();
    auto* scales = out.scales.ptr<uint8_t>();
    std::memset(scales, 0, static_cast<size_t>(out.scales.numel()));
    const auto n = static_cast<int64_t>(blocks.size());
#pragma omp parallel for schedule(static) if (parallel_worth(n * kMxBlock * k))
    for (int64_t b = 0; b < n; ++b) quantize_col_block(src, data, k, blocks[b], scales, out.layout);
  }
}

void dequantize(const DequantizeArgs& a) {
  const Mxfp8View& in = a.src;
  const int64_t m = in.data.size(0), k = in.data.size(1);
  const auto* data = in.data.ptr<const uint8_t>();
  const auto* scales = in.scales.ptr<const uint8_t>();
  const DequantOut out{a.dst.data, a.dst.dtype == DType::bf16};

  if (in.axis == BlockAxis::row) {
    check_rowwise(m, k, in.scales.numel(), "src.scales");
#pragma omp parallel for schedule(static) if (parallel_worth(m * k))
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t kb = 0; kb < k / kMxBlock; ++kb) {
        const int64_t first = r * k + kb * kMxBlock;
        dequantize_block(data + first, 1, kMxBlock, scales[rowwise_scale_index(r, kb, k, in.layout)], out,
                         first);
      }
    }
    return;
  }

  std::vector<ColBlock> blocks;
  const int64_t scale_rows = append_col_blocks(groups_of(a.groups, m), 0, blocks);
  check_colwise(scale_rows, k, in.scales.numel(), "src.scales");
  const auto n = static_cast<int64_t>(blocks.size());
#pragma omp parallel for schedule(static) if (parallel_worth(n * kMxBlock * k))
  for (int64_t bi = 0; bi < n; ++bi) {
    const ColBlock& b = blocks[bi];
    for (int64_t i = 0; i < k; ++i) {
      const uint8_t e = scales[colwise_scale_index(b.chunk_row, b.group_rows, b.j, i, k, in.layout)];
      dequantize_block(data + b.row * k + i, k, b.rows, e, out, b.row * k + i);
    }
  }
}

namespace {
// QuantizeExpertsStep::dequantized: bf16(e4m3_to_f32(q) * e8m0_to_f32(s)) of every quantized value.
void write_dequantized(const detail::QuantizeExpertsStep& s, int64_t scale_bytes) {
  if (s.dequantized.data == nullptr) return;
  const int64_t rows = s.rows, cols = s.cols, elems = rows * cols;
  const auto* data = s.data.ptr<const uint8_t>();
  const auto* scales = s.scales.ptr<const uint8_t>();
  auto* out = s.dequantized.ptr<uint16_t>();
  const bool col = s.axis == BlockAxis::col;
#pragma omp parallel for collapse(2) schedule(static) if (parallel_worth(s.experts * elems))
  for (int64_t e = 0; e < s.experts; ++e) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t si = col ? colwise_scale_index(0, rows, r / 32, c, cols, s.layout)
                               : rowwise_scale_index(r, c / 32, cols, s.layout);
        const int64_t i = e * elems + r * cols + c;
        out[i] = bf16_from_f32(e4m3_to_f32(data[i]) * e8m0_to_f32(scales[e * scale_bytes + si]));
      }
    }
  }
}
}  // namespace

void quantize_experts(const detail::QuantizeExpertsStep& s) {
  const int64_t rows = s.rows, cols = s.cols, elems = rows * cols;
  const ExpertPtrs src = expert_ptrs(s.src, elems, sizeof(uint16_t));
  if (s.format == QuantFormat::fp8_block) {
    // 128x128 blocks of each expert's [rows, cols] (one copy for fprop and dgrad).
    const int64_t per = fp8_weight_scale_count(rows, cols);
    check_fp8_count(s.scales.numel(), s.experts * per, "scales");
    for (int64_t e = 0; e < s.experts; ++e)
      fp8_quantize_weights(src.at<const uint16_t>(e), 1, rows, cols, s.pow2_scales, s.data.ptr<uint8_t>() + e * elems,
                           s.scales.ptr<float>() + e * per);
    return;
  }
  const int64_t scale_bytes =
      s.axis == BlockAxis::row ? rowwise_scale_bytes(rows, cols) : colwise_matrix_scale_bytes(rows, cols);
  if (s.data.data == nullptr && s.dequantized.data != nullptr) {
    // Only the bf16 copy is asked for: quantize into scratch, keep the dequantized values.
    std::vector<uint8_t> scratch(static_cast<size_t>(s.experts * (elems + scale_bytes)));
    detail::QuantizeExpertsStep full = s;
    full.data = TensorView::of(scratch.data(), DType::e4m3, {s.experts, rows, cols});
    full.scales = TensorView::of(scratch.data() + s.experts * elems, DType::e8m0, {s.experts, scale_bytes});
    quantize_experts(full);
    return;
  }
  auto* data = s.data.ptr<uint8_t>();
  auto* scales = s.scales.ptr<uint8_t>();
  if (s.scales.numel() < s.experts * scale_bytes) {
    throw Error("scales", "buffer has " + std::to_string(s.scales.numel()) + " bytes, needs " +
                              std::to_string(s.experts * scale_bytes));
  }
  std::memset(scales, 0, static_cast<size_t>(s.scales.numel()));

  if (s.axis == BlockAxis::row) {
    check_rowwise(rows, cols, scale_bytes, "cols");
#pragma omp parallel for collapse(2) schedule(static) if (parallel_worth(s.experts * rows * cols))
    for (int64_t e = 0; e < s.experts; ++e) {
      for (int64_t r = 0; r < rows; ++r) {
        quantize_row(src.at<const uint16_t>(e) + r * cols, data + e * elems + r * cols, r, cols,
                     scales + e * scale_bytes, s.layout);
      }
    }
    write_dequantized(s, scale_bytes);
    return;
  }

  std::vector<ColBlock> blocks;
  for (int64_t e = 0; e < s.experts; ++e) append_col_blocks({{0, rows}}, e, blocks);
  const auto n = static_cast<int64_t>(blocks.size());
#pragma omp parallel for schedule(static) if (parallel_worth(n * kMxBlock * cols))
  for (int64_t bi = 0; bi < n; ++bi) {
    const ColBlock& b = blocks[bi];
    quantize_col_block(src.at<const uint16_t>(b.matrix), data + b.matrix * elems, cols, b,
                       scales + b.matrix * scale_bytes, s.layout);
  }
  write_dequantized(s, scale_bytes);
}

}  // namespace mxmoe::cpu
