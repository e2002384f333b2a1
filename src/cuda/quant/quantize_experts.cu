// cuda::quantize_experts: MXFP8 quantize of E weight matrices [rows, cols] (bf16, one dense
// [E, rows, cols] tensor or E device addresses read on the device only) into dense e4m3
// [E, rows, cols] plus scales [E, bytes]: row-wise (1x32 blocks along cols, rowwise_scale_bytes
// per expert) or column-wise (32x1 blocks along rows, each matrix one group of `rows`,
// colwise_matrix_scale_bytes per expert). Same kernel as cuda::quantize, one grid row per expert.
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuQuant.QuantizeExperts*'
#include "src/cuda/common/check.h"
#include "src/cuda/cuda_ops.h"
#include "src/cuda/quant/quantize_kernel.cuh"

namespace mxmoe::cuda {

void quantize_experts(const detail::QuantizeExpertsStep& s, void* stream_ptr) {
  using namespace quant;
  const cudaStream_t stream = as_stream(stream_ptr);
  const bool row = s.axis == BlockAxis::row;
  if (s.scales.bytes() > 0) {
    MXMOE_CUDA_CHECK(cudaMemsetAsync(s.scales.data, 0, static_cast<size_t>(s.scales.bytes()), stream));
  }
  if (s.experts == 0 || s.rows == 0 || s.cols == 0) return;

  QuantizeParams p;
  p.src = expert_ptrs(s.src, s.rows * s.cols, sizeof(uint16_t));
  p.rows = s.rows;
  p.cols = s.cols;
  p.col_tiles = ceil_div(s.cols, kTileCols);
  p.data_stride = s.rows * s.cols;
  auto* data = s.data.ptr<uint8_t>();
  auto* scales = s.scales.ptr<uint8_t>();
  if (row) {
    p.row_data = data;
    p.row_scales = scales;
    p.row_layout = s.layout;
    p.row_scale_stride = rowwise_scale_bytes(s.rows, s.cols);
  } else {
    p.col_data = data;
    p.col_scales = scales;
    p.col_layout = s.layout;
    p.col_scale_stride = colwise_matrix_scale_bytes(s.rows, s.cols);
  }
  launch_quantize(p, ceil_div(s.rows, kTileRows), s.experts, stream);
}

}  // namespace mxmoe::cuda
