// permute_rows of the portable backend (cuda_ops.h; docs/kernels/permute.md):
// permuted_x[row_map[t, k]] = x[t], permuted_probs likewise. One team of whole warps per token (as
// few as cover the row with 4 vectors per thread, at most 256 threads): the row is loaded once into
// registers (16/8/4/2-byte vectors, the widest H and the pointers allow), then stored to each of its
// K rows. zero_unused_rows: the rows no slot names are written as zeros after the move.
// Launched as a programmatic dependent of the routing (route_and_permute_rows), the x loads go out
// before the wait for row_map. row_map entries outside [0, R) are dropped slots (never an
// out-of-bounds access). A copy: bit-identical to the CPU reference (src/cpu/permute.cpp).
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuPermute*'
#include <algorithm>

#include "src/cuda/common/check.h"
#include "src/cuda/common/workspace.h"
#include "src/cuda/cuda_ops.h"
#include "src/cuda/portable/permute_common.cuh"

namespace mxmoe::cuda::portable {
using namespace permute_detail;
namespace {

// permuted_x[row_map[t, k]] = x[t]; permuted_probs[row_map[t, k]] = probs[t, k]. Source-major:
// each thread loads U vectors of x[t] (all loads issued before any store), then stores them to each
// of the token's K rows. The probabilities are loaded first and stored last, so that they add no
// memory latency ahead of the row loads.
template <int W, int U>
__device__ __forceinline__ void permute_token(const Vec<W>* __restrict__ x, const int32_t* __restrict__ row_map,
                                              const float* __restrict__ probs, Vec<W>* __restrict__ out,
                                              float* __restrict__ out_probs, uint8_t* __restrict__ named,
                                              const MoveShape& s, int64_t t, int lane) {
  const int32_t* map = row_map + t * s.top_k;
  const bool probs_in_regs = out_probs != nullptr && s.top_k <= s.team;  // one probability per lane
  int32_t prob_row = -1;
  float prob = 0.0f;
  if (probs_in_regs && lane < s.top_k) prob = __ldg(probs + t * s.top_k + lane);
  // x and probs are inputs; the row map may come from the kernel before this one (a programmatic
  // dependent launch after the routing): the first pass's row loads go out before pdl_wait.
  bool waited = false;
  auto wait_for_map = [&] {
    pdl_wait();
    waited = true;
    if (probs_in_regs && lane < s.top_k) prob_row = __ldg(map + lane);
  };
  const Vec<W>* src = x + t * s.vecs;
  for (int64_t v0 = lane; v0 < s.vecs; v0 += static_cast<int64_t>(s.team) * U) {
    Vec<W> reg[U] = {};
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t v = v0 + static_cast<int64_t>(u) * s.team;
      if (v < s.vecs) reg[u] = __ldg(src + v);
    }
    if (!waited) wait_for_map();
#pragma unroll 1
    for (int k = 0; k < s.top_k; ++k) {
      const int32_t r = row_or_drop(__ldg(map + k), s.rows);
      if (r < 0) continue;
      Vec<W>* dst = out + static_cast<int64_t>(r) * s.vecs;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t v = v0 + static_cast<int64_t>(u) * s.team;
        if (v < s.vecs) dst[v] = reg[u];
      }
    }
  }
  if (!waited) wait_for_map();  // a lane with no vector of this row
  if (named != nullptr) {       // zero_unused_rows: the rows this token fills
    for (int k = lane; k < s.top_k; k += s.team) {
      const int32_t r = row_or_drop(__ldg(map + k), s.rows);
      if (r >= 0) named[r] = 1;
    }
  }
  if (out_probs == nullptr) return;
  if (probs_in_regs) {
    const int32_t r = row_or_drop(prob_row, s.rows);
    if (lane < s.top_k && r >= 0) out_probs[r] = prob;
    return;
  }
  for (int k = lane; k < s.top_k; k += s.team) {
    const int32_t r = row_or_drop(map[k], s.rows);
    if (r >= 0) out_probs[r] = probs[t * s.top_k + k];
  }
}

template <int W, int U>
__global__ void __launch_bounds__(kMoveThreads)
    permute_rows_kernel(const Vec<W>* __restrict__ x, const int32_t* __restrict__ row_map,
                        const float* __restrict__ probs, Vec<W>* __restrict__ out, float* __restrict__ out_probs,
                        uint8_t* __restrict__ named, MoveShape s) {
  const TeamSlot me = team_slot(s);
  if (me.t < s.tokens) permute_token<W, U>(x, row_map, probs, out, out_probs, named, s, me.t, me.lane);
}

// zero_unused_rows of permute_by_map: every row the move did not mark, as zeros (a warp per row; a
// marked row costs one byte read). V: 16-byte vectors where the rows allow, else 2 bytes.
template <class V>
__global__ void __launch_bounds__(kMoveThreads)
    zero_unnamed_rows_kernel(const uint8_t* __restrict__ named, int64_t rows, int64_t row_vecs, V* __restrict__ out,
                             float* __restrict__ out_probs) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kMoveThreads / 32);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * (kMoveThreads / 32) + threadIdx.x / 32; r < rows; r += warps) {
    if (named[r]) continue;
    V* row = out + r * row_vecs;
    for (int64_t v = lane; v < row_vecs; v += 32) row[v] = V{};
    if (lane == 0 && out_probs != nullptr) out_probs[r] = 0.0f;
  }
}

constexpr int kPermuteVecs = 4;  // vectors per thread loaded before the K stores

template <int W, int U>
void launch_permute(const Vec<W>* x, const int32_t* row_map, const float* probs, Vec<W>* out, float* out_probs,
                    uint8_t* named, const MoveShape& s, cudaStream_t stream, bool dependent) {
  launch(permute_rows_kernel<W, U>, move_blocks(s), move_threads(s), stream, dependent, x, row_map, probs, out,
         out_probs, named, s);
}

}  // namespace

void permute_rows(const PermuteByMapArgs& a, void* stream_ptr) { move_rows(a, as_stream(stream_ptr), false); }

void permute_detail::move_rows(const PermuteByMapArgs& a, cudaStream_t stream, bool dependent) {
  const int64_t T = a.row_map.shape[0], K = a.row_map.shape[1];
  const int64_t R = a.permuted_x.shape[0], H = a.permuted_x.shape[1];
  float* out_probs = a.permuted_probs.data != nullptr ? a.permuted_probs.ptr<float>() : nullptr;
  // zero_unused_rows: a byte per row, set by the move for the rows it fills; then the others zeroed.
  const bool zero = a.zero_unused_rows && R > 0;
  Workspace ws(zero ? Workspace::aligned(R) : 0, stream);
  uint8_t* named = zero ? ws.take<uint8_t>(R) : nullptr;
  if (zero) MXMOE_CUDA_CHECK(cudaMemsetAsync(named, 0, static_cast<size_t>(R), stream));
  if (T > 0) {
    const int32_t* row_map = a.row_map.ptr<const int32_t>();
    const float* probs = a.probs.ptr<const float>();
    with_vector_bytes(vector_bytes(H, {a.x.data, a.permuted_x.data}), [&](auto w) {
      constexpr int W = decltype(w)::value;
      launch_permute<W, kPermuteVecs>(static_cast<const Vec<W>*>(a.x.data), row_map, probs,
                                      static_cast<Vec<W>*>(a.permuted_x.data), out_probs, named,
                                      move_shape(T, K, R, H, W, kPermuteVecs), stream, dependent && !zero);
    });
  }
  if (!zero) return;
  const int64_t row_bytes = H * 2;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(R, kMoveThreads / 32), 132 * 16));
  if (rows_take_16_bytes(row_bytes, a.permuted_x.data))
    zero_unnamed_rows_kernel<uint4><<<blocks, kMoveThreads, 0, stream>>>(
        named, R, row_bytes / 16, static_cast<uint4*>(a.permuted_x.data), out_probs);
  else
    zero_unnamed_rows_kernel<uint16_t>
        <<<blocks, kMoveThreads, 0, stream>>>(named, R, H, static_cast<uint16_t*>(a.permuted_x.data), out_probs);
  MXMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace mxmoe::cuda::portable
