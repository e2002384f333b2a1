// GLU activations scaled by the router probability (docs/numerics.md "GLU layouts", "SwiGLU",
// "Clamped SwiGLU"), host+device so
// the CPU reference and the CUDA epilogues evaluate the same formulas. All math in fp32.
#pragma once
#include <cmath>
#include <cstdint>

#include "mxmoe/problem.h"
#include "mxmoe/types.h"

namespace mxmoe {

inline constexpr int kGluInterleave = 32;  // interleave32: alternating 32-column a/b blocks

// Column of FC1's 2F-wide output holding a_n (the nonlinear half) and b_n (the linear half).
MXMOE_HD int64_t glu_a_col(int64_t n, int64_t ffn, GluLayout layout) {
  return layout == GluLayout::halves ? n : (n / kGluInterleave) * 2 * kGluInterleave + n % kGluInterleave;
}
MXMOE_HD int64_t glu_b_col(int64_t n, int64_t ffn, GluLayout layout) {
  return layout == GluLayout::halves ? ffn + n : glu_a_col(n, ffn, layout) + kGluInterleave;
}

MXMOE_HD float glu_sigmoid(float x) {
#if defined(__CUDA_ARCH__)
  // ex2.approx and rcp.approx (one MUFU op each). An IEEE 1/y is a called SASS subroutine of about
  // 20 instructions: in the sm90 epilogues, which evaluate this 64 times per thread per tile, it
  // made the code too long for the instruction cache. 1 + e >= 1, so ftz changes nothing; e = inf
  // gives 0.
  // exp(-x) = 2^(-x log2 e) as __expf computes it, with ftz: a subnormal 2^y only ever meets 1 + .
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * -1.4426950408889634f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
  return r;
#else
  return 1.0f / (1.0f + std::exp(-x));
#endif
}

struct GluParams {
  Activation activation = Activation::swiglu;
  ClampedSwiglu clamp{};
};

// Unscaled activation value act(a, b); the layer output is p * act. The templates fix the
// activation at compile time (kernels dispatch once per tile rather than per value); the plain
// functions choose at run time.
template <Activation kAct>
MXMOE_HD float glu_forward(float a, float b, const GluParams& g) {
  if constexpr (kAct == Activation::swiglu) return a * glu_sigmoid(a) * b;
  const float L = g.clamp.limit;
  const float ac = a < L ? a : L;                      // min(a, L); no lower clamp
  const float bc = b < -L ? -L : (b > L ? L : b);      // clamp(b, -L, L)
  return ac * glu_sigmoid(g.clamp.alpha * ac) * (bc + g.clamp.linear_offset);
}

struct GluGrad {
  float da;   // dL/da
  float db;   // dL/db
  float act;  // unscaled act(a, b), for dprob = sum_n g_n * act_n
};

// g = dL/dh (h = p * act); returns dL/da, dL/db for the scaled activation and act itself.
template <Activation kAct>
MXMOE_HD GluGrad glu_backward(float a, float b, float g, float p, const GluParams& gp) {
  GluGrad r;
  const float gs = g * p;
  if constexpr (kAct == Activation::swiglu) {
    const float s = glu_sigmoid(a);
    r.act = a * s * b;
    r.da = gs * b * s * (1.0f + a * (1.0f - s));
    r.db = gs * a * s;
    return r;
  }
  const float L = gp.clamp.limit, alpha = gp.clamp.alpha;
  const float ac = a < L ? a : L;
  const float bc = b < -L ? -L : (b > L ? L : b);
  const float s = glu_sigmoid(alpha * ac);
  const float lin = bc + gp.clamp.linear_offset;
  r.act = ac * s * lin;
  r.da = a <= L ? gs * lin * (s + alpha * ac * s * (1.0f - s)) : 0.0f;  // inclusive masks
  r.db = (b >= -L && b <= L) ? gs * ac * s : 0.0f;
  return r;
}

MXMOE_HD float glu_forward(float a, float b, const GluParams& g) {
  return g.activation == Activation::swiglu ? glu_forward<Activation::swiglu>(a, b, g)
                                            : glu_forward<Activation::clamped_swiglu>(a, b, g);
}
MXMOE_HD GluGrad glu_backward(float a, float b, float g, float p, const GluParams& gp) {
  return gp.activation == Activation::swiglu ? glu_backward<Activation::swiglu>(a, b, g, p, gp)
                                             : glu_backward<Activation::clamped_swiglu>(a, b, g, p, gp);
}

}  // namespace mxmoe
