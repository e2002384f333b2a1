// cuda::quantize: MXFP8 quantize of a bf16 [M, K] activation, row-wise and/or column-wise in one
// pass over the input (kernel: quantize_kernel.cuh), column-wise blocks restarting at each group's
// first row with the group offsets read on the device only (group schedule with 32-row m-tiles:
// src/cuda/common/group_schedule.h).
//
// Stream order: memset of the scale buffers (padding and the unused tail rows of the column-wise
// capacity, whose position depends on the device offsets) -> group-schedule kernel (grouped
// column-wise only) -> quantize kernel. No host synchronisation, so it can be captured in a CUDA graph.
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuQuant*'
#include <string>

#include "src/cuda/common/check.h"
#include "src/cuda/cuda_ops.h"
#include "src/cuda/quant/quantize_kernel.cuh"

namespace mxmoe::cuda {
namespace quant {

void launch_quantize(const QuantizeParams& p, int64_t row_tiles, int64_t matrices, cudaStream_t stream) {
  const int64_t blocks = row_tiles * p.col_tiles;
  if (blocks == 0 || matrices == 0) return;  // nothing to quantize (M = 0, K = 0 or E = 0)
  if (blocks > 0x7fffffff || matrices > 65535) {
    throw Error("src", "tensor too large for the quantize grid: " + std::to_string(blocks) + " tiles x " +
                           std::to_string(matrices) + " matrices");
  }
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(matrices));
  const bool row = p.row_data != nullptr, col = p.col_data != nullptr;
  if (row && col) {
    quantize_kernel<true, true><<<grid, kThreads, 0, stream>>>(p);
  } else if (row) {
    quantize_kernel<true, false><<<grid, kThreads, 0, stream>>>(p);
  } else if (col) {
    quantize_kernel<false, true><<<grid, kThreads, 0, stream>>>(p);
  } else {
    return;
  }
  MXMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace quant

void quantize(const QuantizeArgs& a, void* stream_ptr) {
  using namespace quant;
  if ((a.rowwise.data.data && a.rowwise.format == QuantFormat::fp8_block) ||
      (a.colwise.data.data && a.colwise.format == QuantFormat::fp8_block))
    return quantize_fp8_block(a, stream_ptr);
  const cudaStream_t stream = as_stream(stream_ptr);
  const int64_t m = a.src.size(0), k = a.src.size(1);
  const bool row = a.rowwise.data.data != nullptr, col = a.colwise.data.data != nullptr;

  // Every scale byte is defined: zero first, the kernel then overwrites the real scales.
  if (row && a.rowwise.scales.bytes() > 0) {
    MXMOE_CUDA_CHECK(cudaMemsetAsync(a.rowwise.scales.data, 0, static_cast<size_t>(a.rowwise.scales.bytes()), stream));
  }
  if (col && a.colwise.scales.bytes() > 0) {
    MXMOE_CUDA_CHECK(cudaMemsetAsync(a.colwise.scales.data, 0, static_cast<size_t>(a.colwise.scales.bytes()), stream));
  }
  if (m == 0 || k == 0 || !(row || col)) return;

  QuantizeParams p;
  p.src.dense = static_cast<const char*>(a.src.data);
  p.rows = m;
  p.cols = k;
  p.col_tiles = ceil_div(k, kTileCols);
  if (row) {
    p.row_data = a.rowwise.data.ptr<uint8_t>();
    p.row_scales = a.rowwise.scales.ptr<uint8_t>();
    p.row_layout = a.rowwise.layout;
  }
  if (col) {
    p.col_data = a.colwise.data.ptr<uint8_t>();
    p.col_scales = a.colwise.scales.ptr<uint8_t>();
    p.col_layout = a.colwise.layout;
  }
  // Row-wise alone does not care about groups: plain 32-row tiles over M. With a column-wise output
  // the tiles follow the groups (the row-wise output is indifferent to which 32 rows a CTA holds).
  const GroupOffsets groups = col ? a.groups : GroupOffsets{};
  Workspace ws(row_tiles_workspace_bytes(groups, m), stream);
  const RowTiles tiles = row_tiles(groups, m, ws, stream);
  p.sched = tiles.sched;
  launch_quantize(p, tiles.count, 1, stream);
}

namespace {
// The staged bf16 output of a quantizing GLU step: [rows, F] (glu_forward's A) or [rows, 2F] (dC).
int64_t staged_rows(const detail::MGemmStep& s) {
  return (s.gemm.a.is_mxfp8() ? s.gemm.a.mx.data : s.gemm.a.bf16).shape[0];
}
int64_t staged_cols(const detail::MGemmStep& s) {
  return s.epilogue == detail::Epilogue::glu_forward ? s.ffn : 2 * s.ffn;
}
}  // namespace

bool has_quantized_outputs(const detail::MGemmStep& s) {
  return s.epilogue != detail::Epilogue::store && (s.out_row.data.data != nullptr || s.out_col.data.data != nullptr);
}

int64_t staged_output_bytes(const detail::MGemmStep& s) {
  if (!has_quantized_outputs(s) || s.out_bf16.data != nullptr) return 0;
  return Workspace::aligned(staged_rows(s) * staged_cols(s) * 2);
}

detail::MGemmStep with_bf16_output(detail::MGemmStep s, Workspace& ws) {
  if (!has_quantized_outputs(s)) return s;
  if (s.out_bf16.data == nullptr) {
    const int64_t rows = staged_rows(s), cols = staged_cols(s);
    const Device d = (s.gemm.a.is_mxfp8() ? s.gemm.a.mx.data : s.gemm.a.bf16).device;
    s.out_bf16 = TensorView::of(ws.take<uint16_t>(rows * cols), DType::bf16, {rows, cols}, d);
  }
  s.out_row = Mxfp8View{};
  s.out_col = Mxfp8View{};
  return s;
}

void quantize_outputs(const detail::MGemmStep& s, const TensorView& bf16, void* stream) {
  QuantizeArgs q;
  q.src = bf16;
  q.groups = s.gemm.offsets;
  q.rowwise = s.out_row;
  q.colwise = s.out_col;
  q.pow2_scales = s.pow2_scales;
  quantize(q, stream);
}

MxOut fused_mx_outputs(const detail::MGemmStep& s, void* stream) {
  MxOut o;
  auto take = [&](const Mxfp8View& v, uint8_t*& data, uint8_t*& scales, ScaleLayout& layout) {
    // With T = 0 the data pointer may be null while scales exist: their padding still reads 0.
    if (v.scales.data != nullptr && v.scales.bytes() > 0)
      MXMOE_CUDA_CHECK(cudaMemsetAsync(v.scales.data, 0, static_cast<size_t>(v.scales.bytes()), as_stream(stream)));
    if (v.data.data == nullptr) return;
    data = v.data.ptr<uint8_t>();
    scales = v.scales.ptr<uint8_t>();
    layout = v.layout;
  };
  take(s.out_row, o.row_data, o.row_scales, o.row_layout);
  take(s.out_col, o.col_data, o.col_scales, o.col_layout);
  return o;
}

}  // namespace mxmoe::cuda
