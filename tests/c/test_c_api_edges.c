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

  mxmoe_problem p = problem_of(H, F, E, MXMOE_RECIPE_MXFP8);
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

/* options.check_finite (appended): a NaN or Inf in an input is refused naming the tensor, the first
 * bad value's coordinates and its kind, nothing written; a refused backward leaves its saved state
 * usable. Off (0, or a struct_size from before the field), a NaN is no error. */
static mxmoe_context finite_context(int32_t check, size_t struct_size) {
  mxmoe_options o;
  memset(&o, 0, sizeof o);
  o.struct_size = struct_size;
  o.backend = "cpu";
  o.check_finite = check;
  mxmoe_context ctx = NULL;
  CHECK(mxmoe_context_create(&o, &ctx) == MXMOE_OK, "%s", mxmoe_last_error());
  return ctx;
}

static void check_finite_option(void) {
  static uint16_t x[T * H], w1[E * 2 * F * H], w2[E * H * F], y[T * H], y_before[T * H], dy[T * H], dx[T * H],
      dx_before[T * H];
  static float probs[T], dprobs[T], dw1[E * 2 * F * H], dw2[E * H * F];
  static int32_t offsets[E + 1] = {0, 3, T};
  unsigned seed = 5u;
  for (int i = 0; i < T * H; ++i) x[i] = bf16(urand(&seed, -1, 1)), dy[i] = bf16(urand(&seed, -1, 1));
  for (int i = 0; i < E * 2 * F * H; ++i) w1[i] = bf16(urand(&seed, -0.1f, 0.1f));
  for (int i = 0; i < E * H * F; ++i) w2[i] = bf16(urand(&seed, -0.1f, 0.1f));
  for (int i = 0; i < T; ++i) probs[i] = urand(&seed, 0, 1);
  mxmoe_problem p = problem_of(H, F, E, MXMOE_RECIPE_MXFP8);
  mxmoe_forward_args a = dense_forward_args(x, offsets, probs, w1, w2, y, T, H, F, E);
  mxmoe_backward_args b = backward_args(dy, dx, dprobs, T, H);
  b.grads.dw1.dense = tensor(dw1, MXMOE_F32, 3, E, 2 * F, H);
  b.grads.dw2.dense = tensor(dw2, MXMOE_F32, 3, E, H, F);
  memset(y, 0x5A, sizeof y);
  memcpy(y_before, y, sizeof y);
  mxmoe_context ctx = finite_context(1, sizeof(mxmoe_options));
  mxmoe_saved saved = NULL;

  const uint16_t x_kept = x[5 * H + 10], w2_kept = w2[(1 * H + 2) * F + 3];
  x[5 * H + 10] = 0x7fc0; /* NaN, the first */
  x[6 * H + 0] = 0x7f80;  /* +Inf, later */
  mxmoe_status s = mxmoe_forward(ctx, &p, &a, &saved);
  CHECK(s == MXMOE_ERROR_INVALID_ARGUMENT && has("x: holds NaN at [5, 10]"), "status %d: %s", (int)s,
        mxmoe_last_error());
  CHECK(saved == NULL && memcmp(y, y_before, sizeof y) == 0, "y written by a refused call");
  x[6 * H + 0] = 0;
  /* Off: older struct_size (before check_finite), or 0. */
  mxmoe_context old = finite_context(1, offsetof(mxmoe_options, check_finite));
  CHECK(mxmoe_forward(old, &p, &a, &saved) == MXMOE_OK, "old struct_size checked: %s", mxmoe_last_error());
  mxmoe_saved_destroy(saved), saved = NULL;
  mxmoe_context_destroy(old);
  mxmoe_context off = finite_context(0, sizeof(mxmoe_options));
  CHECK(mxmoe_forward(off, &p, &a, &saved) == MXMOE_OK, "check_finite=0 checked: %s", mxmoe_last_error());
  mxmoe_saved_destroy(saved), saved = NULL;
  mxmoe_context_destroy(off);
  x[5 * H + 10] = x_kept;

  w2[(1 * H + 2) * F + 3] = 0xff80; /* -Inf */
  memcpy(y, y_before, sizeof y);
  s = mxmoe_forward(ctx, &p, &a, &saved);
  CHECK(s == MXMOE_ERROR_INVALID_ARGUMENT && has("w2: holds -Inf at [1, 2, 3]"), "status %d: %s", (int)s,
        mxmoe_last_error());
  CHECK(saved == NULL && memcmp(y, y_before, sizeof y) == 0, "y written by a refused call");
  w2[(1 * H + 2) * F + 3] = w2_kept;

  CHECK(mxmoe_forward(ctx, &p, &a, &saved) == MXMOE_OK, "finite forward: %s", mxmoe_last_error());
  const uint16_t dy_kept = dy[7 * H + 63];
  dy[7 * H + 63] = 0x7f80; /* +Inf */
  memset(dx, 0x5A, sizeof dx);
  memcpy(dx_before, dx, sizeof dx);
  mxmoe_wgrad w = NULL;
  s = mxmoe_backward(ctx, saved, &b, &w);
  CHECK(s == MXMOE_ERROR_INVALID_ARGUMENT && has("dy: holds +Inf at [7, 63]"), "status %d: %s", (int)s,
        mxmoe_last_error());
  CHECK(memcmp(dx, dx_before, sizeof dx) == 0, "dx written by a refused call");
  dy[7 * H + 63] = dy_kept;
  CHECK(mxmoe_backward(ctx, saved, &b, &w) == MXMOE_OK, "the saved state after a refusal: %s", mxmoe_last_error());
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
  check_finite_option();
  if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
  return failures ? 1 : 0;
}
