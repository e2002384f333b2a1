// TMA descriptors (CUtensorMap) for bf16 tensors with 128-byte swizzle (and e4m3 bytes with 64-byte swizzle), encoded on the host through
// the driver entry point that the runtime hands out (no link against libcuda). Encoding needs only
// pointers and shapes, never device data, so it is legal while a stream is being captured.
#pragma once
#include <cuda.h>

#include <cstdint>
#include <initializer_list>

namespace mxmoe::cuda::sm90 {

// TMA reads from 16-byte aligned global addresses only.
inline bool tma_aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// dims: innermost first; strides_bytes: of dims 1..rank-1; box: elements per dim (box[0] * 2 <= 128).
// Elements outside dims read as zero. Throws mxmoe::Error naming `what` if the driver refuses.
CUtensorMap make_tensor_map_bf16(const char* what, const void* base, std::initializer_list<uint64_t> dims,
                                 std::initializer_list<uint64_t> strides_bytes, std::initializer_list<uint32_t> box);
// Bytes (e4m3 data), 64-byte swizzle (box[0] = 64: one 64-byte row per box row) or none.
CUtensorMap make_tensor_map_u8(const char* what, const void* base, std::initializer_list<uint64_t> dims,
                               std::initializer_list<uint64_t> strides_bytes, std::initializer_list<uint32_t> box,
                               bool swizzle64);

// Bytes (e4m3 data), 128-byte swizzle (box[0] = 128: one 128-byte row per box row, the FP8 wgmma
// K-major layout the FP8 blockwise kernels read).
CUtensorMap make_tensor_map_u8_sw128(const char* what, const void* base, std::initializer_list<uint64_t> dims,
                                     std::initializer_list<uint64_t> strides_bytes, std::initializer_list<uint32_t> box);

}  // namespace mxmoe::cuda::sm90
