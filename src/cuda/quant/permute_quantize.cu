// cuda::permute_quantize_rows: the rows of a row_map, quantized to MXFP8 (row-wise and/or
// column-wise, blocks restarting at each expert's first row) as they are gathered, optionally with
// their bf16 copy (docs/kernels/permute.md "Quantized outputs"). Bit-identical to permute_rows
// followed by quantize of the kept rows (the CPU reference runs exactly that composition).
//
// Stream order: memset of the scale buffers (every byte not of a block reads 0, as cuda::quantize)
// and of the inverse map (-1) -> inverse-map kernel (one thread per slot: source token of every
// permuted row, and the probabilities in row order) -> group schedule of 32-row tiles from the
// device offsets -> the one-pass quantize kernel (quantize_kernel.cuh) reading row r from
// x[inverse[r]]. Only rows inside a group are read or written, so the rows past offsets[E] of every
// output are untouched. No host synchronisation: capturable in a CUDA graph.
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuPermuteQuantize*'
#include "src/cuda/common/check.h"
#include "src/cuda/permute_quantize.h"
#include "src/cuda/quant/quantize_kernel.cuh"

namespace mxmoe::cuda {
namespace {

// source[row] = the token of the slot that names row; permuted_probs[row] = its probability. Slots
// whose entry is outside [0, rows) are dropped (permute_rows' rule).
__global__ void inverse_row_map_kernel(const int32_t* __restrict__ row_map, int64_t slots, int64_t top_k,
                                       int64_t rows, const float* __restrict__ probs, int32_t* __restrict__ source,
                                       float* __restrict__ permuted_probs) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= slots) return;
  const int32_t row = row_map[i];
  if (row < 0 || row >= rows) return;
  source[row] = static_cast<int32_t>(i / top_k);
  if (permuted_probs != nullptr) permuted_probs[row] = probs[i];
}

}  // namespace

void permute_quantize_rows(const detail::PermuteQuantizeStep& s, void* stream_ptr) {
  using namespace quant;
  const cudaStream_t stream = as_stream(stream_ptr);
  const bool row = s.rowwise.data.data != nullptr, col = s.colwise.data.data != nullptr;
  if (row && s.rowwise.scales.bytes() > 0)
    MXMOE_CUDA_CHECK(cudaMemsetAsync(s.rowwise.scales.data, 0, static_cast<size_t>(s.rowwise.scales.bytes()), stream));
  if (col && s.colwise.scales.bytes() > 0)
    MXMOE_CUDA_CHECK(cudaMemsetAsync(s.colwise.scales.data, 0, static_cast<size_t>(s.colwise.scales.bytes()), stream));
  const int64_t R = s.rows, H = s.move.x.shape[1], slots = s.move.row_map.numel(), K = s.move.row_map.shape[1];
  if (R == 0) return;

  Workspace ws(Workspace::aligned(R * 4) + row_tiles_workspace_bytes(s.groups, R), stream);
  int32_t* source = ws.take<int32_t>(R);
  MXMOE_CUDA_CHECK(cudaMemsetAsync(source, 0xff, static_cast<size_t>(R) * 4, stream));
  if (slots > 0) {
    constexpr int kBlock = 256;
    const int64_t blocks = ceil_div(slots, kBlock);
    inverse_row_map_kernel<<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(
        s.move.row_map.ptr<const int32_t>(), slots, K, R, s.move.probs.ptr<const float>(), source,
        s.move.permuted_probs.ptr<float>());
    MXMOE_CUDA_CHECK_LAUNCH();
  }
  if (H == 0 || !(row || col || s.move.permuted_x.data)) return;

  QuantizeParams p;
  p.src.dense = static_cast<const char*>(s.move.x.data);
  p.rows = R;
  p.cols = H;
  p.col_tiles = ceil_div(H, kTileCols);
  p.src_rows = source;
  p.copy = s.move.permuted_x.ptr<uint16_t>();
  if (row) {
    p.row_data = s.rowwise.data.ptr<uint8_t>();
    p.row_scales = s.rowwise.scales.ptr<uint8_t>();
    p.row_layout = s.rowwise.layout;
  }
  if (col) {
    p.col_data = s.colwise.data.ptr<uint8_t>();
    p.col_scales = s.colwise.scales.ptr<uint8_t>();
    p.col_layout = s.colwise.layout;
  }
  // Tiles follow the groups for every output (row-wise too): the rows past offsets[E] are in no tile.
  const RowTiles tiles = row_tiles(s.groups, R, ws, stream);
  p.sched = tiles.sched;
  launch_quantize(p, tiles.count, 1, stream);
}

}  // namespace mxmoe::cuda
