// Scalar types, devices and the error type shared by every public header.
// Compiles without CUDA: device-callable helpers use MXMOE_HD.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "mxmoe/export.h"

#if defined(__CUDACC__)
#define MXMOE_HD __host__ __device__ __forceinline__
#else
#define MXMOE_HD inline
#endif

namespace mxmoe {

enum class DType : uint8_t { f32, f64, bf16, e4m3, e8m0, i32, i64 };

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;
  bool operator==(const Device&) const = default;
};

MXMOE_API size_t dtype_size(DType t);
MXMOE_API const char* dtype_name(DType t);
MXMOE_API std::string device_name(Device d);

// The one error type every entry point throws. `argument` names what was wrong; the message
// names the argument and the offending value, e.g. "offsets[3]=17 < offsets[2]=20 (must be monotone)".
class MXMOE_API Error : public std::runtime_error {
 public:
  Error(std::string argument, const std::string& message)
      : std::runtime_error(argument + ": " + message), argument_(std::move(argument)) {}
  const std::string& argument() const { return argument_; }

 private:
  std::string argument_;
};

// The memory a call needs cannot be had: an allocation failed (host, device or the caller's
// Options::allocator) or the call's estimate exceeds the device's memory. The message says how much
// the call needs in all and which allocation failed. The C ABI maps it to MXMOE_ERROR_OUT_OF_MEMORY.
class MXMOE_API OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

}  // namespace mxmoe
