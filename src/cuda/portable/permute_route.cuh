// The counting sort of route_tokens (docs/kernels/permute.md), as permute_route.cu (the sort's
// kernels, and the whole routing for E <= kMaxBins) and permute_route_radix.cu (E > kMaxBins: the
// radix sort of (id, slot) pairs over the same sort passes, then per-expert bounds) share it.
#pragma once
#include <algorithm>
#include <cstdint>

#include "mxmoe/mxfp8_layout.h"
#include "src/cuda/cuda_ops.h"

namespace mxmoe::cuda::portable::permute_detail {

constexpr int kRouteThreads = 256;  // count / assign CTAs
constexpr int kRouteWarps = kRouteThreads / 32;
constexpr int kDigitBits = 10;
constexpr int kMaxBins = 1 << kDigitBits;           // counted bins per sort; bin `bins` is the drop bin
constexpr int kCols = kMaxBins + 1;                 // shared histogram row: the bins and the drop bin
constexpr int kNoSlot = -1;                         // the bin of a lane past the end of its range
constexpr int64_t kMinTile = 1024;                  // slots per CTA at least
constexpr int64_t kCountBudget = int64_t{1} << 20;  // tile x bin counts in the workspace, at most
constexpr int kScanThreads = 1024;                  // column scan, expert bounds and offsets CTAs

// One counting sort over `n` keys (a digit of them, or the key itself).
struct SortPass {
  const int32_t* keys;     // first pass: the ids in slot order (int32), or
  const int64_t* keys64;   //   these (int64 ids, first pass only; outside int32 -> the drop bin)
  const int32_t* vals;     // the slot of each key; nullptr: the key's index (first pass)
  int64_t n;               // keys; with `dropped`, their upper bound
  const int32_t* dropped;  // device: subtracted from n (later passes: the ids the first one dropped)
  int32_t experts;         // first pass: ids outside [0, E) go to the drop bin
  bool first;
  bool direct;  // bin = the id itself (E <= kMaxBins), else the digit at `shift`
  int shift;
  int bins;         // counted bins (<= kMaxBins); the drop bin is `bins`
  int64_t tile;     // slots per CTA, a multiple of kRouteThreads
  int32_t* counts;  // [tiles][bins + 1]: per tile counts, then (after the scan) first positions
};

struct AssignOut {
  int32_t* row_map;   // direct: every slot; sort passes: the first pass writes -1 for dropped ids
  int32_t* offsets;   // direct: [E+1], written by CTA 0
  int32_t* invalid;   // direct, optional: [1], written by CTA 0
  int32_t capacity;   // direct: rows kept per expert (INT32_MAX: all)
  int32_t* keys_out;  // sort passes: keys and slots in the pass's order
  int32_t* vals_out;
  // direct, optional (RouteTokensStep::zero_x / zero_probs): rows offsets[E] .. rows-1 written as
  // zeros by the assign CTAs together, once every CTA knows offsets[E] (its start[bins]).
  void* zero_x = nullptr;       // [zero_rows, zero_row_bytes]; 16-byte vectors when zero_vec16, else 2-byte
  float* zero_probs = nullptr;  // [zero_rows]
  int64_t zero_rows = 0, zero_row_bytes = 0;
  bool zero_vec16 = false;
};

struct RouteGeometry {
  int64_t tile, tiles;
};
// Tiles of at least kMinTile slots, few enough that tiles x cols counts fit kCountBudget; at least
// one tile (T = 0 still writes the offsets).
inline RouteGeometry route_geometry(int64_t slots, int64_t cols) {
  const int64_t max_tiles = std::max<int64_t>(1, kCountBudget / cols);
  int64_t tile = std::max(kMinTile, ceil_div(slots, max_tiles));
  tile = ceil_div(tile, kRouteThreads) * kRouteThreads;
  return {tile, std::max<int64_t>(1, ceil_div(slots, tile))};
}

// One counting sort over p's bins: count, column scan, assign (three launches). `direct`: the pass
// is the whole routing (p.direct), its assign writes o's row_map, offsets and zero rows.
void launch_sort_pass(const SortPass& p, int64_t tiles, int32_t* totals, bool direct, const AssignOut& o,
                      cudaStream_t stream);

// The routing's inputs and outputs as the kernels take them (from a detail::RouteTokensStep).
struct RouteIds {
  int64_t slots, experts;  // T K, E
  const int32_t* ids;      // int32 ids, or
  const int64_t* ids_64;   //   int64 ones
  int32_t capacity;        // rows kept per expert (INT32_MAX: all)
  int32_t* row_map;
  int32_t* offsets;
  int32_t* invalid;  // optional
};

// The routing for E > kMaxBins (permute_route_radix.cu).
void route_radix(const RouteIds& r, cudaStream_t stream);

}  // namespace mxmoe::cuda::portable::permute_detail
