// The finiteness scan of Options::check_finite on device data (cuda_ops.h check_finite): one
// grid-stride pass that keeps, per warp, the first non-finite value its threads met and folds it
// into one word with atomicMin (nonfinite_code: the smallest code is the smallest index), then one
// 8-byte device-to-host copy of that word. The copy synchronises the stream: the scan runs only when
// the caller opted in, and never inside CUDA-graph capture.
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuCheckFinite*'
#include <algorithm>

#include "mxmoe/numerics.h"
#include "src/common/experts.h"
#include "src/common/finite.h"
#include "src/cuda/common/check.h"
#include "src/cuda/common/workspace.h"
#include "src/cuda/cuda_ops.h"

namespace mxmoe::cuda {
namespace {

constexpr int kBlock = 256;
constexpr int64_t kMaxBlocks = 4096;

__global__ void check_finite_kernel(ExpertPtrs src, bool bf16, int64_t count, int64_t total,
                                    unsigned long long* __restrict__ first) {
  unsigned long long found = kAllFinite;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kBlock;
  // Each thread's indices grow, so its first hit is its smallest.
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; i < total; i += stride) {
    const int64_t e = i / count, j = i - e * count;
    const float v = bf16 ? f32_from_bf16(src.at<const uint16_t>(e)[j]) : src.at<const float>(e)[j];
    if (!isfinite(v)) {
      found = nonfinite_code(static_cast<uint64_t>(i), v);
      break;
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) found = min(found, __shfl_down_sync(0xffffffffu, found, offset));
  if ((threadIdx.x & 31) == 0 && found != kAllFinite) atomicMin(first, found);
}

}  // namespace

uint64_t check_finite(const detail::CheckFiniteStep& s, void* stream_ptr) {
  const cudaStream_t stream = as_stream(stream_ptr);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MXMOE_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone)
    throw Error("options.check_finite",
                "the finiteness check reads its result on the host (a stream synchronisation), which a stream "
                "being captured into a CUDA graph does not allow; turn it off while capturing");
  const int64_t total = s.experts * s.count;
  if (total == 0) return kAllFinite;
  const int64_t elem = static_cast<int64_t>(dtype_size(s.dtype));
  Workspace ws(Workspace::aligned(sizeof(unsigned long long)), stream);
  auto* first = ws.take<unsigned long long>(1);
  MXMOE_CUDA_CHECK(cudaMemsetAsync(first, 0xff, sizeof(unsigned long long), stream));  // kAllFinite
  const int64_t blocks = std::min<int64_t>((total + kBlock - 1) / kBlock, kMaxBlocks);
  check_finite_kernel<<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(
      expert_ptrs(s.src, s.count, elem), s.dtype == DType::bf16, s.count, total, first);
  MXMOE_CUDA_CHECK_LAUNCH();
  unsigned long long host = kAllFinite;
  MXMOE_CUDA_CHECK(cudaMemcpyAsync(&host, first, sizeof host, cudaMemcpyDeviceToHost, stream));
  MXMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

}  // namespace mxmoe::cuda
