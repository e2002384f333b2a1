#include "src/api/validate.h"

#include <algorithm>

#include "mxmoe/problem.h"
#include "src/common/checked.h"

namespace mxmoe::detail {

std::string shape_string(const TensorView& t) {
  if (t.rank < 0 || t.rank > kMaxRank) return "(rank " + std::to_string(t.rank) + ")";  // shape[] holds 3
  std::string s = "[";
  for (int d = 0; d < t.rank; ++d) s += (d ? ", " : "") + std::to_string(t.shape[d]);
  return s + "]";
}

void check_rank(const TensorView& t, const std::string& name) {
  if (t.rank < 0 || t.rank > kMaxRank)
    throw Error(name, "rank " + std::to_string(t.rank) + " must be in [1, " + std::to_string(kMaxRank) +
                          "] (a TensorView holds at most " + std::to_string(kMaxRank) + " dimensions)");
}

std::string dtype_text(DType t) {
  const std::string name = dtype_name(t);
  return name != "?" ? name : std::to_string(static_cast<int>(t));
}

namespace {
template <class Enum>
void check_enum_value(Enum v, int count, const std::string& name, const char* field, const char* names) {
  if (static_cast<int>(v) >= count)
    throw Error(name, std::string(field) + "=" + std::to_string(static_cast<int>(v)) + " is not one of " + names);
}
}  // namespace

void check_scale_layout(ScaleLayout layout, const std::string& name) {
  check_enum_value(layout, 2, name, "scale_layout", "compact, swizzled");
}

void check_quantized_view_enums(const Mxfp8View& v, const std::string& name) {
  check_enum_value(v.format, 2, name + ".format", "format", "mxfp8, fp8_block");
  check_enum_value(v.axis, 2, name + ".axis", "axis", "row, col");
  check_enum_value(v.layout, 2, name + ".layout", "layout", "compact, swizzled");
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

void check_device(const TensorView& t, const std::string& name, const CallDevice& call) {
  if (!(t.device == call.device))
    throw Error(name, "is on " + device_name(t.device) + " but " + call.source + " is on " + device_name(call.device) +
                          " (every tensor of a call must be on one device)");
}

void check_pointer(const void* p, int64_t bytes, const std::string& name, Device device) {
  if (bytes > 0 && p == nullptr) throw Error(name, "data pointer is null");
  if (device.type == DeviceType::cuda && p != nullptr &&
      reinterpret_cast<uintptr_t>(p) % kDeviceAlignBytes != 0)
    throw Error(name, "pointer " + std::to_string(reinterpret_cast<uintptr_t>(p)) + " is not " +
                          std::to_string(kDeviceAlignBytes) + "-byte aligned");
}

std::string dtype_list(std::initializer_list<DType> dtypes) {
  std::string want;
  for (DType d : dtypes) want += (want.empty() ? "" : " or ") + std::string(dtype_name(d));
  return want;
}

bool missing(const TensorView& t) { return t.data == nullptr && t.rank == 0; }
}  // namespace

void check_tensor_dtypes(const TensorView& t, const std::string& name, std::initializer_list<DType> dtypes,
                         std::initializer_list<int64_t> shape, const CallDevice& device) {
  if (missing(t))
    throw Error(name, "missing (no data pointer); expected " + dtype_list(dtypes) + " " + list_shape(shape) + " on " +
                          device_name(device.device));
  check_rank(t, name);
  if (std::find(dtypes.begin(), dtypes.end(), t.dtype) == dtypes.end())
    throw Error(name, "dtype " + dtype_text(t.dtype) + " is not " + dtype_list(dtypes));
  bool same = t.rank == static_cast<int>(shape.size());
  int d = 0;
  for (int64_t v : shape) same = same && t.shape[d++] == v;
  if (!same) throw Error(name, "shape " + shape_string(t) + " must be " + list_shape(shape));
  check_device(t, name, device);
  check_pointer(t.data, checked_bytes(t, name), name, device.device);
}

void check_tensor(const TensorView& t, const std::string& name, DType dtype, std::initializer_list<int64_t> shape,
                  const CallDevice& device) {
  check_tensor_dtypes(t, name, {dtype}, shape, device);
}

void check_offsets(const GroupOffsets& g, const std::string& name, int64_t experts, int64_t tokens,
                   const CallDevice& device) {
  check_dim(experts, kMaxExperts, name, "E");
  check_tensor(g.offsets, name, DType::i32, {experts + 1}, device);
  if (tokens < 0 || tokens > kMaxTokens)
    throw Error(name, "tokens=" + std::to_string(tokens) + " must be in [0, " + std::to_string(kMaxTokens) +
                          "] (the int32 offset range)");
  if (device.device.type != DeviceType::cpu) return;
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
                   int64_t experts, int64_t rows, int64_t cols, const CallDevice& device) {
  if (!m.per_expert()) {
    check_tensor_dtypes(m.dense, name, dtypes, {experts, rows, cols}, device);
    return;
  }
  check_tensor(m.pointers, name + ".pointers", DType::i64, {experts}, device);
  if (std::find(dtypes.begin(), dtypes.end(), m.dtype) == dtypes.end())
    throw Error(name + ".dtype", "dtype " + dtype_text(m.dtype) + " is not " + dtype_list(dtypes));
  if (device.device.type != DeviceType::cpu) return;  // device tables are read on the device only
  const int64_t* p = m.pointers.ptr<const int64_t>();
  const int64_t per = checked_mul({rows, cols, static_cast<int64_t>(dtype_size(m.dtype))}, name);
  for (int64_t e = 0; e < experts; ++e)
    if (per > 0 && p[e] == 0) throw Error(name + ".pointers", "pointers[" + std::to_string(e) + "] is null");
}

void check_mxfp8(const Mxfp8View& v, const std::string& name, int64_t rows, int64_t cols, BlockAxis axis,
                 int64_t scale_bytes, const CallDevice& device) {
  check_quantized_view_enums(v, name);
  if (v.format != QuantFormat::mxfp8)
    throw Error(name + ".format", "is fp8_block; an MXFP8 view (format mxfp8, e8m0 scales) is expected here");
  check_tensor(v.data, name + ".data", DType::e4m3, {rows, cols}, device);
  if (v.axis != axis)
    throw Error(name + ".axis", std::string("block axis must be ") + (axis == BlockAxis::row ? "row" : "col"));
  if (missing(v.scales))
    throw Error(name + ".scales", "missing (no data pointer); expected e8m0 of " + std::to_string(scale_bytes) +
                                      " bytes on " + device_name(device.device));
  if (v.scales.dtype != DType::e8m0) throw Error(name + ".scales", "dtype " + dtype_text(v.scales.dtype) + " is not e8m0");
  const int64_t have = checked_numel(v.scales, name + ".scales");
  if (have < scale_bytes)
    throw Error(name + ".scales", "holds " + std::to_string(have) + " bytes, needs " + std::to_string(scale_bytes));
  check_device(v.scales, name + ".scales", device);
  check_pointer(v.scales.data, have, name + ".scales", device.device);
}

void check_fp8_block(const Mxfp8View& v, const std::string& name, int64_t rows, int64_t cols, BlockAxis axis,
                     int64_t scale_count, const CallDevice& device) {
  check_quantized_view_enums(v, name);
  if (v.format != QuantFormat::fp8_block)
    throw Error(name + ".format", "is mxfp8; an FP8-blockwise view (format fp8_block, f32 scales) is expected here");
  check_tensor(v.data, name + ".data", DType::e4m3, {rows, cols}, device);
  if (v.axis != axis)
    throw Error(name + ".axis", std::string("block axis must be ") + (axis == BlockAxis::row ? "row" : "col"));
  if (missing(v.scales))
    throw Error(name + ".scales", "missing (no data pointer); expected f32 of " + std::to_string(scale_count) +
                                      " values on " + device_name(device.device));
  if (v.scales.dtype != DType::f32)
    throw Error(name + ".scales", "dtype " + dtype_text(v.scales.dtype) + " is not f32");
  const int64_t have = checked_numel(v.scales, name + ".scales");
  if (have < scale_count)
    throw Error(name + ".scales", "holds " + std::to_string(have) + " values, needs " + std::to_string(scale_count));
  check_device(v.scales, name + ".scales", device);
  check_pointer(v.scales.data, checked_mul(have, 4, name + ".scales"), name + ".scales", device.device);
}

void add_device(std::vector<NamedDevice>& out, const std::string& name, const TensorView& t) {
  if (!missing(t)) out.push_back({name, t.device});
}

void check_one_device(const std::vector<NamedDevice>& tensors, bool reference_fixed) {
  if (tensors.empty()) return;
  // Devices in order of first appearance, with the tensors on each.
  std::vector<std::pair<Device, std::vector<std::string>>> groups;
  for (const NamedDevice& t : tensors) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == t.device; });
    if (it == groups.end()) groups.push_back({t.device, {t.name}});
    else it->second.push_back(t.name);
  }
  if (groups.size() == 1) return;
  size_t intended = 0;  // the reference's group, unless (not fixed) another one holds more tensors
  if (!reference_fixed)
    for (size_t i = 1; i < groups.size(); ++i)
      if (groups[i].second.size() > groups[intended].second.size()) intended = i;
  std::string listing;
  for (const auto& g : groups) {
    listing += (listing.empty() ? "" : "; ") + device_name(g.first) + ":";
    for (size_t i = 0; i < g.second.size(); ++i) listing += (i ? ", " : " ") + g.second[i];
  }
  const Device want = groups[intended].first;
  const std::string& witness = groups[intended].second.front();
  for (const NamedDevice& t : tensors)
    if (!(t.device == want))
      throw Error(t.name, "is on " + device_name(t.device) + " but " + witness + " is on " + device_name(want) +
                              " (every tensor of a call must be on one device; " + listing + ")");
}

Region region(const std::string& name, const TensorView& t) {
  return {name, t.data, t.data ? checked_bytes(t, name) : 0};
}

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
