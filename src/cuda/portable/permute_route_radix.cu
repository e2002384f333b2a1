// route_tokens for E > 1024 experts (docs/kernels/permute.md): an LSD radix sort of the (id, slot)
// pairs by 10-bit digits of the id, each digit one counting sort of permute_route.cu (count,
// column scan, assign; the first drops the ids outside [0, E)); then per expert its first sorted
// position (binary search), the capped counts' exclusive scan (the offsets), and row_map from the
// sorted order. Stable at every pass, so the result is the direct sort's: bit-identical to the CPU
// reference (src/cpu/permute.cpp).
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuPermute*'
#include <algorithm>

#include "src/cuda/common/block_scan.cuh"
#include "src/cuda/common/check.h"
#include "src/cuda/common/workspace.h"
#include "src/cuda/portable/permute_route.cuh"

namespace mxmoe::cuda::portable {
using namespace permute_detail;
namespace {

// First index of `keys` [0, n) (sorted) that is >= e.
__device__ __forceinline__ int32_t lower_bound(const int32_t* __restrict__ keys, int32_t n, int32_t e) {
  int32_t lo = 0, hi = n;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (keys[mid] < e) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Sorted valid ids -> first[e] (e in [0, E]): expert e's first sorted position; kept_sums[cta] =
// the kept rows min(count, capacity) of the CTA's experts.
__global__ void __launch_bounds__(kScanThreads)
    route_bounds_kernel(const int32_t* __restrict__ keys, int64_t n_bound, const int32_t* __restrict__ dropped,
                        int32_t experts, int32_t capacity, int32_t* __restrict__ first,
                        int32_t* __restrict__ kept_sums) {
  __shared__ int warp_totals[32];
  const int32_t n = static_cast<int32_t>(n_bound - *dropped);
  const int64_t e = static_cast<int64_t>(blockIdx.x) * kScanThreads + threadIdx.x;
  int32_t kept = 0;
  if (e <= experts) {
    const int32_t f = lower_bound(keys, n, static_cast<int32_t>(e));
    first[e] = f;
    if (e < experts) kept = min(lower_bound(keys, n, static_cast<int32_t>(e) + 1) - f, capacity);
  }
  int total = 0;
  block_inclusive_scan<kScanThreads>(kept, ScanSum{}, 0, warp_totals, total);
  if (threadIdx.x == 0) kept_sums[blockIdx.x] = total;
}

// offsets[e] = kept rows of the experts before e (e in [0, E]); the invalid count.
__global__ void __launch_bounds__(kScanThreads)
    route_offsets_kernel(const int32_t* __restrict__ first, const int32_t* __restrict__ kept_sums, int32_t experts,
                         int32_t capacity, const int32_t* __restrict__ dropped, int32_t* __restrict__ offsets,
                         int32_t* __restrict__ invalid) {
  __shared__ int warp_totals[32];
  const int cta = static_cast<int>(blockIdx.x);
  int32_t carry = 0;
  for (int base = 0; base < cta; base += kScanThreads) {  // uniform over the CTA
    const int j = base + static_cast<int>(threadIdx.x);
    int total = 0;
    block_inclusive_scan<kScanThreads>(j < cta ? kept_sums[j] : 0, ScanSum{}, 0, warp_totals, total);
    carry += total;
  }
  const int64_t e = static_cast<int64_t>(cta) * kScanThreads + threadIdx.x;
  const int32_t kept = e < experts ? min(first[e + 1] - first[e], capacity) : 0;
  int total = 0;
  const int32_t incl = block_inclusive_scan<kScanThreads>(kept, ScanSum{}, 0, warp_totals, total);
  if (e <= experts) offsets[e] = carry + incl - kept;
  if (cta == 0 && threadIdx.x == 0 && invalid != nullptr) *invalid = *dropped;
}

// row_map of every valid slot from its sorted position p: rank r = p - first[e] within its expert.
__global__ void __launch_bounds__(kRouteThreads)
    route_assign_sorted_kernel(const int32_t* __restrict__ keys, const int32_t* __restrict__ vals, int64_t n_bound,
                               const int32_t* __restrict__ dropped, const int32_t* __restrict__ first,
                               const int32_t* __restrict__ offsets, int32_t capacity, int32_t* __restrict__ row_map) {
  const int64_t n = n_bound - *dropped;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kRouteThreads;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * kRouteThreads + threadIdx.x; p < n; p += stride) {
    const int32_t e = keys[p];
    const int32_t r = static_cast<int32_t>(p) - first[e];
    row_map[vals[p]] = r < capacity ? offsets[e] + r : -1;
  }
}

}  // namespace

void permute_detail::route_radix(const RouteIds& r, cudaStream_t stream) {
  const int64_t slots = r.slots, E = r.experts;
  const int32_t capacity = r.capacity;
  int bits = 0;
  while ((int64_t{1} << bits) < E) ++bits;  // ids < E need `bits` bits
  const int passes = (bits + kDigitBits - 1) / kDigitBits;
  const RouteGeometry g = route_geometry(slots, kCols);
  const int64_t expert_ctas = ceil_div(E + 1, kScanThreads);
  Workspace ws(Workspace::aligned(g.tiles * kCols * 4) + Workspace::aligned(int64_t{passes} * kCols * 4) +
                   4 * Workspace::aligned(slots * 4) + Workspace::aligned((E + 1) * 4) +
                   Workspace::aligned(expert_ctas * 4),
               stream);
  int32_t* counts = ws.take<int32_t>(g.tiles * kCols);
  int32_t* totals = ws.take<int32_t>(int64_t{passes} * kCols);
  int32_t* keys[2] = {ws.take<int32_t>(slots), ws.take<int32_t>(slots)};
  int32_t* vals[2] = {ws.take<int32_t>(slots), ws.take<int32_t>(slots)};
  int32_t* first = ws.take<int32_t>(E + 1);
  int32_t* kept_sums = ws.take<int32_t>(expert_ctas);
  const int32_t* dropped = totals + kMaxBins;  // the first pass's drop bin: ids outside [0, E)

  for (int pass = 0; pass < passes; ++pass) {
    const int shift = pass * kDigitBits;
    const int bins = pass + 1 < passes ? kMaxBins : static_cast<int>(((E - 1) >> shift) + 1);
    const SortPass p{pass == 0 ? r.ids : keys[(pass - 1) & 1],
                     pass == 0 ? r.ids_64 : nullptr,
                     pass == 0 ? nullptr : vals[(pass - 1) & 1],
                     slots,
                     pass == 0 ? nullptr : dropped,
                     static_cast<int32_t>(E),
                     pass == 0,
                     false,
                     shift,
                     bins,
                     g.tile,
                     counts};
    launch_sort_pass(p, g.tiles, totals + int64_t{pass} * kCols, /*direct=*/false,
                     {r.row_map, nullptr, nullptr, 0, keys[pass & 1], vals[pass & 1]}, stream);
  }
  const int32_t* sorted_keys = keys[(passes - 1) & 1];
  const int32_t* sorted_vals = vals[(passes - 1) & 1];
  route_bounds_kernel<<<static_cast<unsigned>(expert_ctas), kScanThreads, 0, stream>>>(
      sorted_keys, slots, dropped, static_cast<int32_t>(E), capacity, first, kept_sums);
  MXMOE_CUDA_CHECK_LAUNCH();
  route_offsets_kernel<<<static_cast<unsigned>(expert_ctas), kScanThreads, 0, stream>>>(
      first, kept_sums, static_cast<int32_t>(E), capacity, dropped, r.offsets, r.invalid);
  MXMOE_CUDA_CHECK_LAUNCH();
  const int64_t blocks = std::clamp<int64_t>(ceil_div(slots, kRouteThreads), 1, 8192);
  route_assign_sorted_kernel<<<static_cast<unsigned>(blocks), kRouteThreads, 0, stream>>>(
      sorted_keys, sorted_vals, slots, dropped, first, r.offsets, capacity, r.row_map);
  MXMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace mxmoe::cuda::portable
