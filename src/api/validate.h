// Argument validation shared by every entry point. Each check throws mxmoe::Error naming the
// argument and the offending value; nothing is written before all checks of a call have passed.
#pragma once
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "mxmoe/groups.h"
#include "mxmoe/ops.h"

namespace mxmoe::detail {

inline constexpr int64_t kDeviceAlignBytes = 16;  // vector loads / cp.async need 16-byte alignment

inline constexpr int kMaxRank = 3;  // TensorView::shape holds 3 dimensions

// "[d0, d1]"; a rank outside [0, 3] prints as "(rank N)" without reading past the shape array.
std::string shape_string(const TensorView& t);
// A rank in [0, 3] (0: absent): anything else is an Error naming the argument and the rank.
void check_rank(const TensorView& t, const std::string& name);
// A dtype's name, or its number when it is no DType ("99").
std::string dtype_text(DType t);
// Enum fields a caller may have filled with any byte: refused naming the field and its value.
void check_scale_layout(ScaleLayout layout, const std::string& name);
void check_quantized_view_enums(const Mxfp8View& v, const std::string& name);

// The device every tensor of a call must be on, and the argument it was taken from: a mismatch is
// reported as "probs: is on cpu but x is on cuda:0", naming both tensors and both devices.
struct CallDevice {
  Device device;
  std::string source;
  CallDevice(Device d, std::string src) : device(d), source(std::move(src)) {}
};

// dtype, exact shape, device, non-null (unless empty), alignment on the GPU. A missing tensor
// (no data pointer, rank 0) is reported as missing, with what was expected.
void check_tensor(const TensorView& t, const std::string& name, DType dtype,
                  std::initializer_list<int64_t> shape, const CallDevice& device);
// As check_tensor, but any of `dtypes`.
void check_tensor_dtypes(const TensorView& t, const std::string& name, std::initializer_list<DType> dtypes,
                         std::initializer_list<int64_t> shape, const CallDevice& device);

// Offsets i32 [E+1] on `device`. Host offsets are checked element by element (start 0, monotone,
// end T). Device offsets cannot be read without a host synchronisation; they are checked for
// shape and device here and clamped by the kernels. T must be in [0, kMaxTokens].
void check_offsets(const GroupOffsets& g, const std::string& name, int64_t experts, int64_t tokens,
                   const CallDevice& device);

// E matrices [rows, cols]: dense [E, rows, cols] or an i64 [E] pointer table (host-checked for null
// and alignment when on the host).
void check_experts(const ExpertMatrices& m, const std::string& name, std::initializer_list<DType> dtypes,
                   int64_t experts, int64_t rows, int64_t cols, const CallDevice& device);

// MXFP8 view: e4m3 data [rows, cols], scales e8m0 of at least `scale_bytes`, given axis.
void check_mxfp8(const Mxfp8View& v, const std::string& name, int64_t rows, int64_t cols, BlockAxis axis,
                 int64_t scale_bytes, const CallDevice& device);

// FP8-blockwise view: e4m3 data [rows, cols], f32 scales of at least `scale_count` values, given axis.
void check_fp8_block(const Mxfp8View& v, const std::string& name, int64_t rows, int64_t cols, BlockAxis axis,
                     int64_t scale_count, const CallDevice& device);

// Every given tensor of a call (absent ones are skipped) on one device. The first entry is the
// reference. With `reference_fixed` (backward: the forward's data cannot move) every tensor not on
// the reference's device is the culprit; otherwise the device most tensors are on is taken as the
// intended one, so a lone x on the wrong device is named as the culprit rather than its peers. The
// message names the culprit, its device, a tensor on the intended device and lists every device.
struct NamedDevice {
  std::string name;
  Device device;
};
void check_one_device(const std::vector<NamedDevice>& tensors, bool reference_fixed);
// Appends `t` to `out` when it is given (data pointer or rank > 0).
void add_device(std::vector<NamedDevice>& out, const std::string& name, const TensorView& t);

struct Region {
  std::string name;
  const void* data;
  int64_t bytes;
};
Region region(const std::string& name, const TensorView& t);
// No output overlaps an input or another output.
void check_no_alias(const std::vector<Region>& outputs, const std::vector<Region>& inputs);

}  // namespace mxmoe::detail
