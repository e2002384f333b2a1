/* The C ABI from C: a whole forward + deferred backward on the CPU backend with a caller
 * allocator, checked against properties that must hold (finite outputs, dense == per-expert,
 * bad input -> INVALID_ARGUMENT with a message naming the argument, nothing written). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mxmoe/c_api.h"

static int failures = 0;
#define CHECK(cond, ...)                                         \
  do {                                                           \
    if (!(cond)) {                                               \
      ++failures;                                                \
      fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                              \
      fprintf(stderr, "\n");                                     \
    }                                                            \
  } while (0)

static uint16_t bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static float urand(unsigned* s, float lo, float hi) {
  *s = *s * 1664525u + 1013904223u;
  return lo + (hi - lo) * (float)(*s >> 8) / 16777216.0f;
}
static mxmoe_tensor tensor(void* data, int dtype, int rank, int64_t a, int64_t b, int64_t c) {
  mxmoe_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dtype;
  t.rank = rank;
  t.shape[0] = a;
  t.shape[1] = b;
  t.shape[2] = c;
  t.device_type = MXMOE_CPU;
  return t;
}

static int64_t live = 0, allocs = 0;
static void* my_alloc(int64_t bytes, int32_t dt, int32_t di, void* stream, void* user) {
  (void)dt, (void)di, (void)stream, (void)user;
  live += bytes;
  ++allocs;
  return malloc((size_t)bytes);
}
static void my_free(void* p, int64_t bytes, int32_t dt, int32_t di, void* stream, void* user) {
  (void)dt, (void)di, (void)stream, (void)user;
  live -= bytes;
  free(p);
}

enum { H = 64, F = 32, E = 3, T = 40 };

int main(void) {
  unsigned seed = 12345u;
  static uint16_t x[T * H], dy[T * H], w1[E * 2 * F * H], w2[E * H * F], y[T * H], y2[T * H], dx[T * H];
  static float probs[T], dprobs[T], dw1[E * 2 * F * H], dw2[E * H * F];
  int32_t offsets[E + 1] = {0, 15, 15, T};
  for (int i = 0; i < T * H; ++i) x[i] = bf16(urand(&seed, -1, 1)), dy[i] = bf16(urand(&seed, -1, 1));
  for (int i = 0; i < E * 2 * F * H; ++i) w1[i] = bf16(urand(&seed, -0.2f, 0.2f));
  for (int i = 0; i < E * H * F; ++i) w2[i] = bf16(urand(&seed, -0.2f, 0.2f));
  for (int i = 0; i < T; ++i) probs[i] = urand(&seed, 0, 1);
  memset(y, 0xA5, sizeof y);

  printf("mxmoe %s\n", mxmoe_version());
  mxmoe_options opt;
  memset(&opt, 0, sizeof opt);
  opt.struct_size = sizeof opt;
  opt.backend = "cpu";
  opt.alloc = my_alloc;
  opt.free = my_free;
  mxmoe_context ctx = NULL;
  CHECK(mxmoe_context_create(&opt, &ctx) == MXMOE_OK, "%s", mxmoe_last_error());

  mxmoe_problem p;
  memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.hidden = H, p.ffn = F, p.experts = E;
  p.activation = MXMOE_SWIGLU, p.glu_layout = MXMOE_GLU_HALVES, p.recipe = MXMOE_RECIPE_MXFP8;
  p.weight_layout = MXMOE_WEIGHTS_DENSE;

  mxmoe_forward_args fa;
  memset(&fa, 0, sizeof fa);
  fa.struct_size = sizeof fa;
  fa.x = tensor(x, MXMOE_BF16, 2, T, H, 0);
  fa.offsets = tensor(offsets, MXMOE_I32, 1, E + 1, 0, 0);
  fa.probs = tensor(probs, MXMOE_F32, 1, T, 0, 0);
  fa.w1.dense = tensor(w1, MXMOE_BF16, 3, E, 2 * F, H);
  fa.w2.dense = tensor(w2, MXMOE_BF16, 3, E, H, F);
  fa.y = tensor(y, MXMOE_BF16, 2, T, H, 0);

  mxmoe_saved saved = NULL;
  CHECK(mxmoe_forward(ctx, &p, &fa, &saved) == MXMOE_OK, "%s", mxmoe_last_error());
  CHECK(mxmoe_saved_bytes(saved) > 0, "saved bytes");
  CHECK(strcmp(mxmoe_context_step_backend(ctx, "fc1_fprop"), "cpu") == 0, "backend of fc1_fprop");
  int finite = 1;
  for (int i = 0; i < T * H; ++i) finite &= isfinite(from_bf16(y[i])) != 0;
  CHECK(finite, "y has non-finite values (unwritten?)");

  mxmoe_backward_args ba;
  memset(&ba, 0, sizeof ba);
  ba.struct_size = sizeof ba;
  ba.dy = tensor(dy, MXMOE_BF16, 2, T, H, 0);
  ba.dx = tensor(dx, MXMOE_BF16, 2, T, H, 0);
  ba.dprobs = tensor(dprobs, MXMOE_F32, 1, T, 0, 0);
  ba.grads.struct_size = sizeof ba.grads;
  ba.deferred_wgrad = 1;
  mxmoe_wgrad wg = NULL;
  CHECK(mxmoe_backward(ctx, saved, &ba, &wg) == MXMOE_OK, "%s", mxmoe_last_error());
  CHECK(wg != NULL, "deferred wgrad handle");
  mxmoe_weight_grads g;
  memset(&g, 0, sizeof g);
  g.struct_size = sizeof g;
  g.dw1.dense = tensor(dw1, MXMOE_F32, 3, E, 2 * F, H);
  g.dw2.dense = tensor(dw2, MXMOE_F32, 3, E, H, F);
  memset(dw1, 0xFF, sizeof dw1);
  CHECK(mxmoe_compute_wgrad(ctx, wg, &g) == MXMOE_OK, "%s", mxmoe_last_error());
  double norm = 0;
  for (int i = 0; i < E * 2 * F * H; ++i) norm += fabs(dw1[i]);
  CHECK(isfinite(norm) && norm > 0, "dw1 norm %g", norm);
  for (int i = 2 * F * H; i < 2 * 2 * F * H; ++i) CHECK(dw1[i] == 0.0f, "empty expert 1 must have zero dw1 (i=%d)", i);
  mxmoe_wgrad_destroy(wg);
  mxmoe_saved_destroy(saved);

  /* Bad input: non-monotone offsets -> INVALID_ARGUMENT naming offsets, y untouched. */
  offsets[2] = 10;
  memcpy(y2, y, sizeof y);
  memset(y, 0x5A, sizeof y);
  memcpy(y2, y, sizeof y);
  saved = NULL;
  CHECK(mxmoe_forward(ctx, &p, &fa, &saved) == MXMOE_ERROR_INVALID_ARGUMENT, "status");
  CHECK(strstr(mxmoe_last_error(), "offsets") != NULL, "message: %s", mxmoe_last_error());
  CHECK(saved == NULL, "no saved state on error");
  CHECK(memcmp(y, y2, sizeof y) == 0, "y written on error");
  offsets[2] = 15;

  /* A struct from an older, smaller layout is refused with a clear message. */
  fa.struct_size = 8;
  CHECK(mxmoe_forward(ctx, &p, &fa, &saved) == MXMOE_ERROR_INVALID_ARGUMENT, "struct_size");
  CHECK(strstr(mxmoe_last_error(), "struct_size") != NULL, "message: %s", mxmoe_last_error());
  fa.struct_size = sizeof fa;

  /* Forcing a GPU backend on host data is UNAVAILABLE, not a crash. */
  mxmoe_context gpu = NULL;
  opt.backend = "cuda_portable";
  CHECK(mxmoe_context_create(&opt, &gpu) == MXMOE_OK, "%s", mxmoe_last_error());
  CHECK(mxmoe_forward(gpu, &p, &fa, &saved) == MXMOE_ERROR_UNAVAILABLE, "status for forced gpu: %s", mxmoe_last_error());
  mxmoe_context_destroy(gpu);

  opt.backend = "no_such_backend";
  mxmoe_context bad = NULL;
  CHECK(mxmoe_context_create(&opt, &bad) == MXMOE_ERROR_INVALID_ARGUMENT && bad == NULL, "unknown backend");
  mxmoe_context_destroy(ctx);
  CHECK(live == 0 && allocs > 0, "caller allocator: %lld bytes still live after %lld allocations", (long long)live,
        (long long)allocs);

  printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
  return failures ? 1 : 0;
}
