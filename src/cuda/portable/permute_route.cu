// route_tokens of the portable backend (cuda_ops.h; docs/kernels/permute.md): a stable counting
// sort of the (token, slot) pairs by expert id, on the device:
//   count   per CTA tile, per-warp shared-memory histograms (__match_any_sync groups equal keys of a
//           warp, the group's first lane adds the group's size);
//   scan    per bin, an exclusive scan over the tiles (one warp lane per bin);
//   assign  each CTA re-counts its warps, turns the counts into every warp's first position per
//           bin, then walks its slots in order: position = the warp's running count + the lane's
//           rank among the lanes of its group.
// E <= 1024 (here): one such sort with the expert id as the bin; its assign applies the capacity
// and writes row_map, the offsets and the invalid count directly. One tile: a single CTA does all
// three (one launch); a count matrix of at most kFusedScanBudget entries: each assign CTA sums its
// columns itself (two launches). E > 1024: permute_route_radix.cu, on the same three kernels.
// route_and_permute_rows chains the move (permute_move.cu) on the assign with a programmatic
// dependent launch where the kernels were compiled for sm_90+.
//
// Bit-identical to the CPU reference (src/cpu/permute.cpp): the routing is a function of the ids
// alone. No host synchronisation: scratch comes from a stream-ordered Workspace, every size is
// known on the host from the shapes, so a call can be captured in a graph.
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuPermute*'
#include <algorithm>
#include <climits>
#include <mutex>
#include <string>
#include <vector>

#include "src/common/experts.h"
#include "src/cuda/common/block_scan.cuh"
#include "src/cuda/common/check.h"
#include "src/cuda/common/device_facts.h"
#include "src/cuda/common/workspace.h"
#include "src/cuda/cuda_ops.h"
#include "src/cuda/portable/permute_common.cuh"
#include "src/cuda/portable/permute_route.cuh"

namespace mxmoe::cuda::portable {
using namespace permute_detail;
namespace {

__device__ __forceinline__ int bin_of(int32_t key, const SortPass& p) {
  if (p.first && (key < 0 || key >= p.experts)) return p.bins;
  return p.direct ? key : (key >> p.shift) & (kMaxBins - 1);
}

__device__ __forceinline__ int64_t keys_of(const SortPass& p) { return p.dropped != nullptr ? p.n - *p.dropped : p.n; }

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
  __shared__ int32_t start[kCols];                 // direct: the offsets; sort pass: each digit's first position
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

// Rows offsets[E] .. R-1 of a [R, row_bytes] buffer as zeros, 16 bytes per thread and step (row_bytes
// % 16 == 0) or 4 (row_bytes % 4 == 0, the probs); nothing to do costs one read of offsets[E].
template <class V>
__global__ void __launch_bounds__(kMoveThreads)
    zero_rows_from_kernel(const int32_t* __restrict__ used, int64_t rows, int64_t row_vecs, V* __restrict__ out) {
  zero_tail(out, clamp_offset(*used, rows) * row_vecs, rows * row_vecs);
}
template <class V>
void zero_rows_from(const int32_t* used, int64_t rows, int64_t row_bytes, void* out, cudaStream_t stream) {
  const int64_t vecs = row_bytes / static_cast<int64_t>(sizeof(V));
  if (rows <= 0 || vecs <= 0) return;
  const int64_t blocks = std::min<int64_t>(ceil_div(rows * vecs, kMoveThreads), 132 * 16);
  zero_rows_from_kernel<V>
      <<<static_cast<unsigned>(blocks), kMoveThreads, 0, stream>>>(used, rows, vecs, static_cast<V*>(out));
  MXMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace permute_detail {
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
}  // namespace permute_detail

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
    SortPass p{ids,    ids_64, nullptr, slots, nullptr, static_cast<int32_t>(E), true, true, 0, static_cast<int>(E),
               g.tile, nullptr};
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
  route_radix({slots, E, ids, ids_64, capacity, row_map, offsets, invalid}, stream);
  return false;
}

}  // namespace mxmoe::cuda::portable
