// CPU reference GEMM building blocks (see gemm_core.h): MXFP8/BF16 operand decode to fp32 and a
// cache-blocked fp32 GEMM whose register tile (kMicroM x kMicroN) the compiler vectorizes.
#include "src/cpu/gemm_core.h"

#include <algorithm>
#include <cstring>

#include "mxmoe/numerics.h"
#include "src/common/experts.h"

namespace mxmoe::cpu::gemm_detail {
namespace {

constexpr int64_t kTileM = 64;   // rows per parallel tile
constexpr int64_t kTileN = 256;  // columns per parallel tile (B block of kTileK x kTileN in L2)
constexpr int64_t kTileK = 256;  // reduction slice kept hot (A: kMicroM x kTileK, B: kTileK x kMicroN)

// Four fp32 lanes (SSE / NEON width). Written with GCC/Clang vector extensions because the
// auto-vectorizer turned the plain-loop version of this tile into shuffles (5 GFLOP/s instead of 35).
typedef float Vec4 __attribute__((vector_size(16)));
constexpr int kLanes = 4;
constexpr int kTileRows = static_cast<int>(kMicroM);
constexpr int kTileVecs = static_cast<int>(kMicroN) / kLanes;
static_assert(kMicroN % kLanes == 0, "the register tile is a whole number of vectors wide");

inline Vec4 load_vec(const float* p) {
  Vec4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_vec(float* p, Vec4 v) { std::memcpy(p, &v, sizeof v); }

// One kMicroM x kMicroN register tile over k in [0, kc): acc starts from c (or 0) and is stored back.
// Each element is a sequential sum over k (no reassociation), so results are reproducible.
__attribute__((noinline)) void micro_tile(int64_t kc, const float* __restrict a, int64_t lda,
                                          const float* __restrict b, int64_t ldb, float* __restrict c,
                                          int64_t ldc, bool load_c) {
  Vec4 acc[kTileRows][kTileVecs];
  for (int r = 0; r < kTileRows; ++r)
    for (int j = 0; j < kTileVecs; ++j) acc[r][j] = load_c ? load_vec(c + r * ldc + kLanes * j) : Vec4{};
  for (int64_t k = 0; k < kc; ++k) {
    Vec4 bv[kTileVecs];  // (kMicroN) row k of the B panel
    for (int j = 0; j < kTileVecs; ++j) bv[j] = load_vec(b + k * ldb + kLanes * j);
    for (int r = 0; r < kTileRows; ++r) {
      const float ar = a[r * lda + k];
      for (int j = 0; j < kTileVecs; ++j) acc[r][j] += ar * bv[j];
    }
  }
  for (int r = 0; r < kTileRows; ++r)
    for (int j = 0; j < kTileVecs; ++j) store_vec(c + r * ldc + kLanes * j, acc[r][j]);
}

float scale_f32(const uint8_t* scales, int64_t index) { return e8m0_to_f32(scales[index]); }

}  // namespace

void gemm_f32(int64_t m_pad, int64_t n_pad, int64_t kdim, const float* a, int64_t lda, const float* b,
              int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  const int64_t tiles_m = (m_pad + kTileM - 1) / kTileM;
  const int64_t tiles_n = (n_pad + kTileN - 1) / kTileN;
#pragma omp parallel for schedule(static) if (parallel_worth(m_pad * n_pad * kdim / 16))
  for (int64_t tile = 0; tile < tiles_m * tiles_n; ++tile) {
    const int64_t m0 = (tile / tiles_n) * kTileM, m1 = std::min(m0 + kTileM, m_pad);
    const int64_t n0 = (tile % tiles_n) * kTileN, n1 = std::min(n0 + kTileN, n_pad);
    if (kdim == 0 && !accumulate) {
      for (int64_t m = m0; m < m1; ++m) std::fill(c + m * ldc + n0, c + m * ldc + n1, 0.0f);
      continue;
    }
    for (int64_t k0 = 0; k0 < kdim; k0 += kTileK) {
      const int64_t kc = std::min(kTileK, kdim - k0);
      const bool load_c = accumulate || k0 > 0;
      for (int64_t m = m0; m < m1; m += kMicroM)
        for (int64_t n = n0; n < n1; n += kMicroN)
          micro_tile(kc, a + m * lda + k0, lda, b + k0 * ldb + n, ldb, c + m * ldc + n, ldc, load_c);
    }
  }
}

std::vector<int64_t> group_bounds(const GroupOffsets& g, int64_t total_rows) {
  const int64_t experts = g.experts();
  std::vector<int64_t> o(static_cast<size_t>(experts + 1), 0);
  const int32_t* src = g.data();
  for (int64_t e = 0; e <= experts; ++e) {
    const int64_t v = clamp_offset(src[e], total_rows);
    o[e] = e == 0 ? v : std::max(v, o[e - 1]);
  }
  return o;
}

std::vector<int32_t> fp8_offsets(const GroupOffsets& g, int64_t total_rows) {
  if (g.offsets.data == nullptr) return {};
  const std::vector<int64_t> b = group_bounds(g, total_rows);
  std::vector<int32_t> o(b.begin(), b.end());
  o.back() = static_cast<int32_t>(total_rows);
  return o;
}

std::vector<int64_t> colwise_chunk_rows(const std::vector<int64_t>& bounds) {
  std::vector<int64_t> s(bounds.size() > 0 ? bounds.size() - 1 : 0, 0);
  for (size_t e = 1; e < s.size(); ++e) s[e] = s[e - 1] + colwise_group_scale_rows(bounds[e] - bounds[e - 1]);
  return s;
}

void load_rows(const Operand& a, int64_t k, int64_t t0, int64_t t1, float* out, int64_t ld) {
#pragma omp parallel for schedule(static) if (parallel_worth((t1 - t0) * k))
  for (int64_t t = t0; t < t1; ++t) {
    float* dst = out + (t - t0) * ld;
    if (a.is_mxfp8()) {
      const uint8_t* q = a.mx.data.ptr<const uint8_t>() + t * k;
      const uint8_t* sc = a.mx.scales.ptr<const uint8_t>();
      for (int64_t kb = 0; kb < k / kMxBlock; ++kb) {
        const float s = scale_f32(sc, rowwise_scale_index(t, kb, k, a.mx.layout));
        for (int64_t i = kb * kMxBlock; i < (kb + 1) * kMxBlock; ++i) dst[i] = e4m3_to_f32(q[i]) * s;
      }
    } else if (a.bf16.dtype == DType::f32) {
      std::memcpy(dst, a.bf16.ptr<const float>() + t * k, static_cast<size_t>(k) * sizeof(float));
    } else {
      const uint16_t* src = a.bf16.ptr<const uint16_t>() + t * k;
      for (int64_t i = 0; i < k; ++i) dst[i] = f32_from_bf16(src[i]);
    }
  }
}

namespace {
// Element (t, i) of a grouped column-wise operand, decoded to fp32.
inline float grouped_element(const Operand& a, int64_t cols, int64_t group_begin, int64_t group_rows,
                             int64_t chunk_row, int64_t t, int64_t i) {
  if (a.is_mxfp8()) {
    const int64_t j = (t - group_begin) / kMxBlock;
    const float s = scale_f32(a.mx.scales.ptr<const uint8_t>(),
                              colwise_scale_index(chunk_row, group_rows, j, i, cols, a.mx.layout));
    return e4m3_to_f32(a.mx.data.ptr<const uint8_t>()[t * cols + i]) * s;
  }
  if (a.bf16.dtype == DType::f32) return a.bf16.ptr<const float>()[t * cols + i];
  return f32_from_bf16(a.bf16.ptr<const uint16_t>()[t * cols + i]);
}
}  // namespace

void load_group_rows_transposed(const Operand& a, int64_t cols, int64_t group_begin, int64_t group_rows,
                                int64_t chunk_row, int64_t t0, int64_t t1, float* out, int64_t ld) {
#pragma omp parallel for schedule(static) if (parallel_worth((t1 - t0) * cols))
  for (int64_t i = 0; i < cols; ++i)
    for (int64_t t = t0; t < t1; ++t)
      out[i * ld + (t - t0)] = grouped_element(a, cols, group_begin, group_rows, chunk_row, t, i);
}

void load_group_rows(const Operand& a, int64_t cols, int64_t group_begin, int64_t group_rows,
                     int64_t chunk_row, int64_t t0, int64_t t1, float* out, int64_t ld) {
#pragma omp parallel for schedule(static) if (parallel_worth((t1 - t0) * cols))
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t i = 0; i < cols; ++i)
      out[(t - t0) * ld + i] = grouped_element(a, cols, group_begin, group_rows, chunk_row, t, i);
}

DType expert_dtype(const ExpertMatrices& m) { return m.per_expert() ? m.dtype : m.dense.dtype; }

void load_expert_kn(const ExpertOperand& b, int64_t e, int64_t k, int64_t n, bool b_kn, float* out,
                    int64_t ld) {
  const DType dt = expert_dtype(b.data);
  const bool mx = b.is_mxfp8();
  const ExpertPtrs data = expert_ptrs(b.data, k * n, static_cast<int64_t>(dtype_size(dt)));
  const int64_t scale_bytes = b_kn ? colwise_matrix_scale_bytes(k, n) : rowwise_scale_bytes(n, k);
  const uint8_t* sc = nullptr;
  if (mx) sc = expert_ptrs(b.scales, scale_bytes, 1).at<const uint8_t>(e);
  const void* base = data.get(e);

  // Element (kk, nn) of B_e, wherever it is stored.
  auto element = [&](int64_t kk, int64_t nn) -> float {
    const int64_t at = b_kn ? kk * n + nn : nn * k + kk;
    if (mx) {
      const int64_t si = b_kn ? colwise_scale_index(0, k, kk / kMxBlock, nn, n, b.layout)
                              : rowwise_scale_index(nn, kk / kMxBlock, k, b.layout);
      return e4m3_to_f32(static_cast<const uint8_t*>(base)[at]) * scale_f32(sc, si);
    }
    if (dt == DType::f32) return static_cast<const float*>(base)[at];
    return f32_from_bf16(static_cast<const uint16_t*>(base)[at]);
  };

  if (b_kn) {
#pragma omp parallel for schedule(static) if (parallel_worth(k * n))
    for (int64_t kk = 0; kk < k; ++kk) {
      for (int64_t nn = 0; nn < n; ++nn) out[kk * ld + nn] = element(kk, nn);
      std::fill(out + kk * ld + n, out + kk * ld + ld, 0.0f);
    }
  } else {
    // Transpose in blocks of 32 k-rows so both the [N, K] source and the [K, ld] destination are
    // walked in cache-friendly runs.
#pragma omp parallel for schedule(static) if (parallel_worth(k * n))
    for (int64_t kb = 0; kb < (k + kMxBlock - 1) / kMxBlock; ++kb) {
      const int64_t k0 = kb * kMxBlock, k1 = std::min(k0 + kMxBlock, k);
      for (int64_t nn = 0; nn < n; ++nn)
        for (int64_t kk = k0; kk < k1; ++kk) out[kk * ld + nn] = element(kk, nn);
      for (int64_t kk = k0; kk < k1; ++kk) std::fill(out + kk * ld + n, out + kk * ld + ld, 0.0f);
    }
  }
}

void write_grad(const detail::GradOut& g, int64_t at, const double* v, int64_t count) {
  if (g.dst.dtype == DType::f32) {
    float* dst = g.dst.ptr<float>() + at;
    for (int64_t i = 0; i < count; ++i) {
      const float x = static_cast<float>(v[i]);
      dst[i] = g.accumulate ? x + dst[i] : x;
    }
  } else {
    uint16_t* dst = g.dst.ptr<uint16_t>() + at;
    for (int64_t i = 0; i < count; ++i) dst[i] = bf16_from_f32(static_cast<float>(v[i]));
  }
}

void write_empty_grad(const detail::GradOut& g, int64_t at, int64_t count) {
  if (g.accumulate && g.dst.dtype == DType::f32) return;
  const std::vector<double> zeros(static_cast<size_t>(count), 0.0);
  write_grad(detail::GradOut{g.dst, false}, at, zeros.data(), count);
}

}  // namespace mxmoe::cpu::gemm_detail
