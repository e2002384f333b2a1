#include "src/cuda/sm90/tensor_map.h"

#include <cuda_runtime.h>

#include <mutex>
#include <sstream>
#include <string>

#include "mxmoe/types.h"

namespace mxmoe::cuda::sm90 {
namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encoder() {
  static EncodeTiled fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
            cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<EncodeTiled>(p);
    cudaGetLastError();
  });
  if (fn == nullptr) throw Error("cuda_sm90", "the CUDA driver has no cuTensorMapEncodeTiled (driver too old for TMA)");
  return fn;
}

CUtensorMap make_tensor_map(const char* what, CUtensorMapDataType type, CUtensorMapSwizzle swizzle, const void* base,
                            std::initializer_list<uint64_t> dims, std::initializer_list<uint64_t> strides_bytes,
                            std::initializer_list<uint32_t> box) {
  constexpr int kMaxRank = 5;
  const int rank = static_cast<int>(dims.size());
  if (rank < 1 || rank > kMaxRank || static_cast<int>(strides_bytes.size()) != rank - 1 ||
      static_cast<int>(box.size()) != rank)
    throw Error(what, "internal: inconsistent tensor map rank");
  cuuint64_t d[kMaxRank], s[kMaxRank];
  cuuint32_t b[kMaxRank], e[kMaxRank];
  int i = 0;
  for (uint64_t v : dims) d[i++] = v;
  i = 0;
  for (uint64_t v : strides_bytes) s[i++] = v;
  i = 0;
  for (uint32_t v : box) b[i] = v, e[i] = 1, ++i;
  CUtensorMap map{};
  const CUresult r = encoder()(&map, type, rank, const_cast<void*>(base), d, s, b, e,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::ostringstream msg;
    msg << "cuTensorMapEncodeTiled failed (error " << static_cast<int>(r) << ") for dims [";
    for (int k = 0; k < rank; ++k) msg << (k ? "," : "") << d[k];
    msg << "] at address " << base;
    throw Error(what, msg.str());
  }
  return map;
}

}  // namespace

CUtensorMap make_tensor_map_bf16(const char* what, const void* base, std::initializer_list<uint64_t> dims,
                                 std::initializer_list<uint64_t> strides_bytes, std::initializer_list<uint32_t> box) {
  return make_tensor_map(what, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, CU_TENSOR_MAP_SWIZZLE_128B, base, dims, strides_bytes,
                         box);
}

CUtensorMap make_tensor_map_u8(const char* what, const void* base, std::initializer_list<uint64_t> dims,
                               std::initializer_list<uint64_t> strides_bytes, std::initializer_list<uint32_t> box,
                               bool swizzle64) {
  return make_tensor_map(what, CU_TENSOR_MAP_DATA_TYPE_UINT8,
                         swizzle64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_NONE, base, dims, strides_bytes, box);
}

CUtensorMap make_tensor_map_u8_sw128(const char* what, const void* base, std::initializer_list<uint64_t> dims,
                                     std::initializer_list<uint64_t> strides_bytes, std::initializer_list<uint32_t> box) {
  return make_tensor_map(what, CU_TENSOR_MAP_DATA_TYPE_UINT8, CU_TENSOR_MAP_SWIZZLE_128B, base, dims, strides_bytes, box);
}

}  // namespace mxmoe::cuda::sm90
