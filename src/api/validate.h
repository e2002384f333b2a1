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

std::string shape_string(const TensorView& t);

// dtype, exact shape, device, non-null (unless empty), alignment on the GPU.
void check_tensor(const TensorView& t, const std::string& name, DType dtype,
                  std::initializer_list<int64_t> shape, Device device);
// As check_tensor, but any of `dtypes`.
void check_tensor_dtypes(const TensorView& t, const std::string& name, std::initializer_list<DType> dtypes,
                         std::initializer_list<int64_t> shape, Device device);

// Offsets i32 [E+1] on `device`. Host offsets are checked element by element (start 0, monotone,
// end T). Device offsets cannot be read without a host synchronisation; they are checked for
// shape and device here and clamped by the kernels.
void check_offsets(const GroupOffsets& g, const std::string& name, int64_t experts, int64_t tokens,
                   Device device);

// E matrices [rows, cols]: dense [E, rows, cols] or an i64 [E] pointer table (host-checked for null
// and alignment when on the host).
void check_experts(const ExpertMatrices& m, const std::string& name, std::initializer_list<DType> dtypes,
                   int64_t experts, int64_t rows, int64_t cols, Device device);

// MXFP8 view: e4m3 data [rows, cols], scales e8m0 of at least `scale_bytes`, given axis.
void check_mxfp8(const Mxfp8View& v, const std::string& name, int64_t rows, int64_t cols, BlockAxis axis,
                 int64_t scale_bytes, Device device);

struct Region {
  std::string name;
  const void* data;
  int64_t bytes;
};
Region region(const std::string& name, const TensorView& t);
// No output overlaps an input or another output.
void check_no_alias(const std::vector<Region>& outputs, const std::vector<Region>& inputs);

}  // namespace mxmoe::detail
