#include "src/api/validate.h"

#include <algorithm>

namespace mxmoe::detail {

std::string shape_string(const TensorView& t) {
  std::string s = "[";
  for (int d = 0; d < t.rank; ++d) s += (d ? ", " : "") + std::to_string(t.shape[d]);
  return s + "]";
}

namespace {
std::string list_shape(std::initializer_list<int64_t> shape) {
  std::string s = "[";
  bool first = true;
  for (int64_t v : shape) {
    s += (first ? "" : ", ") + std::to_string(v);
    first = false;
  }
  return s + "]";
}

void check_device(const TensorView& t, const std::string& name, Device device) {
  if (!(t.device == device))
    throw Error(name, "is on " + device_name(t.device) + " but the call's data is on " + device_name(device));
}

void check_pointer(const void* p, int64_t bytes, const std::string& name, Device device) {
  if (bytes > 0 && p == nullptr) throw Error(name, "data pointer is null");
  if (device.type == DeviceType::cuda && p != nullptr &&
      reinterpret_cast<uintptr_t>(p) % kDeviceAlignBytes != 0)
    throw Error(name, "pointer " + std::to_string(reinterpret_cast<uintptr_t>(p)) + " is not " +
                          std::to_string(kDeviceAlignBytes) + "-byte aligned");
}
}  // namespace

void check_tensor_dtypes(const TensorView& t, const std::string& name, std::initializer_list<DType> dtypes,
                         std::initializer_list<int64_t> shape, Device device) {
  if (std::find(dtypes.begin(), dtypes.end(), t.dtype) == dtypes.end()) {
    std::string want;
    for (DType d : dtypes) want += (want.empty() ? "" : " or ") + std::string(dtype_name(d));
    throw Error(name, std::string("dtype ") + dtype_name(t.dtype) + " is not " + want);
  }
  bool same = t.rank == static_cast<int>(shape.size());
  int d = 0;
  for (int64_t v : shape) same = same && t.shape[d++] == v;
  if (!same) throw Error(name, "shape " + shape_string(t) + " must be " + list_shape(shape));
  check_device(t, name, device);
  check_pointer(t.data, t.bytes(), name, device);
}

void check_tensor(const TensorView& t, const std::string& name, DType dtype, std::initializer_list<int64_t> shape,
                  Device device) {
  check_tensor_dtypes(t, name, {dtype}, shape, device);
}

void check_offsets(const GroupOffsets& g, const std::string& name, int64_t experts, int64_t tokens, Device device) {
  check_tensor(g.offsets, name, DType::i32, {experts + 1}, device);
  if (tokens > INT32_MAX) throw Error(name, "tokens=" + std::to_string(tokens) + " exceeds the int32 offset range");
  if (device.type != DeviceType::cpu) return;
  const int32_t* o = g.data();
  if (o[0] != 0) throw Error(name, "offsets[0]=" + std::to_string(o[0]) + " must be 0");
  for (int64_t e = 0; e < experts; ++e)
    if (o[e + 1] < o[e])
      throw Error(name, "offsets[" + std::to_string(e + 1) + "]=" + std::to_string(o[e + 1]) + " < offsets[" +
                            std::to_string(e) + "]=" + std::to_string(o[e]) + " (must be monotone)");
  if (o[experts] != tokens)
    throw Error(name, "offsets[" + std::to_string(experts) + "]=" + std::to_string(o[experts]) +
                          " must equal the number of tokens " + std::to_string(tokens));
}

void check_experts(const ExpertMatrices& m, const std::string& name, std::initializer_list<DType> dtypes,
                   int64_t experts, int64_t rows, int64_t cols, Device device) {
  if (!m.per_expert()) {
    check_tensor_dtypes(m.dense, name, dtypes, {experts, rows, cols}, device);
    return;
  }
  check_tensor(m.pointers, name + ".pointers", DType::i64, {experts}, device);
  if (std::find(dtypes.begin(), dtypes.end(), m.dtype) == dtypes.end())
    throw Error(name + ".dtype", std::string("dtype ") + dtype_name(m.dtype) + " is not accepted here");
  if (device.type != DeviceType::cpu) return;  // device tables are read on the device only
  const int64_t* p = m.pointers.ptr<const int64_t>();
  for (int64_t e = 0; e < experts; ++e)
    if (rows * cols > 0 && p[e] == 0) throw Error(name + ".pointers", "pointers[" + std::to_string(e) + "] is null");
}

void check_mxfp8(const Mxfp8View& v, const std::string& name, int64_t rows, int64_t cols, BlockAxis axis,
                 int64_t scale_bytes, Device device) {
  check_tensor(v.data, name + ".data", DType::e4m3, {rows, cols}, device);
  if (v.axis != axis)
    throw Error(name + ".axis", std::string("block axis must be ") + (axis == BlockAxis::row ? "row" : "col"));
  if (v.scales.dtype != DType::e8m0) throw Error(name + ".scales", std::string("dtype ") + dtype_name(v.scales.dtype) + " is not e8m0");
  if (v.scales.numel() < scale_bytes)
    throw Error(name + ".scales", "holds " + std::to_string(v.scales.numel()) + " bytes, needs " + std::to_string(scale_bytes));
  check_device(v.scales, name + ".scales", device);
  check_pointer(v.scales.data, v.scales.bytes(), name + ".scales", device);
}

Region region(const std::string& name, const TensorView& t) { return {name, t.data, t.data ? t.bytes() : 0}; }

void check_no_alias(const std::vector<Region>& outputs, const std::vector<Region>& inputs) {
  auto overlap = [](const Region& a, const Region& b) {
    if (!a.data || !b.data || a.bytes == 0 || b.bytes == 0) return false;
    const auto* a0 = static_cast<const char*>(a.data);
    const auto* b0 = static_cast<const char*>(b.data);
    return a0 < b0 + b.bytes && b0 < a0 + a.bytes;
  };
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (const Region& in : inputs)
      if (overlap(outputs[i], in)) throw Error(outputs[i].name, "output overlaps input " + in.name);
    for (size_t j = i + 1; j < outputs.size(); ++j)
      if (overlap(outputs[i], outputs[j])) throw Error(outputs[i].name, "output overlaps output " + outputs[j].name);
  }
}

}  // namespace mxmoe::detail
