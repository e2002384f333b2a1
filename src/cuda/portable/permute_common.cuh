// What the token routing (permute_route*.cu), the row move (permute_move.cu) and the unpermute
// (unpermute.cu) share: programmatic dependent launch, and the geometry of the row kernels (one
// team of whole warps per token, W-byte vectors of bf16). docs/kernels/permute.md has the design.
#pragma once
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "mxmoe/mxfp8_layout.h"
#include "src/cuda/common/check.h"
#include "src/cuda/cuda_ops.h"

namespace mxmoe::cuda::portable::permute_detail {

// Programmatic dependent launch (sm_90+): a kernel launched with the attribute may start while the
// kernel before it on the stream runs (once every CTA of that one has called pdl_allow_next or
// exited); pdl_wait returns when the earlier kernel has finished and its writes are visible. Both
// are no-ops where the launch had no such dependency (and compile to nothing before sm_90).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_allow_next() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, 0, stream>>>(args...), as a programmatic dependent of the previous kernel
// on the stream when `dependent`.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), unsigned grid, unsigned block, cudaStream_t stream, bool dependent,
            Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = dependent ? &attr : nullptr;
  cfg.numAttrs = dependent ? 1 : 0;
  MXMOE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// Whether rows of `row_bytes` at `p` can be written in 16-byte vectors (else 2-byte ones).
inline bool rows_take_16_bytes(int64_t row_bytes, const void* p) {
  return row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

constexpr int kMoveThreads = 256;  // threads per CTA, at most

template <int W>
struct VecOf;
template <>
struct VecOf<16> {
  using type = uint4;
};
template <>
struct VecOf<8> {
  using type = uint2;
};
template <>
struct VecOf<4> {
  using type = uint32_t;
};
template <>
struct VecOf<2> {
  using type = uint16_t;
};
template <int W>
using Vec = typename VecOf<W>::type;

// W bytes: W / 2 bf16 values.
template <int W>
union Pack {
  Vec<W> v;
  uint16_t h[W / 2];
};

struct MoveShape {
  int64_t tokens;  // T
  int32_t top_k;   // K
  int64_t rows;    // R: row_map entries outside [0, R) are dropped slots
  int64_t vecs;    // W-byte vectors per row of H bf16
  int team;        // threads per token: whole warps, at most kMoveThreads
  int per_cta;     // tokens per CTA: the CTA has team * per_cta threads
};

// This thread's token and its lane in the token's team.
struct TeamSlot {
  int64_t t;
  int lane;
};
__device__ __forceinline__ TeamSlot team_slot(const MoveShape& s) {
  const int member = static_cast<int>(threadIdx.x) / s.team;
  return {static_cast<int64_t>(blockIdx.x) * s.per_cta + member, static_cast<int>(threadIdx.x) - member * s.team};
}

__device__ __forceinline__ int32_t row_or_drop(int32_t r, int64_t rows) { return r >= 0 && r < rows ? r : -1; }

// The widest vector (16, 8, 4 or 2 bytes) dividing a row of H bf16 and aligning every pointer.
inline int vector_bytes(int64_t H, std::initializer_list<const void*> ptrs) {
  for (int w : {16, 8, 4}) {
    if ((H * 2) % w != 0) continue;
    bool aligned = true;
    for (const void* p : ptrs) aligned = aligned && reinterpret_cast<uintptr_t>(p) % w == 0;
    if (aligned) return w;
  }
  return 2;
}

template <class F>
void with_vector_bytes(int w, F&& f) {
  switch (w) {
    case 16:
      f(std::integral_constant<int, 16>{});
      break;
    case 8:
      f(std::integral_constant<int, 8>{});
      break;
    case 4:
      f(std::integral_constant<int, 4>{});
      break;
    default:
      f(std::integral_constant<int, 2>{});
      break;
  }
}

// Threads per token: whole warps, as few as cover a row with `per_thread` vectors each in as few
// passes as kMoveThreads threads need, the row spread evenly over those passes (H = 2880, 16-byte
// vectors, 1 per thread: 2 passes of 192 threads, where a power-of-two team of 256 ran its second
// pass with 104). Tokens per CTA: as many teams as fit kMoveThreads.
inline MoveShape move_shape(int64_t T, int64_t K, int64_t R, int64_t H, int w, int per_thread) {
  MoveShape s{T, static_cast<int32_t>(K), R, H * 2 / w, 32, 1};
  const int64_t passes = std::max<int64_t>(1, ceil_div(s.vecs, int64_t{per_thread} * kMoveThreads));
  const int64_t want = ceil_div(ceil_div(s.vecs, passes * per_thread), 32) * 32;
  s.team = static_cast<int>(std::clamp<int64_t>(want, 32, kMoveThreads));
  s.per_cta = kMoveThreads / s.team;
  return s;
}

inline unsigned move_blocks(const MoveShape& s) { return static_cast<unsigned>(ceil_div(s.tokens, s.per_cta)); }
inline unsigned move_threads(const MoveShape& s) { return static_cast<unsigned>(s.team * s.per_cta); }

// permute_rows' move (permute_move.cu); `dependent`: launched as a programmatic dependent of the
// kernel before it on the stream (the routing's assign, route_and_permute_rows).
void move_rows(const PermuteByMapArgs& a, cudaStream_t stream, bool dependent);

}  // namespace mxmoe::cuda::portable::permute_detail
