// CPU reference token permute and unpermute (docs/numerics.md "Permute and unpermute").
//
// route_tokens:   a counting sort of the (token, slot) pairs by expert id. Counts per expert (ids
//                 outside [0, E) counted as invalid), capped at the capacity, prefix-summed into the
//                 offsets; one pass in (token, slot) order then hands each expert's rows out in
//                 that order, so rows are sorted by expert, then token, then slot, and the first C
//                 of an expert are the ones kept.
// permute_rows:   permuted_x[row_map[t, k]] = x[t] (and the probs), one thread per token.
// unpermute_rows: y[t] = bf16(sum over k in slot order of fp32 permuted_y[row_map[t, k]]).
//
// Every output element is written by one thread from a fixed sequence of operations: the results do
// not depend on the thread count. Entries of row_map outside [0, R) are skipped (the entry points
// reject them on the host; the rule is the device kernels').
// Run: <build>/tests/mxmoe_unit_tests --gtest_filter='Permute*:Unpermute*'
#include <algorithm>
#include <cstring>
#include <vector>

#include "mxmoe/numerics.h"
#include "src/cpu/cpu_ops.h"
#include "src/cpu/gemm_core.h"

namespace mxmoe::cpu {
namespace {

using gemm_detail::parallel_worth;

// The row of slot i, or -1 when it is dropped or names no row of an [rows, H] tensor.
int64_t row_of(const int32_t* row_map, int64_t i, int64_t rows) {
  const int64_t r = row_map[i];
  return r >= 0 && r < rows ? r : -1;
}

}  // namespace

namespace {
// ids int32 or int64 (an int64 id outside [0, E) is dropped like any other).
template <class Id>
void route_ids(const detail::RouteTokensStep& s, const Id* ids) {
  const int64_t slots = s.expert_ids.numel(), E = s.experts;
  auto valid = [E](Id id) { return id >= 0 && static_cast<int64_t>(id) < E; };

  std::vector<int64_t> kept(static_cast<size_t>(E), 0);
  int64_t invalid = 0;
  for (int64_t i = 0; i < slots; ++i) {
    if (valid(ids[i]))
      ++kept[ids[i]];
    else
      ++invalid;
  }
  int32_t* offsets = s.offsets.ptr<int32_t>();
  offsets[0] = 0;
  for (int64_t e = 0; e < E; ++e) {
    if (s.capacity >= 0) kept[e] = std::min(kept[e], s.capacity);
    offsets[e + 1] = static_cast<int32_t>(offsets[e] + kept[e]);
  }

  std::vector<int64_t> taken(static_cast<size_t>(E), 0);
  int32_t* row_map = s.row_map.ptr<int32_t>();
  for (int64_t i = 0; i < slots; ++i) {  // i = t * K + k: token order, then slot order
    const Id e = ids[i];
    if (!valid(e) || taken[e] == kept[e]) {
      row_map[i] = -1;
      continue;
    }
    row_map[i] = static_cast<int32_t>(offsets[e] + taken[e]++);
  }
  if (s.invalid.data) *s.invalid.ptr<int32_t>() = static_cast<int32_t>(invalid);
  const int64_t used = offsets[E];
  if (s.zero_x.data && s.zero_x.shape[0] > used)
    std::memset(s.zero_x.ptr<uint16_t>() + used * s.zero_x.shape[1], 0,
                static_cast<size_t>((s.zero_x.shape[0] - used) * s.zero_x.shape[1] * 2));
  if (s.zero_probs.data && s.zero_probs.shape[0] > used)
    std::memset(s.zero_probs.ptr<float>() + used, 0, static_cast<size_t>((s.zero_probs.shape[0] - used) * 4));
}
}  // namespace

void route_tokens(const detail::RouteTokensStep& s) {
  if (s.expert_ids.dtype == DType::i64)
    route_ids(s, s.expert_ids.ptr<const int64_t>());
  else
    route_ids(s, s.expert_ids.ptr<const int32_t>());
}

void permute_rows(const PermuteByMapArgs& a) {
  const int64_t T = a.row_map.shape[0], K = a.row_map.shape[1];
  const int64_t R = a.permuted_x.shape[0], H = a.permuted_x.shape[1];
  const int32_t* row_map = a.row_map.ptr<const int32_t>();
  const auto* x = a.x.ptr<const uint16_t>();
  auto* out = a.permuted_x.ptr<uint16_t>();
  const float* probs = a.probs.ptr<const float>();
  float* out_probs = a.permuted_probs.ptr<float>();
#pragma omp parallel for schedule(static) if (parallel_worth(T * K * H))
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t row = row_of(row_map, t * K + k, R);
      if (row < 0) continue;
      if (H > 0) std::memcpy(out + row * H, x + t * H, static_cast<size_t>(H) * sizeof(uint16_t));
      if (out_probs) out_probs[row] = probs[t * K + k];
    }
  if (!a.zero_unused_rows) return;
  std::vector<char> named(static_cast<size_t>(R), 0);
  for (int64_t i = 0; i < T * K; ++i)
    if (const int64_t row = row_of(row_map, i, R); row >= 0) named[row] = 1;
  for (int64_t r = 0; r < R; ++r) {
    if (named[r]) continue;
    if (H > 0) std::memset(out + r * H, 0, static_cast<size_t>(H) * sizeof(uint16_t));
    if (out_probs) out_probs[r] = 0.0f;
  }
}

void unpermute_rows(const UnpermuteArgs& a) {
  const int64_t T = a.row_map.shape[0], K = a.row_map.shape[1];
  const int64_t R = a.permuted_y.shape[0], H = a.permuted_y.shape[1];
  const int32_t* row_map = a.row_map.ptr<const int32_t>();
  const auto* in = a.permuted_y.ptr<const uint16_t>();
  auto* y = a.y.ptr<uint16_t>();
  const float* in_probs = a.permuted_probs.ptr<const float>();
  float* probs = a.probs.ptr<float>();
#pragma omp parallel if (parallel_worth(T * K * H))
  {
    std::vector<float> acc(static_cast<size_t>(H));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t k = 0; k < K; ++k) {
        const int64_t row = row_of(row_map, t * K + k, R);
        if (probs) probs[t * K + k] = row < 0 ? 0.0f : in_probs[row];
        if (row < 0) continue;
        for (int64_t h = 0; h < H; ++h) acc[h] += f32_from_bf16(in[row * H + h]);
      }
      for (int64_t h = 0; h < H; ++h) y[t * H + h] = bf16_from_f32(acc[h]);
    }
  }
}

}  // namespace mxmoe::cpu
