// The library's device memory pool (src/common/pool.h): what the library frees stays reserved
// across a synchronize, so the next call reuses it instead of mapping it again (the device's default
// pool, threshold 0, returned it at every sync); release_cached_memory() returns it; layer buffers
// and kernel scratch both come from it; its watermark counts them.
#include <gtest/gtest.h>

#include "mxmoe/context.h"
#include "src/common/memory.h"
#include "tests/gpu_support.h"

#if defined(MXMOE_WITH_CUDA)
#include <cuda_runtime.h>

#include "src/common/pool.h"
#include "src/cuda/common/workspace.h"
#endif

namespace mxmoe {
namespace {

TEST(GpuMemoryPool, FreedMemoryStaysReservedAcrossASyncAndIsReusedUntilReleased) {
  MXMOE_REQUIRE_GPU();
#if defined(MXMOE_WITH_CUDA)
  constexpr int64_t kBytes = int64_t{256} << 20;
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  {
    detail::Buffer b = detail::allocate(test::kGpu0, kBytes, s);  // a layer buffer
    ASSERT_EQ(cudaMemsetAsync(b.ptr, 0x5a, kBytes, s), cudaSuccess);
  }  // freed on s
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  const uint64_t kept = cuda::pool_reserved(0);
  EXPECT_GE(kept, static_cast<uint64_t>(kBytes)) << "the pool gave the freed buffer back at the synchronize";

  cuda::pool_used_high(0, /*reset=*/true);
  {
    cuda::Workspace w(kBytes, s);  // kernel scratch: the same pool, the same reserved memory
    char* p = w.take<char>(kBytes);
    ASSERT_EQ(cudaMemsetAsync(p, 0x33, kBytes, s), cudaSuccess);
  }
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(cuda::pool_reserved(0), kept) << "a second allocation of the same size reserved more memory";
  EXPECT_GE(cuda::pool_used_high(0, /*reset=*/false), static_cast<uint64_t>(kBytes));

  release_cached_memory();
  EXPECT_LT(cuda::pool_reserved(0), static_cast<uint64_t>(kBytes)) << "release_cached_memory kept the memory";
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
#endif
}

}  // namespace
}  // namespace mxmoe
