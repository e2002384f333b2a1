// The public C++ API from an installed mxmoe: one MXFP8 grouped-MLP forward and backward over a few
// tokens on the CPU, then a summary line. Exits 1 if an output is not finite or the library's
// version is not the headers'.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include <mxmoe/mxmoe.h>

using namespace mxmoe;

namespace {
constexpr int64_t H = 64, F = 32, E = 2, T = 24;

std::vector<uint16_t> bf16_random(int64_t n, float scale, uint32_t seed) {
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (uint16_t& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = bf16_from_f32(scale * (static_cast<float>(seed >> 8) / 8388608.0f - 1.0f));
  }
  return v;
}

template <class T>
double abs_sum(const std::vector<T>& v) {
  double s = 0;
  for (T x : v) {
    if constexpr (sizeof(T) == 2)
      s += std::fabs(f32_from_bf16(x));
    else
      s += std::fabs(x);
  }
  return s;
}
}  // namespace

int main() {
  std::vector<uint16_t> x = bf16_random(T * H, 1.0f, 1), w1 = bf16_random(E * 2 * F * H, 0.2f, 2),
                        w2 = bf16_random(E * H * F, 0.2f, 3), dy = bf16_random(T * H, 1.0f, 4);
  std::vector<uint16_t> y(T * H), dx(T * H);
  std::vector<float> probs(T, 0.5f), dprobs(T), dw1(E * 2 * F * H), dw2(E * H * F);
  std::vector<int32_t> offsets{0, 10, static_cast<int32_t>(T)};

  Problem p{.hidden = H, .ffn = F, .experts = E, .recipe = Recipe::mxfp8};
  Context ctx;
  ForwardArgs f{.x = TensorView::of(x.data(), DType::bf16, {T, H}),
                .offsets = {TensorView::of(offsets.data(), DType::i32, {E + 1})},
                .probs = TensorView::of(probs.data(), DType::f32, {T}),
                .w1 = {.dense = TensorView::of(w1.data(), DType::bf16, {E, 2 * F, H})},
                .w2 = {.dense = TensorView::of(w2.data(), DType::bf16, {E, H, F})},
                .y = TensorView::of(y.data(), DType::bf16, {T, H})};
  BackwardArgs b{.dy = TensorView::of(dy.data(), DType::bf16, {T, H}),
                 .dx = TensorView::of(dx.data(), DType::bf16, {T, H}),
                 .dprobs = TensorView::of(dprobs.data(), DType::f32, {T}),
                 .grads = {.dw1 = {.dense = TensorView::of(dw1.data(), DType::f32, {E, 2 * F, H})},
                           .dw2 = {.dense = TensorView::of(dw2.data(), DType::f32, {E, H, F})}}};
  try {
    SavedState saved = forward(ctx, p, f);
    backward(ctx, saved, b);
  } catch (const Error& e) {  // the library's exception type, caught across the shared library
    std::fprintf(stderr, "mxmoe error (%s): %s\n", e.argument().c_str(), e.what());
    return 1;
  }

  const char* backend = ctx.report().empty() ? "?" : ctx.report().front().backend.c_str();
  const double sy = abs_sum(y), sdx = abs_sum(dx), sdw1 = abs_sum(dw1), sdw2 = abs_sum(dw2);
  std::printf("mxmoe %s (headers %s): %s forward+backward, T=%lld H=%lld F=%lld E=%lld on %s: "
              "sum|y|=%.4g sum|dx|=%.4g sum|dW1|=%.4g sum|dW2|=%.4g\n",
              version(), MXMOE_VERSION, to_string(p.recipe), static_cast<long long>(T),
              static_cast<long long>(H), static_cast<long long>(F), static_cast<long long>(E), backend, sy, sdx,
              sdw1, sdw2);
  const bool ok = std::isfinite(sy + sdx + sdw1 + sdw2) && sy > 0 && sdx > 0 && sdw1 > 0 && sdw2 > 0;
  return ok && std::strcmp(version(), MXMOE_VERSION) == 0 ? 0 : 1;
}
