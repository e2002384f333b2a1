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
#endif
