// unpermute_rows of the portable backend (cuda_ops.h; docs/kernels/permute.md):
// y[t] = bf16(sum over k in slot order of fp32 permuted_y[row_map[t, k]]), probs gathered. One team
// of whole warps per token: per vector position, fp32 accumulators from +0; the K rows' vectors are
// loaded in groups (several loads in flight), then added in slot order with __fadd_rn; rounded
// once to bf16. Bit-identical to the CPU reference (src/cpu/permute.cpp): the same fp32 additions
// in the same order, with the host's (x86) NaN propagation (add_like_host). row_map entries
// outside [0, R) are dropped slots (never an out-of-bounds access).
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuPermute*'
#include "mxmoe/numerics.h"
#include "src/cuda/common/check.h"
#include "src/cuda/cuda_ops.h"
#include "src/cuda/portable/permute_common.cuh"

namespace mxmoe::cuda::portable {
using namespace permute_detail;
namespace {

// acc + v in fp32, round to nearest, with the NaN the host reference gets on x86 (SSE propagates
// the first NaN operand, quieted; an invalid operation gives the negative default NaN), where the
// GPU would give its canonical 0x7fffffff. acc is +0 or an earlier result, so already quiet.
__device__ __forceinline__ float add_like_host(float acc, float v) {
  const float r = __fadd_rn(acc, v);
  if (r == r) return r;
  if (acc != acc) return acc;
  if (v != v) return __uint_as_float(__float_as_uint(v) | 0x00400000u);
  return __uint_as_float(0xffc00000u);
}

// y[t] = bf16(sum over k in slot order of fp32 permuted_y[row_map[t, k]]); probs[t, k] =
// permuted_probs[row_map[t, k]] or 0. A thread keeps U vector positions' accumulators and loads
// the vectors of G slots before adding them (U * G loads in flight). The probabilities are
// gathered after the rows, so that no dependent load waits ahead of the row loads.
template <int W, int U, int G>
__device__ __forceinline__ void unpermute_token(const Vec<W>* __restrict__ in, const int32_t* __restrict__ row_map,
                                                const float* __restrict__ in_probs, Vec<W>* __restrict__ y,
                                                float* __restrict__ probs, const MoveShape& s, int64_t t, int lane) {
  constexpr int kElems = W / 2;
  const int32_t* map = row_map + t * s.top_k;
  for (int64_t v0 = lane; v0 < s.vecs; v0 += static_cast<int64_t>(s.team) * U) {
    float acc[U][kElems];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < kElems; ++j) acc[u][j] = 0.0f;
    for (int k0 = 0; k0 < s.top_k; k0 += G) {
      int32_t r[G];
      Pack<W> val[G][U];
#pragma unroll
      for (int g = 0; g < G; ++g) {
        r[g] = k0 + g < s.top_k ? row_or_drop(__ldg(map + k0 + g), s.rows) : -1;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t v = v0 + static_cast<int64_t>(u) * s.team;
          val[g][u].v = r[g] >= 0 && v < s.vecs ? __ldg(in + static_cast<int64_t>(r[g]) * s.vecs + v) : Vec<W>{};
        }
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (r[g] < 0) continue;
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int j = 0; j < kElems; ++j) acc[u][j] = add_like_host(acc[u][j], f32_from_bf16(val[g][u].h[j]));
      }
    }
    Vec<W>* dst = y + t * s.vecs;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t v = v0 + static_cast<int64_t>(u) * s.team;
      if (v >= s.vecs) continue;
      Pack<W> o;
#pragma unroll
      for (int j = 0; j < kElems; ++j) o.h[j] = bf16_from_f32(acc[u][j]);
      dst[v] = o.v;
    }
  }
  if (probs == nullptr) return;
  for (int k = lane; k < s.top_k; k += s.team) {
    const int32_t r = row_or_drop(__ldg(map + k), s.rows);
    probs[t * s.top_k + k] = r >= 0 ? __ldg(in_probs + r) : 0.0f;
  }
}

template <int W, int U, int G>
__global__ void __launch_bounds__(kMoveThreads)
    unpermute_rows_kernel(const Vec<W>* __restrict__ in, const int32_t* __restrict__ row_map,
                          const float* __restrict__ in_probs, Vec<W>* __restrict__ y, float* __restrict__ probs,
                          MoveShape s) {
  const TeamSlot me = team_slot(s);
  if (me.t < s.tokens) unpermute_token<W, U, G>(in, row_map, in_probs, y, probs, s, me.t, me.lane);
}

template <int W, int U, int G>
void launch_unpermute(const Vec<W>* in, const int32_t* row_map, const float* in_probs, Vec<W>* y, float* probs,
                      const MoveShape& s, cudaStream_t stream) {
  unpermute_rows_kernel<W, U, G><<<move_blocks(s), move_threads(s), 0, stream>>>(in, row_map, in_probs, y, probs, s);
  MXMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void unpermute_rows(const UnpermuteArgs& a, void* stream_ptr) {
  const cudaStream_t stream = as_stream(stream_ptr);
  const int64_t T = a.row_map.shape[0], K = a.row_map.shape[1];
  const int64_t R = a.permuted_y.shape[0], H = a.permuted_y.shape[1];
  if (T == 0) return;
  const int32_t* row_map = a.row_map.ptr<const int32_t>();
  const float* in_probs = a.permuted_probs.ptr<const float>();
  float* probs = a.probs.data != nullptr ? a.probs.ptr<float>() : nullptr;
  with_vector_bytes(vector_bytes(H, {a.permuted_y.data, a.y.data}), [&](auto w) {
    constexpr int W = decltype(w)::value;
    const auto* in = static_cast<const Vec<W>*>(a.permuted_y.data);
    auto* y = static_cast<Vec<W>*>(a.y.data);
    // U positions x G slots in flight per thread (docs/kernels/permute.md has the measurements).
    if (K <= 2) {
      launch_unpermute<W, 2, 2>(in, row_map, in_probs, y, probs, move_shape(T, K, R, H, W, 2), stream);
    } else if (K <= 4) {
      launch_unpermute<W, 1, 4>(in, row_map, in_probs, y, probs, move_shape(T, K, R, H, W, 1), stream);
    } else {
      launch_unpermute<W, 1, 8>(in, row_map, in_probs, y, probs, move_shape(T, K, R, H, W, 1), stream);
    }
  });
}

}  // namespace mxmoe::cuda::portable
