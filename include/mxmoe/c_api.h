/* The stable C ABI of mxmoe: opaque handles, status codes, a thread-local last-error message, and
 * a struct_size field first in every config struct so the structs can grow (the library accepts
 * any struct_size >= the size of the first published version and ignores what it does not know).
 * No C++ exception crosses this boundary. */
#ifndef MXMOE_C_API_H
#define MXMOE_C_API_H

#include <stddef.h>
#include <stdint.h>

#include "mxmoe/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mxmoe_status {
  MXMOE_OK = 0,
  MXMOE_ERROR_INVALID_ARGUMENT = 1, /* bad shape, dtype, offsets, alias, struct_size...; nothing written */
  MXMOE_ERROR_UNAVAILABLE = 2,      /* no backend can run the call (reasons in the message) */
  MXMOE_ERROR_CUDA = 3,
  MXMOE_ERROR_INTERNAL = 4,
  /* The memory the call needs cannot be had: its estimate exceeds the device's memory, or an
   * allocation failed (host, device, or the caller's alloc returned NULL). The message says how much
   * the call needs in all and which allocation failed. Outputs may be partly written. */
  MXMOE_ERROR_OUT_OF_MEMORY = 5
} mxmoe_status;

typedef enum mxmoe_dtype {
  MXMOE_F32 = 0, MXMOE_F64 = 1, MXMOE_BF16 = 2, MXMOE_E4M3 = 3, MXMOE_E8M0 = 4, MXMOE_I32 = 5, MXMOE_I64 = 6
} mxmoe_dtype;
typedef enum mxmoe_device_type { MXMOE_CPU = 0, MXMOE_CUDA = 1 } mxmoe_device_type;
/* FP8_BLOCKWISE: E4M3 with one fp32 scale per 128 values (1x128 activations, 128-token wgrad
 * blocks, 128x128 weights); the cpu backend only so far. */
typedef enum mxmoe_recipe { MXMOE_RECIPE_BF16 = 0, MXMOE_RECIPE_MXFP8 = 1, MXMOE_RECIPE_FP8_BLOCKWISE = 2 } mxmoe_recipe;
typedef enum mxmoe_activation { MXMOE_SWIGLU = 0, MXMOE_CLAMPED_SWIGLU = 1 } mxmoe_activation;
typedef enum mxmoe_glu_layout { MXMOE_GLU_HALVES = 0, MXMOE_GLU_INTERLEAVE32 = 1 } mxmoe_glu_layout;
typedef enum mxmoe_weight_layout { MXMOE_WEIGHTS_DENSE = 0, MXMOE_WEIGHTS_PER_EXPERT = 1 } mxmoe_weight_layout;

/* A contiguous row-major tensor of rank 0..3. data == NULL and rank == 0 means "absent". */
typedef struct mxmoe_tensor {
  void* data;
  int32_t dtype;       /* mxmoe_dtype */
  int32_t rank;
  int64_t shape[3];
  int32_t device_type; /* mxmoe_device_type */
  int32_t device_index;
} mxmoe_tensor;

/* Bounds (larger values are MXMOE_ERROR_INVALID_ARGUMENT naming the field): hidden and ffn in
 * [1, 2^20] (multiples of 32 for MXFP8, of 16 for FP8_BLOCKWISE, of 8 for BF16), experts in [1, 2^20], tokens T (rows of x)
 * in [0, 2^31 - 1] (the offsets are int32). Every size derived from them is computed with overflow
 * checks. */
typedef struct mxmoe_problem {
  size_t struct_size;
  int64_t hidden, ffn, experts;
  int32_t activation;  /* mxmoe_activation */
  float clamp_limit, clamp_alpha, clamp_linear_offset;
  int32_t glu_layout;  /* mxmoe_glu_layout */
  int32_t fc1_bias, fc2_bias, scale_fc2_bias;
  int32_t recipe;        /* mxmoe_recipe */
  int32_t weight_layout; /* mxmoe_weight_layout */
  /* Appended (read when struct_size covers it, else 0): FP8_BLOCKWISE power-of-two scales. */
  int32_t pow2_scales;
} mxmoe_problem;

/* Library memory (workspaces, saved state) from the caller; both NULL: the library's own. */
typedef void* (*mxmoe_alloc_fn)(int64_t bytes, int32_t device_type, int32_t device_index, void* stream, void* user);
typedef void (*mxmoe_free_fn)(void* ptr, int64_t bytes, int32_t device_type, int32_t device_index, void* stream,
                              void* user);

typedef struct mxmoe_options {
  size_t struct_size;
  const char* backend; /* force one by name (`mxmoe info` lists them); NULL = best */
  const char* deny;    /* comma-separated backends never to use; NULL = none */
  int32_t swizzled_scales;
  void* stream;        /* cudaStream_t; NULL = legacy default stream */
  mxmoe_alloc_fn alloc;
  mxmoe_free_fn free;
  void* alloc_user;
  /* Appended (read when struct_size covers it, else 0): nonzero scans the inputs for NaN and +-Inf
   * before anything is written (Options::check_finite): forward's x, probs, w1, w2, b1, b2, backward's
   * dy, mxmoe_prepare_weights' w1 and w2. The first one is MXMOE_ERROR_INVALID_ARGUMENT whose message
   * names the tensor, its coordinates and the value. On CUDA it synchronises the stream, and is an
   * error while the stream is being captured into a CUDA graph. */
  int32_t check_finite;
} mxmoe_options;

/* Weights or weight grads of one FC: dense [E, out, in], or an i64 [E] table of addresses of
 * [out, in] matrices of element type `dtype` (per-expert layout). */
typedef struct mxmoe_experts {
  mxmoe_tensor dense;
  mxmoe_tensor pointers;
  int32_t dtype;
} mxmoe_experts;

/* An MXFP8 tensor (mxmoe/tensor.h Mxfp8View): e4m3 data [rows, cols] and e8m0 scales, laid out as
 * mxmoe/mxfp8_layout.h says for its block axis (row-wise or, grouped, column-wise). Absent: data
 * NULL and rank 0. */
typedef struct mxmoe_mxfp8 {
  mxmoe_tensor data;   /* e4m3 [rows, cols] */
  mxmoe_tensor scales; /* e8m0 [bytes] */
  int32_t swizzled;    /* nonzero: 128x4-swizzled scales; 0: compact */
} mxmoe_mxfp8;

typedef struct mxmoe_forward_args {
  size_t struct_size;
  mxmoe_tensor x, offsets, probs;
  mxmoe_experts w1;
  mxmoe_tensor b1;
  mxmoe_experts w2;
  mxmoe_tensor b2;
  mxmoe_tensor y;
  /* Read only when struct_size covers it (the struct of an older header is smaller: NULL):
   * weights quantized once by mxmoe_prepare_weights from these w1 and w2, read instead of
   * quantizing them in this call; NULL: quantize them here. */
  struct mxmoe_prepared_weights_s* prepared;
  /* Appended (read when struct_size covers them, else absent): X already quantized, recipe MXFP8
   * only, both or neither (ForwardArgs::x_row / x_col): row-wise [T, H] and column-wise [T, H]
   * grouped by offsets, scales in the context's layout (swizzled_scales). Given, x may be absent;
   * x_col must stay alive and unchanged until backward / compute_wgrad, like x. */
  mxmoe_mxfp8 x_row;
  mxmoe_mxfp8 x_col;
} mxmoe_forward_args;

typedef struct mxmoe_weight_grads {
  size_t struct_size;
  mxmoe_experts dw1, dw2;
  mxmoe_tensor db1, db2;
  int32_t accumulate; /* 1: add into fp32 buffers (main grads); 0: overwrite */
} mxmoe_weight_grads;

typedef struct mxmoe_backward_args {
  size_t struct_size;
  mxmoe_tensor dy, dx, dprobs;
  mxmoe_weight_grads grads;
  int32_t deferred_wgrad; /* 1: dW later through mxmoe_compute_wgrad */
  /* As mxmoe_forward_args.prepared (read when struct_size covers it): the forward's w1 and w2
   * quantized once; NULL: quantize them in this call. */
  struct mxmoe_prepared_weights_s* prepared;
} mxmoe_backward_args;

/* Lifetimes of the handles (any destruction order is safe; each destroy function accepts NULL):
 * - A saved state (mxmoe_forward) and a wgrad state (mxmoe_backward with deferred_wgrad) own the
 *   library memory they hold and keep alive what freeing it needs, in particular the allocator
 *   callbacks of the context that allocated it. The contexts may therefore be destroyed before the
 *   states they produced; mxmoe_backward and mxmoe_compute_wgrad may run with any live context
 *   (another one than the forward's included).
 * - The caller's alloc / free callbacks and alloc_user (and, on CUDA, options.stream, on which the
 *   memory is freed) must stay valid until the last context and the last state that came from that
 *   context are destroyed: free is called when a state is destroyed or consumed, even after its
 *   context was destroyed.
 * - The caller's tensors a forward reads (x, offsets, probs, w1, b1, w2, b2) are referenced, not
 *   copied: they must stay alive and unchanged until mxmoe_backward (and, when deferred,
 *   mxmoe_compute_wgrad; for the BF16 recipe x and dy too) has run.
 * - A prepared-weights handle (mxmoe_prepare_weights) owns its quantized copies and, like the states,
 *   keeps alive the allocator bridge of the context that made it: that context may be destroyed
 *   first, and any context may use it. It copies w1 and w2 (they may change afterwards; it is then
 *   stale and must be prepared again). It must stay alive until every mxmoe_forward and
 *   mxmoe_backward that was given it (args.prepared) has returned; destroying it between a forward
 *   and its backward is fine when that backward is not given it. A saved state never references it.
 * - A handle must not be used by two threads at once; mxmoe_last_error() is per thread. */
typedef struct mxmoe_context_s* mxmoe_context;
typedef struct mxmoe_saved_s* mxmoe_saved;
typedef struct mxmoe_wgrad_s* mxmoe_wgrad;
typedef struct mxmoe_prepared_weights_s* mxmoe_prepared_weights;

MXMOE_API const char* mxmoe_version(void);
/* Returns the library's device memory pools' reserved memory that no live buffer holds
 * (mxmoe::release_cached_memory; MXMOE_POOL_RELEASE_BYTES). */
MXMOE_API void mxmoe_release_cached_memory(void);
/* The message of the last failed call on this thread ("" if none). Valid until the next call. */
MXMOE_API const char* mxmoe_last_error(void);

MXMOE_API mxmoe_status mxmoe_context_create(const mxmoe_options* options, mxmoe_context* out);
MXMOE_API void mxmoe_context_destroy(mxmoe_context ctx);
/* The backend that ran `step` ("fc1_fprop", "fc2_wgrad", ...) in the last calls, or NULL. */
MXMOE_API const char* mxmoe_context_step_backend(mxmoe_context ctx, const char* step);

MXMOE_API mxmoe_status mxmoe_forward(mxmoe_context ctx, const mxmoe_problem* problem,
                                     const mxmoe_forward_args* args, mxmoe_saved* saved_out);
MXMOE_API int64_t mxmoe_saved_bytes(mxmoe_saved saved);
MXMOE_API void mxmoe_saved_destroy(mxmoe_saved saved);

/* Consumes the saved state's contents (the handle must still be destroyed). With deferred_wgrad,
 * *wgrad_out receives the operands of the weight gradients; else it is set to NULL. */
MXMOE_API mxmoe_status mxmoe_backward(mxmoe_context ctx, mxmoe_saved saved, const mxmoe_backward_args* args,
                                      mxmoe_wgrad* wgrad_out);
MXMOE_API mxmoe_status mxmoe_compute_wgrad(mxmoe_context ctx, mxmoe_wgrad wgrad, const mxmoe_weight_grads* grads);
MXMOE_API void mxmoe_wgrad_destroy(mxmoe_wgrad wgrad);

/* Weights quantized once per version: W1 and W2 in the MXFP8 copies forward (row-wise) and
 * backward (column-wise) read, for any number of calls given it through args.prepared while the
 * weights do not change; results are bit-identical to calls without it. Tied to the problem's
 * hidden, ffn, experts, recipe and glu_layout, the weights' device and the context's scale layout
 * (a call that differs is MXMOE_ERROR_INVALID_ARGUMENT naming "prepared"). For the BF16 recipe it
 * holds nothing (bytes 0). The report's steps are "prepare.quantize_w1", ... On CUDA the copies are
 * written on the context's stream: a call on another stream must be ordered after it. */
MXMOE_API mxmoe_status mxmoe_prepare_weights(mxmoe_context ctx, const mxmoe_problem* problem,
                                             const mxmoe_experts* w1, const mxmoe_experts* w2,
                                             mxmoe_prepared_weights* out);
MXMOE_API int64_t mxmoe_prepared_weights_bytes(mxmoe_prepared_weights prepared);
MXMOE_API void mxmoe_prepared_weights_destroy(mxmoe_prepared_weights prepared);

/* Token permute and unpermute around the grouped MLP (mxmoe/permute.h; docs/numerics.md "Permute
 * and unpermute"). Optional tensors are absent with data NULL and rank 0. Rows are sorted by
 * expert, then token, then slot; with capacity >= 0 each expert keeps its first `capacity` rows
 * (row_map -1 for the rest); ids outside [0, experts) are dropped and counted in `invalid`. The
 * router probabilities are not applied (the grouped MLP applies them). The report's steps are
 * "route_tokens", "permute_rows" and "unpermute_rows". */
typedef struct mxmoe_permute_args {
  size_t struct_size;
  mxmoe_tensor x;          /* bf16 [T, H] */
  mxmoe_tensor expert_ids; /* i32 or i64 [T, K] */
  mxmoe_tensor probs;      /* optional f32 [T, K] */
  int64_t experts;         /* E >= 1 */
  int64_t capacity;        /* rows kept per expert; -1: every row */
  mxmoe_tensor offsets;    /* out i32 [E+1] */
  mxmoe_tensor permuted_x; /* out bf16 [R, H], R >= mxmoe_permuted_rows_bound(); rows past offsets[E] untouched
                              (or zeros with zero_unused_rows) */
  mxmoe_tensor row_map;    /* out i32 [T, K] */
  mxmoe_tensor permuted_probs; /* out f32 [R], given exactly when probs is */
  mxmoe_tensor invalid;        /* optional out i32 [1] */
  int32_t zero_unused_rows;    /* appended: nonzero writes rows offsets[E] .. R-1 (permuted_x and
                                  permuted_probs) as zeros; absent (older struct_size): 0 */
  /* Appended (read when struct_size covers them, else absent): MXFP8 outputs of the permuted rows
   * (PermuteArgs::rowwise / colwise), rowwise e4m3 [R, H] with roundup(R, 128) * roundup(H / 32, 4)
   * scale bytes, colwise e4m3 [R, H] with (ceil(R / 32) + 4 E) * roundup(H, 128), blocks restarting at
   * each expert's first row: the bytes of permute then quantize of rows 0 .. offsets[E]-1. With
   * either given, permuted_x may be absent. The report's step is "permute_quantize_rows". */
  mxmoe_mxfp8 rowwise;
  mxmoe_mxfp8 colwise;
} mxmoe_permute_args;

/* y[t] = bf16(fp32 sum over k of permuted_y[row_map[t, k]]); also permute's backward (dx, and
 * d_probs through probs). */
typedef struct mxmoe_unpermute_args {
  size_t struct_size;
  mxmoe_tensor permuted_y;     /* bf16 [R, H] */
  mxmoe_tensor row_map;        /* i32 [T, K] */
  mxmoe_tensor permuted_probs; /* optional f32 [R] */
  mxmoe_tensor y;              /* out bf16 [T, H] */
  mxmoe_tensor probs;          /* out f32 [T, K], given exactly when permuted_probs is */
} mxmoe_unpermute_args;

/* permuted_x[row_map[t, k]] = x[t] for an existing row_map (other rows untouched, or zeros with
 * zero_unused_rows); also unpermute's backward. */
typedef struct mxmoe_permute_by_map_args {
  size_t struct_size;
  mxmoe_tensor x;              /* bf16 [T, H] */
  mxmoe_tensor row_map;        /* i32 [T, K] */
  mxmoe_tensor probs;          /* optional f32 [T, K] */
  mxmoe_tensor permuted_x;     /* out bf16 [R, H] */
  mxmoe_tensor permuted_probs; /* out f32 [R], given exactly when probs is */
  int32_t zero_unused_rows;    /* appended: nonzero writes the rows no slot names as zeros; absent: 0 */
} mxmoe_permute_by_map_args;

/* Rows permuted_x needs at least: tokens * top_k, or min(tokens * top_k, experts * capacity). An
 * argument out of the range mxmoe_permute_tokens accepts (tokens in [0, 2^31 - 1], top_k >= 1 with
 * tokens * top_k <= 2^31 - 1, experts in [1, 2^20], capacity -1 or in [0, 2^31 - 1]) gives -1, and
 * mxmoe_last_error() names it and its value. */
MXMOE_API int64_t mxmoe_permuted_rows_bound(int64_t tokens, int64_t top_k, int64_t experts, int64_t capacity);
MXMOE_API mxmoe_status mxmoe_permute_tokens(mxmoe_context ctx, const mxmoe_permute_args* args);
MXMOE_API mxmoe_status mxmoe_unpermute_tokens(mxmoe_context ctx, const mxmoe_unpermute_args* args);
MXMOE_API mxmoe_status mxmoe_permute_by_map(mxmoe_context ctx, const mxmoe_permute_by_map_args* args);

#ifdef __cplusplus
}
#endif
#endif /* MXMOE_C_API_H */
