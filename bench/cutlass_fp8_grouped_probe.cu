// A peer probe, built only on the GPU machine to be measured beside mxmoe (not part of the library):
// CUTLASS 4.2's sm90 FP8 blockwise ptr-array grouped GEMM on the presets' m-grouped shapes.
//   I=.deps/cutlass/cutlass_library/source
//   nvcc -std=c++17 -O3 -DNDEBUG -DCFG=1 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
//        -I$I/include -I$I/tools/util/include bench/cutlass_fp8_grouped_probe.cu -o probe1 && ./probe1 20
// CFG 1: cooperative 128x128x128, cluster 1x2 (example 68's); 2: cluster 2x1; 3: pingpong 64x128x128,
// 1x2; 4: cooperative, 1x1. Prints a markdown table (ms, TFLOP/s, max error of sampled outputs against a
// naive GPU reference, relative to each output's sum of |terms|). Results:
// bench/results/2026-12-03-h200-sm90-s12-fp8-vs-cutlass.md.
#include <cuda_runtime.h>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cute/tensor.hpp>
#include <cutlass/detail/blockwise_scale_layout.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <random>
#include <algorithm>
#include <cmath>
#include <type_traits>

using namespace cute;
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)

#ifndef CFG
#define CFG 1
#endif
#if CFG == 1
using TileShape = Shape<_128, _128, _128>; using ClusterShape = Shape<_1, _2, _1>;
static const char* kName = "coop 128x128x128 cluster 1x2";
#elif CFG == 2
using TileShape = Shape<_128, _128, _128>; using ClusterShape = Shape<_2, _1, _1>;
static const char* kName = "coop 128x128x128 cluster 2x1";
#elif CFG == 3
using TileShape = Shape<_64, _128, _128>; using ClusterShape = Shape<_1, _2, _1>;
static const char* kName = "pingpong 64x128x128 cluster 1x2";
#elif CFG == 4
using TileShape = Shape<_128, _128, _128>; using ClusterShape = Shape<_1, _1, _1>;
static const char* kName = "coop 128x128x128 cluster 1x1";
#endif
constexpr bool kPingpong = CFG == 3;
using KernelSchedule = std::conditional_t<kPingpong, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise,
                                          cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise>;
using EpilogueSchedule = std::conditional_t<kPingpong, cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong,
                                            cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;

using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
using UShape = ProblemShape::UnderlyingProblemShape;
using EA = cutlass::float_e4m3_t;
using ED = cutlass::bfloat16_t;
using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128, cute::GMMA::Major::MN, cute::GMMA::Major::K>;
using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutD = cutlass::layout::RowMajor;

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, 8, ED, LayoutD*, 8,
    EpilogueSchedule, cutlass::epilogue::fusion::LinearCombination<ED, float, void>>::CollectiveOp;
using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, EA, cute::tuple<LayoutA*, LayoutSFA*>, 16, EA,
    cute::tuple<LayoutB*, LayoutSFB*>, 16, float, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    KernelSchedule>::CollectiveOp;
using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
using StrideA = typename GemmKernel::InternalStrideA;
using StrideB = typename GemmKernel::InternalStrideB;
using StrideD = typename GemmKernel::InternalStrideD;

struct Dev {
  UShape* shapes; const EA** pa; const EA** pb; ED** pd; const float** psfa; const float** psfb;
  StrideA* sa; StrideB* sb; StrideD* sd; LayoutSFA* lsfa; LayoutSFB* lsfb;
};

__global__ void prepare(Dev d, const int64_t* off, int E, int N, int K, int64_t rows, const EA* A, const EA* B, ED* D,
                        const float* sfa, const float* sfb) {
  int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= E) return;
  int64_t b = off[g];
  int m = static_cast<int>(off[g + 1] - b);
  d.shapes[g] = UShape{m, N, K};
  d.pa[g] = A + b * K;
  d.pb[g] = B + static_cast<int64_t>(g) * N * K;
  d.pd[g] = D + b * N;
  d.psfa[g] = sfa + b * ((K + 127) / 128);  // the repacked scales (repack_sfa)
  d.psfb[g] = sfb + static_cast<int64_t>(g) * ((N + 127) / 128) * ((K + 127) / 128);
  d.sa[g] = cutlass::make_cute_packed_stride(StrideA{}, {m, K, 1});
  d.sb[g] = cutlass::make_cute_packed_stride(StrideB{}, {N, K, 1});
  d.sd[g] = cutlass::make_cute_packed_stride(StrideD{}, {m, N, 1});
  // Per-group compact scale layouts, as 4.2's mainloop rebuilds them from the group's shape.
  d.lsfa[g] = ScaleConfig::tile_atom_to_shape_SFA(make_shape(m, N, K, 1));
  d.lsfb[g] = ScaleConfig::tile_atom_to_shape_SFB(make_shape(m, N, K, 1));
}

// CUTLASS 4.2's ptr-array blockwise mainloop rebuilds each group's SFA layout from (M_e, K): a compact
// [K/128][M_e] block per group. mxmoe keeps [K/128][rows]; this repacks it (one pass over the scales).
__global__ void repack_sfa(const int64_t* off, int E, int kbs, int64_t rows, const float* sfa, float* out) {
  const int64_t total = rows * kbs;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t kb = i / rows, r = i % rows;
    int lo = 0, hi = E;  // group of row r: off[g] <= r < off[g + 1]
    while (hi - lo > 1) { int mid = (lo + hi) / 2; if (off[mid] <= r) lo = mid; else hi = mid; }
    const int64_t b = off[lo], m = off[lo + 1] - b;
    out[b * kbs + kb * m + (r - b)] = sfa[kb * rows + r];
  }
}

__global__ void fill_fp8(EA* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
    float v = ((h & 0xffff) / 65535.0f) * 4.0f - 2.0f;
    p[i] = EA(v);
  }
}
__global__ void fill_scale(float* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2246822519u ^ seed; h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
    p[i] = 0.25f + ((h & 0xffff) / 65535.0f);
  }
}
// reference on sampled (row, col): sum over kb of sa*sb*sum(a*b)
__global__ void ref(const int64_t* off, int E, int N, int K, int64_t rows, const EA* A, const EA* B, const float* sfa,
                    const float* sfb, const ED* D, const int64_t* samp_r, const int* samp_c, int ns, float* err) {
  int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= ns) return;
  int64_t r = samp_r[s]; int c = samp_c[s];
  int e = 0; while (e + 1 <= E && off[e + 1] <= r) ++e;
  double acc = 0, mag = 0;
  int kbs = (K + 127) / 128;
  for (int kb = 0; kb < kbs; ++kb) {
    float part = 0, part_abs = 0;  // the block's sum and sum of |terms| (scales are positive)
    for (int k = kb * 128; k < min(K, kb * 128 + 128); ++k) {
      const float t = float(A[r * K + k]) * float(B[((int64_t)e * N + c) * K + k]);
      part += t;
      part_abs += fabsf(t);
    }
    double sc = (double)sfa[(int64_t)kb * rows + r] * sfb[((int64_t)e * ((N + 127) / 128) + c / 128) * kbs + kb];
    acc += sc * part;
    mag += sc * part_abs;
  }
  float got = float(D[r * N + c]);
  err[s] = (float)(fabs(got - acc) / (mag + 1e-6));
}

int main(int argc, char** argv) {
  struct P { const char* name; int H, F, E; int64_t R; };
  std::vector<P> presets = {{"dsv3", 7168, 2048, 32, 32768}, {"qwen3-30b", 2048, 768, 128, 65536},
                            {"gptoss-120b", 2880, 2880, 32, 32768}, {"mixtral", 4096, 14336, 8, 16384}};
  int iters = argc > 1 ? atoi(argv[1]) : 20;
  printf("# %s\n| preset | split | gemm | M | N | K | ms | TFLOP/s | max rel err |\n|---|---|---|---|---|---|---|---|---|\n", kName);
  for (auto& pr : presets) for (int skew = 0; skew < 2; ++skew) {
    int E = pr.E; int64_t R = pr.R;
    std::vector<int64_t> cnt(E);
    if (!skew) for (int e = 0; e < E; ++e) cnt[e] = R / E;
    else {  // zipf-ish: weight 1/(e+1)^1.2, expert 3 empty
      std::vector<double> w(E); double sw = 0;
      for (int e = 0; e < E; ++e) { w[e] = e == 3 ? 0 : 1.0 / pow(e + 1, 1.2); sw += w[e]; }
      int64_t tot = 0; for (int e = 0; e < E; ++e) { cnt[e] = (int64_t)(R * w[e] / sw); tot += cnt[e]; }
      cnt[0] += R - tot;
    }
    std::vector<int64_t> off(E + 1, 0); for (int e = 0; e < E; ++e) off[e + 1] = off[e] + cnt[e];
    struct G { const char* n; int N, K; };
    G gs[4] = {{"fc1_fprop", 2 * pr.F, pr.H}, {"fc2_fprop", pr.H, pr.F}, {"fc2_dgrad", pr.F, pr.H}, {"fc1_dgrad", pr.H, 2 * pr.F}};
    for (auto& g : gs) {
      int N = g.N, K = g.K;
      int kbs = (K + 127) / 128, nbs = (N + 127) / 128;
      EA *A, *B; ED* D; float *sfa, *sfb; int64_t* doff;
      CK(cudaMalloc(&A, R * K)); CK(cudaMalloc(&B, (int64_t)E * N * K)); CK(cudaMalloc(&D, R * N * 2));
      CK(cudaMalloc(&sfa, (int64_t)kbs * R * 4)); CK(cudaMalloc(&sfb, (int64_t)E * nbs * kbs * 4));
      CK(cudaMalloc(&doff, (E + 1) * 8)); CK(cudaMemcpy(doff, off.data(), (E + 1) * 8, cudaMemcpyHostToDevice));
      fill_fp8<<<1024, 256>>>(A, R * K, 1); fill_fp8<<<1024, 256>>>(B, (int64_t)E * N * K, 2);
      fill_scale<<<256, 256>>>(sfa, (int64_t)kbs * R, 3); fill_scale<<<256, 256>>>(sfb, (int64_t)E * nbs * kbs, 4);
      CK(cudaMemset(D, 0xff, R * N * 2));
      Dev d;
      CK(cudaMalloc(&d.shapes, E * sizeof(UShape))); CK(cudaMalloc(&d.pa, E * 8)); CK(cudaMalloc(&d.pb, E * 8));
      CK(cudaMalloc(&d.pd, E * 8)); CK(cudaMalloc(&d.psfa, E * 8)); CK(cudaMalloc(&d.psfb, E * 8));
      CK(cudaMalloc(&d.sa, E * sizeof(StrideA))); CK(cudaMalloc(&d.sb, E * sizeof(StrideB))); CK(cudaMalloc(&d.sd, E * sizeof(StrideD)));
      CK(cudaMalloc(&d.lsfa, E * sizeof(LayoutSFA))); CK(cudaMalloc(&d.lsfb, E * sizeof(LayoutSFB)));
      cutlass::KernelHardwareInfo hw; hw.device_id = 0;
      hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(0);
      typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGrouped, {E, d.shapes, nullptr},
                                    {d.pa, d.sa, d.pb, d.sb, d.psfa, d.lsfa, d.psfb, d.lsfb},
                                    {{}, nullptr, d.sd, d.pd, d.sd}, hw};
      auto& f = args.epilogue.thread; f.alpha = 1; f.beta = 0; f.alpha_ptr = nullptr; f.beta_ptr = nullptr;
      f.alpha_ptr_array = nullptr; f.beta_ptr_array = nullptr; f.dAlpha = {_0{}, _0{}, 0}; f.dBeta = {_0{}, _0{}, 0};
      size_t wsb = Gemm::get_workspace_size(args); void* ws; CK(cudaMalloc(&ws, wsb + 16));
      Gemm gemm;
      float* sfa_g; CK(cudaMalloc(&sfa_g, (int64_t)kbs * R * 4));
      auto run = [&]() {
        repack_sfa<<<264, 256>>>(doff, E, kbs, R, sfa, sfa_g);
        prepare<<<1, 128>>>(d, doff, E, N, K, R, A, B, D, sfa_g, sfb);
        if (gemm.can_implement(args) != cutlass::Status::kSuccess) { printf("can_implement failed\n"); exit(1); }
        if (gemm.initialize(args, ws) != cutlass::Status::kSuccess) { printf("init failed\n"); exit(1); }
        if (gemm.run() != cutlass::Status::kSuccess) { printf("run failed\n"); exit(1); }
      };
      run(); CK(cudaDeviceSynchronize());
      // check
      int ns = 2048; std::mt19937_64 rng(7); std::vector<int64_t> sr(ns); std::vector<int> sc(ns);
      for (int i = 0; i < ns; ++i) { sr[i] = rng() % R; sc[i] = rng() % N; }
      sr[0] = R - 1; sc[0] = N - 1;
      int64_t* dsr; int* dsc; float* derr; CK(cudaMalloc(&dsr, ns * 8)); CK(cudaMalloc(&dsc, ns * 4)); CK(cudaMalloc(&derr, ns * 4));
      CK(cudaMemcpy(dsr, sr.data(), ns * 8, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dsc, sc.data(), ns * 4, cudaMemcpyHostToDevice));
      ref<<<(ns + 127) / 128, 128>>>(doff, E, N, K, R, A, B, sfa, sfb, D, dsr, dsc, ns, derr);
      std::vector<float> err(ns); CK(cudaMemcpy(err.data(), derr, ns * 4, cudaMemcpyDeviceToHost));
      float me = *std::max_element(err.begin(), err.end());
      for (int i = 0; i < 3; ++i) run();
      cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
      cudaEventRecord(a); for (int i = 0; i < iters; ++i) run(); cudaEventRecord(b); CK(cudaEventSynchronize(b));
      float ms; cudaEventElapsedTime(&ms, a, b); ms /= iters;
      double tf = 2.0 * R * N * K / (ms * 1e-3) / 1e12;
      printf("| %s | %s | %s | %lld | %d | %d | %.3f | %.0f | %.2e |\n", pr.name, skew ? "skew" : "bal", g.n, (long long)R, N, K, ms, tf, me);
      fflush(stdout);
      cudaFree(sfa_g); cudaFree(A); cudaFree(B); cudaFree(D); cudaFree(sfa); cudaFree(sfb); cudaFree(doff); cudaFree(ws);
      cudaFree(d.shapes); cudaFree(d.pa); cudaFree(d.pb); cudaFree(d.pd); cudaFree(d.psfa); cudaFree(d.psfb);
      cudaFree(d.sa); cudaFree(d.sb); cudaFree(d.sd); cudaFree(d.lsfa); cudaFree(d.lsfb); cudaFree(dsr); cudaFree(dsc); cudaFree(derr);
    }
  }
  return 0;
}
