// Non-owning tensor views. mxmoe never takes ownership of caller memory; every view is a
// contiguous row-major tensor of rank 1..3 on one device.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>

#include "mxmoe/mxfp8_layout.h"
#include "mxmoe/types.h"

namespace mxmoe {

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  int rank = 0;
  std::array<int64_t, 3> shape{0, 0, 0};
  Device device{};

  static TensorView of(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device = {}) {
    TensorView v;
    v.data = data;
    v.dtype = dtype;
    v.device = device;
    for (int64_t s : shape) v.shape[v.rank++] = s;
    return v;
  }
  bool defined() const { return data != nullptr || rank > 0; }
  int64_t size(int d) const { return shape[d]; }
  // Element count and bytes. Every entry point first checks its views' shapes (each dimension in
  // its documented bound, no product beyond int64, with an error naming the argument); on a view
  // that was never checked these wrap instead of overflowing (no undefined behaviour).
  int64_t numel() const {
    uint64_t n = 1;
    for (int d = 0; d < rank && d < static_cast<int>(shape.size()); ++d) n *= static_cast<uint64_t>(shape[d]);
    return static_cast<int64_t>(n);
  }
  int64_t bytes() const { return static_cast<int64_t>(static_cast<uint64_t>(numel()) * dtype_size(dtype)); }
  template <class T>
  T* ptr() const { return static_cast<T*>(data); }
};

// How a quantized tensor's scales are made and placed: MXFP8 (one E8M0 scale per 32 values) or FP8
// blockwise (one fp32 inverse scale per 128 values; docs/numerics.md "FP8 blockwise").
enum class QuantFormat : uint8_t { mxfp8, fp8_block };

// A quantized tensor: E4M3 data [M, K] (never transposed) plus scales for one block axis.
// MXFP8: e8m0 scales; row-wise rowwise_scale_bytes(M, K) bytes, column-wise (grouped)
// colwise_scale_bytes(M, K, E) bytes (see mxfp8_layout.h for the exact placement).
// FP8 blockwise (format fp8_block, layout unused): f32 inverse scales; row-wise (1x128 along K)
// fp8_rowwise_scale_count(M, K) floats, MN-major; column-wise (128-token blocks restarting at each
// group) fp8_token_block_rows_capacity(M, E) x K floats, [block rows][K].
struct Mxfp8View {
  TensorView data;    // e4m3 [M, K]
  TensorView scales;  // e8m0 [bytes] (mxfp8) or f32 [count] (fp8_block)
  BlockAxis axis = BlockAxis::row;
  ScaleLayout layout = ScaleLayout::compact;
  QuantFormat format = QuantFormat::mxfp8;
};

}  // namespace mxmoe
