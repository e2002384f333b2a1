// Throughput of e4m3 (x E8M0 scale) -> bf16 conversions on one GPU, the inner work of the sm90
// MXFP8 kernels (gemm_kernel.cuh): the cvt path (F2FP e4m3 -> f16, f16 -> f32, F2FP pack, bf16
// multiply) against bit placement (PRMT/shift/LOP3 puts the 7 magnitude bits into a bf16 whose
// value is the e4m3 value times 2^-120, one bf16 multiply by 2^(s - 7) rescales it) with its NaN fix.
// Also checks that every variant equals the cvt path on all 65536 code pairs x every scale byte.
// Build and run (GPU machine): nvcc -O3 -arch=sm_90a -o cvt_bench bench/cvt_bench.cu && ./cvt_bench
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
__device__ __forceinline__ uint32_t bmul(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
// The current path (gemm_kernel.cuh e4m3x2_scaled): two codes, one bf16x2 scale pair.
__device__ __forceinline__ uint32_t cvt_pair(uint32_t two, uint32_t s2) {
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(static_cast<uint16_t>(two)));
  float lo, hi;
  asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(static_cast<uint16_t>(h & 0xFFFF)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(static_cast<uint16_t>(h >> 16)));
  uint32_t v;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(v) : "f"(hi), "f"(lo));
  return bmul(v, s2);
}
// Bit placement of bytes `sel` (0x4140: b0, b1; 0x4342: b2, b3) of x: sign at 15, magnitude at 4..10.
__device__ __forceinline__ uint32_t place(uint32_t x, uint32_t sel) {
  const uint32_t full = prmt(x, 0, sel);  // b_lo at bits 0..7, b_hi at 16..23
  const uint32_t u = full << 4;           // magnitudes at 4..10 / 20..26, signs at 11 / 27
  return u + (u & 0x08000800u) * 15u;     // signs moved to 15 / 31
}
// NaN lanes (code & 0x7F == 0x7F) of a word: 0x80 in each such byte.
__device__ __forceinline__ uint32_t nan_bytes(uint32_t x) { return ((x & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u; }
__device__ __forceinline__ uint32_t nan_fix(uint32_t r, uint32_t nb, uint32_t sel) {
  const uint32_t m = prmt(nb, 0, sel);  // 0xFFFF per NaN lane
  return r | (m & 0x7FC07FC0u);
}

template <int V>
__device__ __forceinline__ void cvt4(uint32_t x, uint32_t s2, uint32_t s2b, uint32_t& lo, uint32_t& hi) {
  if constexpr (V == 0) {
    lo = cvt_pair(x, s2);
    hi = cvt_pair(x >> 16, s2);
  } else if constexpr (V == 1) {  // placement, one multiply, no NaN fix (not exact: reference only)
    lo = bmul(place(x, 0x4140), s2);
    hi = bmul(place(x, 0x4342), s2);
  } else if constexpr (V == 2) {  // placement, two multiplies (any scale), NaN fix
    const uint32_t nb = nan_bytes(x);
    lo = nan_fix(bmul(bmul(place(x, 0x4140), s2), s2b), nb, 0x9988);
    hi = nan_fix(bmul(bmul(place(x, 0x4342), s2), s2b), nb, 0xBBAA);
  } else {  // placement, one multiply (scales <= 134), NaN fix
    const uint32_t nb = nan_bytes(x);
    lo = nan_fix(bmul(place(x, 0x4140), s2), nb, 0x9988);
    hi = nan_fix(bmul(place(x, 0x4342), s2), nb, 0xBBAA);
  }
}

__host__ __device__ inline uint32_t e8m0_bf16(uint32_t s) { return s == 0 ? 0x0040u : s == 255 ? 0x7FC0u : (s << 7); }
// Factors of the placed value: 2^(min(s, 134) - 7) and 2^(max(s, 134) - 134) (NaN for 255).
__host__ __device__ inline void placed_factors(uint32_t s, uint32_t& f1, uint32_t& f2) {
  if (s == 255) { f1 = f2 = 0x7FC0u; return; }
  const uint32_t a = s < 134 ? s : 134, b = s < 134 ? 134 : s;
  f1 = (a + 120) << 7;          // 2^(a - 7): exponent field a - 7 + 127
  f2 = (b - 134 + 127) << 7;    // 2^(b - 134)
}

template <int V>
__global__ void bench(const uint32_t* in, uint32_t* out, int iters, uint32_t s) {
  uint32_t f1, f2;
  if (V == 0) f1 = f2 = e8m0_bf16(s);
  else placed_factors(s, f1, f2);
  const uint32_t s2 = f1 | (f1 << 16), s2b = f2 | (f2 << 16);
  uint32_t w[8], acc = 0;
  for (int i = 0; i < 8; ++i) w[i] = in[(threadIdx.x * 8 + i) % 4096];
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      uint32_t lo, hi;
      cvt4<V>(w[i], s2, s2b, lo, hi);
      acc ^= lo ^ hi;
      w[i] += 0x01030507u;
    }
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

template <int V>
__global__ void check(uint32_t* bad, uint32_t* first) {
  // thread: one code pair (lo, hi bytes) for every scale
  const uint32_t code = blockIdx.x * blockDim.x + threadIdx.x;  // 0..65535
  const uint32_t x = code | (code << 16);
  for (uint32_t s = 0; s < 256; ++s) {
    if (V == 1 || V == 3) {
      if (s > 134) continue;
    }
    uint32_t f1, f2;
    placed_factors(s, f1, f2);
    const uint32_t r = e8m0_bf16(s), rs = r | (r << 16);
    uint32_t elo, ehi, glo, ghi;
    cvt4<0>(x, rs, rs, elo, ehi);
    cvt4<V>(x, f1 | (f1 << 16), f2 | (f2 << 16), glo, ghi);
    auto same = [](uint32_t a, uint32_t b) {
      for (int h = 0; h < 2; ++h) {
        const uint32_t p = (a >> (16 * h)) & 0xFFFF, q = (b >> (16 * h)) & 0xFFFF;
        const bool pn = (p & 0x7F80) == 0x7F80 && (p & 0x7F), qn = (q & 0x7F80) == 0x7F80 && (q & 0x7F);
        if (pn || qn) {
          if (pn != qn) return false;
        } else if (p != q) {
          return false;
        }
      }
      return true;
    };
    if (!same(elo, glo) || !same(ehi, ghi)) {
      if (atomicAdd(bad, 1u) == 0) {
        first[0] = code, first[1] = s, first[2] = elo, first[3] = glo;
      }
    }
  }
}

template <int V>
void run(const char* name, const uint32_t* din, uint32_t* dout, int sms) {
  uint32_t* bad;
  cudaMalloc(&bad, 20);
  cudaMemset(bad, 0, 20);
  check<V><<<256, 256>>>(bad, bad + 1);
  uint32_t hb[5];
  cudaMemcpy(hb, bad, 20, cudaMemcpyDeviceToHost);
  cudaFree(bad);
  const int iters = 4096;
  for (int threads : {256, 512}) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    bench<V><<<sms, threads>>>(din, dout, iters, 120);
    cudaEventRecord(a);
    bench<V><<<sms, threads>>>(din, dout, iters, 120);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    int clk = 0;
    cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
    const double values = double(sms) * threads * iters * 8 * 4;
    const double per_clk_sm = values / (ms * 1e-3) / sms / (clk * 1e3);
    printf("%-44s threads/SM %4d: %8.3f ms, %7.1f values/clk/SM (at %d MHz), mismatches %u%s\n", name, threads, ms,
           per_clk_sm, clk / 1000, hb[0], hb[0] ? " FIRST:" : "");
    if (hb[0]) printf("   code %04x scale %u want %08x got %08x\n", hb[1], hb[2], hb[3], hb[4]);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  std::vector<uint32_t> h(4096);
  uint32_t st = 12345;
  for (auto& v : h) v = (st = st * 1664525u + 1013904223u);
  uint32_t *din, *dout;
  cudaMalloc(&din, 4096 * 4);
  cudaMalloc(&dout, size_t(sms) * 1024 * 4);
  cudaMemcpy(din, h.data(), 4096 * 4, cudaMemcpyHostToDevice);
  run<0>("cvt path (F2FP e4m3->f16, f32, pack, mul)", din, dout, sms);
  run<1>("placement + 1 mul, no NaN fix (s<=134)", din, dout, sms);
  run<2>("placement + 2 mul + NaN fix (any scale)", din, dout, sms);
  run<3>("placement + 1 mul + NaN fix (s<=134)", din, dout, sms);
  const cudaError_t e = cudaDeviceSynchronize();
  printf("status: %s\n", cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
