// Public token permute / unpermute entry points (include/mxmoe/permute.h): validate every argument,
// pick a backend for every step of the call, run.
#include "mxmoe/permute.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "mxmoe/numerics.h"
#include "mxmoe/problem.h"
#include "src/api/validate.h"
#include "src/common/checked.h"
#include "src/dispatch/backend.h"

namespace mxmoe {

using detail::CallDevice;
using detail::check_no_alias;
using detail::check_tensor;
using detail::region;
using detail::Step;

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// A required rank-2 tensor of `dtype`: its [rows, cols], each bounded; `what` names the dims.
std::pair<int64_t, int64_t> dims2(const TensorView& t, const std::string& name, DType dtype, const char* what,
                                  int64_t max_cols) {
  if (t.data == nullptr && t.rank == 0)
    throw Error(name, std::string("missing (no data pointer); expected ") + dtype_name(dtype) + " " + what);
  detail::check_rank(t, name);
  if (t.rank != 2) throw Error(name, "shape " + detail::shape_string(t) + " must be " + what);
  detail::check_dim(t.shape[0], kMaxTokens, name, "rows");
  detail::check_dim(t.shape[1], max_cols, name, "columns");
  return {t.shape[0], t.shape[1]};
}

// row_map i32 [T, K] with T as given by the call's token-side tensor; returns K. Rows are int32
// indices, so T * K is bounded by the int32 range.
// A row map i32 [T, K], or (ids64: the expert ids) i32 or i64 [T, K].
int64_t check_row_map_shape(const TensorView& row_map, const std::string& name, int64_t tokens, const char* tokens_from,
                            const CallDevice& d, bool ids64 = false) {
  const auto [t, k] = dims2(row_map, name, DType::i32, "[T, K]", kMaxTokens);
  if (t != tokens)
    throw Error(name, "shape " + detail::shape_string(row_map) + " must be [T=" + str(tokens) + ", K] (T from " +
                          tokens_from + ")");
  if (k < 1) throw Error(name, "K=" + str(k) + " must be >= 1 (experts per token)");
  if (detail::checked_mul(t, k, name) > kMaxTokens)
    throw Error(name, "T*K=" + str(t * k) + " slots exceed " + str(kMaxTokens) + " (rows are int32 indices)");
  if (ids64)
    detail::check_tensor_dtypes(row_map, name, {DType::i32, DType::i64}, {t, k}, d);
  else
    check_tensor(row_map, name, DType::i32, {t, k}, d);
  return k;
}

// Host row_maps: every entry -1 or a row in [0, rows); with `injective`, no row named twice.
// Device row_maps are not read (kernels skip entries outside [0, rows)).
void check_row_map_values(const TensorView& row_map, const std::string& name, int64_t rows, bool injective,
                          const CallDevice& d) {
  if (d.device.type != DeviceType::cpu) return;
  const int64_t K = row_map.shape[1], slots = row_map.numel();
  const int32_t* m = row_map.ptr<const int32_t>();
  auto slot = [&](int64_t i) { return name + "[" + str(i / K) + ", " + str(i % K) + "]"; };
  std::vector<std::pair<int32_t, int64_t>> used;  // (row, slot) of every kept slot
  for (int64_t i = 0; i < slots; ++i) {
    if (m[i] == -1) continue;
    if (m[i] < -1 || m[i] >= rows)
      throw Error(name, slot(i) + "=" + str(m[i]) + " must be -1 (dropped) or a row in [0, " + str(rows) + ")");
    if (injective) used.emplace_back(m[i], i);
  }
  std::sort(used.begin(), used.end());
  for (size_t j = 1; j < used.size(); ++j)
    if (used[j].first == used[j - 1].first)
      throw Error(name, slot(used[j].second) + "=" + str(used[j].first) + " repeats " + slot(used[j - 1].second) +
                            " (each row can receive one slot)");
}

// probs [T, K] and its permuted counterpart [R]: both given or both absent.
void check_probs_pair(const TensorView& probs, const std::string& probs_name, const TensorView& permuted,
                      const std::string& permuted_name, int64_t T, int64_t K, int64_t R, const CallDevice& d) {
  const bool have = probs.defined(), have_permuted = permuted.defined();
  if (!have && !have_permuted) return;
  if (have != have_permuted) {
    const std::string& missing = have ? permuted_name : probs_name;
    const std::string& given = have ? probs_name : permuted_name;
    throw Error(missing, "missing (no data pointer) but " + given + " is given; the two come together");
  }
  check_tensor(probs, probs_name, DType::f32, {T, K}, d);
  check_tensor(permuted, permuted_name, DType::f32, {R}, d);
}

// The permuted rows' count R and the quantized outputs of permute_tokens: R from permuted_x, or from
// the quantized data when permuted_x is absent (allowed only then); every given output [R, H].
int64_t check_permute_outputs(const PermuteArgs& a, int64_t H, int64_t bound, const CallDevice& d) {
  const bool row = a.rowwise.data.data != nullptr, col = a.colwise.data.data != nullptr;
  const bool x_given = a.permuted_x.defined() || !(row || col);
  const char* name = x_given ? "permuted_x" : row ? "rowwise.data" : "colwise.data";
  const TensorView& t = x_given ? a.permuted_x : row ? a.rowwise.data : a.colwise.data;
  const DType dtype = x_given ? DType::bf16 : DType::e4m3;
  const auto [R, Hp] = dims2(t, name, dtype, "[R, H]", kMaxColumns);
  if (R < bound || Hp != H)
    throw Error(name, "shape " + detail::shape_string(t) + " must be [R, H=" + str(H) + "] with R >= " + str(bound) +
                          " (" + (a.capacity < 0 ? "T*K" : "min(T*K, E*capacity)") + ")");
  if (x_given) check_tensor(a.permuted_x, "permuted_x", DType::bf16, {R, H}, d);
  if (row) {
    if (H % kMxBlock != 0)
      throw Error("rowwise", "row-wise MXFP8 needs H % 32 == 0, got H=" + str(H));
    detail::check_mxfp8(a.rowwise, "rowwise", R, H, BlockAxis::row, rowwise_scale_bytes(R, H), d);
  } else if (a.rowwise.scales.data != nullptr) {
    throw Error("rowwise.data", "missing (no data pointer) but rowwise.scales is given");
  }
  if (col) {
    detail::check_mxfp8(a.colwise, "colwise", R, H, BlockAxis::col, colwise_scale_bytes(R, H, a.experts), d);
  } else if (a.colwise.scales.data != nullptr) {
    throw Error("colwise.data", "missing (no data pointer) but colwise.scales is given");
  }
  return R;
}

void check_experts_and_capacity(int64_t experts, int64_t capacity) {
  if (experts < 1 || experts > kMaxExperts)
    throw Error("experts", "E=" + str(experts) + " must be in [1, " + str(kMaxExperts) + "]");
  if (capacity < -1 || capacity > kMaxTokens)
    throw Error("capacity", "C=" + str(capacity) + " must be -1 (keep every row) or in [0, " + str(kMaxTokens) + "]");
}

}  // namespace

int64_t permuted_rows_bound(int64_t tokens, int64_t top_k, int64_t experts, int64_t capacity) {
  if (tokens < 0 || tokens > kMaxTokens)
    throw Error("tokens", "T=" + str(tokens) + " must be in [0, " + str(kMaxTokens) + "]");
  if (top_k < 1 || top_k > kMaxTokens) throw Error("top_k", "K=" + str(top_k) + " must be in [1, " + str(kMaxTokens) + "]");
  if (tokens * top_k > kMaxTokens)  // both <= 2^31 - 1: no overflow
    throw Error("top_k", "T*K=" + str(tokens * top_k) + " slots exceed " + str(kMaxTokens) + " (rows are int32 indices)");
  check_experts_and_capacity(experts, capacity);
  const int64_t all = tokens * top_k;
  return capacity < 0 ? all : std::min(all, experts * capacity);
}

void permute_tokens(Context& ctx, const PermuteArgs& a) {
  const CallDevice d{a.x.device, "x"};
  const auto [T, H] = dims2(a.x, "x", DType::bf16, "[T, H]", kMaxColumns);
  check_tensor(a.x, "x", DType::bf16, {T, H}, d);
  const int64_t K = check_row_map_shape(a.expert_ids, "expert_ids", T, "x", d, /*ids64=*/true);
  check_experts_and_capacity(a.experts, a.capacity);
  const int64_t E = a.experts;
  check_tensor(a.offsets, "offsets", DType::i32, {E + 1}, d);
  const int64_t R = check_permute_outputs(a, H, permuted_rows_bound(T, K, E, a.capacity), d);
  const bool quantized = a.rowwise.data.data != nullptr || a.colwise.data.data != nullptr;
  check_tensor(a.row_map, "row_map", DType::i32, {T, K}, d);
  check_probs_pair(a.probs, "probs", a.permuted_probs, "permuted_probs", T, K, R, d);
  if (a.invalid.defined()) check_tensor(a.invalid, "invalid", DType::i32, {1}, d);
  check_no_alias({region("offsets", a.offsets), region("permuted_x", a.permuted_x), region("row_map", a.row_map),
                  region("permuted_probs", a.permuted_probs), region("invalid", a.invalid),
                  region("rowwise.data", a.rowwise.data), region("rowwise.scales", a.rowwise.scales),
                  region("colwise.data", a.colwise.data), region("colwise.scales", a.colwise.scales)},
                 {region("x", a.x), region("expert_ids", a.expert_ids), region("probs", a.probs)});

  // Both steps' backends are picked before the first runs: a step no backend serves writes nothing.
  detail::Backend& route = *detail::select(ctx, {Step::route_tokens, d.device, Recipe::bf16, H, K}).backend;
  detail::Backend& move = *(quantized ? detail::select(ctx, {Step::permute_rows, d.device, Recipe::mxfp8, H, K},
                                                       "permute_quantize_rows")
                                      : detail::select(ctx, {Step::permute_rows, d.device, Recipe::bf16, H, K}))
                               .backend;
  const detail::RouteTokensStep r{.expert_ids = a.expert_ids,
                                  .experts = E,
                                  .capacity = a.capacity,
                                  .offsets = a.offsets,
                                  .row_map = a.row_map,
                                  .invalid = a.invalid,
                                  .zero_x = a.zero_unused_rows ? a.permuted_x : TensorView{},
                                  .zero_probs = a.zero_unused_rows ? a.permuted_probs : TensorView{}};
  const PermuteByMapArgs m{.x = a.x,
                           .row_map = a.row_map,
                           .probs = a.probs,
                           .permuted_x = a.permuted_x,
                           .permuted_probs = a.permuted_probs};
  if (quantized) {
    route.route_tokens(ctx, r);
    move.permute_quantize_rows(
        ctx, {.move = m, .groups = {a.offsets}, .rows = R, .rowwise = a.rowwise, .colwise = a.colwise});
  } else if (&route == &move) {
    route.route_and_permute_rows(ctx, r, m);
  } else {
    route.route_tokens(ctx, r);
    move.permute_rows(ctx, m);
  }
}

void unpermute_tokens(Context& ctx, const UnpermuteArgs& a) {
  const CallDevice d{a.permuted_y.device, "permuted_y"};
  const auto [R, H] = dims2(a.permuted_y, "permuted_y", DType::bf16, "[R, H]", kMaxColumns);
  check_tensor(a.permuted_y, "permuted_y", DType::bf16, {R, H}, d);
  const int64_t T = dims2(a.row_map, "row_map", DType::i32, "[T, K]", kMaxTokens).first;
  const int64_t K = check_row_map_shape(a.row_map, "row_map", T, "row_map", d);
  check_tensor(a.y, "y", DType::bf16, {T, H}, d);
  check_probs_pair(a.probs, "probs", a.permuted_probs, "permuted_probs", T, K, R, d);
  check_row_map_values(a.row_map, "row_map", R, /*injective=*/false, d);
  check_no_alias(
      {region("y", a.y), region("probs", a.probs)},
      {region("permuted_y", a.permuted_y), region("row_map", a.row_map), region("permuted_probs", a.permuted_probs)});
  detail::select(ctx, {Step::unpermute_rows, d.device, Recipe::bf16, H, K}).backend->unpermute_rows(ctx, a);
}

void permute_by_map(Context& ctx, const PermuteByMapArgs& a) {
  const CallDevice d{a.x.device, "x"};
  const auto [T, H] = dims2(a.x, "x", DType::bf16, "[T, H]", kMaxColumns);
  check_tensor(a.x, "x", DType::bf16, {T, H}, d);
  const int64_t K = check_row_map_shape(a.row_map, "row_map", T, "x", d);
  const auto [R, Hp] = dims2(a.permuted_x, "permuted_x", DType::bf16, "[R, H]", kMaxColumns);
  if (Hp != H)
    throw Error("permuted_x", "shape " + detail::shape_string(a.permuted_x) + " must be [R, H=" + str(H) + "]");
  check_tensor(a.permuted_x, "permuted_x", DType::bf16, {R, H}, d);
  check_probs_pair(a.probs, "probs", a.permuted_probs, "permuted_probs", T, K, R, d);
  check_row_map_values(a.row_map, "row_map", R, /*injective=*/true, d);
  check_no_alias({region("permuted_x", a.permuted_x), region("permuted_probs", a.permuted_probs)},
                 {region("x", a.x), region("row_map", a.row_map), region("probs", a.probs)});
  detail::select(ctx, {Step::permute_rows, d.device, Recipe::bf16, H, K}).backend->permute_rows(ctx, a);
}

}  // namespace mxmoe
