// CPU reference FP8-blockwise quantize / dequantize (src/cpu/fp8_block.h, docs/numerics.md
// "FP8 blockwise"). Per block: amax over the bf16 values ignoring NaN (amax_update), s =
// fp8_block_scale(amax, pow2), q = fp8_block_encode(x, s), scale_inv = fp8_block_scale_inv(s);
// dequantize is fp8_block_decode(q, scale_inv). OpenMP splits rows, token blocks or (expert, block
// row) pairs, each written by one thread, so the bytes do not depend on the thread count.
#include "src/cpu/fp8_block.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "mxmoe/numerics.h"
#include "mxmoe/types.h"
#include "src/common/fp8_block.h"
#include "src/cpu/gemm_core.h"

namespace mxmoe::cpu {
using gemm_detail::parallel_worth;

namespace {

void check_sizes(const char* fn, int64_t a, const char* an, int64_t b, const char* bn) {
  if (a < 0) throw Error(an, std::string(fn) + ": " + an + " = " + std::to_string(a) + " is negative");
  if (b < 0) throw Error(bn, std::string(fn) + ": " + bn + " = " + std::to_string(b) + " is negative");
}
void check_ptr(const char* fn, const void* p, const char* name, int64_t count) {
  if (p == nullptr && count > 0)
    throw Error(name, std::string(fn) + ": " + name + " is null for " + std::to_string(count) + " elements");
}

struct Group {
  int64_t begin, rows;
};

// The groups of `offsets` (checked: experts + 1 values, ascending, from 0 to rows), or one group.
std::vector<Group> groups_of(const char* fn, const int32_t* offsets, int64_t experts, int64_t rows) {
  if (offsets == nullptr) return {{0, rows}};
  if (experts < 1) throw Error("experts", std::string(fn) + ": experts = " + std::to_string(experts) + " (at least 1)");
  if (offsets[0] != 0)
    throw Error("offsets", std::string(fn) + ": offsets[0] = " + std::to_string(offsets[0]) + ", not 0");
  if (offsets[experts] != rows)
    throw Error("offsets", std::string(fn) + ": offsets[" + std::to_string(experts) +
                               "] = " + std::to_string(offsets[experts]) + ", not rows = " + std::to_string(rows));
  std::vector<Group> g;
  for (int64_t e = 0; e < experts; ++e) {
    if (offsets[e + 1] < offsets[e])
      throw Error("offsets", std::string(fn) + ": offsets[" + std::to_string(e + 1) +
                                 "] = " + std::to_string(offsets[e + 1]) + " < offsets[" + std::to_string(e) +
                                 "] = " + std::to_string(offsets[e]));
    g.push_back({offsets[e], offsets[e + 1] - offsets[e]});
  }
  return g;
}

struct TokenBlock {
  int64_t row0, rows, scale_row;
};
std::vector<TokenBlock> token_blocks(const std::vector<Group>& groups) {
  std::vector<TokenBlock> b;
  int64_t sr = 0;
  for (const Group& g : groups)
    for (int64_t r = 0; r < g.rows; r += kFp8Block)
      b.push_back({g.begin + r, std::min<int64_t>(kFp8Block, g.rows - r), sr++});
  return b;
}

}  // namespace

void fp8_quantize_rows(const uint16_t* x, int64_t rows, int64_t k, bool pow2, uint8_t* q, float* scale_inv) {
  const char* fn = "fp8_quantize_rows";
  check_sizes(fn, rows, "rows", k, "k");
  check_ptr(fn, x, "x", rows * k), check_ptr(fn, q, "q", rows * k);
  check_ptr(fn, scale_inv, "scale_inv", fp8_rowwise_scale_count(rows, k));
  const int64_t kb_count = ceil_div(k, kFp8Block), pitch = fp8_rowwise_pitch(rows);
  for (int64_t kb = 0; kb < kb_count; ++kb)
    for (int64_t r = rows; r < pitch; ++r) scale_inv[kb * pitch + r] = 0.0f;
#pragma omp parallel for schedule(static) if (parallel_worth(rows * k))
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t kb = 0; kb < kb_count; ++kb) {
      const int64_t c0 = kb * kFp8Block, c1 = std::min<int64_t>(k, c0 + kFp8Block);
      float amax = 0.0f;
      for (int64_t c = c0; c < c1; ++c) amax = amax_update(amax, f32_from_bf16(x[r * k + c]));
      const float s = fp8_block_scale(amax, pow2);
      for (int64_t c = c0; c < c1; ++c) q[r * k + c] = fp8_block_encode(f32_from_bf16(x[r * k + c]), s);
      scale_inv[fp8_rowwise_scale_index(r, kb, rows)] = fp8_block_scale_inv(s);
    }
  }
}

void fp8_dequantize_rows(const uint8_t* q, const float* scale_inv, int64_t rows, int64_t k, float* out) {
  const char* fn = "fp8_dequantize_rows";
  check_sizes(fn, rows, "rows", k, "k");
  check_ptr(fn, q, "q", rows * k), check_ptr(fn, out, "out", rows * k);
  check_ptr(fn, scale_inv, "scale_inv", fp8_rowwise_scale_count(rows, k));
#pragma omp parallel for schedule(static) if (parallel_worth(rows * k))
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < k; ++c)
      out[r * k + c] = fp8_block_decode(q[r * k + c], scale_inv[fp8_rowwise_scale_index(r, c / kFp8Block, rows)]);
}

int64_t fp8_quantize_token_blocks(const uint16_t* x, int64_t rows, int64_t k, const int32_t* offsets, int64_t experts,
                                  bool pow2, uint8_t* q, float* scale_inv, int64_t scale_rows) {
  const char* fn = "fp8_quantize_token_blocks";
  check_sizes(fn, rows, "rows", k, "k");
  check_ptr(fn, x, "x", rows * k), check_ptr(fn, q, "q", rows * k);
  const std::vector<TokenBlock> blocks = token_blocks(groups_of(fn, offsets, experts, rows));
  const int64_t used = static_cast<int64_t>(blocks.size());
  if (scale_rows < used)
    throw Error("scale_rows", std::string(fn) + ": scale_inv has room for " + std::to_string(scale_rows) +
                                  " block rows, the groups need " + std::to_string(used));
  check_ptr(fn, scale_inv, "scale_inv", scale_rows * k);
  std::fill(scale_inv + used * k, scale_inv + scale_rows * k, 0.0f);
#pragma omp parallel for schedule(static) if (parallel_worth(rows * k))
  for (int64_t i = 0; i < used; ++i) {
    const TokenBlock& b = blocks[static_cast<size_t>(i)];
    for (int64_t c = 0; c < k; ++c) {
      float amax = 0.0f;
      for (int64_t r = b.row0; r < b.row0 + b.rows; ++r) amax = amax_update(amax, f32_from_bf16(x[r * k + c]));
      const float s = fp8_block_scale(amax, pow2);
      for (int64_t r = b.row0; r < b.row0 + b.rows; ++r)
        q[r * k + c] = fp8_block_encode(f32_from_bf16(x[r * k + c]), s);
      scale_inv[b.scale_row * k + c] = fp8_block_scale_inv(s);
    }
  }
  return used;
}

void fp8_dequantize_token_blocks(const uint8_t* q, const float* scale_inv, int64_t rows, int64_t k,
                                 const int32_t* offsets, int64_t experts, float* out) {
  const char* fn = "fp8_dequantize_token_blocks";
  check_sizes(fn, rows, "rows", k, "k");
  check_ptr(fn, q, "q", rows * k), check_ptr(fn, out, "out", rows * k);
  const std::vector<TokenBlock> blocks = token_blocks(groups_of(fn, offsets, experts, rows));
  check_ptr(fn, scale_inv, "scale_inv", static_cast<int64_t>(blocks.size()) * k);
#pragma omp parallel for schedule(static) if (parallel_worth(rows * k))
  for (int64_t i = 0; i < static_cast<int64_t>(blocks.size()); ++i) {
    const TokenBlock& b = blocks[static_cast<size_t>(i)];
    for (int64_t r = b.row0; r < b.row0 + b.rows; ++r)
      for (int64_t c = 0; c < k; ++c) out[r * k + c] = fp8_block_decode(q[r * k + c], scale_inv[b.scale_row * k + c]);
  }
}

void fp8_quantize_weights(const uint16_t* w, int64_t experts, int64_t n, int64_t k, bool pow2, uint8_t* q,
                          float* scale_inv) {
  const char* fn = "fp8_quantize_weights";
  if (experts < 0) throw Error("experts", std::string(fn) + ": experts = " + std::to_string(experts) + " is negative");
  check_sizes(fn, n, "n", k, "k");
  check_ptr(fn, w, "w", experts * n * k), check_ptr(fn, q, "q", experts * n * k);
  check_ptr(fn, scale_inv, "scale_inv", experts * fp8_weight_scale_count(n, k));
  const int64_t nb_count = ceil_div(n, kFp8Block), kb_count = ceil_div(k, kFp8Block);
#pragma omp parallel for schedule(static) if (parallel_worth(experts * n * k))
  for (int64_t eb = 0; eb < experts * nb_count; ++eb) {
    const int64_t e = eb / nb_count, nb = eb % nb_count;
    const uint16_t* we = w + e * n * k;
    uint8_t* qe = q + e * n * k;
    const int64_t r0 = nb * kFp8Block, r1 = std::min<int64_t>(n, r0 + kFp8Block);
    for (int64_t kb = 0; kb < kb_count; ++kb) {
      const int64_t c0 = kb * kFp8Block, c1 = std::min<int64_t>(k, c0 + kFp8Block);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = amax_update(amax, f32_from_bf16(we[r * k + c]));
      const float s = fp8_block_scale(amax, pow2);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) qe[r * k + c] = fp8_block_encode(f32_from_bf16(we[r * k + c]), s);
      scale_inv[(e * nb_count + nb) * kb_count + kb] = fp8_block_scale_inv(s);
    }
  }
}

void fp8_dequantize_weights(const uint8_t* q, const float* scale_inv, int64_t experts, int64_t n, int64_t k,
                            float* out) {
  const char* fn = "fp8_dequantize_weights";
  if (experts < 0) throw Error("experts", std::string(fn) + ": experts = " + std::to_string(experts) + " is negative");
  check_sizes(fn, n, "n", k, "k");
  check_ptr(fn, q, "q", experts * n * k), check_ptr(fn, out, "out", experts * n * k);
  check_ptr(fn, scale_inv, "scale_inv", experts * fp8_weight_scale_count(n, k));
  const int64_t nb_count = ceil_div(n, kFp8Block), kb_count = ceil_div(k, kFp8Block);
#pragma omp parallel for schedule(static) if (parallel_worth(experts * n * k))
  for (int64_t er = 0; er < experts * n; ++er) {
    const int64_t e = er / n, r = er % n;
    for (int64_t c = 0; c < k; ++c)
      out[er * k + c] =
          fp8_block_decode(q[er * k + c], scale_inv[(e * nb_count + r / kFp8Block) * kb_count + c / kFp8Block]);
  }
}

// ---- GEMMs ----
namespace {

std::vector<float> decoded(const uint8_t* q, int64_t count) {
  std::vector<float> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[static_cast<size_t>(i)] = e4m3_to_f32(q[i]);
  return v;
}
std::vector<Group> gemm_groups(const char* fn, const int32_t* offsets, int64_t experts, int64_t rows) {
  if (offsets == nullptr) throw Error("offsets", std::string(fn) + ": offsets is null");
  return groups_of(fn, offsets, experts, rows);
}

}  // namespace

namespace {
// D[t, c] = sum over 128-blocks b of the reduction index r < red: fma(sum_{r in b} a[t, r] w(e, c, r),
// sa(t, b) * ws(e, c, b), acc), for the rows t of each group e (fprop: r = k, c = n; dgrad: r = n, c = k).
template <class W, class WS>
void gemm_m_blocks(const std::vector<float>& a, const float* sa, int64_t rows, int64_t red, int64_t cols,
                   const std::vector<Group>& groups, W w, WS ws, float* d) {
  const int64_t blocks = ceil_div(red, kFp8Block);
  for (int64_t e = 0; e < static_cast<int64_t>(groups.size()); ++e) {
    const Group g = groups[static_cast<size_t>(e)];
#pragma omp parallel for schedule(static) if (parallel_worth(g.rows * red * cols))
    for (int64_t t = g.begin; t < g.begin + g.rows; ++t)
      for (int64_t c = 0; c < cols; ++c) {
        float acc = 0.0f;
        for (int64_t b = 0; b < blocks; ++b) {
          float part = 0.0f;
          for (int64_t r = b * kFp8Block; r < std::min<int64_t>(red, (b + 1) * kFp8Block); ++r)
            part += a[static_cast<size_t>(t * red + r)] * w(e, c, r);
          acc = std::fma(part, sa[fp8_rowwise_scale_index(t, b, rows)] * ws(e, c, b), acc);
        }
        d[t * cols + c] = acc;
      }
  }
}
}  // namespace

void fp8_gemm_fprop(const uint8_t* qa, const float* sa, int64_t rows, int64_t k, const uint8_t* qw, const float* sw,
                    int64_t experts, int64_t n, const int32_t* offsets, float* d) {
  const char* fn = "fp8_gemm_fprop";
  check_sizes(fn, rows, "rows", k, "k");
  check_sizes(fn, experts, "experts", n, "n");
  const std::vector<Group> groups = gemm_groups(fn, offsets, experts, rows);
  check_ptr(fn, qa, "qa", rows * k), check_ptr(fn, sa, "sa", fp8_rowwise_scale_count(rows, k));
  check_ptr(fn, qw, "qw", experts * n * k), check_ptr(fn, sw, "sw", experts * fp8_weight_scale_count(n, k));
  check_ptr(fn, d, "d", rows * n);
  const std::vector<float> a = decoded(qa, rows * k), w = decoded(qw, experts * n * k);
  const int64_t nbs = ceil_div(n, kFp8Block), kbs = ceil_div(k, kFp8Block);
  gemm_m_blocks(
      a, sa, rows, k, n, groups,
      [&](int64_t e, int64_t c, int64_t r) { return w[static_cast<size_t>((e * n + c) * k + r)]; },
      [&](int64_t e, int64_t c, int64_t b) { return sw[(e * nbs + c / kFp8Block) * kbs + b]; }, d);
}

void fp8_gemm_dgrad(const uint8_t* qg, const float* sg, int64_t rows, int64_t n, const uint8_t* qw, const float* sw,
                    int64_t experts, int64_t k, const int32_t* offsets, float* d) {
  const char* fn = "fp8_gemm_dgrad";
  check_sizes(fn, rows, "rows", n, "n");
  check_sizes(fn, experts, "experts", k, "k");
  const std::vector<Group> groups = gemm_groups(fn, offsets, experts, rows);
  check_ptr(fn, qg, "qg", rows * n), check_ptr(fn, sg, "sg", fp8_rowwise_scale_count(rows, n));
  check_ptr(fn, qw, "qw", experts * n * k), check_ptr(fn, sw, "sw", experts * fp8_weight_scale_count(n, k));
  check_ptr(fn, d, "d", rows * k);
  const std::vector<float> g = decoded(qg, rows * n), w = decoded(qw, experts * n * k);
  const int64_t nbs = ceil_div(n, kFp8Block), kbs = ceil_div(k, kFp8Block);
  gemm_m_blocks(
      g, sg, rows, n, k, groups,
      [&](int64_t e, int64_t c, int64_t r) { return w[static_cast<size_t>((e * n + r) * k + c)]; },
      [&](int64_t e, int64_t c, int64_t b) { return sw[(e * nbs + b) * kbs + c / kFp8Block]; }, d);
}

void fp8_gemm_wgrad(const uint8_t* qa, const float* sa, int64_t m, const uint8_t* qb, const float* sb, int64_t n,
                    int64_t rows, const int32_t* offsets, int64_t experts, float* d) {
  const char* fn = "fp8_gemm_wgrad";
  check_sizes(fn, m, "m", n, "n");
  if (rows < 0) throw Error("rows", std::string(fn) + ": rows = " + std::to_string(rows) + " is negative");
  const std::vector<Group> groups = gemm_groups(fn, offsets, experts, rows);
  const std::vector<TokenBlock> blocks = token_blocks(groups);
  const int64_t brows = static_cast<int64_t>(blocks.size());
  check_ptr(fn, qa, "qa", rows * m), check_ptr(fn, sa, "sa", brows * m);
  check_ptr(fn, qb, "qb", rows * n), check_ptr(fn, sb, "sb", brows * n);
  check_ptr(fn, d, "d", experts * m * n);
  const std::vector<float> av = decoded(qa, rows * m), bv = decoded(qb, rows * n);
  int64_t first = 0;  // the group's first token block
  for (int64_t e = 0; e < experts; ++e) {
    const Group g = groups[static_cast<size_t>(e)];
    const int64_t nblk = fp8_token_block_rows(g.rows);
#pragma omp parallel for schedule(static) if (parallel_worth(g.rows * m * n))
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        float acc = 0.0f;
        for (int64_t b = first; b < first + nblk; ++b) {
          const TokenBlock& tb = blocks[static_cast<size_t>(b)];
          float part = 0.0f;
          for (int64_t t = tb.row0; t < tb.row0 + tb.rows; ++t)
            part += av[static_cast<size_t>(t * m + i)] * bv[static_cast<size_t>(t * n + j)];
          acc = std::fma(part, sa[b * m + i] * sb[b * n + j], acc);
        }
        d[(e * m + i) * n + j] = acc;
      }
    first += nblk;
  }
}

}  // namespace mxmoe::cpu
