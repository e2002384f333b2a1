// Unquantized fp64 forward + backward of the grouped MLP; see reference_f64.h for the math and
// layouts. Written independently of the CPU backend's steps (its activation math is in double here,
// not glu.h's fp32 formulas) so that the two can check each other.
#include "src/cpu/reference_f64.h"

#include <algorithm>
#include <cmath>

#include "src/common/glu.h"

namespace mxmoe::cpu {
namespace {

constexpr double kParallelWork = 1 << 18;  // T*H*F below which threads cost more than they save

struct ActValue {
  double act;  // act(a, b), unscaled by p
  double dact_da;
  double dact_db;
};

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

ActValue activation(double a, double b, const Problem& p) {
  if (p.activation == Activation::swiglu) {
    const double s = sigmoid(a);
    return {a * s * b, b * s * (1.0 + a * (1.0 - s)), a * s};
  }
  const double limit = p.clamp.limit, alpha = p.clamp.alpha;
  const double ac = std::min(a, limit);  // no lower clamp on a
  const double bc = std::clamp(b, -limit, limit);
  const double s = sigmoid(alpha * ac);
  const double lin = bc + p.clamp.linear_offset;
  ActValue v;
  v.act = ac * s * lin;
  // Inclusive masks (docs/numerics.md "Clamped SwiGLU"): the gradient passes at a == L and |b| == L.
  v.dact_da = a <= limit ? lin * (s + alpha * ac * s * (1.0 - s)) : 0.0;
  v.dact_db = (b >= -limit && b <= limit) ? ac * s : 0.0;
  return v;
}

// Row range [begin[e], end[e]) of every expert and the expert of every row (-1: no expert owns it).
// Offsets are clamped to [0, T] and kept monotone, so bad offsets cannot index out of bounds.
struct Groups {
  std::vector<int64_t> begin, end;
  std::vector<int32_t> owner;
};

Groups make_groups(const std::vector<int32_t>& offsets, int64_t experts, int64_t tokens) {
  Groups g;
  g.begin.resize(static_cast<size_t>(experts));
  g.end.resize(static_cast<size_t>(experts));
  g.owner.assign(static_cast<size_t>(tokens), -1);
  int64_t previous = 0;
  for (int64_t e = 0; e < experts; ++e) {
    g.begin[e] = std::max(previous, std::clamp<int64_t>(offsets[e], 0, tokens));
    g.end[e] = std::max(g.begin[e], std::clamp<int64_t>(offsets[e + 1], 0, tokens));
    for (int64_t t = g.begin[e]; t < g.end[e]; ++t) g.owner[t] = static_cast<int32_t>(e);
    previous = g.end[e];
  }
  return g;
}

}  // namespace

RefLayerOutputs reference_layer_f64(const RefLayerInputs& in) {
  const Problem& p = in.problem;
  const int64_t T = in.tokens, H = p.hidden, F = p.ffn, E = p.experts, F2 = 2 * F;
  const bool has_b1 = p.fc1_bias && !in.b1.empty();
  const bool has_b2 = p.fc2_bias && !in.b2.empty();
  const bool scale_b2 = has_b2 && p.scale_fc2_bias;
  const Groups groups = make_groups(in.offsets, E, T);
  // Tiny problems (the finite-difference tests call this thousands of times) run on one thread.
  const bool parallel = static_cast<double>(T) * static_cast<double>(H) * static_cast<double>(F) >= kParallelWork;

  RefLayerOutputs out;
  out.c.assign(static_cast<size_t>(T * F2), 0.0);
  out.y.assign(static_cast<size_t>(T * H), 0.0);
  std::vector<double> A(static_cast<size_t>(T * F), 0.0);  // p * act, for dW2

  // ---- forward: C = X W1_e^T + b1_e; A = p act(C); Y = A W2_e^T + (p) b2_e ----
  auto forward_row = [&](int64_t t) {
    const int64_t e = groups.owner[t];
    if (e < 0) return;
    const double* xt = &in.x[t * H];
    double* ct = &out.c[t * F2];
    for (int64_t j = 0; j < F2; ++j) {
      const double* w = &in.w1[(e * F2 + j) * H];
      double acc = has_b1 ? in.b1[e * F2 + j] : 0.0;
      for (int64_t k = 0; k < H; ++k) acc += xt[k] * w[k];
      ct[j] = acc;
    }
    const double prob = in.probs[t];
    double* at = &A[t * F];
    for (int64_t n = 0; n < F; ++n)
      at[n] = prob * activation(ct[glu_a_col(n, F, p.glu_layout)], ct[glu_b_col(n, F, p.glu_layout)], p).act;
    for (int64_t h = 0; h < H; ++h) {
      const double* w = &in.w2[(e * H + h) * F];
      double acc = has_b2 ? (scale_b2 ? prob : 1.0) * in.b2[e * H + h] : 0.0;
      for (int64_t n = 0; n < F; ++n) acc += at[n] * w[n];
      out.y[t * H + h] = acc;
    }
  };
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t t = 0; t < T; ++t) forward_row(t);
  if (in.dy.empty()) return out;

  // ---- backward per row: dA = dY W2_e; dC = act'(C) dA p; dprob; dX = dC W1_e ----
  out.dx.assign(static_cast<size_t>(T * H), 0.0);
  out.dprobs.assign(static_cast<size_t>(T), 0.0);
  std::vector<double> dC(static_cast<size_t>(T * F2), 0.0);
  auto backward_row = [&](int64_t t, std::vector<double>& dA) {
    const int64_t e = groups.owner[t];
    if (e < 0) return;
    const double* dyt = &in.dy[t * H];
    const double* ct = &out.c[t * F2];
    double* dct = &dC[t * F2];
    const double prob = in.probs[t];
    std::fill(dA.begin(), dA.end(), 0.0);
    for (int64_t h = 0; h < H; ++h) {
      const double* w = &in.w2[(e * H + h) * F];
      for (int64_t n = 0; n < F; ++n) dA[n] += dyt[h] * w[n];
    }
    double dprob = 0.0;
    for (int64_t n = 0; n < F; ++n) {
      const int64_t ca = glu_a_col(n, F, p.glu_layout), cb = glu_b_col(n, F, p.glu_layout);
      const ActValue v = activation(ct[ca], ct[cb], p);
      dprob += dA[n] * v.act;
      dct[ca] = dA[n] * prob * v.dact_da;
      dct[cb] = dA[n] * prob * v.dact_db;
    }
    if (scale_b2)
      for (int64_t h = 0; h < H; ++h) dprob += dyt[h] * in.b2[e * H + h];
    out.dprobs[t] = dprob;
    double* dxt = &out.dx[t * H];
    for (int64_t j = 0; j < F2; ++j) {
      const double* w = &in.w1[(e * F2 + j) * H];
      for (int64_t k = 0; k < H; ++k) dxt[k] += dct[j] * w[k];
    }
  };
#pragma omp parallel if (parallel)
  {
    std::vector<double> dA(static_cast<size_t>(F));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) backward_row(t, dA);
  }
  if (!in.compute_weight_grads) return out;

  // ---- weight and bias gradients: contractions over each expert's own rows ----
  out.dw1.assign(static_cast<size_t>(E * F2 * H), 0.0);
  out.dw2.assign(static_cast<size_t>(E * H * F), 0.0);
#pragma omp parallel for collapse(2) schedule(static) if (parallel)
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t j = 0; j < F2; ++j) {  // dW1_e = dC_e^T X_e
      double* d = &out.dw1[(e * F2 + j) * H];
      for (int64_t t = groups.begin[e]; t < groups.end[e]; ++t)
        for (int64_t k = 0; k < H; ++k) d[k] += dC[t * F2 + j] * in.x[t * H + k];
    }
  }
#pragma omp parallel for collapse(2) schedule(static) if (parallel)
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t h = 0; h < H; ++h) {  // dW2_e = dY_e^T A_e
      double* d = &out.dw2[(e * H + h) * F];
      for (int64_t t = groups.begin[e]; t < groups.end[e]; ++t)
        for (int64_t n = 0; n < F; ++n) d[n] += in.dy[t * H + h] * A[t * F + n];
    }
  }
  if (p.fc1_bias) {
    out.db1.assign(static_cast<size_t>(E * F2), 0.0);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t t = groups.begin[e]; t < groups.end[e]; ++t)
        for (int64_t j = 0; j < F2; ++j) out.db1[e * F2 + j] += dC[t * F2 + j];
  }
  if (p.fc2_bias) {
    out.db2.assign(static_cast<size_t>(E * H), 0.0);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t t = groups.begin[e]; t < groups.end[e]; ++t) {
        const double s = p.scale_fc2_bias ? in.probs[t] : 1.0;
        for (int64_t h = 0; h < H; ++h) out.db2[e * H + h] += s * in.dy[t * H + h];
      }
  }
  return out;
}

}  // namespace mxmoe::cpu
