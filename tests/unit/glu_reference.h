// Independent fp64 statement of the scaled GLU activations (docs/numerics.md "SwiGLU",
// "Clamped SwiGLU"), for tests only: the value h = p * act(a, b) and its derivatives, derived by
// hand rather than taken from src/common/glu.h.
#pragma once
#include <algorithm>
#include <cmath>

#include "src/common/glu.h"

namespace mxmoe::test {

struct GluRef {
  double act;  // unscaled act(a, b)
  double da;   // d(g * p * act)/da
  double db;   // d(g * p * act)/db
};

inline double sigmoid_f64(double x) { return 1.0 / (1.0 + std::exp(-x)); }

inline double glu_act_f64(double a, double b, const GluParams& gp) {
  if (gp.activation == Activation::swiglu) return a * sigmoid_f64(a) * b;
  const double lim = gp.clamp.limit, alpha = gp.clamp.alpha, off = gp.clamp.linear_offset;
  const double ac = std::min(a, lim);
  const double bc = std::clamp(b, -lim, lim);
  return ac * sigmoid_f64(alpha * ac) * (bc + off);
}

// Derivatives of g * p * act; the clamp masks are inclusive (gradient passes at a = L and |b| = L).
inline GluRef glu_ref_f64(double a, double b, double g, double p, const GluParams& gp) {
  GluRef r;
  r.act = glu_act_f64(a, b, gp);
  if (gp.activation == Activation::swiglu) {
    // d/da [a s(a)] = s + a s (1 - s)
    const double s = sigmoid_f64(a);
    r.da = g * p * b * (s + a * s * (1.0 - s));
    r.db = g * p * a * s;
    return r;
  }
  const double lim = gp.clamp.limit, alpha = gp.clamp.alpha, off = gp.clamp.linear_offset;
  const double ac = std::min(a, lim);
  const double bc = std::clamp(b, -lim, lim);
  const double s = sigmoid_f64(alpha * ac);
  // d/dx [x s(alpha x)] = s + alpha x s (1 - s)
  r.da = a <= lim ? g * p * (bc + off) * (s + alpha * ac * s * (1.0 - s)) : 0.0;
  r.db = (b >= -lim && b <= lim) ? g * p * ac * s : 0.0;
  return r;
}

}  // namespace mxmoe::test
