/* Helpers shared by the C ABI tests: a failure counter with CHECK, bf16 bits, a small LCG and a
 * CPU mxmoe_tensor. Header-only (static functions), one copy per test program. */
#ifndef MXMOE_TESTS_C_TEST_SUPPORT_H
#define MXMOE_TESTS_C_TEST_SUPPORT_H
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "mxmoe/c_api.h"

static int failures = 0;
#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      ++failures;                                                              \
      fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, "\n");                                                   \
    }                                                                          \
  } while (0)

static inline uint16_t bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static inline float from_bf16(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline float urand(unsigned* s, float lo, float hi) {
  *s = *s * 1664525u + 1013904223u;
  return lo + (hi - lo) * (float)(*s >> 8) / 16777216.0f;
}
static inline mxmoe_tensor tensor(void* data, int dtype, int rank, int64_t a, int64_t b, int64_t c) {
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

/* A problem of these sizes and recipe; every other field 0 (SwiGLU, halves, no biases, dense). */
static inline mxmoe_problem problem_of(int64_t hidden, int64_t ffn, int64_t experts, int32_t recipe) {
  mxmoe_problem p;
  memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.hidden = hidden, p.ffn = ffn, p.experts = experts;
  p.recipe = recipe;
  return p;
}

/* Forward arguments over CPU buffers: x and y bf16 [T, H], offsets [E+1], probs [T], dense w1
 * [E, 2F, H] and w2 [E, H, F]; no biases. */
static inline mxmoe_forward_args dense_forward_args(void* x, void* offsets, void* probs, void* w1, void* w2, void* y,
                                                    int64_t T, int64_t H, int64_t F, int64_t E) {
  mxmoe_forward_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.x = tensor(x, MXMOE_BF16, 2, T, H, 0);
  a.offsets = tensor(offsets, MXMOE_I32, 1, E + 1, 0, 0);
  a.probs = tensor(probs, MXMOE_F32, 1, T, 0, 0);
  a.w1.dense = tensor(w1, MXMOE_BF16, 3, E, 2 * F, H);
  a.w2.dense = tensor(w2, MXMOE_BF16, 3, E, H, F);
  a.y = tensor(y, MXMOE_BF16, 2, T, H, 0);
  return a;
}

/* Backward arguments over CPU buffers: dy and dx bf16 [T, H], dprobs [T]; no weight grads yet. */
static inline mxmoe_backward_args backward_args(void* dy, void* dx, void* dprobs, int64_t T, int64_t H) {
  mxmoe_backward_args b;
  memset(&b, 0, sizeof b);
  b.struct_size = sizeof b;
  b.dy = tensor(dy, MXMOE_BF16, 2, T, H, 0);
  b.dx = tensor(dx, MXMOE_BF16, 2, T, H, 0);
  b.dprobs = tensor(dprobs, MXMOE_F32, 1, T, 0, 0);
  b.grads.struct_size = sizeof b.grads;
  return b;
}
#endif
