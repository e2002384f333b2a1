// CPU reference grouped GEMMs, the oracle every GPU path is tested against (docs/numerics.md "Layer dataflow",
// "Weight-gradient accumulation", "Determinism and graph safety").
//
// gemm_m:  D[t, :] = A[t, :] . B_e for the rows t of group e, fp32 accumulation, then an epilogue:
//   store         D = acc (+ b_e, or p_t * b_e)                     -> bf16 or f32 [T, N]
//   glu_forward   C = acc (+ b1_e) -> bf16 [T, 2F]; A = p_t * act(C_fp32) -> bf16 or MXFP8 [T, F]
//   glu_backward  g = acc [T, F]; dC = act'(C_bf16, g, p) -> bf16 or MXFP8 [T, 2F]; dprob; db1
//   A: bf16 or MXFP8 row-wise [T, K]; B_e: [N, K] (b_kn = false) or [K, N] (b_kn = true).
// gemm_k:  D_e = A_e^T B_e over the group's rows; A [T, M], B [T, N] bf16 or MXFP8 column-wise.
// fc2_bias_grads: db2_e = sum_t (p_t or 1) dY_t, and the scale_fc2_bias dprob term dY_t . b2_e.
//
// Operands are decoded to fp32 once (per expert for weights, per chunk of rows for activations) and
// multiplied by the blocked fp32 GEMM of gemm_core.cpp. Reductions (dprob, db1, db2) run in fp64 in
// a fixed order, so every output is deterministic.
// Run: <build>/tests/mxmoe_unit_tests --gtest_filter='CpuGemm*:CpuGlu*:CpuFc2*'
#include <algorithm>
#include <vector>

#include "mxmoe/numerics.h"
#include "src/common/experts.h"
#include "src/common/glu.h"
#include "src/cpu/cpu_ops.h"
#include "src/cpu/fp8_block.h"
#include "src/cpu/gemm_core.h"

namespace mxmoe::cpu {
namespace {

using namespace gemm_detail;
using detail::Epilogue;
using detail::MGemmStep;

constexpr int64_t kRowChunk = 256;  // activation rows decoded (and accumulated) at a time

float prob_at(const TensorView& probs, int64_t t) { return probs.data ? probs.ptr<const float>()[t] : 1.0f; }
float bias_at(const TensorView& bias, int64_t e, int64_t n, int64_t col) {
  return bias.data ? f32_from_bf16(bias.ptr<const uint16_t>()[e * n + col]) : 0.0f;
}
// The operand's [rows, cols] view; by shape, since an MXFP8 operand with no rows has no data pointer.
const TensorView& operand_view(const Operand& a) { return a.mx.data.rank > 0 ? a.mx.data : a.bf16; }
int64_t operand_rows(const Operand& a) { return operand_view(a).shape[0]; }
int64_t operand_cols(const Operand& a) { return operand_view(a).shape[1]; }

// ---- epilogues, one row at a time ----

void store_row(const MGemmStep& s, int64_t e, int64_t t, int64_t n, const float* acc) {
  const TensorView& bias = s.gemm.bias;
  const float p = s.bias_scale_by_probs ? prob_at(s.probs, t) : 1.0f;
  const TensorView& d = s.gemm.d;
  for (int64_t j = 0; j < n; ++j) {
    const float v = bias.data ? acc[j] + p * bias_at(bias, e, n, j) : acc[j];
    if (d.dtype == DType::f32)
      d.ptr<float>()[t * n + j] = v;
    else
      d.ptr<uint16_t>()[t * n + j] = bf16_from_f32(v);
  }
}

// acc: [2F] fp32, overwritten with acc + b1. The activation uses these fp32 values ("Activation precision"), not the
// bf16 copy saved in C.
void glu_forward_row(const MGemmStep& s, int64_t e, int64_t t, float* acc, uint16_t* a_out) {
  const int64_t f = s.ffn, n = 2 * f;
  for (int64_t j = 0; j < n; ++j) acc[j] += bias_at(s.gemm.bias, e, n, j);
  if (s.c.data) {
    uint16_t* c = s.c.ptr<uint16_t>() + t * n;
    for (int64_t j = 0; j < n; ++j) c[j] = bf16_from_f32(acc[j]);
  }
  const float p = prob_at(s.probs, t);
  for (int64_t i = 0; i < f; ++i) {
    const float a = acc[glu_a_col(i, f, s.glu_layout)], b = acc[glu_b_col(i, f, s.glu_layout)];
    a_out[i] = bf16_from_f32(p * glu_forward(a, b, s.glu));
  }
}

// g: [F] fp32 (dA); dc: [2F] fp32 out. Recomputes the activation from the saved bf16 C
// (docs/numerics.md "Activation precision").
void glu_backward_row(const MGemmStep& s, int64_t t, const float* g, float* dc, uint16_t* dc_out) {
  const int64_t f = s.ffn, n = 2 * f;
  const uint16_t* c = s.c.ptr<const uint16_t>() + t * n;
  const float p = prob_at(s.probs, t);
  double dprob = 0.0;
  for (int64_t i = 0; i < f; ++i) {
    const int64_t ca = glu_a_col(i, f, s.glu_layout), cb = glu_b_col(i, f, s.glu_layout);
    const GluGrad r = glu_backward(f32_from_bf16(c[ca]), f32_from_bf16(c[cb]), g[i], p, s.glu);
    dc[ca] = r.da;
    dc[cb] = r.db;
    dprob += static_cast<double>(g[i]) * static_cast<double>(r.act);
  }
  for (int64_t j = 0; j < n; ++j) dc_out[j] = bf16_from_f32(dc[j]);
  if (s.dprobs.data) {
    if (s.dprob_add.data) dprob += s.dprob_add.ptr<const float>()[t];
    s.dprobs.ptr<float>()[t] = static_cast<float>(dprob);
  }
}

// The bf16 [T, cols] tensor a glu epilogue writes: the caller's out_bf16, or a temporary that is
// then quantized to out_row / out_col (docs/numerics.md "Quantized value").
struct ActivationOut {
  std::vector<uint16_t> temp;
  uint16_t* data = nullptr;
  TensorView view;
  ActivationOut(const MGemmStep& s, int64_t t, int64_t cols) {
    if (s.out_bf16.data) {
      data = s.out_bf16.ptr<uint16_t>();
    } else {
      temp.assign(static_cast<size_t>(t * cols), 0);  // rows outside every group stay 0
      data = temp.data();
    }
    view = TensorView::of(data, DType::bf16, {t, cols});
  }
  void quantize_if_asked(const MGemmStep& s) const {
    if (!s.out_row.data.data && !s.out_col.data.data) return;
    QuantizeArgs q;
    q.src = view;
    q.groups = s.gemm.offsets;
    q.rowwise = s.out_row;
    q.colwise = s.out_col;
    q.pow2_scales = s.pow2_scales;
    cpu::quantize(q);
  }
};

// FP8 blockwise operands (docs/numerics.md "FP8 blockwise", GEMM rule): the whole fp32 product
// [T, N] of an m-grouped GEMM, which the epilogues below then read row by row.
std::vector<float> fp8_block_product(const MGemmStep& s, int64_t t_total,
                                     int64_t k, int64_t n) {
  const MGroupedGemmArgs& g = s.gemm;
  if (!g.b.is_fp8_block() || g.b.data.per_expert())
    throw Error("b", "an fp8_block A needs dense fp8_block weights (128x128 blocks)");
  const std::vector<int32_t> off = fp8_offsets(g.offsets, t_total);
  std::vector<float> d(static_cast<size_t>(t_total * n));
  const auto* qa = g.a.mx.data.ptr<const uint8_t>();
  const auto* sa = g.a.mx.scales.ptr<const float>();
  const auto* qw = g.b.data.dense.ptr<const uint8_t>();
  const auto* sw = g.b.scales.dense.ptr<const float>();
  const int64_t experts = g.offsets.experts();
  if (g.b_kn)
    fp8_gemm_dgrad(qa, sa, t_total, k, qw, sw, experts, n, off.data(), d.data());
  else
    fp8_gemm_fprop(qa, sa, t_total, k, qw, sw, experts, n, off.data(), d.data());
  return d;
}

}  // namespace

void gemm_m(const MGemmStep& s) {
  const MGroupedGemmArgs& g = s.gemm;
  const int64_t t_total = operand_rows(g.a), k = operand_cols(g.a);
  const int64_t n = detail::gemm_width(s), np = pad_n(n), f = s.ffn;
  const std::vector<int64_t> o = group_bounds(g.offsets, t_total);
  const int64_t experts = g.offsets.experts();

  const bool glu = s.epilogue != Epilogue::store;
  const int64_t out_cols = s.epilogue == Epilogue::glu_forward ? f : 2 * f;
  ActivationOut act(s, glu ? t_total : 0, glu ? out_cols : 0);
  const bool want_db1 = s.epilogue == Epilogue::glu_backward && s.db1.dst.data;

  std::vector<float> bw(static_cast<size_t>(k * np));                            // B_e, fp32 [K, np]
  std::vector<float> aw(static_cast<size_t>(pad_m(kRowChunk) * k));              // A rows, fp32 [rows, K]
  std::vector<float> acc(static_cast<size_t>(pad_m(kRowChunk) * np));            // [rows, np]
  std::vector<float> dc(want_db1 ? static_cast<size_t>(kRowChunk * 2 * f) : 0);  // fp32 dC [rows, 2F]
  std::vector<double> db1(want_db1 ? static_cast<size_t>(2 * f) : 0);
  const bool fp8 = g.a.is_fp8_block();
  const std::vector<float> prod = fp8 ? fp8_block_product(s, t_total, k, n) : std::vector<float>{};

  for (int64_t e = 0; e < experts; ++e) {
    const int64_t begin = o[e], end = o[e + 1];
    if (begin == end) {
      if (want_db1) write_empty_grad(s.db1, e * 2 * f, 2 * f);
      continue;
    }
    if (!fp8) load_expert_kn(g.b, e, k, n, g.b_kn, bw.data(), np);
    std::fill(db1.begin(), db1.end(), 0.0);
    for (int64_t t0 = begin; t0 < end; t0 += kRowChunk) {
      const int64_t rows = std::min(kRowChunk, end - t0), mp = pad_m(rows);
      if (fp8) {
        for (int64_t r = 0; r < rows; ++r)
          std::copy_n(prod.data() + (t0 + r) * n, n, acc.data() + r * np);
      } else {
        load_rows(g.a, k, t0, t0 + rows, aw.data(), k);
        std::fill(aw.begin() + rows * k, aw.begin() + mp * k, 0.0f);
        gemm_f32(mp, np, k, aw.data(), k, bw.data(), np, acc.data(), np, /*accumulate=*/false);
      }

#pragma omp parallel if (parallel_worth(rows * n * 4))
      {
        std::vector<float> local_dc(s.epilogue == Epilogue::glu_backward && !want_db1 ? 2 * f : 0);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t t = t0 + r;
          float* row = acc.data() + r * np;
          switch (s.epilogue) {
            case Epilogue::store:
              store_row(s, e, t, n, row);
              break;
            case Epilogue::glu_forward:
              glu_forward_row(s, e, t, row, act.data + t * out_cols);
              break;
            case Epilogue::glu_backward:
              glu_backward_row(s, t, row, want_db1 ? dc.data() + r * 2 * f : local_dc.data(),
                               act.data + t * out_cols);
              break;
          }
        }
      }
      if (want_db1) {
        // Columns in parallel, rows in order: the sum does not depend on the thread count.
#pragma omp parallel for schedule(static) if (parallel_worth(rows * 2 * f))
        for (int64_t j = 0; j < 2 * f; ++j)
          for (int64_t r = 0; r < rows; ++r) db1[j] += dc[r * 2 * f + j];
      }
    }
    if (want_db1) write_grad(s.db1, e * 2 * f, db1.data(), 2 * f);
  }
  if (glu) act.quantize_if_asked(s);
}

void gemm_k(const KGroupedGemmArgs& a) {
  constexpr int64_t kTokenChunk = 512;  // tokens (the reduction axis) decoded at a time
  const int64_t t_total = operand_rows(a.a), m = operand_cols(a.a), n = operand_cols(a.b);
  const int64_t mp = pad_m(m), np = pad_n(n);
  const std::vector<int64_t> o = group_bounds(a.offsets, t_total);
  const std::vector<int64_t> chunk_row = colwise_chunk_rows(o);
  const int64_t experts = a.offsets.experts();
  const DType out_dt = expert_dtype(a.d);
  const ExpertPtrs out = expert_ptrs(a.d, m * n, static_cast<int64_t>(dtype_size(out_dt)));
  const bool beta = a.accumulate && out_dt == DType::f32;

  std::vector<float> at(static_cast<size_t>(mp * kTokenChunk));        // A^T rows, fp32 [mp, tokens]
  std::vector<float> bt(static_cast<size_t>(kTokenChunk * np), 0.0f);  // B rows, fp32 [tokens, np]
  std::vector<float> acc(static_cast<size_t>(mp * np));
  // FP8 blockwise (token blocks): every expert's fp32 product [E, m, n] at once (empty groups 0).
  const bool fp8 = a.a.is_fp8_block();
  std::vector<float> prod;
  if (fp8) {
    if (!a.b.is_fp8_block()) throw Error("b", "a and b must both be fp8_block");
    const std::vector<int32_t> off = fp8_offsets(a.offsets, t_total);
    prod.resize(static_cast<size_t>(experts * m * n));
    fp8_gemm_wgrad(a.a.mx.data.ptr<const uint8_t>(), a.a.mx.scales.ptr<const float>(), m,
                   a.b.mx.data.ptr<const uint8_t>(), a.b.mx.scales.ptr<const float>(), n, t_total, off.data(),
                   experts, prod.data());
  }

  for (int64_t e = 0; e < experts; ++e) {
    const int64_t begin = o[e], end = o[e + 1];
    if (fp8) {
      for (int64_t i = 0; i < m; ++i) std::copy_n(prod.data() + (e * m + i) * n, n, acc.data() + i * np);
    } else if (begin == end) {
      std::fill(acc.begin(), acc.end(), 0.0f);  // D_e = 0 (beta 0); untouched when accumulating
    } else {
      for (int64_t t0 = begin; t0 < end; t0 += kTokenChunk) {
        const int64_t rows = std::min(kTokenChunk, end - t0);
        load_group_rows_transposed(a.a, m, begin, end - begin, chunk_row[e], t0, t0 + rows, at.data(), rows);
        std::fill(at.begin() + m * rows, at.begin() + mp * rows, 0.0f);
        load_group_rows(a.b, n, begin, end - begin, chunk_row[e], t0, t0 + rows, bt.data(), np);
        gemm_f32(mp, np, rows, at.data(), rows, bt.data(), np, acc.data(), np, /*accumulate=*/t0 > begin);
      }
    }
    if (begin == end && beta) continue;
#pragma omp parallel for schedule(static) if (parallel_worth(m * n))
    for (int64_t i = 0; i < m; ++i) {
      const float* src = acc.data() + i * np;
      if (out_dt == DType::f32) {
        float* dst = out.at<float>(e) + i * n;
        for (int64_t j = 0; j < n; ++j) dst[j] = beta ? src[j] + dst[j] : src[j];
      } else {
        uint16_t* dst = out.at<uint16_t>(e) + i * n;
        for (int64_t j = 0; j < n; ++j) dst[j] = bf16_from_f32(src[j]);
      }
    }
  }
}

void fc2_bias_grads(const detail::Fc2BiasGradStep& s) {
  const int64_t t_total = s.dy.shape[0], h = s.dy.shape[1];
  const std::vector<int64_t> o = group_bounds(s.offsets, t_total);
  const int64_t experts = s.offsets.experts();
  const uint16_t* dy = s.dy.ptr<const uint16_t>();
  const bool want_dprob = s.scale_by_probs && s.dprob_add.data && s.b2.data;
  std::vector<double> sum(static_cast<size_t>(h));

  for (int64_t e = 0; e < experts; ++e) {
    const int64_t begin = o[e], end = o[e + 1];
    if (s.db2.dst.data) {
      if (begin == end) {
        write_empty_grad(s.db2, e * h, h);
      } else {
        // Blocks of columns in parallel, tokens in order inside each: deterministic and row-contiguous.
        constexpr int64_t kCols = 64;
#pragma omp parallel for schedule(static) if (parallel_worth((end - begin) * h))
        for (int64_t j0 = 0; j0 < h; j0 += kCols) {
          const int64_t j1 = std::min(j0 + kCols, h);
          for (int64_t j = j0; j < j1; ++j) sum[j] = 0.0;
          for (int64_t t = begin; t < end; ++t) {
            const double w = s.scale_by_probs ? static_cast<double>(prob_at(s.probs, t)) : 1.0;
            for (int64_t j = j0; j < j1; ++j) sum[j] += w * static_cast<double>(f32_from_bf16(dy[t * h + j]));
          }
        }
        write_grad(s.db2, e * h, sum.data(), h);
      }
    }
    if (want_dprob) {
      const uint16_t* b2 = s.b2.ptr<const uint16_t>() + e * h;
#pragma omp parallel for schedule(static) if (parallel_worth((end - begin) * h))
      for (int64_t t = begin; t < end; ++t) {
        double v = 0.0;
        for (int64_t j = 0; j < h; ++j)
          v += static_cast<double>(f32_from_bf16(dy[t * h + j])) * static_cast<double>(f32_from_bf16(b2[j]));
        s.dprob_add.ptr<float>()[t] = static_cast<float>(v);
      }
    }
  }
}

}  // namespace mxmoe::cpu
