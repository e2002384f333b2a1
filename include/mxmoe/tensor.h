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
    for (int d = 0; d < rank; ++d) n *= static_cast<uint64_t>(shape[d]);
    return static_cast<int64_t>(n);
  }
  int64_t bytes() const { return static_cast<int64_t>(static_cast<uint64_t>(numel()) * dtype_size(dtype)); }
  template <class T>
  T* ptr() const { return static_cast<T*>(data); }
};

// An MXFP8 tensor: E4M3 data [M, K] (never transposed) plus E8M0 scales for one block axis.
// Row-wise scales: rowwise_scale_bytes(M, K) bytes. Column-wise scales of a grouped tensor:
// colwise_scale_bytes(M, K, E) bytes (see mxfp8_layout.h for the exact placement).
struct Mxfp8View {
  TensorView data;    // e4m3 [M, K]
  TensorView scales;  // e8m0 [bytes]
  BlockAxis axis = BlockAxis::row;
  ScaleLayout layout = ScaleLayout::compact;
};

}  // namespace mxmoe
