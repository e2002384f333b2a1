// Public low-level entry points: validate, pick a backend, run.
#include "mxmoe/ops.h"

#include "mxmoe/numerics.h"
#include "mxmoe/problem.h"
#include "src/api/validate.h"
#include "src/common/checked.h"
#include "src/dispatch/backend.h"

namespace mxmoe {

using detail::check_mxfp8;
using detail::check_no_alias;
using detail::check_offsets;
using detail::check_tensor;
using detail::check_tensor_dtypes;
using detail::region;
using detail::Step;

namespace {

int64_t group_count(const GroupOffsets& g) { return g.offsets.data ? g.experts() : 1; }

void check_groups(const GroupOffsets& g, const char* name, int64_t rows, const detail::CallDevice& d) {
  if (!g.offsets.data) return;
  if (g.offsets.rank != 1 || g.offsets.shape[0] < 2)
    throw Error(name, "shape " + detail::shape_string(g.offsets) + " must be [E+1] with E >= 1");
  detail::check_dim(g.experts(), kMaxExperts, name, "E");
  check_offsets(g, name, g.experts(), rows, d);
}

void check_mx_dims(int64_t k, const char* name) {
  if (k % kMxBlock != 0)
    throw Error(name, "inner dimension " + std::to_string(k) + " must be a multiple of 32 for MXFP8");
}

// Every dimension of the low-level ops is bounded (problem.h): rows by kMaxTokens, columns by
// kMaxColumns, groups by kMaxExperts (check_offsets).
void check_rows_cols(int64_t rows, int64_t cols, const std::string& name) {
  detail::check_dim(rows, kMaxTokens, name, "rows");
  detail::check_dim(cols, kMaxColumns, name, "columns");
}

// Shape [rows, cols] of an operand, with its dtype checked.
std::pair<int64_t, int64_t> operand_dims(const Operand& o, const char* name) {
  const TensorView& t = o.is_mxfp8() ? o.mx.data : o.bf16;
  if (t.rank != 2) throw Error(name, "shape " + detail::shape_string(t) + " must be 2-D");
  check_rows_cols(t.shape[0], t.shape[1], name);
  return {t.shape[0], t.shape[1]};
}

void check_operand(const Operand& o, const std::string& name, int64_t rows, int64_t cols, BlockAxis axis,
                   int64_t groups, const detail::CallDevice& d) {
  if (!o.is_mxfp8()) {
    check_tensor(o.bf16, name, DType::bf16, {rows, cols}, d);
    return;
  }
  const int64_t sb = axis == BlockAxis::row ? rowwise_scale_bytes(rows, cols) : colwise_scale_bytes(rows, cols, groups);
  check_mxfp8(o.mx, name, rows, cols, axis, sb, d);
}

detail::Region operand_region(const std::string& name, const Operand& o) {
  return o.is_mxfp8() ? region(name, o.mx.data) : region(name, o.bf16);
}

}  // namespace

void quantize_mxfp8(Context& ctx, const QuantizeArgs& a) {
  const detail::CallDevice d{a.src.device, "src"};
  if (a.src.rank != 2) throw Error("src", "shape " + detail::shape_string(a.src) + " must be [M, K]");
  const int64_t M = a.src.shape[0], K = a.src.shape[1];
  check_rows_cols(M, K, "src");
  check_tensor(a.src, "src", DType::bf16, {M, K}, d);
  check_groups(a.groups, "groups", M, d);
  const bool row = a.rowwise.data.data != nullptr, col = a.colwise.data.data != nullptr;
  if (!row && !col) throw Error("rowwise/colwise", "at least one output must be given");
  if (row) {
    check_mx_dims(K, "src");
    check_mxfp8(a.rowwise, "rowwise", M, K, BlockAxis::row, rowwise_scale_bytes(M, K), d);
  }
  if (col) check_mxfp8(a.colwise, "colwise", M, K, BlockAxis::col, colwise_scale_bytes(M, K, group_count(a.groups)), d);
  check_no_alias({region("rowwise.data", a.rowwise.data), region("rowwise.scales", a.rowwise.scales),
                  region("colwise.data", a.colwise.data), region("colwise.scales", a.colwise.scales)},
                 {region("src", a.src), region("groups", a.groups.offsets)});
  detail::select(ctx, {Step::quantize, d.device, Recipe::mxfp8, 0, K}).backend->quantize(ctx, a);
}

void dequantize_mxfp8(Context& ctx, const DequantizeArgs& a) {
  const detail::CallDevice d{a.src.data.device, "src.data"};
  if (a.src.data.rank != 2) throw Error("src.data", "shape " + detail::shape_string(a.src.data) + " must be [M, K]");
  const int64_t M = a.src.data.shape[0], K = a.src.data.shape[1];
  check_rows_cols(M, K, "src.data");
  check_groups(a.groups, "groups", M, d);
  if (a.src.axis == BlockAxis::row) {
    check_mx_dims(K, "src.data");
    if (a.groups.offsets.data) throw Error("groups", "only column-wise tensors are grouped");
  }
  const int64_t sb = a.src.axis == BlockAxis::row ? rowwise_scale_bytes(M, K) : colwise_scale_bytes(M, K, group_count(a.groups));
  check_mxfp8(a.src, "src", M, K, a.src.axis, sb, d);
  check_tensor_dtypes(a.dst, "dst", {DType::f32, DType::bf16}, {M, K}, d);
  check_no_alias({region("dst", a.dst)}, {region("src.data", a.src.data), region("src.scales", a.src.scales),
                                          region("groups", a.groups.offsets)});
  detail::select(ctx, {Step::dequantize, d.device, Recipe::mxfp8, 0, K}).backend->dequantize(ctx, a);
}

void grouped_gemm_m(Context& ctx, const MGroupedGemmArgs& a) {
  const detail::CallDevice d{a.a.is_mxfp8() ? a.a.mx.data.device : a.a.bf16.device, "a"};
  const auto [T, K] = operand_dims(a.a, "a");
  const int64_t E = a.offsets.experts();
  if (E < 1) throw Error("offsets", "shape " + detail::shape_string(a.offsets.offsets) + " must be [E+1] with E >= 1");
  detail::check_dim(E, kMaxExperts, "offsets", "E");
  if (a.d.rank != 2 || a.d.shape[0] != T) throw Error("d", "shape " + detail::shape_string(a.d) + " must be [T=" + std::to_string(T) + ", N]");
  const int64_t N = a.d.shape[1];
  check_rows_cols(T, N, "d");
  const bool mx = a.a.is_mxfp8();
  if (mx != a.b.is_mxfp8()) throw Error("b", "a and b must both be bf16 or both be mxfp8");
  if (mx) check_mx_dims(K, "a");
  else if (K % 8 != 0 || N % 8 != 0) throw Error("a", "bf16 GEMM dims K=" + std::to_string(K) + ", N=" + std::to_string(N) + " must be multiples of 8");
  if (mx && N % kMxBlock != 0) throw Error("d", "N=" + std::to_string(N) + " must be a multiple of 32 for MXFP8");
  check_operand(a.a, "a", T, K, BlockAxis::row, 1, d);
  check_offsets(a.offsets, "offsets", E, T, d);
  const int64_t br = a.b_kn ? K : N, bc = a.b_kn ? N : K;
  detail::check_experts(a.b.data, "b.data", {mx ? DType::e4m3 : DType::bf16}, E, br, bc, d);
  if (mx) {
    const int64_t per = a.b_kn ? colwise_matrix_scale_bytes(K, N) : rowwise_scale_bytes(N, K);
    if (a.b.scales.per_expert())
      check_tensor(a.b.scales.pointers, "b.scales.pointers", DType::i64, {E}, d);
    else
      check_tensor(a.b.scales.dense, "b.scales", DType::e8m0, {E, per}, d);
  }
  if (a.bias.data) check_tensor(a.bias, "bias", DType::bf16, {E, N}, d);
  check_tensor_dtypes(a.d, "d", {DType::bf16, DType::f32}, {T, N}, d);
  check_no_alias({region("d", a.d)}, {operand_region("a", a.a), region("b", a.b.data.dense), region("bias", a.bias),
                                      region("offsets", a.offsets.offsets)});
  detail::MGemmStep s;
  s.gemm = a;
  detail::StepQuery q{Step::gemm_m, d.device, mx ? Recipe::mxfp8 : Recipe::bf16, N, K};
  q.gemm_m = &s;
  const detail::Choice c = detail::select(ctx, q, "gemm_m");
  c.backend->gemm_m(ctx, s, c.plan);
}

void grouped_gemm_k(Context& ctx, const KGroupedGemmArgs& a) {
  const detail::CallDevice d{a.a.is_mxfp8() ? a.a.mx.data.device : a.a.bf16.device, "a"};
  const auto [T, M] = operand_dims(a.a, "a");
  const auto [Tb, N] = operand_dims(a.b, "b");
  if (Tb != T) throw Error("b", "has " + std::to_string(Tb) + " rows, a has " + std::to_string(T));
  const int64_t E = a.offsets.experts();
  if (E < 1) throw Error("offsets", "shape " + detail::shape_string(a.offsets.offsets) + " must be [E+1] with E >= 1");
  detail::check_dim(E, kMaxExperts, "offsets", "E");
  const bool mx = a.a.is_mxfp8();
  if (mx != a.b.is_mxfp8()) throw Error("b", "a and b must both be bf16 or both be mxfp8");
  if (!mx && (M % 8 != 0 || N % 8 != 0)) throw Error("a", "bf16 dims M=" + std::to_string(M) + ", N=" + std::to_string(N) + " must be multiples of 8");
  check_operand(a.a, "a", T, M, BlockAxis::col, E, d);
  check_operand(a.b, "b", T, N, BlockAxis::col, E, d);
  check_offsets(a.offsets, "offsets", E, T, d);
  detail::check_experts(a.d, "d", {DType::f32, DType::bf16}, E, M, N, d);
  const DType dt = a.d.per_expert() ? a.d.dtype : a.d.dense.dtype;
  if (a.accumulate && dt != DType::f32) throw Error("accumulate", "accumulate=true needs an f32 output, d is " + std::string(dtype_name(dt)));
  check_no_alias({region("d", a.d.dense)}, {operand_region("a", a.a), operand_region("b", a.b), region("offsets", a.offsets.offsets)});
  detail::StepQuery q{Step::gemm_k, d.device, mx ? Recipe::mxfp8 : Recipe::bf16, N, M};
  q.gemm_k = &a;
  const detail::Choice c = detail::select(ctx, q, "gemm_k");
  c.backend->gemm_k(ctx, a, c.plan);
}

}  // namespace mxmoe
