/* The C ABI from C: a whole forward + deferred backward on the CPU backend with a caller
 * allocator, checked against properties that must hold (finite outputs, dense == per-expert,
 * bad input -> INVALID_ARGUMENT with a message naming the argument, nothing written); handles
 * destroyed in every order (c_api.h "Lifetimes"; also run under AddressSanitizer when the build
 * can, CApi.LifetimesUnderAddressSanitizer); out of memory -> MXMOE_ERROR_OUT_OF_MEMORY; prepared
 * weights bit-identical to quantizing per call, refused when made for another problem, and
 * destroyed before or after the contexts and states around them; token permute -> unpermute. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/c/c_test_support.h"

/* The caller allocator. Every block records the alloc_user it was allocated for; freeing it with
 * another user (or with garbage) is counted, so a free through a dangling bridge is caught even
 * without AddressSanitizer. `fail_allocs` makes it return NULL (out of memory). */
typedef struct pool {
  int64_t live, allocs;
} pool;
static pool main_pool, other_pool;
static int64_t live = 0, allocs = 0, bad_frees = 0;
static int fail_allocs = 0;
enum { HEADER = 64 };
static void* my_alloc(int64_t bytes, int32_t dt, int32_t di, void* stream, void* user) {
  (void)dt, (void)di, (void)stream;
  if (fail_allocs) return NULL;
  char* block = (char*)malloc((size_t)bytes + HEADER);
  memcpy(block, &user, sizeof user);
  pool* p = (pool*)user;
  p->live += bytes;
  ++p->allocs;
  live += bytes;
  ++allocs;
  return block + HEADER;
}
static void my_free(void* ptr, int64_t bytes, int32_t dt, int32_t di, void* stream, void* user) {
  (void)dt, (void)di, (void)stream;
  char* block = (char*)ptr - HEADER;
  void* owner;
  memcpy(&owner, block, sizeof owner);
  if (owner != user || (user != &main_pool && user != &other_pool)) {
    ++bad_frees;
    return; /* not ours to account (would be a use of a dangling bridge) */
  }
  ((pool*)user)->live -= bytes;
  live -= bytes;
  free(block);
}

enum { H = 64, F = 32, E = 3, T = 40 };

/* Handles destroyed in every order: a context (with a caller allocator) before the saved state it
 * produced, backward and compute_wgrad through other contexts, a wgrad state after every context.
 * Every free must reach the callbacks with the alloc_user of the context that allocated the block. */
static void lifetimes(const mxmoe_problem* p, const mxmoe_forward_args* fa, const mxmoe_backward_args* ba,
                      const mxmoe_weight_grads* g) {
  mxmoe_options oa, ob;
  memset(&oa, 0, sizeof oa);
  oa.struct_size = sizeof oa;
  oa.backend = "cpu";
  oa.alloc = my_alloc;
  oa.free = my_free;
  oa.alloc_user = &main_pool;
  ob = oa;
  ob.alloc_user = &other_pool;
  const int64_t main_before = main_pool.live, bad_before = bad_frees;
  mxmoe_context a = NULL, b = NULL, c = NULL;
  mxmoe_saved saved = NULL;
  mxmoe_wgrad wg = NULL;

  /* 1. forward (a), destroy a; deferred backward (b), destroy b; destroy saved; compute_wgrad
   *    through c (the library's own memory), destroy c, then the wgrad state. */
  CHECK(mxmoe_context_create(&oa, &a) == MXMOE_OK, "%s", mxmoe_last_error());
  CHECK(mxmoe_forward(a, p, fa, &saved) == MXMOE_OK, "%s", mxmoe_last_error());
  mxmoe_context_destroy(a);
  CHECK(mxmoe_context_create(&ob, &b) == MXMOE_OK, "%s", mxmoe_last_error());
  CHECK(mxmoe_backward(b, saved, ba, &wg) == MXMOE_OK, "%s", mxmoe_last_error());
  mxmoe_context_destroy(b);
  mxmoe_saved_destroy(saved);
  CHECK(other_pool.live > 0, "the deferred backward's operands live in the second context's memory");
  CHECK(mxmoe_context_create(NULL, &c) == MXMOE_OK, "%s", mxmoe_last_error());
  CHECK(mxmoe_compute_wgrad(c, wg, g) == MXMOE_OK, "%s", mxmoe_last_error());
  mxmoe_context_destroy(c);
  mxmoe_wgrad_destroy(wg);

  /* 2. A saved state never consumed, destroyed after its context. */
  CHECK(mxmoe_context_create(&oa, &a) == MXMOE_OK, "%s", mxmoe_last_error());
  CHECK(mxmoe_forward(a, p, fa, &saved) == MXMOE_OK, "%s", mxmoe_last_error());
  mxmoe_context_destroy(a);
  CHECK(mxmoe_context_create(&ob, &b) == MXMOE_OK, "%s", mxmoe_last_error());
  mxmoe_saved_destroy(saved);
  mxmoe_context_destroy(b);

  /* 3. A wgrad state never computed, destroyed after the context and the saved state. */
  CHECK(mxmoe_context_create(&oa, &a) == MXMOE_OK, "%s", mxmoe_last_error());
  CHECK(mxmoe_forward(a, p, fa, &saved) == MXMOE_OK, "%s", mxmoe_last_error());
  CHECK(mxmoe_backward(a, saved, ba, &wg) == MXMOE_OK, "%s", mxmoe_last_error());
  mxmoe_context_destroy(a);
  mxmoe_saved_destroy(saved);
  CHECK(mxmoe_context_create(&ob, &b) == MXMOE_OK, "%s", mxmoe_last_error());
  mxmoe_wgrad_destroy(wg);
  mxmoe_context_destroy(b);

  mxmoe_saved_destroy(NULL);
  mxmoe_wgrad_destroy(NULL);
  mxmoe_context_destroy(NULL);
  CHECK(bad_frees == bad_before, "%lld frees reached the callbacks with the wrong alloc_user (dangling allocator)",
        (long long)(bad_frees - bad_before));
  CHECK(main_pool.live == main_before && other_pool.live == 0, "live bytes after every handle is gone: %lld, %lld",
        (long long)(main_pool.live - main_before), (long long)other_pool.live);
}

/* One forward + immediate backward; copies y, dx and dw1 out. */
static void run_once(mxmoe_context ctx, const mxmoe_problem* p, const mxmoe_forward_args* fa,
                     const mxmoe_backward_args* ba, mxmoe_prepared_weights pw, uint16_t* y, uint16_t* dx, float* dw1) {
  mxmoe_forward_args f = *fa;
  mxmoe_backward_args b = *ba;
  f.prepared = pw;
  b.prepared = pw;
  b.deferred_wgrad = 0;
  mxmoe_saved saved = NULL;
  CHECK(mxmoe_forward(ctx, p, &f, &saved) == MXMOE_OK, "%s", mxmoe_last_error());
  CHECK(mxmoe_backward(ctx, saved, &b, NULL) == MXMOE_OK, "%s", mxmoe_last_error());
  mxmoe_saved_destroy(saved);
  memcpy(y, f.y.data, sizeof(uint16_t) * T * H);
  memcpy(dx, b.dx.data, sizeof(uint16_t) * T * H);
  memcpy(dw1, b.grads.dw1.dense.data, sizeof(float) * E * 2 * F * H);
}

/* Weights quantized once (mxmoe_prepare_weights): bit-identical results, no per-call weight
 * quantize step, a mismatch refused naming "prepared" with nothing written, an older (smaller)
 * args struct ignoring the field, and the handle destroyed before or after its context and the
 * states of the calls that used it. */
static void prepared_weights(const mxmoe_problem* p, const mxmoe_forward_args* fa, const mxmoe_backward_args* ba,
                             const mxmoe_weight_grads* g) {
  static uint16_t y0[T * H], dx0[T * H], y1[T * H], dx1[T * H];
  static float dw0[E * 2 * F * H], dw1[E * 2 * F * H];
  mxmoe_options oa;
  memset(&oa, 0, sizeof oa);
  oa.struct_size = sizeof oa;
  oa.backend = "cpu";
  oa.alloc = my_alloc;
  oa.free = my_free;
  oa.alloc_user = &other_pool;
  const int64_t bad_before = bad_frees;
  mxmoe_backward_args b = *ba;
  b.grads = *g;
  mxmoe_context ctx = NULL, maker = NULL;
  CHECK(mxmoe_context_create(&oa, &ctx) == MXMOE_OK, "%s", mxmoe_last_error());
  run_once(ctx, p, fa, &b, NULL, y0, dx0, dw0);
  CHECK(mxmoe_context_step_backend(ctx, "quantize_w1") != NULL, "a plain forward quantizes w1");

  /* Made by a context destroyed before the handle is used. */
  CHECK(mxmoe_context_create(&oa, &maker) == MXMOE_OK, "%s", mxmoe_last_error());
  mxmoe_prepared_weights pw = NULL;
  CHECK(mxmoe_prepare_weights(maker, p, &fa->w1, &fa->w2, &pw) == MXMOE_OK, "%s", mxmoe_last_error());
  CHECK(pw != NULL && mxmoe_prepared_weights_bytes(pw) > 0, "prepared bytes");
  CHECK(mxmoe_context_step_backend(maker, "prepare.quantize_w1_col") != NULL, "prepare steps in the report");
  mxmoe_context_destroy(maker);

  run_once(ctx, p, fa, &b, pw, y1, dx1, dw1);
  CHECK(mxmoe_context_step_backend(ctx, "quantize_w1") == NULL &&
            mxmoe_context_step_backend(ctx, "quantize_w1_col") == NULL,
        "a prepared forward/backward quantizes no weights");
  CHECK(memcmp(y0, y1, sizeof y0) == 0, "prepared y differs");
  CHECK(memcmp(dx0, dx1, sizeof dx0) == 0, "prepared dx differs");
  CHECK(memcmp(dw0, dw1, sizeof dw0) == 0, "prepared dw1 differs");

  /* Made for another recipe: refused, naming it, y untouched. */
  mxmoe_problem other = *p;
  other.recipe = MXMOE_RECIPE_BF16;
  mxmoe_prepared_weights wrong = NULL;
  CHECK(mxmoe_prepare_weights(ctx, &other, &fa->w1, &fa->w2, &wrong) == MXMOE_OK, "%s", mxmoe_last_error());
  CHECK(mxmoe_prepared_weights_bytes(wrong) == 0, "bf16 prepared weights hold nothing");
  mxmoe_forward_args f = *fa;
  f.prepared = wrong;
  memset(f.y.data, 0x5A, sizeof(uint16_t) * T * H);
  memcpy(y1, f.y.data, sizeof y1);
  mxmoe_saved saved = NULL;
  CHECK(mxmoe_forward(ctx, p, &f, &saved) == MXMOE_ERROR_INVALID_ARGUMENT, "mismatched prepared");
  CHECK(strstr(mxmoe_last_error(), "prepared: was prepared for problem.recipe=bf16") != NULL, "message: %s",
        mxmoe_last_error());
  CHECK(saved == NULL && memcmp(f.y.data, y1, sizeof y1) == 0, "nothing written on a mismatch");

  /* A caller built against the header before the field: its struct_size stops before `prepared`,
   * which is not read (here it holds the mismatched handle). */
  f.struct_size = offsetof(mxmoe_forward_args, prepared);
  CHECK(mxmoe_forward(ctx, p, &f, &saved) == MXMOE_OK, "older struct_size: %s", mxmoe_last_error());
  mxmoe_backward_args ob = b;
  ob.struct_size = offsetof(mxmoe_backward_args, prepared);
  ob.prepared = wrong;
  ob.deferred_wgrad = 0;
  CHECK(mxmoe_backward(ctx, saved, &ob, NULL) == MXMOE_OK, "older struct_size: %s", mxmoe_last_error());
  mxmoe_saved_destroy(saved);
  mxmoe_prepared_weights_destroy(wrong);

  /* Destroyed between a forward that used it and a backward that is not given it; and a handle
   * outliving every context. */
  f = *fa;
  f.prepared = pw;
  ob = b;
  ob.deferred_wgrad = 0;
  CHECK(mxmoe_forward(ctx, p, &f, &saved) == MXMOE_OK, "%s", mxmoe_last_error());
  mxmoe_prepared_weights_destroy(pw);
  CHECK(mxmoe_backward(ctx, saved, &ob, NULL) == MXMOE_OK, "%s", mxmoe_last_error());
  mxmoe_saved_destroy(saved);
  CHECK(mxmoe_prepare_weights(ctx, p, &fa->w1, &fa->w2, &pw) == MXMOE_OK, "%s", mxmoe_last_error());
  mxmoe_context_destroy(ctx);
  CHECK(other_pool.live > 0, "the prepared copies live in the context's memory");
  mxmoe_prepared_weights_destroy(pw);
  mxmoe_prepared_weights_destroy(NULL);
  CHECK(mxmoe_prepared_weights_bytes(NULL) == 0, "bytes of NULL");
  CHECK(bad_frees == bad_before, "%lld frees with the wrong alloc_user", (long long)(bad_frees - bad_before));
  CHECK(other_pool.live == 0, "live bytes after every handle is gone: %lld", (long long)other_pool.live);
}

/* Token permute -> unpermute through the C ABI: every slot kept (K = 2), so y = 2 x exactly and the
 * probs come back; permute_by_map moves the same rows; capacity -2 and an old struct_size are
 * INVALID_ARGUMENT with nothing written; device data is UNAVAILABLE (no backend serves it yet). */
static void permute_unpermute(mxmoe_context ctx) {
  enum { PT = 5, PK = 2, PE = 3, PH = 8, PR = PT * PK };
  /* 16-byte aligned, as device pointers must be (the last check claims the data is on a GPU). */
  _Alignas(16) uint16_t x[PT * PH], permuted[PR * PH], permuted2[PR * PH], before[PR * PH], y[PT * PH];
  _Alignas(16) int32_t ids[PT * PK], offsets[PE + 1], row_map[PT * PK], invalid[1] = {-7};
  _Alignas(16) float probs[PT * PK], pprobs[PR], pprobs2[PR], back[PT * PK];
  unsigned seed = 7u;
  for (int i = 0; i < PT * PH; ++i) x[i] = bf16(urand(&seed, -1, 1));
  for (int t = 0; t < PT; ++t) ids[t * PK] = t % PE, ids[t * PK + 1] = (t + 1) % PE;
  for (int i = 0; i < PT * PK; ++i) probs[i] = urand(&seed, 0, 1);
  memset(permuted, 0xFF, sizeof permuted);
  CHECK(mxmoe_permuted_rows_bound(PT, PK, PE, -1) == PR, "bound without capacity");
  CHECK(mxmoe_permuted_rows_bound(PT, PK, PE, 2) == 6, "bound with capacity 2");

  mxmoe_permute_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.x = tensor(x, MXMOE_BF16, 2, PT, PH, 0);
  a.expert_ids = tensor(ids, MXMOE_I32, 2, PT, PK, 0);
  a.probs = tensor(probs, MXMOE_F32, 2, PT, PK, 0);
  a.experts = PE;
  a.capacity = -1;
  a.offsets = tensor(offsets, MXMOE_I32, 1, PE + 1, 0, 0);
  a.permuted_x = tensor(permuted, MXMOE_BF16, 2, PR, PH, 0);
  a.row_map = tensor(row_map, MXMOE_I32, 2, PT, PK, 0);
  a.permuted_probs = tensor(pprobs, MXMOE_F32, 1, PR, 0, 0);
  a.invalid = tensor(invalid, MXMOE_I32, 1, 1, 0, 0);
  CHECK(mxmoe_permute_tokens(ctx, &a) == MXMOE_OK, "%s", mxmoe_last_error());
  const char* ran = mxmoe_context_step_backend(ctx, "route_tokens");
  CHECK(ran != NULL && strcmp(ran, "cpu") == 0, "backend of route_tokens: %s", ran ? ran : "(none)");
  CHECK(offsets[0] == 0 && offsets[PE] == PR && invalid[0] == 0, "offsets[E]=%d invalid=%d", offsets[PE], invalid[0]);
  for (int e = 0; e < PE; ++e) CHECK(offsets[e] <= offsets[e + 1], "offsets not monotone at %d", e);
  for (int i = 0; i < PT * PK; ++i) {
    CHECK(row_map[i] >= 0 && row_map[i] < PR, "row_map[%d]=%d", i, row_map[i]);
    if (row_map[i] < 0 || row_map[i] >= PR) continue;
    CHECK(row_map[i] >= offsets[ids[i]] && row_map[i] < offsets[ids[i] + 1], "slot %d outside its expert", i);
    CHECK(memcmp(&permuted[row_map[i] * PH], &x[(i / PK) * PH], PH * sizeof(uint16_t)) == 0, "row of slot %d", i);
  }

  mxmoe_unpermute_args u;
  memset(&u, 0, sizeof u);
  u.struct_size = sizeof u;
  u.permuted_y = tensor(permuted, MXMOE_BF16, 2, PR, PH, 0);
  u.row_map = a.row_map;
  u.permuted_probs = a.permuted_probs;
  u.y = tensor(y, MXMOE_BF16, 2, PT, PH, 0);
  u.probs = tensor(back, MXMOE_F32, 2, PT, PK, 0);
  CHECK(mxmoe_unpermute_tokens(ctx, &u) == MXMOE_OK, "%s", mxmoe_last_error());
  for (int i = 0; i < PT * PH; ++i) CHECK(y[i] == bf16(2.0f * from_bf16(x[i])), "y[%d] is not 2 x", i);
  for (int i = 0; i < PT * PK; ++i) CHECK(back[i] == probs[i], "probs[%d] did not come back", i);

  mxmoe_permute_by_map_args m;
  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  m.x = a.x;
  m.row_map = a.row_map;
  m.probs = a.probs;
  m.permuted_x = tensor(permuted2, MXMOE_BF16, 2, PR, PH, 0);
  m.permuted_probs = tensor(pprobs2, MXMOE_F32, 1, PR, 0, 0);
  CHECK(mxmoe_permute_by_map(ctx, &m) == MXMOE_OK, "%s", mxmoe_last_error());
  CHECK(memcmp(permuted2, permuted, sizeof permuted) == 0 && memcmp(pprobs2, pprobs, sizeof pprobs) == 0,
        "permute_by_map moved other rows than permute_tokens");
  /* zero_unused_rows (appended): a row no slot names becomes zeros; a struct_size ending before the
   * field is still taken (the field reads as 0: the row stays as it was). */
  m.row_map.shape[0] = PT - 1; /* the last token's rows are named by no slot */
  m.x.shape[0] = PT - 1;
  m.probs.shape[0] = PT - 1;
  memset(permuted2, 0xFF, sizeof permuted2);
  m.struct_size = offsetof(mxmoe_permute_by_map_args, zero_unused_rows);
  CHECK(mxmoe_permute_by_map(ctx, &m) == MXMOE_OK, "old struct_size: %s", mxmoe_last_error());
  CHECK(permuted2[row_map[(PT - 1) * PK] * PH] == 0xFFFF, "an old struct_size zeroed a row");
  m.struct_size = sizeof m;
  m.zero_unused_rows = 1;
  CHECK(mxmoe_permute_by_map(ctx, &m) == MXMOE_OK, "%s", mxmoe_last_error());
  for (int k = 0; k < PK; ++k) {
    const int32_t r = row_map[(PT - 1) * PK + k];
    for (int h = 0; h < PH; ++h) CHECK(permuted2[r * PH + h] == 0, "unnamed row %d not zeroed", r);
    CHECK(pprobs2[r] == 0.0f, "unnamed row %d's prob not zeroed", r);
  }
  for (int i = 0; i < (PT - 1) * PK; ++i)
    CHECK(memcmp(&permuted2[row_map[i] * PH], &permuted[row_map[i] * PH], PH * sizeof(uint16_t)) == 0,
          "named row of slot %d", i);

  memset(permuted, 0x5A, sizeof permuted);
  memcpy(before, permuted, sizeof permuted);
  a.capacity = -2;
  CHECK(mxmoe_permute_tokens(ctx, &a) == MXMOE_ERROR_INVALID_ARGUMENT, "capacity -2");
  CHECK(strstr(mxmoe_last_error(), "capacity: C=-2") != NULL, "message: %s", mxmoe_last_error());
  a.capacity = -1;
  a.struct_size = 8;
  CHECK(mxmoe_permute_tokens(ctx, &a) == MXMOE_ERROR_INVALID_ARGUMENT, "struct_size");
  CHECK(strstr(mxmoe_last_error(), "args.struct_size") != NULL, "message: %s", mxmoe_last_error());
  a.struct_size = sizeof a;
  a.x.device_type = a.expert_ids.device_type = a.probs.device_type = MXMOE_CUDA;
  a.offsets.device_type = a.permuted_x.device_type = a.row_map.device_type = MXMOE_CUDA;
  a.permuted_probs.device_type = a.invalid.device_type = MXMOE_CUDA;
  CHECK(mxmoe_permute_tokens(ctx, &a) == MXMOE_ERROR_UNAVAILABLE, "device data: %s", mxmoe_last_error());
  CHECK(strstr(mxmoe_last_error(), "route_tokens") != NULL, "message: %s", mxmoe_last_error());
  CHECK(memcmp(permuted, before, sizeof permuted) == 0, "permuted_x written on error");
}

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
  mxmoe_release_cached_memory(); /* nothing cached yet: a no-op that must not fail or crash */
  mxmoe_options opt;
  memset(&opt, 0, sizeof opt);
  opt.struct_size = sizeof opt;
  opt.backend = "cpu";
  opt.alloc = my_alloc;
  opt.free = my_free;
  opt.alloc_user = &main_pool;
  mxmoe_context ctx = NULL;
  CHECK(mxmoe_context_create(&opt, &ctx) == MXMOE_OK, "%s", mxmoe_last_error());

  mxmoe_problem p = problem_of(H, F, E, MXMOE_RECIPE_MXFP8); /* SwiGLU, halves, dense weights */
  mxmoe_forward_args fa = dense_forward_args(x, offsets, probs, w1, w2, y, T, H, F, E);

  mxmoe_saved saved = NULL;
  CHECK(mxmoe_forward(ctx, &p, &fa, &saved) == MXMOE_OK, "%s", mxmoe_last_error());
  CHECK(mxmoe_saved_bytes(saved) > 0, "saved bytes");
  CHECK(strcmp(mxmoe_context_step_backend(ctx, "fc1_fprop"), "cpu") == 0, "backend of fc1_fprop");
  int finite = 1;
  for (int i = 0; i < T * H; ++i) finite &= isfinite(from_bf16(y[i])) != 0;
  CHECK(finite, "y has non-finite values (unwritten?)");

  /* The permute's MXFP8 outputs (appended fields) as the forward's pre-quantized X (appended
   * fields), x absent: ids that keep every token in place (already sorted by expert) make the
   * quantized rows X's own, so y must come out byte for byte the same. */
  {
    static int32_t ids1[T], off1[E + 1], map1[T];
    static uint8_t xr[T * H], xrs[128 * 4], xc[T * H], xcs[(2 + 4 * E) * 128];
    static uint16_t y3[T * H];
    for (int t = 0; t < T; ++t) ids1[t] = t < offsets[1] ? 0 : 2;
    mxmoe_permute_args pa;
    memset(&pa, 0, sizeof pa);
    pa.struct_size = sizeof pa;
    pa.x = tensor(x, MXMOE_BF16, 2, T, H, 0);
    pa.expert_ids = tensor(ids1, MXMOE_I32, 2, T, 1, 0);
    pa.experts = E;
    pa.capacity = -1;
    pa.offsets = tensor(off1, MXMOE_I32, 1, E + 1, 0, 0);
    pa.row_map = tensor(map1, MXMOE_I32, 2, T, 1, 0);
    pa.rowwise.data = tensor(xr, MXMOE_E4M3, 2, T, H, 0);
    pa.rowwise.scales = tensor(xrs, MXMOE_E8M0, 1, sizeof xrs, 0, 0);
    pa.colwise.data = tensor(xc, MXMOE_E4M3, 2, T, H, 0);
    pa.colwise.scales = tensor(xcs, MXMOE_E8M0, 1, sizeof xcs, 0, 0);
    CHECK(mxmoe_permute_tokens(ctx, &pa) == MXMOE_OK, "quantized permute: %s", mxmoe_last_error());
    const char* fused = mxmoe_context_step_backend(ctx, "permute_quantize_rows");
    CHECK(fused != NULL && strcmp(fused, "cpu") == 0, "backend of permute_quantize_rows: %s", fused ? fused : "(none)");
    for (int e = 0; e <= E; ++e) CHECK(off1[e] == offsets[e], "offsets[%d]=%d", e, off1[e]);
    mxmoe_forward_args qa = fa;
    memset(&qa.x, 0, sizeof qa.x);
    qa.x_row = pa.rowwise;
    qa.x_col = pa.colwise;
    memset(y3, 0xA5, sizeof y3);
    qa.y = tensor(y3, MXMOE_BF16, 2, T, H, 0);
    mxmoe_saved qs = NULL;
    CHECK(mxmoe_forward(ctx, &p, &qa, &qs) == MXMOE_OK, "pre-quantized forward: %s", mxmoe_last_error());
    CHECK(memcmp(y3, y, sizeof y) == 0, "y with pre-quantized X differs from y with x");
    CHECK(mxmoe_context_step_backend(ctx, "quantize_x") == NULL, "quantize_x ran with X given quantized");
    mxmoe_saved_destroy(qs);
    qa.struct_size = offsetof(mxmoe_forward_args, x_row); /* an older header: x_row unseen, x missing */
    CHECK(mxmoe_forward(ctx, &p, &qa, &qs) == MXMOE_ERROR_INVALID_ARGUMENT, "old struct_size without x");
    CHECK(strstr(mxmoe_last_error(), "x: missing") != NULL, "message: %s", mxmoe_last_error());
  }

  mxmoe_backward_args ba = backward_args(dy, dx, dprobs, T, H);
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

  /* Messages: a missing tensor is named as missing (not as "dtype f32 is not bf16"); a device
   * mismatch names both tensors and both devices. */
  {
    mxmoe_forward_args m = fa;
    memset(&m.y, 0, sizeof m.y);
    CHECK(mxmoe_forward(ctx, &p, &m, &saved) == MXMOE_ERROR_INVALID_ARGUMENT, "missing y");
    CHECK(strstr(mxmoe_last_error(), "y: missing (no data pointer)") != NULL, "message: %s", mxmoe_last_error());
    m = fa;
    m.x.device_type = m.probs.device_type = m.w1.dense.device_type = m.w2.dense.device_type = MXMOE_CUDA;
    m.y.device_type = MXMOE_CUDA;
    CHECK(mxmoe_forward(ctx, &p, &m, &saved) == MXMOE_ERROR_INVALID_ARGUMENT, "offsets on the cpu");
    CHECK(strstr(mxmoe_last_error(), "offsets: is on cpu but x is on cuda:0") != NULL, "message: %s",
          mxmoe_last_error());
  }

  /* hidden = ffn = 2^31 (once a signed overflow in the size arithmetic): refused by the bounds,
   * naming the field. */
  {
    mxmoe_problem big = p;
    mxmoe_forward_args m = fa;
    big.hidden = big.ffn = (int64_t)1 << 31;
    m.x.shape[1] = m.y.shape[1] = m.w2.dense.shape[1] = m.w1.dense.shape[2] = big.hidden;
    m.w1.dense.shape[1] = 2 * big.ffn;
    m.w2.dense.shape[2] = big.ffn;
    CHECK(mxmoe_forward(ctx, &big, &m, &saved) == MXMOE_ERROR_INVALID_ARGUMENT, "2^31: %s", mxmoe_last_error());
    CHECK(strstr(mxmoe_last_error(), "problem.hidden: hidden=2147483648 exceeds the bound") != NULL, "message: %s",
          mxmoe_last_error());
    CHECK(saved == NULL, "no saved state on error");
  }

  /* Out of memory: the caller's allocator returns NULL -> MXMOE_ERROR_OUT_OF_MEMORY with what the
   * call needs; nothing written, nothing leaked; a backward that runs out keeps its saved state. */
  {
    const int64_t live_before = live;
    memset(y, 0x3C, sizeof y);
    memcpy(y2, y, sizeof y);
    fail_allocs = 1;
    CHECK(mxmoe_forward(ctx, &p, &fa, &saved) == MXMOE_ERROR_OUT_OF_MEMORY, "status: %s", mxmoe_last_error());
    CHECK(strstr(mxmoe_last_error(), "forward (T=40, H=64 F=32 E=3") != NULL &&
              strstr(mxmoe_last_error(), "needs about") != NULL &&
              strstr(mxmoe_last_error(), "allocator returned null") != NULL,
          "message: %s", mxmoe_last_error());
    CHECK(saved == NULL, "no saved state on error");
    CHECK(memcmp(y, y2, sizeof y) == 0, "y written on out-of-memory");
    fail_allocs = 0;
    CHECK(mxmoe_forward(ctx, &p, &fa, &saved) == MXMOE_OK, "%s", mxmoe_last_error());
    fail_allocs = 1;
    wg = NULL;
    CHECK(mxmoe_backward(ctx, saved, &ba, &wg) == MXMOE_ERROR_OUT_OF_MEMORY, "status: %s", mxmoe_last_error());
    CHECK(strstr(mxmoe_last_error(), "backward (T=40") != NULL, "message: %s", mxmoe_last_error());
    CHECK(wg == NULL, "no wgrad state on error");
    fail_allocs = 0;
    CHECK(mxmoe_backward(ctx, saved, &ba, &wg) == MXMOE_OK, "%s", mxmoe_last_error());
    mxmoe_wgrad_destroy(wg);
    mxmoe_saved_destroy(saved);
    saved = NULL;
    CHECK(live == live_before, "leak after out-of-memory: %lld bytes", (long long)(live - live_before));
  }

  /* FP8_BLOCKWISE (power-of-two scales): runs on the cpu backend, finite outputs, prepared weights
   * bit-identical; a struct without the appended pow2_scales is read as 0; recipe 3 is refused. */
  {
    mxmoe_problem q = p;
    q.recipe = MXMOE_RECIPE_FP8_BLOCKWISE;
    q.pow2_scales = 1;
    static uint16_t y_a[T * H], y_b[T * H], dx_a[T * H], dx_b[T * H];
    static float w_a[E * 2 * F * H], w_b[E * 2 * F * H];
    mxmoe_backward_args b = ba;
    b.grads = g;
    run_once(ctx, &q, &fa, &b, NULL, y_a, dx_a, w_a);
    int fin = 1;
    for (int i = 0; i < T * H; ++i) fin &= isfinite(from_bf16(y_a[i])) && isfinite(from_bf16(dx_a[i]));
    CHECK(fin, "fp8_blockwise y / dx not finite");
    CHECK(strcmp(mxmoe_context_step_backend(ctx, "fc1_wgrad"), "cpu") == 0, "backend of fc1_wgrad");
    mxmoe_prepared_weights pw = NULL;
    CHECK(mxmoe_prepare_weights(ctx, &q, &fa.w1, &fa.w2, &pw) == MXMOE_OK, "%s", mxmoe_last_error());
    run_once(ctx, &q, &fa, &b, pw, y_b, dx_b, w_b);
    CHECK(memcmp(y_a, y_b, sizeof y_a) == 0 && memcmp(dx_a, dx_b, sizeof dx_a) == 0 && memcmp(w_a, w_b, sizeof w_a) == 0,
          "fp8_blockwise with prepared weights differs");
    mxmoe_prepared_weights_destroy(pw);
    q.pow2_scales = 0;
    q.struct_size = offsetof(mxmoe_problem, pow2_scales);
    run_once(ctx, &q, &fa, &b, NULL, y_b, dx_b, w_b);
    CHECK(memcmp(y_a, y_b, sizeof y_a) != 0, "pow2 scales should change y (both runs identical)");
    q.recipe = 3;
    CHECK(mxmoe_forward(ctx, &q, &fa, &saved) == MXMOE_ERROR_INVALID_ARGUMENT &&
              strstr(mxmoe_last_error(), "problem.recipe") != NULL,
          "recipe 3: %s", mxmoe_last_error());
  }

  lifetimes(&p, &fa, &ba, &g);
  prepared_weights(&p, &fa, &ba, &g);
  permute_unpermute(ctx);

  opt.backend = "no_such_backend";
  mxmoe_context bad = NULL;
  CHECK(mxmoe_context_create(&opt, &bad) == MXMOE_ERROR_INVALID_ARGUMENT && bad == NULL, "unknown backend");
  mxmoe_context_destroy(ctx);
  CHECK(live == 0 && allocs > 0, "caller allocator: %lld bytes still live after %lld allocations", (long long)live,
        (long long)allocs);
  CHECK(bad_frees == 0, "%lld frees with the wrong alloc_user", (long long)bad_frees);

  printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
  return failures ? 1 : 0;
}
