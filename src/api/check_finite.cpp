// The opt-in finiteness check of the layer's inputs (src/api/check_finite.h).
#include "src/api/check_finite.h"

#include <string>
#include <vector>

#include "src/common/finite.h"
#include "src/dispatch/backend.h"
#include "src/dispatch/device_facts.h"

namespace mxmoe::detail {
namespace {

bool wanted(const Context& ctx) { return ctx.options().check_finite && !planning(ctx); }

// "[1, 5, 7]": linear `index` of a row-major tensor of `shape`.
std::string coordinates(uint64_t index, const std::vector<int64_t>& shape) {
  std::vector<int64_t> at(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    const auto n = static_cast<uint64_t>(shape[d]);  // > 0: the tensor holds the value
    at[d] = static_cast<int64_t>(index % n);
    index /= n;
  }
  std::string s = "[";
  for (size_t d = 0; d < at.size(); ++d) s += (d ? ", " : "") + std::to_string(at[d]);
  return s + "]";
}

const char* kind_name(NonfiniteKind k) {
  switch (k) {
    case NonfiniteKind::nan: return "NaN";
    case NonfiniteKind::pos_inf: return "+Inf";
    case NonfiniteKind::neg_inf: return "-Inf";
  }
  return "?";
}

// Scans `experts` matrices of `count` values (dense or per-expert, on `device`), reporting the first
// non-finite one under `name` at its coordinates in `shape`.
void scan(Context& ctx, const std::string& name, const ExpertMatrices& m, DType dtype, Device device,
          int64_t experts, int64_t count, const std::vector<int64_t>& shape) {
  const CheckFiniteStep step{.src = m, .dtype = dtype, .experts = experts, .count = count};
  const StepQuery q{.step = Step::check_finite, .device = device, .n = count};
  const uint64_t code = select(ctx, q).backend->check_finite(ctx, step);
  if (code == kAllFinite) return;
  throw Error(name, std::string("holds ") + kind_name(nonfinite_kind(code)) + " at " +
                        coordinates(nonfinite_index(code), shape) +
                        ", its first non-finite value (Options::check_finite)");
}

void scan_tensor(Context& ctx, const std::string& name, const TensorView& t) {
  if (t.data == nullptr) return;  // absent (validation has said where that is allowed)
  ExpertMatrices m;
  m.dense = t;
  scan(ctx, name, m, t.dtype, t.device, 1, t.numel(), {t.shape.begin(), t.shape.begin() + t.rank});
}

// E weight matrices [rows, cols].
void scan_experts(Context& ctx, const std::string& name, const ExpertMatrices& m, int64_t experts, int64_t rows,
                  int64_t cols) {
  const TensorView& where = m.per_expert() ? m.pointers : m.dense;
  scan(ctx, name, m, m.per_expert() ? m.dtype : m.dense.dtype, where.device, experts, rows * cols,
       {experts, rows, cols});
}

}  // namespace

void check_forward_finite(Context& ctx, const Problem& p, const ForwardArgs& a) {
  if (!wanted(ctx)) return;
  scan_tensor(ctx, "x", a.x);
  scan_tensor(ctx, "probs", a.probs);
  scan_experts(ctx, "w1", a.w1, p.experts, 2 * p.ffn, p.hidden);
  scan_tensor(ctx, "b1", a.b1);
  scan_experts(ctx, "w2", a.w2, p.experts, p.hidden, p.ffn);
  scan_tensor(ctx, "b2", a.b2);
}

void check_backward_finite(Context& ctx, const BackwardArgs& a) {
  if (!wanted(ctx)) return;
  scan_tensor(ctx, "dy", a.dy);
}

void check_weights_finite(Context& ctx, const Problem& p, const WeightsArgs& w) {
  if (!wanted(ctx)) return;
  scan_experts(ctx, "w1", w.w1, p.experts, 2 * p.ffn, p.hidden);
  scan_experts(ctx, "w2", w.w2, p.experts, p.hidden, p.ffn);
}

}  // namespace mxmoe::detail
