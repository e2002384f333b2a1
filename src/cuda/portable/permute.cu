// Token permute and unpermute of the portable backend (cuda_ops.h; docs/kernels/permute.md):
//
// route_tokens    a stable counting sort of the (token, slot) pairs by expert id, on the device:
//                   count   per CTA tile, per-warp shared-memory histograms (__match_any_sync groups
//                           equal keys of a warp, the group's first lane adds the group's size);
//                   scan    per bin, an exclusive scan over the tiles (one warp lane per bin);
//                   assign  each CTA re-counts its warps, turns the counts into every warp's first
//                           position per bin, then walks its slots in order: position = the warp's
//                           running count + the lane's rank among the lanes of its group.
//                 E <= 1024: one such sort with the expert id as the bin; its assign applies the
//                 capacity and writes row_map, the offsets and the invalid count directly. One
//                 tile: a single CTA does all three (one launch); a count matrix of at most
//                 kFusedScanBudget entries: each assign CTA sums its columns itself (two launches).
//                 E > 1024: an LSD radix sort of (id, slot) pairs by 10-bit digits with the same
//                 three kernels per digit (the first drops the ids outside [0, E)), then per expert
//                 its first sorted position (binary search), the capped counts' exclusive scan
//                 (the offsets), and row_map from the sorted order.
// permute_rows    one team of whole warps per token (as few as cover the row with 4 vectors per
//                 thread, at most 256 threads): the row is loaded once into registers (16/8/4/2-byte
//                 vectors, the widest H and the pointers allow), then stored to each of its K rows;
//                 probs likewise.
// unpermute_rows  one team per token: per vector position, fp32 accumulators from +0; the K rows'
//                 vectors are loaded in groups (several loads in flight), then added in slot order
//                 with __fadd_rn; rounded once to bf16.
//
// Bit-identical to the CPU reference (src/cpu/permute.cpp): the routing is a function of the ids
// alone; unpermute's sums are the same fp32 additions in the same order, with the host's (x86) NaN
// propagation (add_like_host). No host synchronisation: scratch comes from a stream-ordered
// Workspace, every size is known on the host from the shapes, so a call can be captured in a graph.
// row_map entries outside [0, R) are dropped slots (never an out-of-bounds access).
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuPermute*'
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "mxmoe/numerics.h"
#include "src/common/experts.h"
#include "src/cuda/common/block_scan.cuh"
#include "src/cuda/common/check.h"
#include "src/cuda/common/device_facts.h"
#include "src/cuda/common/workspace.h"
#include "src/cuda/cuda_ops.h"

namespace mxmoe::cuda::portable {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

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

// ================================ route_tokens ================================

constexpr int kRouteThreads = 256;  // count / assign CTAs
constexpr int kRouteWarps = kRouteThreads / 32;
constexpr int kDigitBits = 10;
constexpr int kMaxBins = 1 << kDigitBits;  // counted bins per sort; bin `bins` is the drop bin
constexpr int kCols = kMaxBins + 1;        // shared histogram row: the bins and the drop bin
constexpr int kNoSlot = -1;                // the bin of a lane past the end of its range
constexpr int64_t kMinTile = 1024;         // slots per CTA at least
constexpr int64_t kCountBudget = int64_t{1} << 20;  // tile x bin counts in the workspace, at most
constexpr int kScanThreads = 1024;         // column scan, expert bounds and offsets CTAs

// One counting sort over `n` keys (a digit of them, or the key itself).
struct SortPass {
  const int32_t* keys;     // first pass: the ids in slot order (int32), or
  const int64_t* keys64;   //   these (int64 ids, first pass only; outside int32 -> the drop bin)
  const int32_t* vals;     // the slot of each key; nullptr: the key's index (first pass)
  int64_t n;               // keys; with `dropped`, their upper bound
  const int32_t* dropped;  // device: subtracted from n (later passes: the ids the first one dropped)
  int32_t experts;         // first pass: ids outside [0, E) go to the drop bin
  bool first;
  bool direct;             // bin = the id itself (E <= kMaxBins), else the digit at `shift`
  int shift;
  int bins;                // counted bins (<= kMaxBins); the drop bin is `bins`
  int64_t tile;            // slots per CTA, a multiple of kRouteThreads
  int32_t* counts;         // [tiles][bins + 1]: per tile counts, then (after the scan) first positions
};

__device__ __forceinline__ int bin_of(int32_t key, const SortPass& p) {
  if (p.first && (key < 0 || key >= p.experts)) return p.bins;
  return p.direct ? key : (key >> p.shift) & (kMaxBins - 1);
}

__device__ __forceinline__ int64_t keys_of(const SortPass& p) {
  return p.dropped != nullptr ? p.n - *p.dropped : p.n;
}

// This warp's slots: the CTA's tile is split into kRouteWarps contiguous ranges, in order.
struct WarpRange {
  int64_t begin, end;
};
__device__ __forceinline__ WarpRange warp_range(const SortPass& p, int64_t n) {
  const int64_t sub = p.tile / kRouteWarps;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * p.tile + static_cast<int64_t>(threadIdx.x / 32) * sub;
  return {begin, begin + sub < n ? begin + sub : n};
}

__device__ __forceinline__ void zero_histograms(int32_t (*hist)[kCols], int cols) {
  for (int j = static_cast<int>(threadIdx.x); j < kRouteWarps * cols; j += kRouteThreads) hist[j / cols][j % cols] = 0;
}

// Slots a warp loads before it bins them (kRouteBatch x 32, in order): the loads are independent,
// so a warp waits for one memory latency per batch, not per 32 slots.
constexpr int kRouteBatch = 4;

// The bins of the warp's next kRouteBatch x 32 slots from `base` (kNoSlot past the range's end);
// keys[u] is the key of slot base + 32 u + lane.
__device__ __forceinline__ void load_batch(const SortPass& p, WarpRange r, int64_t base, int32_t (&key)[kRouteBatch],
                                           int (&bin)[kRouteBatch]) {
  const int lane = static_cast<int>(threadIdx.x % 32);
#pragma unroll
  for (int u = 0; u < kRouteBatch; ++u) {
    const int64_t i = base + u * 32 + lane;
    if (i >= r.end) {
      key[u] = 0;
    } else if (p.keys64 != nullptr) {  // an int64 id outside [0, E) is dropped: any value past int32 is
      const int64_t id = __ldg(p.keys64 + i);
      key[u] = id >= 0 && id <= INT32_MAX ? static_cast<int32_t>(id) : -1;
    } else {
      key[u] = __ldg(p.keys + i);
    }
  }
#pragma unroll
  for (int u = 0; u < kRouteBatch; ++u) bin[u] = base + u * 32 + lane < r.end ? bin_of(key[u], p) : kNoSlot;
}

// hist[bin] += the warp's keys in each bin over its range (32 slots at a time; lanes with equal bins
// form a group whose first lane adds the group's size: no two lanes write one counter).
__device__ __forceinline__ void count_warp(const SortPass& p, WarpRange r, int32_t* hist) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  for (int64_t base = r.begin; base < r.end; base += 32 * kRouteBatch) {  // uniform over the warp
    int32_t key[kRouteBatch];
    int bin[kRouteBatch];
    load_batch(p, r, base, key, bin);
#pragma unroll
    for (int u = 0; u < kRouteBatch; ++u) {
      const unsigned peers = __match_any_sync(0xffffffffu, bin[u]);
      if (bin[u] != kNoSlot && lane == __ffs(peers) - 1) hist[bin[u]] += __popc(peers);
      __syncwarp();
    }
  }
}

// counts[tile][bin] = keys of the tile in the bin.
__global__ void __launch_bounds__(kRouteThreads) route_count_kernel(SortPass p) {
  pdl_allow_next();  // the assign may start: it counts its own tile before it waits for this
  __shared__ int32_t hist[kRouteWarps][kCols];
  const int cols = p.bins + 1;
  zero_histograms(hist, cols);
  __syncthreads();
  count_warp(p, warp_range(p, keys_of(p)), hist[threadIdx.x / 32]);
  __syncthreads();
  int32_t* row = p.counts + static_cast<int64_t>(blockIdx.x) * cols;
  for (int c = static_cast<int>(threadIdx.x); c < cols; c += kRouteThreads) {
    int32_t s = 0;
    for (int w = 0; w < kRouteWarps; ++w) s += hist[w][c];
    row[c] = s;
  }
}

// Per column c (a bin): counts[b][c] <- sum over tiles b' < b of counts[b'][c]; totals[c] = the sum
// over every tile. 32 columns per CTA (one per lane, coalesced rows); the 32 warps take contiguous
// ranges of tiles, a scan over the warps' sums joins them. counts is read and rewritten by the same
// thread, so it is not __restrict__.
__global__ void __launch_bounds__(kScanThreads)
    route_scan_columns_kernel(int32_t* counts, int tiles, int cols, int32_t* __restrict__ totals) {
  __shared__ int32_t part[32][33];
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int c = static_cast<int>(blockIdx.x) * 32 + lane;
  const int per = (tiles + 31) / 32;
  const int b0 = min(warp * per, tiles), b1 = min(b0 + per, tiles);
  int32_t s = 0;
  if (c < cols) {
#pragma unroll 4
    for (int b = b0; b < b1; ++b) s += counts[static_cast<int64_t>(b) * cols + c];
  }
  part[warp][lane] = s;
  __syncthreads();
  if (warp == 0) {
    int32_t run = 0;
    for (int w = 0; w < 32; ++w) {
      const int32_t v = part[w][lane];
      part[w][lane] = run;
      run += v;
    }
    if (c < cols) totals[c] = run;
  }
  __syncthreads();
  if (c < cols) {
    int32_t run = part[warp][lane];
    for (int b = b0; b < b1; ++b) {
      const int64_t at = static_cast<int64_t>(b) * cols + c;
      const int32_t v = counts[at];
      counts[at] = run;
      run += v;
    }
  }
}

struct AssignOut {
  int32_t* row_map;    // direct: every slot; sort passes: the first pass writes -1 for dropped ids
  int32_t* offsets;    // direct: [E+1], written by CTA 0
  int32_t* invalid;    // direct, optional: [1], written by CTA 0
  int32_t capacity;    // direct: rows kept per expert (INT32_MAX: all)
  int32_t* keys_out;   // sort passes: keys and slots in the pass's order
  int32_t* vals_out;
  // direct, optional (RouteTokensStep::zero_x / zero_probs): rows offsets[E] .. rows-1 written as
  // zeros by the assign CTAs together, once every CTA knows offsets[E] (its start[bins]).
  void* zero_x = nullptr;       // [zero_rows, zero_row_bytes]; 16-byte vectors when zero_vec16, else 2-byte
  float* zero_probs = nullptr;  // [zero_rows]
  int64_t zero_rows = 0, zero_row_bytes = 0;
  bool zero_vec16 = false;
};

// Whether rows of `row_bytes` at `p` can be written in 16-byte vectors (else 2-byte ones).
inline bool rows_take_16_bytes(int64_t row_bytes, const void* p) {
  return row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// out[first .. n-1] = 0, striped over the grid.
template <class V>
__device__ __forceinline__ void zero_tail(V* out, int64_t first, int64_t n) {
  for (int64_t i = first + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = V{};
}

// Where an assign CTA gets the bins' totals and its tile's first position in each bin:
enum class Totals {
  kScanned,  // from the column scan: `totals` [bins + 1], p.counts [tiles][bins + 1] first positions
  kFused,    // p.counts holds the raw per-tile counts; each CTA sums the matrix's columns itself
  kSingle,   // one CTA, no count matrix: its own warps' counts are the totals
};

// The largest count matrix (tiles x (bins + 1)) an assign CTA sums itself (Totals::kFused): at most
// 64 loads per thread, from L2.
constexpr int64_t kFusedScanBudget = 16384;

// kDirect: row_map[i] = offsets[e] + (position of slot i among expert e's slots), or -1 past the
// capacity or for an id outside [0, E). Sort pass: (key, slot) to its position in the digit order.
template <bool kDirect, Totals kTotals>
__global__ void __launch_bounds__(kRouteThreads)
    route_assign_kernel(SortPass p, const int32_t* __restrict__ totals, AssignOut o) {
  static_assert(kDirect || kTotals == Totals::kScanned, "sort passes use the column scan");
  pdl_allow_next();  // permute_rows may start: it loads its x rows before it waits for this
  constexpr bool kOwnTotals = kTotals != Totals::kScanned;
  __shared__ int32_t hist[kRouteWarps][kCols];
  __shared__ int32_t start[kCols];  // direct: the offsets; sort pass: each digit's first position
  __shared__ int32_t tot[kOwnTotals ? kCols : 1];  // kFused, kSingle: the bins' totals
  __shared__ int32_t pre[kTotals == Totals::kFused ? kCols : 1];  // kFused: the earlier tiles' counts
  __shared__ int warp_totals[32];
  const int cols = p.bins + 1;
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);

  // 1. Every warp's counts per bin over its range; kFused: the count matrix's column sums, over all
  // tiles (tot) and over the tiles before this one (pre). Integer sums: the order does not matter.
  zero_histograms(hist, cols);
  if (kOwnTotals) {
    for (int c = static_cast<int>(threadIdx.x); c < cols; c += kRouteThreads) {
      tot[c] = 0;
      if (kTotals == Totals::kFused) pre[c] = 0;
    }
  }
  __syncthreads();
  const WarpRange r = warp_range(p, keys_of(p));
  count_warp(p, r, hist[warp]);  // the ids: ready before the count kernel started
  pdl_wait();                    // the count matrix (and kScanned: the totals) from here on
  if (kTotals == Totals::kFused) {
    constexpr int kLoads = 8;  // loads in flight per thread
    const int n = static_cast<int>(gridDim.x) * cols, me = static_cast<int>(blockIdx.x);
    for (int j0 = static_cast<int>(threadIdx.x); j0 < n; j0 += kRouteThreads * kLoads) {
      int32_t v[kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int j = j0 + u * kRouteThreads;
        v[u] = j < n ? __ldg(p.counts + j) : 0;
      }
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int j = j0 + u * kRouteThreads;
        if (j >= n) break;
        const int b = j / cols, c = j - b * cols;
        atomicAdd(&tot[c], v[u]);
        if (b < me) atomicAdd(&pre[c], v[u]);
      }
    }
  }
  __syncthreads();
  if (kTotals == Totals::kSingle) {
    for (int c = static_cast<int>(threadIdx.x); c < cols; c += kRouteThreads) {
      int32_t s = 0;
      for (int w = 0; w < kRouteWarps; ++w) s += hist[w][c];
      tot[c] = s;
    }
    __syncthreads();
  }
  const int32_t* const bin_totals = kOwnTotals ? tot : totals;

  // 2. start[d] = sum over bins d' < d of (direct: min(count, capacity); sort: count), d <= bins.
  constexpr int kPer = kMaxBins / kRouteThreads;
  int32_t v[kPer];
  int32_t local = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int d = static_cast<int>(threadIdx.x) * kPer + j;
    v[j] = d < p.bins ? bin_totals[d] : 0;
    if (kDirect) v[j] = min(v[j], o.capacity);
    local += v[j];
  }
  int total = 0;
  int32_t run = block_inclusive_scan<kRouteThreads>(local, ScanSum{}, 0, warp_totals, total) - local;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int d = static_cast<int>(threadIdx.x) * kPer + j;
    if (d < p.bins) start[d] = run;
    run += v[j];
  }
  if (threadIdx.x == 0) start[p.bins] = total;
  __syncthreads();
  if (kDirect && blockIdx.x == 0) {
    for (int e = static_cast<int>(threadIdx.x); e <= p.bins; e += kRouteThreads) o.offsets[e] = start[e];
    if (threadIdx.x == 0 && o.invalid != nullptr) *o.invalid = bin_totals[p.bins];
  }

  // 3. Every warp's first position in every bin: the tile's (the earlier tiles' counts) plus the
  // earlier warps'.
  for (int c = static_cast<int>(threadIdx.x); c < cols; c += kRouteThreads) {
    int32_t at = kTotals == Totals::kScanned ? p.counts[static_cast<int64_t>(blockIdx.x) * cols + c]
                 : kTotals == Totals::kFused ? pre[c]
                                             : 0;
    for (int w = 0; w < kRouteWarps; ++w) {
      const int32_t k = hist[w][c];
      hist[w][c] = at;
      at += k;
    }
  }
  __syncthreads();

  // 4. The slots in order: the group's first lane takes the warp's running position and advances it.
  int32_t* const next = hist[warp];
  for (int64_t base = r.begin; base < r.end; base += 32 * kRouteBatch) {  // uniform over the warp
    int32_t key[kRouteBatch], val[kRouteBatch] = {};
    int bin[kRouteBatch];
    load_batch(p, r, base, key, bin);
    if (!kDirect) {
#pragma unroll
      for (int u = 0; u < kRouteBatch; ++u) {
        const int64_t i = base + u * 32 + lane;
        val[u] = p.vals == nullptr ? static_cast<int32_t>(i) : bin[u] != kNoSlot ? __ldg(p.vals + i) : 0;
      }
    }
#pragma unroll
    for (int u = 0; u < kRouteBatch; ++u) {
      const int64_t i = base + u * 32 + lane;
      const unsigned peers = __match_any_sync(0xffffffffu, bin[u]);
      const int leader = __ffs(peers) - 1;
      int32_t at = 0;
      if (bin[u] != kNoSlot && lane == leader) {
        at = next[bin[u]];
        next[bin[u]] = at + __popc(peers);
      }
      at = __shfl_sync(0xffffffffu, at, leader) + __popc(peers & ((1u << lane) - 1u));
      __syncwarp();
      if (bin[u] == kNoSlot) continue;
      if (kDirect) {
        o.row_map[i] = bin[u] < p.bins && at < o.capacity ? start[bin[u]] + at : -1;
      } else if (bin[u] == p.bins) {
        o.row_map[i] = -1;  // first pass: an id outside [0, E)
      } else {
        const int32_t to = start[bin[u]] + at;
        o.keys_out[to] = key[u];
        o.vals_out[to] = val[u];
      }
    }
  }

  // 5. Direct: the rows no slot took (offsets[E] = start[bins] .. zero_rows-1), striped over the CTAs.
  if (kDirect && (o.zero_x != nullptr || o.zero_probs != nullptr)) {
    const int64_t used = min(static_cast<int64_t>(start[p.bins]), o.zero_rows);
    if (o.zero_probs != nullptr) zero_tail(o.zero_probs, used, o.zero_rows);
    if (o.zero_x != nullptr) {
      if (o.zero_vec16) {
        const int64_t v = o.zero_row_bytes / 16;
        zero_tail(static_cast<uint4*>(o.zero_x), used * v, o.zero_rows * v);
      } else {
        const int64_t v = o.zero_row_bytes / 2;
        zero_tail(static_cast<uint16_t*>(o.zero_x), used * v, o.zero_rows * v);
      }
    }
  }
}

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

struct RouteGeometry {
  int64_t tile, tiles;
};
// Tiles of at least kMinTile slots, few enough that tiles x cols counts fit kCountBudget; at least
// one tile (T = 0 still writes the offsets).
RouteGeometry route_geometry(int64_t slots, int64_t cols) {
  const int64_t max_tiles = std::max<int64_t>(1, kCountBudget / cols);
  int64_t tile = std::max(kMinTile, ceil_div(slots, max_tiles));
  tile = ceil_div(tile, kRouteThreads) * kRouteThreads;
  return {tile, std::max<int64_t>(1, ceil_div(slots, tile))};
}

// One counting sort over p's bins: count, column scan, assign (three launches).
void launch_sort_pass(const SortPass& p, int64_t tiles, int32_t* totals, bool direct, const AssignOut& o,
                      cudaStream_t stream) {
  const int cols = p.bins + 1;
  route_count_kernel<<<static_cast<unsigned>(tiles), kRouteThreads, 0, stream>>>(p);
  MXMOE_CUDA_CHECK_LAUNCH();
  route_scan_columns_kernel<<<static_cast<unsigned>(ceil_div(cols, 32)), kScanThreads, 0, stream>>>(
      p.counts, static_cast<int>(tiles), cols, totals);
  MXMOE_CUDA_CHECK_LAUNCH();
  const unsigned grid = static_cast<unsigned>(tiles);
  if (direct) {
    route_assign_kernel<true, Totals::kScanned><<<grid, kRouteThreads, 0, stream>>>(p, totals, o);
  } else {
    route_assign_kernel<false, Totals::kScanned><<<grid, kRouteThreads, 0, stream>>>(p, totals, o);
  }
  MXMOE_CUDA_CHECK_LAUNCH();
}

// ================================ permute_rows / unpermute_rows ================================

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
  if (named != nullptr) {  // zero_unused_rows: the rows this token fills
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

// The widest vector (16, 8, 4 or 2 bytes) dividing a row of H bf16 and aligning every pointer.
int vector_bytes(int64_t H, std::initializer_list<const void*> ptrs) {
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
    case 16: f(std::integral_constant<int, 16>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    default: f(std::integral_constant<int, 2>{}); break;
  }
}

// Threads per token: whole warps, as few as cover a row with `per_thread` vectors each in as few
// passes as kMoveThreads threads need, the row spread evenly over those passes (H = 2880, 16-byte
// vectors, 1 per thread: 2 passes of 192 threads, where a power-of-two team of 256 ran its second
// pass with 104). Tokens per CTA: as many teams as fit kMoveThreads.
MoveShape move_shape(int64_t T, int64_t K, int64_t R, int64_t H, int w, int per_thread) {
  MoveShape s{T, static_cast<int32_t>(K), R, H * 2 / w, 32, 1};
  const int64_t passes = std::max<int64_t>(1, ceil_div(s.vecs, int64_t{per_thread} * kMoveThreads));
  const int64_t want = ceil_div(ceil_div(s.vecs, passes * per_thread), 32) * 32;
  s.team = static_cast<int>(std::clamp<int64_t>(want, 32, kMoveThreads));
  s.per_cta = kMoveThreads / s.team;
  return s;
}

unsigned move_blocks(const MoveShape& s) { return static_cast<unsigned>(ceil_div(s.tokens, s.per_cta)); }
unsigned move_threads(const MoveShape& s) { return static_cast<unsigned>(s.team * s.per_cta); }

constexpr int kPermuteVecs = 4;  // vectors per thread loaded before the K stores

template <int W, int U>
void launch_permute(const Vec<W>* x, const int32_t* row_map, const float* probs, Vec<W>* out, float* out_probs,
                    uint8_t* named, const MoveShape& s, cudaStream_t stream, bool dependent) {
  launch(permute_rows_kernel<W, U>, move_blocks(s), move_threads(s), stream, dependent, x, row_map, probs, out,
         out_probs, named, s);
}

template <int W, int U, int G>
void launch_unpermute(const Vec<W>* in, const int32_t* row_map, const float* in_probs, Vec<W>* y, float* probs,
                      const MoveShape& s, cudaStream_t stream) {
  unpermute_rows_kernel<W, U, G><<<move_blocks(s), move_threads(s), 0, stream>>>(in, row_map, in_probs, y, probs, s);
  MXMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace {
// Rows offsets[E] .. R-1 of a [R, row_bytes] buffer as zeros, 16 bytes per thread and step (row_bytes
// % 16 == 0) or 4 (row_bytes % 4 == 0, the probs); nothing to do costs one read of offsets[E].
template <class V>
__global__ void __launch_bounds__(kMoveThreads) zero_rows_from_kernel(const int32_t* __restrict__ used, int64_t rows,
                                                                      int64_t row_vecs, V* __restrict__ out) {
  zero_tail(out, clamp_offset(*used, rows) * row_vecs, rows * row_vecs);
}
template <class V>
void zero_rows_from(const int32_t* used, int64_t rows, int64_t row_bytes, void* out, cudaStream_t stream) {
  const int64_t vecs = row_bytes / static_cast<int64_t>(sizeof(V));
  if (rows <= 0 || vecs <= 0) return;
  const int64_t blocks = std::min<int64_t>(ceil_div(rows * vecs, kMoveThreads), 132 * 16);
  zero_rows_from_kernel<V><<<static_cast<unsigned>(blocks), kMoveThreads, 0, stream>>>(used, rows, vecs, static_cast<V*>(out));
  MXMOE_CUDA_CHECK_LAUNCH();
}
}  // namespace

// Whether permute_tokens chains its kernels with programmatic dependent launches on `device`: only
// where the kernels that run there were compiled for sm_90 or later (their pdl_wait is real; a
// build for sm_80 and sm_90a running on a Blackwell GPU JIT-compiles the sm_80 PTX, which has no
// wait: chaining those would race).
// The kernels' PTX target is asked once per device (cudaFuncGetAttributes: ptxVersion).
static bool chain_launches(int device) {
  if (device < 0) return false;
  static std::mutex mu;
  static std::vector<int8_t> known;  // per device: -1 not asked yet, 0 / 1
  std::lock_guard<std::mutex> lock(mu);
  if (known.size() <= static_cast<size_t>(device)) known.resize(device + 1, -1);
  if (known[device] < 0) {
    known[device] = 0;
    if (device_facts(device).major >= 9) {
      int current = 0;
      cudaFuncAttributes fa{};
      const bool asked = cudaGetDevice(&current) == cudaSuccess && cudaSetDevice(device) == cudaSuccess &&
                         cudaFuncGetAttributes(&fa, route_count_kernel) == cudaSuccess;
      if (!asked) cudaGetLastError();
      cudaSetDevice(current);
      known[device] = asked && fa.ptxVersion >= 90 ? 1 : 0;
    }
  }
  return known[device] == 1;
}

// Returns whether the routing's last kernel is the direct plans' assign (which also wrote the zero
// rows); `chain`: the fused plan's assign is a programmatic dependent of its count kernel.
static bool route_ids(const detail::RouteTokensStep& s, cudaStream_t stream, bool chain);

// The routing and the zero rows; returns whether the last kernel is the direct assign.
static bool route(const detail::RouteTokensStep& s, cudaStream_t stream, bool chain) {
  if (route_ids(s, stream, chain)) return true;
  const int32_t* used = s.offsets.ptr<const int32_t>() + s.experts;
  if (s.zero_x.data) {
    const int64_t row_bytes = s.zero_x.shape[1] * 2;
    if (rows_take_16_bytes(row_bytes, s.zero_x.data))
      zero_rows_from<uint4>(used, s.zero_x.shape[0], row_bytes, s.zero_x.data, stream);
    else
      zero_rows_from<uint16_t>(used, s.zero_x.shape[0], row_bytes, s.zero_x.data, stream);
  }
  if (s.zero_probs.data) zero_rows_from<float>(used, s.zero_probs.shape[0], 4, s.zero_probs.data, stream);
  return false;
}

static void move_rows(const PermuteByMapArgs& a, cudaStream_t stream, bool dependent);

void route_tokens(const detail::RouteTokensStep& s, void* stream_ptr) {
  route(s, as_stream(stream_ptr), chain_launches(s.expert_ids.device.index));
}

// permute_tokens' two steps chained: the move is a programmatic dependent of the routing's assign
// kernel, so its CTAs start and load their x rows while the routing finishes (x is ready: it was
// before the routing's first kernel started, which was launched as usual).
void route_and_permute_rows(const detail::RouteTokensStep& s, const PermuteByMapArgs& a, void* stream_ptr) {
  const cudaStream_t stream = as_stream(stream_ptr);
  const bool chain = chain_launches(s.expert_ids.device.index);
  const bool after_assign = route(s, stream, chain);
  move_rows(a, stream, chain && after_assign);
}

static bool route_ids(const detail::RouteTokensStep& s, cudaStream_t stream, bool chain) {
  const int64_t slots = s.expert_ids.numel(), E = s.experts;
  if (E < 1 || E >= INT32_MAX)
    throw Error("experts", "E=" + std::to_string(E) + " is outside what the device routing takes");
  const int32_t capacity = s.capacity < 0 ? INT32_MAX : static_cast<int32_t>(std::min<int64_t>(s.capacity, INT32_MAX));
  const bool ids64 = s.expert_ids.dtype == DType::i64;
  const int32_t* ids = ids64 ? nullptr : s.expert_ids.ptr<const int32_t>();
  const int64_t* ids_64 = ids64 ? s.expert_ids.ptr<const int64_t>() : nullptr;
  int32_t* row_map = s.row_map.ptr<int32_t>();
  int32_t* offsets = s.offsets.ptr<int32_t>();
  int32_t* invalid = s.invalid.data != nullptr ? s.invalid.ptr<int32_t>() : nullptr;

  if (E <= kMaxBins) {  // one counting sort, the id as the bin
    const int64_t cols = E + 1;
    const RouteGeometry g = route_geometry(slots, cols);
    AssignOut o{row_map, offsets, invalid, capacity, nullptr, nullptr};
    if (s.zero_x.data != nullptr || s.zero_probs.data != nullptr) {
      o.zero_x = s.zero_x.data;
      o.zero_probs = s.zero_probs.data != nullptr ? s.zero_probs.ptr<float>() : nullptr;
      o.zero_rows = s.zero_x.data != nullptr ? s.zero_x.shape[0] : s.zero_probs.shape[0];
      o.zero_row_bytes = s.zero_x.data != nullptr ? s.zero_x.shape[1] * 2 : 0;
      o.zero_vec16 = rows_take_16_bytes(o.zero_row_bytes, s.zero_x.data);
    }
    SortPass p{ids, ids_64, nullptr, slots, nullptr, static_cast<int32_t>(E), true, true, 0, static_cast<int>(E), g.tile,
               nullptr};
    if (g.tiles == 1) {  // one CTA counts, scans and assigns: one launch, no scratch
      route_assign_kernel<true, Totals::kSingle><<<1, kRouteThreads, 0, stream>>>(p, nullptr, o);
      MXMOE_CUDA_CHECK_LAUNCH();
      return true;
    }
    const bool fused = g.tiles * cols <= kFusedScanBudget;  // two launches: count, assign
    Workspace ws(Workspace::aligned(g.tiles * cols * 4) + (fused ? 0 : Workspace::aligned(cols * 4)), stream);
    p.counts = ws.take<int32_t>(g.tiles * cols);
    if (fused) {
      route_count_kernel<<<static_cast<unsigned>(g.tiles), kRouteThreads, 0, stream>>>(p);
      MXMOE_CUDA_CHECK_LAUNCH();
      launch(route_assign_kernel<true, Totals::kFused>, static_cast<unsigned>(g.tiles), kRouteThreads, stream, chain, p,
             nullptr, o);
      return true;
    }
    launch_sort_pass(p, g.tiles, ws.take<int32_t>(cols), /*direct=*/true, o, stream);
    return true;
  }

  // LSD radix sort of (id, slot) by 10-bit digits of id, then the offsets and row_map.
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
    const SortPass p{pass == 0 ? ids : keys[(pass - 1) & 1],
                     pass == 0 ? ids_64 : nullptr,
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
                     {row_map, nullptr, nullptr, 0, keys[pass & 1], vals[pass & 1]}, stream);
  }
  const int32_t* sorted_keys = keys[(passes - 1) & 1];
  const int32_t* sorted_vals = vals[(passes - 1) & 1];
  route_bounds_kernel<<<static_cast<unsigned>(expert_ctas), kScanThreads, 0, stream>>>(
      sorted_keys, slots, dropped, static_cast<int32_t>(E), capacity, first, kept_sums);
  MXMOE_CUDA_CHECK_LAUNCH();
  route_offsets_kernel<<<static_cast<unsigned>(expert_ctas), kScanThreads, 0, stream>>>(
      first, kept_sums, static_cast<int32_t>(E), capacity, dropped, offsets, invalid);
  MXMOE_CUDA_CHECK_LAUNCH();
  const int64_t blocks = std::clamp<int64_t>(ceil_div(slots, kRouteThreads), 1, 8192);
  route_assign_sorted_kernel<<<static_cast<unsigned>(blocks), kRouteThreads, 0, stream>>>(
      sorted_keys, sorted_vals, slots, dropped, first, offsets, capacity, row_map);
  MXMOE_CUDA_CHECK_LAUNCH();
  return false;
}

void permute_rows(const PermuteByMapArgs& a, void* stream_ptr) { move_rows(a, as_stream(stream_ptr), false); }

static void move_rows(const PermuteByMapArgs& a, cudaStream_t stream, bool dependent) {
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
    zero_unnamed_rows_kernel<uint4><<<blocks, kMoveThreads, 0, stream>>>(named, R, row_bytes / 16,
                                                                        static_cast<uint4*>(a.permuted_x.data), out_probs);
  else
    zero_unnamed_rows_kernel<uint16_t><<<blocks, kMoveThreads, 0, stream>>>(
        named, R, H, static_cast<uint16_t*>(a.permuted_x.data), out_probs);
  MXMOE_CUDA_CHECK_LAUNCH();
}

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
