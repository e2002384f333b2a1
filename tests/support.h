// Test helpers: fresh random inputs, poisoned outputs, relative Frobenius error.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "mxmoe/mxmoe.h"

namespace mxmoe::test {

// A host tensor that owns its bytes.
struct HostTensor {
  std::vector<uint8_t> bytes;
  TensorView view;
  HostTensor() = default;
  HostTensor(DType t, std::initializer_list<int64_t> shape) {
    view = TensorView::of(nullptr, t, shape);
    bytes.resize(static_cast<size_t>(view.bytes()));
    view.data = bytes.data();
  }
  HostTensor(const HostTensor& o) : bytes(o.bytes), view(o.view) { view.data = bytes.data(); }
  HostTensor& operator=(const HostTensor& o) {
    bytes = o.bytes;
    view = o.view;
    view.data = bytes.data();
    return *this;
  }
  template <class T>
  T* ptr() { return reinterpret_cast<T*>(bytes.data()); }
  template <class T>
  const T* ptr() const { return reinterpret_cast<const T*>(bytes.data()); }
  int64_t numel() const { return view.numel(); }
  void poison(uint8_t byte = 0xA5) {
    if (!bytes.empty()) std::memset(bytes.data(), byte, bytes.size());
  }
};

inline std::mt19937_64& rng() {
  static std::mt19937_64 g(std::random_device{}());
  return g;
}

inline HostTensor random_bf16(std::initializer_list<int64_t> shape, float lo = -1.f, float hi = 1.f) {
  HostTensor t(DType::bf16, shape);
  std::uniform_real_distribution<float> d(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<uint16_t>()[i] = bf16_from_f32(d(rng()));
  return t;
}
inline HostTensor random_f32(std::initializer_list<int64_t> shape, float lo = -1.f, float hi = 1.f) {
  HostTensor t(DType::f32, shape);
  std::uniform_real_distribution<float> d(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = d(rng());
  return t;
}

// Offsets [E+1] on the host from group sizes.
inline HostTensor offsets_from_sizes(const std::vector<int>& sizes) {
  HostTensor t(DType::i32, {static_cast<int64_t>(sizes.size()) + 1});
  int32_t* o = t.ptr<int32_t>();
  o[0] = 0;
  for (size_t e = 0; e < sizes.size(); ++e) o[e + 1] = o[e] + sizes[e];
  return t;
}

// Element i of a tensor as double (f32, f64, bf16, i32).
inline double value_at(const TensorView& v, int64_t i) {
  switch (v.dtype) {
    case DType::f32: return v.ptr<const float>()[i];
    case DType::f64: return v.ptr<const double>()[i];
    case DType::bf16: return f32_from_bf16(v.ptr<const uint16_t>()[i]);
    case DType::i32: return v.ptr<const int32_t>()[i];
    default: return NAN;
  }
}

// ||out - ref|| / ||ref|| over all elements (ref == 0 everywhere: returns ||out||). NaN anywhere -> inf.
inline double rel_error(const TensorView& out, const TensorView& ref) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double a = value_at(out, i), b = value_at(ref, i);
    if (!std::isfinite(a) || !std::isfinite(b)) return INFINITY;
    num += (a - b) * (a - b);
    den += b * b;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline bool bytes_equal(const TensorView& a, const TensorView& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.data, b.data, static_cast<size_t>(a.bytes())) == 0;
}

}  // namespace mxmoe::test
