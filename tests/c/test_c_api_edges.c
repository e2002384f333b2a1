/* The C ABI at its edges (issue 39): out-of-range values a C caller can put in an int field are
 * refused with MXMOE_ERROR_INVALID_ARGUMENT and a message naming the field and the value, never
 * truncated into a valid enumerator, and nothing the caller owns is written. Also built with
 * AddressSanitizer and UndefinedBehaviorSanitizer in the sanitizer build (scripts/sanitize.sh). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tests/c/c_test_support.h"

static int has(const char* fragment) { return strstr(mxmoe_last_error(), fragment) != NULL; }

/* Returns nonzero when mxmoe_permuted_rows_bound refuses the arguments naming `arg` and `value`. */
static int bound_refused(int64_t t, int64_t k, int64_t e, int64_t c, const char* arg, const char* value) {
  const int64_t r = mxmoe_permuted_rows_bound(t, k, e, c);
  return r == -1 && has(arg) && has(value);
}

static void rows_bound(void) {
  const int64_t huge = (int64_t)1 << 62;
  CHECK(bound_refused(huge, 4, 1, -1, "tokens", "T=4611686018427387904"), "%s", mxmoe_last_error());
  CHECK(bound_refused(10, 1, huge, 4, "experts", "E=4611686018427387904"), "%s", mxmoe_last_error());
  CHECK(bound_refused(-5, 2, 3, -1, "tokens", "T=-5"), "%s", mxmoe_last_error());
  CHECK(bound_refused(6, 2, 3, -7, "capacity", "C=-7"), "%s", mxmoe_last_error());
  CHECK(mxmoe_permuted_rows_bound(6, 2, 3, -1) == 12 && mxmoe_last_error()[0] == '\0', "T*K, and the error cleared");
  CHECK(mxmoe_permuted_rows_bound(6, 2, 3, 1) == 3, "min(T*K, E*C)");
}

enum { H = 64, F = 32, E = 2, T = 8 };

/* A forward whose per-expert weight table says `dtype` (or whose x claims CPU index `x_index`):
 * refused naming `arg` and `value`, y untouched. */
static void forward_refused(int32_t dtype, int32_t x_index, const char* arg, const char* value) {
  static uint16_t x[T * H], w1[E * 2 * F * H], w2[E * H * F], y[T * H], y_before[T * H];
  static float probs[T];
  static int32_t offsets[E + 1] = {0, 3, T};
  int64_t p1[E], p2[E];
  unsigned seed = 11u;
  for (int i = 0; i < T * H; ++i) x[i] = bf16(urand(&seed, -1, 1));
  for (int i = 0; i < E * 2 * F * H; ++i) w1[i] = bf16(urand(&seed, -0.1f, 0.1f));
  for (int i = 0; i < E * H * F; ++i) w2[i] = bf16(urand(&seed, -0.1f, 0.1f));
  for (int i = 0; i < T; ++i) probs[i] = urand(&seed, 0, 1);
  for (int e = 0; e < E; ++e) p1[e] = (int64_t)(intptr_t)&w1[e * 2 * F * H], p2[e] = (int64_t)(intptr_t)&w2[e * H * F];
  memset(y, 0x5A, sizeof y);
  memcpy(y_before, y, sizeof y);

  mxmoe_problem p;
  memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.hidden = H, p.ffn = F, p.experts = E;
  p.recipe = MXMOE_RECIPE_MXFP8;
  p.weight_layout = MXMOE_WEIGHTS_PER_EXPERT;
  mxmoe_forward_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.x = tensor(x, MXMOE_BF16, 2, T, H, 0);
  a.x.device_index = x_index;
  a.offsets = tensor(offsets, MXMOE_I32, 1, E + 1, 0, 0);
  a.probs = tensor(probs, MXMOE_F32, 1, T, 0, 0);
  a.w1.pointers = tensor(p1, MXMOE_I64, 1, E, 0, 0);
  a.w1.dtype = dtype;
  a.w2.pointers = tensor(p2, MXMOE_I64, 1, E, 0, 0);
  a.w2.dtype = MXMOE_BF16;
  a.y = tensor(y, MXMOE_BF16, 2, T, H, 0);
  mxmoe_options o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.backend = "cpu";
  mxmoe_context ctx = NULL;
  CHECK(mxmoe_context_create(&o, &ctx) == MXMOE_OK, "%s", mxmoe_last_error());
  mxmoe_saved saved = NULL;
  const mxmoe_status s = mxmoe_forward(ctx, &p, &a, &saved);
  const int expect_ok = arg == NULL;
  if (expect_ok) {
    CHECK(s == MXMOE_OK, "the valid call fails: %s", mxmoe_last_error());
  } else {
    CHECK(s == MXMOE_ERROR_INVALID_ARGUMENT && has(arg) && has(value), "dtype %d, x index %d: status %d, %s",
          (int)dtype, (int)x_index, (int)s, mxmoe_last_error());
    CHECK(saved == NULL && memcmp(y, y_before, sizeof y) == 0, "y written by a refused call");
  }
  mxmoe_saved_destroy(saved);
  mxmoe_context_destroy(ctx);
}

int main(void) {
  rows_bound();
  forward_refused(MXMOE_BF16, 0, NULL, NULL); /* the fixture is a valid call */
  forward_refused(258, 0, "w1.dtype", "258");   /* 258 & 0xff == 2 (BF16) once truncated */
  forward_refused(-254, 0, "w1.dtype", "-254"); /* -254 & 0xff == 2 too */
  forward_refused(99, 0, "w1.dtype", "99");
  forward_refused(MXMOE_BF16, 3, "x: is on cpu:3 but", "is on cpu (");
  forward_refused(MXMOE_BF16, -1, "x: is on cpu:-1 but", "is on cpu (");
  if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
  return failures ? 1 : 0;
}
