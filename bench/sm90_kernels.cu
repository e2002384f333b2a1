// Kernel benchmark of the sm90 grouped GEMMs: on one preset's shapes, times the configuration the
// layer's plan uses for each of its six GEMMs beside the other tile width of the same family and the
// same GEMM with a plain store epilogue, and checks that every variant writes the same bytes as the
// plan's configuration (the accumulation order along K is the same in all of them). It answers "where
// does the time go" questions in one GPU call; the layer-level comparison with the peers is
// `mxmoe bench` + bench/peer_torch.py. Every row runs the library's own launch functions
// (src/cuda/sm90/kernels.h: launch_gemm_m_bf16, launch_gemm_k) on the library's MLaunch / KLaunch of
// the step (make_launch), so this file instantiates no kernel of its own.
// Build: cmake -DMXMOE_BUILD_KERNEL_BENCH=ON ... ; Run: <build>/mxmoe_sm90_kernels [dsv3|qwen3-30b|gptoss-120b|mixtral] [skew]
// Environment knobs (to find out why `mxmoe bench` times the same kernels slower than this):
//   MXMOE_KB_DATA=bench   operands drawn as `mxmoe bench` draws them (uniform, weights scaled by
//                         1/sqrt(fan-in)) instead of hashed values in +-1.7
//   MXMOE_KB_POOL=1       buffers from the stream-ordered pool (cudaMallocAsync), as the library's
//   MXMOE_KB_LAYER_ONLY=1 only the plan's configuration of each GEMM (no variants)
//   MXMOE_KB_ITERS=N      timed runs per variant (default 10)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "mxmoe/numerics.h"
#include "src/api/layer_steps.h"
#include "src/cuda/common/workspace.h"
#include "src/cuda/sm90/gemm_m_plan.h"
#include "src/cuda/sm90/kernels.h"

namespace mxmoe::cuda::sm90 {
namespace {

#define BENCH_CHECK(x)                                                                   \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

struct Shape {
  const char* name;
  int64_t hidden, ffn, experts, tokens;
};
constexpr Shape kPresets[] = {{"dsv3", 7168, 2048, 32, 32768},
                              {"qwen3-30b", 2048, 768, 128, 65536},
                              {"gptoss-120b", 2880, 2880, 32, 32768},
                              {"mixtral", 4096, 14336, 8, 16384}};

// Hashed values: (h / 65536 - 0.5) * span * scale, 16 bits of the hash.
__global__ void fill_bf16(uint16_t* p, size_t n, float span, float scale, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
    p[i] = bf16_from_f32((static_cast<float>(h & 0xFFFF) / 65536.0f - 0.5f) * span * scale);
  }
}

bool env_on(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != 0 && std::strcmp(v, "0") != 0;
}
const bool g_pool = env_on("MXMOE_KB_POOL");
const bool g_layer_only = env_on("MXMOE_KB_LAYER_ONLY");
const bool g_bench_data = std::getenv("MXMOE_KB_DATA") && std::strcmp(std::getenv("MXMOE_KB_DATA"), "bench") == 0;
const int g_iters = std::getenv("MXMOE_KB_ITERS") ? std::atoi(std::getenv("MXMOE_KB_ITERS")) : 10;

struct Buf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Buf(size_t n) : bytes(n) {
    if (g_pool) {
      BENCH_CHECK(cudaMallocAsync(&p, n + 256, nullptr));
      BENCH_CHECK(cudaStreamSynchronize(nullptr));
    } else {
      BENCH_CHECK(cudaMalloc(&p, n + 256));
    }
  }
  ~Buf() { g_pool ? cudaFreeAsync(p, nullptr) : cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
};

TensorView tv(const Buf& b, DType t, std::initializer_list<int64_t> shape) {
  return TensorView::of(b.p, t, shape, Device{DeviceType::cuda, 0});
}

float median_ms(const std::function<void()>& f, int iters = g_iters) {
  f();
  BENCH_CHECK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    BENCH_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  cudaEventDestroy(a), cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::vector<uint8_t> snapshot(const Buf& b) {
  std::vector<uint8_t> h(b.bytes);
  BENCH_CHECK(cudaMemcpy(h.data(), b.p, b.bytes, cudaMemcpyDeviceToHost));
  return h;
}

struct Row {
  std::string gemm, variant;
  float ms;
  double flops;
  std::string same;
};
std::vector<Row> rows;

// Times `run` (which writes `out`), then compares `out` with `reference` (empty: this is the
// reference) byte for byte.
void measure(const std::string& gemm, const std::string& variant, double flops, const Buf& out,
             std::vector<uint8_t>& reference, const std::function<void()>& run) {
  if (g_layer_only && variant.rfind("layer:", 0) != 0) return;
  BENCH_CHECK(cudaMemset(out.p, 0xFF, out.bytes));
  run();
  BENCH_CHECK(cudaDeviceSynchronize());
  std::string same = "reference";
  if (reference.empty()) reference = snapshot(out);
  else same = snapshot(out) == reference ? "yes" : "NO";
  const float ms = median_ms(run);
  rows.push_back({gemm, variant, ms, flops, same});
  std::printf("  %-10s %-34s %8.3f ms %6.0f TFLOP/s  same bytes: %s\n", gemm.c_str(), variant.c_str(), ms,
              flops / ms * 1e-9, same.c_str());
  std::fflush(stdout);
}

// The BF16 m-grouped kernel of the step at tile width bn (kWideN or kNarrowN): its launch, then the
// fixed-order reductions of glu_backward, as the plan's bf16_n256 / bf16_n128 run it.
std::function<void()> m_runner(const detail::MGemmStep& s, int bn) {
  return [s, bn] {
    Workspace ws(gemm_m_workspace_bytes(s, bn), nullptr);
    const MLaunch l = make_launch(s, bn, ws, nullptr);
    launch_gemm_m_bf16(kernel_epi(s), s.gemm.b_kn, bn == kWideN, l, nullptr);
    finish_gemm_m(s, l, nullptr);
  };
}

// The BF16 k-grouped kernel (the plan's only BF16 wgrad configuration, bf16_n256).
std::function<void()> k_runner(const KGroupedGemmArgs& a) {
  return [a] {
    Workspace ws(gemm_k_workspace_bytes(a), nullptr);
    const KLaunch l = make_launch(a, kWideN, ws, nullptr);
    launch_gemm_k(/*fp8_block=*/false, l, nullptr);
  };
}

int run(const Shape& sh, bool skew) {
  const int64_t H = sh.hidden, F = sh.ffn, E = sh.experts, T = sh.tokens;
  std::vector<int32_t> sizes(E, static_cast<int32_t>(T / E));
  if (skew) {  // Dirichlet(0.5)-like split, some experts empty
    std::mt19937 rng(7);
    std::gamma_distribution<double> g(0.5, 1.0);
    std::vector<double> w(E);
    double sum = 0;
    for (double& x : w) sum += (x = g(rng));
    int64_t used = 0;
    for (int64_t e = 0; e < E; ++e) used += (sizes[e] = static_cast<int32_t>(w[e] / sum * T));
    sizes[0] += static_cast<int32_t>(T - used);
  }
  std::vector<int32_t> offs(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) offs[e + 1] = offs[e] + sizes[e];
  std::printf("%s %s: T=%lld H=%lld F=%lld E=%lld\n", sh.name, skew ? "skew" : "balanced", (long long)T,
              (long long)H, (long long)F, (long long)E);

  Buf offsets((E + 1) * 4), x(T * H * 2), w1(E * 2 * F * H * 2), w2(E * H * F * 2), dy(T * H * 2), a(T * F * 2),
      c(T * 2 * F * 2), dc(T * 2 * F * 2), y(T * H * 2), dx(T * H * 2), probs(T * 4), dprobs(T * 4),
      dw1(E * 2 * F * H * 4), dw2(E * H * F * 4), c_store(T * 2 * F * 2), da(T * F * 2);
  BENCH_CHECK(cudaMemcpy(offsets.p, offs.data(), offs.size() * 4, cudaMemcpyHostToDevice));
  uint32_t seed = 1;
  // bench data: uniform in [-1, 1], weights in [-1, 1] / sqrt(fan-in) (W1: H, W2: F), as mxmoe bench
  const float w1_scale = g_bench_data ? 1.0f / std::sqrt(float(H)) : 1.0f;
  const float w2_scale = g_bench_data ? 1.0f / std::sqrt(float(F)) : 1.0f;
  const float span = g_bench_data ? 2.0f : 3.4f;
  for (Buf* b : {&x, &w1, &w2, &dy, &a, &c})
    fill_bf16<<<1024, 256>>>(static_cast<uint16_t*>(b->p), b->bytes / 2, span,
                             b == &w1 ? w1_scale : b == &w2 ? w2_scale : 1.0f, seed++);
  std::printf("data: %s, buffers: %s, %d timed runs\n", g_bench_data ? "as mxmoe bench (uniform, W / sqrt(fan-in))" : "hashed +-1.7",
              g_pool ? "cudaMallocAsync pool" : "cudaMalloc", g_iters);
  std::vector<float> p(T);
  for (int64_t t = 0; t < T; ++t) p[t] = 0.25f + 0.5f * static_cast<float>(t % 7) / 7.0f;
  BENCH_CHECK(cudaMemcpy(probs.p, p.data(), T * 4, cudaMemcpyHostToDevice));

  Problem prob{.hidden = H, .ffn = F, .experts = E, .recipe = Recipe::bf16};
  const GroupOffsets go{tv(offsets, DType::i32, {E + 1})};
  const double thf = static_cast<double>(T) * H * F;

  const detail::LayerStep fc1 = detail::fc1_fprop(prob, {.x = {.bf16 = tv(x, DType::bf16, {T, H})},
                                                         .w1 = {.data = {.dense = tv(w1, DType::bf16, {E, 2 * F, H})}},
                                                         .offsets = go, .probs = tv(probs, DType::f32, {T}),
                                                         .c = tv(c, DType::bf16, {T, 2 * F}),
                                                         .a = {.bf16 = tv(a, DType::bf16, {T, F})}});
  detail::MGemmStep fc1_store = fc1.gemm_m();  // the same GEMM, C stored plainly (no GLU)
  fc1_store.epilogue = detail::Epilogue::store;
  fc1_store.gemm.d = tv(c_store, DType::bf16, {T, 2 * F});
  std::vector<uint8_t> ref;
  measure("fc1_fprop", "layer: glu_forward BN256", 4 * thf, a, ref, m_runner(fc1.gemm_m(), kWideN));
  std::vector<uint8_t> glu_ref = ref;
  ref.clear();
  measure("fc1_fprop", "plain store of C, BN256", 4 * thf, c_store, ref, m_runner(fc1_store, kWideN));
  detail::MGemmStep fc1_no_c = fc1.gemm_m();  // GLU output only (C not saved): what the C stores cost
  fc1_no_c.c = {};
  measure("fc1_fprop", "glu_forward BN256, C not stored", 4 * thf, a, glu_ref, m_runner(fc1_no_c, kWideN));

  const detail::LayerStep fc2 = detail::fc2_fprop(prob, {.a = {.bf16 = tv(a, DType::bf16, {T, F})},
                                                         .w2 = {.data = {.dense = tv(w2, DType::bf16, {E, H, F})}},
                                                         .offsets = go, .probs = tv(probs, DType::f32, {T}),
                                                         .y = tv(y, DType::bf16, {T, H})});
  ref.clear();
  measure("fc2_fprop", "layer: store BN256", 2 * thf, y, ref, m_runner(fc2.gemm_m(), kWideN));
  measure("fc2_fprop", "store BN128", 2 * thf, y, ref, m_runner(fc2.gemm_m(), kNarrowN));

  const detail::LayerStep d2 = detail::fc2_dgrad(prob, {.dy = {.bf16 = tv(dy, DType::bf16, {T, H})},
                                                        .w2 = {.data = {.dense = tv(w2, DType::bf16, {E, H, F})}},
                                                        .offsets = go, .probs = tv(probs, DType::f32, {T}),
                                                        .c = tv(c, DType::bf16, {T, 2 * F}),
                                                        .dprobs = tv(dprobs, DType::f32, {T}),
                                                        .dc = {.bf16 = tv(dc, DType::bf16, {T, 2 * F})}});
  detail::MGemmStep d2_store = d2.gemm_m();  // dA = dY W2 stored plainly (no dGLU)
  d2_store.epilogue = detail::Epilogue::store;
  d2_store.gemm.d = tv(da, DType::bf16, {T, F});
  ref.clear();
  measure("fc2_dgrad", "layer: glu_backward BN256", 2 * thf, dc, ref, m_runner(d2.gemm_m(), kWideN));
  measure("fc2_dgrad", "glu_backward BN128", 2 * thf, dc, ref, m_runner(d2.gemm_m(), kNarrowN));
  ref.clear();
  measure("fc2_dgrad", "plain store of dA, BN128", 2 * thf, da, ref, m_runner(d2_store, kNarrowN));
  measure("fc2_dgrad", "plain store of dA, BN256", 2 * thf, da, ref, m_runner(d2_store, kWideN));

  const detail::LayerStep d1 = detail::fc1_dgrad(prob, {.dc = {.bf16 = tv(dc, DType::bf16, {T, 2 * F})},
                                                        .w1 = {.data = {.dense = tv(w1, DType::bf16, {E, 2 * F, H})}},
                                                        .offsets = go, .dx = tv(dx, DType::bf16, {T, H})});
  ref.clear();
  measure("fc1_dgrad", "layer: store BN256", 4 * thf, dx, ref, m_runner(d1.gemm_m(), kWideN));
  measure("fc1_dgrad", "store BN128", 4 * thf, dx, ref, m_runner(d1.gemm_m(), kNarrowN));

  {  // bf16 weight gradients (what `mxmoe bench` times by default, like the peers' autograd)
    const KGroupedGemmArgs w2g{.a = {.bf16 = tv(dy, DType::bf16, {T, H})}, .b = {.bf16 = tv(a, DType::bf16, {T, F})},
                               .offsets = go, .d = {.dense = tv(dw2, DType::bf16, {E, H, F})}, .accumulate = false};
    const KGroupedGemmArgs w1g{.a = {.bf16 = tv(dc, DType::bf16, {T, 2 * F})}, .b = {.bf16 = tv(x, DType::bf16, {T, H})},
                               .offsets = go, .d = {.dense = tv(dw1, DType::bf16, {E, 2 * F, H})}, .accumulate = false};
    ref.clear();
    measure("fc2_wgrad", "layer: BN256 bf16", 2 * thf, dw2, ref, k_runner(w2g));
    ref.clear();
    measure("fc1_wgrad", "layer: BN256 bf16", 4 * thf, dw1, ref, k_runner(w1g));
  }
  for (bool acc : {false, true}) {
    const KGroupedGemmArgs w2g{.a = {.bf16 = tv(dy, DType::bf16, {T, H})}, .b = {.bf16 = tv(a, DType::bf16, {T, F})},
                               .offsets = go, .d = {.dense = tv(dw2, DType::f32, {E, H, F})}, .accumulate = acc};
    const KGroupedGemmArgs w1g{.a = {.bf16 = tv(dc, DType::bf16, {T, 2 * F})}, .b = {.bf16 = tv(x, DType::bf16, {T, H})},
                               .offsets = go, .d = {.dense = tv(dw1, DType::f32, {E, 2 * F, H})}, .accumulate = acc};
    const std::string beta = acc ? " f32 beta 1" : " f32 beta 0";
    // With beta 1 every run adds to the last one: compare only the beta-0 runs.
    ref.clear();
    std::vector<uint8_t> none;
    measure("fc2_wgrad", "layer: BN256" + beta, 2 * thf, dw2, acc ? none : ref, k_runner(w2g));
    ref.clear(), none.clear();
    measure("fc1_wgrad", "layer: BN256" + beta, 4 * thf, dw1, acc ? none : ref, k_runner(w1g));
  }

  int mismatches = 0;
  for (const Row& r : rows) mismatches += r.same == "NO";
  std::printf("%s\n", mismatches ? "VARIANTS DIFFER from the plan's configuration" : "all variants write the same bytes");
  return mismatches ? 1 : 0;
}

}  // namespace
}  // namespace mxmoe::cuda::sm90

int main(int argc, char** argv) {
  using namespace mxmoe::cuda::sm90;
  const std::string want = argc > 1 ? argv[1] : "dsv3";
  const bool skew = argc > 2 && std::strcmp(argv[2], "skew") == 0;
  for (const Shape& s : kPresets)
    if (want == s.name) return run(s, skew);
  std::fprintf(stderr, "unknown preset '%s' (dsv3, qwen3-30b, gptoss-120b, mixtral)\n", want.c_str());
  return 2;
}
