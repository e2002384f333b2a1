// GLU epilogues of the m-grouped GEMM (docs/numerics.md "GLU layouts", "SwiGLU", "Clamped SwiGLU",
// "Activation precision", "Router probabilities", "Biases").
//
// glu_forward: the CTA's 128 GEMM columns are 64 GLU features f0..f0+63 arranged so that warp wn's
// 32 columns are a-columns of features f0+16wn.. (fragments ni = 0, 1) followed by the b-columns of
// the same features (ni = 2, 3); the B loader maps tile column j to FC1 column glu_a_col / glu_b_col
// (glu_forward_b_row). So every thread holds a and b of the same (t, f) in registers.
//   C = acc + b1 -> bf16 [T, 2F];  A = p_t * act(a, b) from the fp32 values -> bf16 [T, F] or
//   bf16-rounded and staged (128, 64) in shared memory, then MXFP8 row + column quantized.
// glu_backward: g = acc = dA [T, F] for features f0..f0+127; C (bf16, saved) gives a and b.
//   dC = act'(a, b, g, p) -> bf16 [T, 2F] or staged (2 x (128, 128)) and MXFP8 quantized;
//   dprob partial = sum over the tile's features of g * act   -> ws_dprob[n_tile, t]
//   db1 partial   = sum over the tile's rows of fp32 dC        -> ws_db1[m_tile, column]
//   Both partials are reduced in a fixed order (shuffles, then warps by index): deterministic.
#pragma once
#include "src/cuda/portable/mainloop.cuh"

namespace mxmoe::cuda::portable {

inline constexpr int kGluFwdFeatures = kTileMN / 2;  // features per glu_forward CTA
inline constexpr int kGluFwdPitch = kGluFwdFeatures + 8;
inline constexpr int kGluBwdPitch = kTileMN + 8;
inline constexpr int kGluFwdSmem = kTileMN * kGluFwdPitch * 2;
inline constexpr int kGluBwdStage = kTileMN * kGluBwdPitch * 2;           // one (128, 136) bf16 tile
inline constexpr int kGluBwdSmem = 2 * kGluBwdStage + (4 + 2 * 2) * kTileMN * 4;  // + row / column sums

// FC1 column (the B row) of glu_forward tile column j, or -1 past F.
__device__ __forceinline__ int64_t glu_forward_b_row(int j, int64_t f0, int64_t ffn, GluLayout layout) {
  const int wn = j / kWarpTileN, wc = j % kWarpTileN;
  const int64_t f = f0 + wn * (kWarpTileN / 2) + wc % (kWarpTileN / 2);
  if (f >= ffn) return -1;
  return wc < kWarpTileN / 2 ? glu_a_col(f, ffn, layout) : glu_b_col(f, ffn, layout);
}

__device__ __forceinline__ MxTileTarget mx_target(int64_t ld, int64_t row0, int64_t row_end, const GroupInfo& g) {
  return mx_tile_target(ld, row0, row_end, g.begin, g.end, g.col_chunk);
}

__device__ __forceinline__ void epilogue_glu_forward(const Accum& acc, const MGemmParams& p, uint8_t* smem,
                                                     int expert, const GroupInfo& g, int64_t row0,
                                                     int64_t row_end, int64_t f0) {
  const FragCoord fc;
  const int64_t F = p.ffn, C = 2 * F;
  const bool mx = p.out_mx.any();
  uint16_t* stage = reinterpret_cast<uint16_t*>(smem);  // (128, kGluFwdPitch) bf16 A values
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rl = fc.row(mi, 2 * h);
      const int64_t t = row0 + rl;
      if (t >= row_end) continue;
      const float prob = p.probs != nullptr ? p.probs[t] : 1.0f;
#pragma unroll
      for (int nn = 0; nn < 2; ++nn) {
        const int fl = fc.wn * (kWarpTileN / 2) + nn * 8 + ((fc.lane & 3) << 1);
        const int64_t f = f0 + fl;
        if (f >= F) continue;
        const int64_t ca = glu_a_col(f, F, p.glu_layout), cb = glu_b_col(f, F, p.glu_layout);
        float a0 = acc[mi][nn][2 * h], a1 = acc[mi][nn][2 * h + 1];
        float b0 = acc[mi][nn + 2][2 * h], b1 = acc[mi][nn + 2][2 * h + 1];
        if (p.bias != nullptr) {
          const uint16_t* bias = p.bias + expert * C;
          const uint32_t ba = *reinterpret_cast<const uint32_t*>(bias + ca);
          const uint32_t bb = *reinterpret_cast<const uint32_t*>(bias + cb);
          a0 += bf16_lo(ba), a1 += bf16_hi(ba), b0 += bf16_lo(bb), b1 += bf16_hi(bb);
        }
        if (p.c_out != nullptr) {
          *reinterpret_cast<uint32_t*>(p.c_out + t * C + ca) = pack_bf16x2(a0, a1);
          *reinterpret_cast<uint32_t*>(p.c_out + t * C + cb) = pack_bf16x2(b0, b1);
        }
        const uint32_t out = pack_bf16x2(prob * glu_forward(a0, b0, p.glu), prob * glu_forward(a1, b1, p.glu));
        if (p.out_bf16 != nullptr) *reinterpret_cast<uint32_t*>(p.out_bf16 + t * F + f) = out;
        if (mx) *reinterpret_cast<uint32_t*>(stage + rl * kGluFwdPitch + fl) = out;
      }
    }
  if (!mx) return;
  __syncthreads();
  quantize_staged_tile<kTileMN, kGluFwdFeatures>(
      PitchedTile<kGluFwdPitch>{stage}, p.out_mx, mx_target(F, row0, row_end, g),
      [&](int c) -> int64_t { return f0 + c < F ? f0 + c : -1; }, threadIdx.x, blockDim.x);
}

__device__ __forceinline__ void epilogue_glu_backward(const Accum& acc, const MGemmParams& p, uint8_t* smem,
                                                      const GroupInfo& g, int64_t row0, int64_t row_end,
                                                      int64_t f0, int m_tile, int n_tile) {
  const FragCoord fc;
  const int64_t F = p.ffn, C = 2 * F;
  const bool mx = p.out_mx.any();
  uint16_t* stage_a = reinterpret_cast<uint16_t*>(smem);                 // (128, kGluBwdPitch) bf16 dC_a
  uint16_t* stage_b = reinterpret_cast<uint16_t*>(smem + kGluBwdStage);  // (128, kGluBwdPitch) bf16 dC_b
  float* s_rows = reinterpret_cast<float*>(smem + 2 * kGluBwdStage);     // (4 wn, 128 rows)
  float* s_cols = s_rows + 4 * kTileMN;                                  // (2 wm, 2 halves, 128 cols)

  float row_sum[4][2] = {};  // (mi, h): sum of g * act over this thread's columns
  float col_a[4][2] = {}, col_b[4][2] = {};  // (ni, column parity): sums of da, db over its rows
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rl = fc.row(mi, 2 * h);
      const int64_t t = row0 + rl;
      if (t >= row_end) continue;
      const float prob = p.probs != nullptr ? p.probs[t] : 1.0f;
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        const int fl = fc.col(ni, 0);
        const int64_t f = f0 + fl;
        if (f >= F) continue;
        const int64_t ca = glu_a_col(f, F, p.glu_layout), cb = glu_b_col(f, F, p.glu_layout);
        const uint32_t av = *reinterpret_cast<const uint32_t*>(p.c_in + t * C + ca);
        const uint32_t bv = *reinterpret_cast<const uint32_t*>(p.c_in + t * C + cb);
        const float g0 = acc[mi][ni][2 * h], g1 = acc[mi][ni][2 * h + 1];
        const GluGrad r0 = glu_backward(bf16_lo(av), bf16_lo(bv), g0, prob, p.glu);
        const GluGrad r1 = glu_backward(bf16_hi(av), bf16_hi(bv), g1, prob, p.glu);
        row_sum[mi][h] += g0 * r0.act + g1 * r1.act;
        col_a[ni][0] += r0.da, col_a[ni][1] += r1.da;
        col_b[ni][0] += r0.db, col_b[ni][1] += r1.db;
        const uint32_t da = pack_bf16x2(r0.da, r1.da), db = pack_bf16x2(r0.db, r1.db);
        if (p.out_bf16 != nullptr) {
          *reinterpret_cast<uint32_t*>(p.out_bf16 + t * C + ca) = da;
          *reinterpret_cast<uint32_t*>(p.out_bf16 + t * C + cb) = db;
        }
        if (mx) {
          *reinterpret_cast<uint32_t*>(stage_a + rl * kGluBwdPitch + fl) = da;
          *reinterpret_cast<uint32_t*>(stage_b + rl * kGluBwdPitch + fl) = db;
        }
      }
    }

  // Row sums: the 4 lanes of a quad share a row; then the 4 wn warps, in order, below.
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v = row_sum[mi][h];
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      if ((fc.lane & 3) == 0) s_rows[fc.wn * kTileMN + fc.row(mi, 2 * h)] = v;
    }
  // Column sums: lanes with equal lane % 4 share columns; then the 2 wm warps, in order, below.
#pragma unroll
  for (int ni = 0; ni < 4; ++ni)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float va = col_a[ni][j], vb = col_b[ni][j];
#pragma unroll
      for (int d = 4; d < 32; d <<= 1) {
        va += __shfl_xor_sync(0xffffffffu, va, d);
        vb += __shfl_xor_sync(0xffffffffu, vb, d);
      }
      if (fc.lane < 4) {
        s_cols[(fc.wm * 2 + 0) * kTileMN + fc.col(ni, j)] = va;
        s_cols[(fc.wm * 2 + 1) * kTileMN + fc.col(ni, j)] = vb;
      }
    }
  __syncthreads();
  if (threadIdx.x < kTileMN && p.ws_dprob != nullptr) {
    const int64_t t = row0 + threadIdx.x;
    if (t < row_end) {
      const float* s = s_rows + threadIdx.x;
      p.ws_dprob[n_tile * p.rows + t] = ((s[0] + s[kTileMN]) + s[2 * kTileMN]) + s[3 * kTileMN];
    }
  }
  if (p.ws_db1 != nullptr) {
    const int half = threadIdx.x / kTileMN, c = threadIdx.x % kTileMN;  // 256 threads: both halves
    const int64_t f = f0 + c;
    if (f < F) {
      const int64_t col = half == 0 ? glu_a_col(f, F, p.glu_layout) : glu_b_col(f, F, p.glu_layout);
      p.ws_db1[m_tile * C + col] = s_cols[half * kTileMN + c] + s_cols[(2 + half) * kTileMN + c];
    }
  }
  if (!mx) return;
  const MxTileTarget target = mx_target(C, row0, row_end, g);
  quantize_staged_tile<kTileMN, kTileMN>(
      PitchedTile<kGluBwdPitch>{stage_a}, p.out_mx, target,
      [&](int c) -> int64_t { return f0 + c < F ? glu_a_col(f0 + c, F, p.glu_layout) : -1; }, threadIdx.x, blockDim.x);
  quantize_staged_tile<kTileMN, kTileMN>(
      PitchedTile<kGluBwdPitch>{stage_b}, p.out_mx, target,
      [&](int c) -> int64_t { return f0 + c < F ? glu_b_col(f0 + c, F, p.glu_layout) : -1; }, threadIdx.x, blockDim.x);
}

}  // namespace mxmoe::cuda::portable
