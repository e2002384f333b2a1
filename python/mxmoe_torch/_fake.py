"""Fake (meta) kernels of torch.ops.mxmoe.*: output shapes and dtypes only, so torch.compile and
torch.library.opcheck trace the ops without running them. Shapes follow include/mxmoe/mxfp8_layout.h;
every size is plain integer arithmetic, so symbolic token counts work."""

import torch

from ._checks import check_devices

E4M3 = torch.float8_e4m3fn
SCALE = torch.uint8
BLOCK = 32


def _round_up(a, b):
    return (a + b - 1) // b * b


def rowwise_scale_bytes(rows, cols):
    return _round_up(rows, 128) * _round_up(cols // BLOCK, 4)


def colwise_scale_bytes(rows, cols, groups):
    # Capacity over any split of `rows` tokens into `groups` groups (colwise_scale_bytes in C++).
    return ((rows + BLOCK - 1) // BLOCK + 4 * groups) * _round_up(cols, 128)


def colwise_matrix_scale_bytes(rows, cols):
    return _round_up((rows + BLOCK - 1) // BLOCK, 4) * _round_up(cols, 128)


FP8_BLOCK_RECIPES = ("fp8_blockwise", "fp8_blockwise_pow2")


def _colwise(like, rows, cols, groups, recipe="mxfp8"):
    data = like.new_empty((rows, cols), dtype=E4M3)
    if recipe in FP8_BLOCK_RECIPES:  # f32 scales of 128-token blocks per group (src/common/fp8_block.h)
        return [data, like.new_empty((((rows + 127) // 128 + groups) * cols,), dtype=torch.float32)]
    return [data, like.new_empty((colwise_scale_bytes(rows, cols, groups),), dtype=SCALE)]


def _layer_devices(op, x, dy=None, saved=None, offsets=None, probs=None, w1=None, b1=None, w2=None, b2=None, *rest):
    # The fake kernel also serves mixed real tensors (meta offsets with CPU data dispatch here):
    # such a mix is an error, as it is in the CPU and CUDA kernels.
    check_devices(op, ("x", x), ("dy", dy), ("saved", saved), ("offsets", offsets), ("probs", probs), ("w1", w1),
                  ("b1", b1), ("w2", w2), ("b2", b2), *rest)


def _dims(w1):
    return w1.shape[0], w1.shape[1] // 2, w1.shape[2]  # E, F, H


def _saved(like, recipe, tokens, experts, ffn, hidden):
    saved = [like.new_empty((tokens, 2 * ffn), dtype=torch.bfloat16)]
    if recipe != "bf16":
        return saved + _colwise(like, tokens, hidden, experts, recipe) + _colwise(like, tokens, ffn, experts, recipe)
    return saved + [like.new_empty((tokens, ffn), dtype=torch.bfloat16)]


def _deferred(like, recipe, tokens, experts, ffn, hidden):
    if recipe != "bf16":
        return _colwise(like, tokens, hidden, experts, recipe) + _colwise(like, tokens, 2 * ffn, experts, recipe)
    return [like.new_empty((tokens, 2 * ffn), dtype=torch.bfloat16)]


def deferred_buffers(like, recipe, tokens, experts, ffn, hidden):
    """The deferred-wgrad list grouped_mlp_backward_ fills (scales zeroed, as the op's own are)."""
    return [t.zero_() if t.dtype in (SCALE, torch.float32) else t
            for t in _deferred(like, recipe, tokens, experts, ffn, hidden)]


@torch.library.register_fake("mxmoe::grouped_mlp_prepare_weights")
def _grouped_mlp_prepare_weights(w1, w2, recipe, activation, limit, alpha, linear_offset, glu_layout,
                                 scale_fc2_bias):
    # An opaque object has no shape to infer: fake (and meta) weights give an empty PreparedWeights,
    # which a real layer op refuses, naming `prepared`. The module never prepares fake weights
    # (GroupedMLP._prepared_weights bypasses its cache under tracing).
    check_devices("grouped_mlp_prepare_weights", ("w1", w1), ("w2", w2))
    return torch.classes.mxmoe.PreparedWeights()


# `prepared` and `check_finite` (the layer ops' optional last arguments) change no shape: the fake
# kernels take them and never read them (the class's tracing_mode is "real", so fake-tensor tracing
# hands over the object).
@torch.library.register_fake("mxmoe::grouped_mlp_forward")
def _grouped_mlp_forward(x, offsets, probs, w1, b1, w2, b2, recipe, activation, limit, alpha, linear_offset,
                         glu_layout, scale_fc2_bias, prepared=None, check_finite=False):
    _layer_devices("grouped_mlp_forward", x, None, None, offsets, probs, w1, b1, w2, b2)
    E, F, H = _dims(w1)
    T = x.shape[0]
    return x.new_empty((T, H)), _saved(x, recipe, T, E, F, H)


@torch.library.register_fake("mxmoe::grouped_mlp_forward_prequantized")
def _grouped_mlp_forward_prequantized(x_row, x_row_scales, x_col, x_col_scales, offsets, probs, w1, b1, w2, b2, recipe,
                                      activation, limit, alpha, linear_offset, glu_layout, scale_fc2_bias,
                                      prepared=None, check_finite=False):
    _layer_devices("grouped_mlp_forward_prequantized", x_row, None, None, offsets, probs, w1, b1, w2, b2,
                   ("x_row_scales", x_row_scales), ("x_col", x_col), ("x_col_scales", x_col_scales))
    E, F, H = _dims(w1)
    T = x_row.shape[0]
    # The saved list without x_col and its scales: [c, a_col, a_col_scales].
    saved = [x_row.new_empty((T, 2 * F), dtype=torch.bfloat16)] + _colwise(x_row, T, F, E)
    return x_row.new_empty((T, H), dtype=torch.bfloat16), saved


def _backward_common(dy, saved, w1, recipe, defer_wgrad):
    E, F, H = _dims(w1)
    T = saved[0].shape[0]
    dx = dy.new_empty((T, H), dtype=torch.bfloat16)
    dprobs = dy.new_empty((T,), dtype=torch.float32)
    deferred = _deferred(dy, recipe, T, E, F, H) if defer_wgrad else []
    return E, F, H, dx, dprobs, deferred


@torch.library.register_fake("mxmoe::grouped_mlp_backward")
def _grouped_mlp_backward(dy, saved, x, offsets, probs, w1, b1, w2, b2, recipe, activation, limit, alpha,
                          linear_offset, glu_layout, scale_fc2_bias, defer_wgrad, prepared=None, check_finite=False):
    _layer_devices("grouped_mlp_backward", x, dy, saved, offsets, probs, w1, b1, w2, b2)
    E, F, H, dx, dprobs, deferred = _backward_common(dy, saved, w1, recipe, defer_wgrad)
    bf = torch.bfloat16
    dw1 = dy.new_empty((0,) if defer_wgrad else (E, 2 * F, H), dtype=bf)
    dw2 = dy.new_empty((0,) if defer_wgrad else (E, H, F), dtype=bf)
    db1 = dy.new_empty((E, 2 * F) if b1 is not None else (0,), dtype=bf)
    db2 = dy.new_empty((E, H) if b2 is not None else (0,), dtype=bf)
    return dx, dprobs, dw1, dw2, db1, db2, deferred


@torch.library.register_fake("mxmoe::grouped_mlp_backward_")
def _grouped_mlp_backward_(dy, saved, x, offsets, probs, w1, b1, w2, b2, recipe, activation, limit, alpha,
                           linear_offset, glu_layout, scale_fc2_bias, defer_wgrad, main_grad_w1, main_grad_w2,
                           main_grad_b1, main_grad_b2, deferred, prepared=None, check_finite=False):
    _layer_devices("grouped_mlp_backward_", x, dy, saved, offsets, probs, w1, b1, w2, b2,
                   ("main_grad_w1", main_grad_w1), ("main_grad_w2", main_grad_w2), ("main_grad_b1", main_grad_b1),
                   ("main_grad_b2", main_grad_b2), ("deferred", deferred))
    _, _, _, dx, dprobs, _ = _backward_common(dy, saved, w1, recipe, False)
    return dx, dprobs


def _wgrad_dims(x, offsets, saved_tail, recipe):
    E = offsets.shape[0] - 1
    if recipe != "bf16":
        return E, saved_tail[2].shape[1], saved_tail[0].shape[1]
    return E, saved_tail[0].shape[1], x.shape[1]


@torch.library.register_fake("mxmoe::grouped_mlp_wgrad")
def _grouped_mlp_wgrad(x, dy, offsets, saved_tail, deferred, recipe):
    check_devices("grouped_mlp_wgrad", ("x", x), ("dy", dy), ("saved_tail", saved_tail), ("offsets", offsets),
                  ("deferred", deferred))
    E, F, H = _wgrad_dims(x, offsets, saved_tail, recipe)
    like = saved_tail[0]
    return like.new_empty((E, 2 * F, H), dtype=torch.bfloat16), like.new_empty((E, H, F), dtype=torch.bfloat16)


@torch.library.register_fake("mxmoe::grouped_mlp_wgrad_")
def _grouped_mlp_wgrad_(x, dy, offsets, saved_tail, deferred, recipe, main_grad_w1, main_grad_w2):
    check_devices("grouped_mlp_wgrad_", ("x", x), ("dy", dy), ("saved_tail", saved_tail), ("offsets", offsets),
                  ("deferred", deferred), ("main_grad_w1", main_grad_w1), ("main_grad_w2", main_grad_w2))
    return None


@torch.library.register_fake("mxmoe::quantize_mxfp8")
def _quantize_mxfp8(x, axis, groups=None, scale_layout="compact"):
    check_devices("quantize_mxfp8", ("x", x), ("groups", groups))
    M, K = x.shape
    groups_n = groups.shape[0] - 1 if groups is not None else 1
    n = rowwise_scale_bytes(M, K) if axis == "row" else colwise_scale_bytes(M, K, groups_n)
    return x.new_empty((M, K), dtype=E4M3), x.new_empty((n,), dtype=SCALE)


@torch.library.register_fake("mxmoe::dequantize_mxfp8")
def _dequantize_mxfp8(data, scales, axis, groups=None, scale_layout="compact", dtype=None):
    check_devices("dequantize_mxfp8", ("data", data), ("scales", scales), ("groups", groups))
    return data.new_empty(data.shape, dtype=dtype or torch.float32)


@torch.library.register_fake("mxmoe::grouped_gemm_m")
def _grouped_gemm_m(a, a_scales, offsets, b, b_scales, b_kn=False, bias=None, scale_layout="compact", dtype=None):
    check_devices("grouped_gemm_m", ("a", a), ("a_scales", a_scales), ("offsets", offsets), ("b", b),
                  ("b_scales", b_scales), ("bias", bias))
    N = b.shape[2] if b_kn else b.shape[1]
    return a.new_empty((a.shape[0], N), dtype=dtype or torch.bfloat16)


@torch.library.register_fake("mxmoe::grouped_gemm_k")
def _grouped_gemm_k(a, a_scales, b, b_scales, offsets, scale_layout="compact", dtype=None):
    check_devices("grouped_gemm_k", ("a", a), ("a_scales", a_scales), ("b", b), ("b_scales", b_scales),
                  ("offsets", offsets))
    return a.new_empty((offsets.shape[0] - 1, a.shape[1], b.shape[1]), dtype=dtype or torch.float32)


@torch.library.register_fake("mxmoe::grouped_gemm_k_")
def _grouped_gemm_k_(a, a_scales, b, b_scales, offsets, out, accumulate, scale_layout="compact"):
    check_devices("grouped_gemm_k_", ("a", a), ("a_scales", a_scales), ("b", b), ("b_scales", b_scales),
                  ("offsets", offsets), ("out", out))
    return None


def permuted_rows_bound(tokens, top_k, experts, capacity):
    """Rows permute_tokens keeps at most (include/mxmoe/permute.h): T * K, or min(T * K, E * C) with a
    capacity C >= 0. Symbolic token counts stay symbolic."""
    rows = tokens * top_k
    if capacity < 0:
        return rows
    return torch.sym_min(rows, experts * capacity)


def _absent_probs(like):
    return like.new_empty((0,), dtype=torch.float32)


@torch.library.register_fake("mxmoe::permute_tokens")
def _permute_tokens(x, expert_ids, probs, experts, capacity=-1):
    check_devices("permute_tokens", ("x", x), ("expert_ids", expert_ids), ("probs", probs))
    T, H = x.shape
    K = expert_ids.shape[1]
    R = permuted_rows_bound(T, K, experts, capacity) if capacity >= -1 else 0
    i32 = torch.int32
    permuted_probs = x.new_empty((R,), dtype=torch.float32) if probs is not None else _absent_probs(x)
    return (x.new_empty((R, H)), x.new_empty((max(experts, 0) + 1,), dtype=i32), x.new_empty((T, K), dtype=i32),
            permuted_probs, x.new_empty((1,), dtype=i32))


@torch.library.register_fake("mxmoe::permute_tokens_mxfp8")
def _permute_tokens_mxfp8(x, expert_ids, probs, experts, capacity=-1, zero_unused_rows=True):
    check_devices("permute_tokens_mxfp8", ("x", x), ("expert_ids", expert_ids), ("probs", probs))
    T, H = x.shape
    K = expert_ids.shape[1]
    R = permuted_rows_bound(T, K, experts, capacity) if capacity >= -1 else 0
    E = max(experts, 0)
    i32 = torch.int32
    permuted_probs = x.new_empty((R,), dtype=torch.float32) if probs is not None else _absent_probs(x)
    return (x.new_empty((E + 1,), dtype=i32), x.new_empty((T, K), dtype=i32), permuted_probs,
            x.new_empty((1,), dtype=i32), x.new_empty((R, H), dtype=E4M3),
            x.new_empty((rowwise_scale_bytes(R, H),), dtype=SCALE), *_colwise(x, R, H, E))


@torch.library.register_fake("mxmoe::unpermute_tokens")
def _unpermute_tokens(permuted_y, row_map, permuted_probs=None):
    check_devices("unpermute_tokens", ("permuted_y", permuted_y), ("row_map", row_map),
                  ("permuted_probs", permuted_probs))
    T, K = row_map.shape
    probs = permuted_y.new_empty((T, K), dtype=torch.float32) if permuted_probs is not None \
        else _absent_probs(permuted_y)
    return permuted_y.new_empty((T, permuted_y.shape[1])), probs


@torch.library.register_fake("mxmoe::permute_by_map")
def _permute_by_map(x, row_map, probs, rows):
    check_devices("permute_by_map", ("x", x), ("row_map", row_map), ("probs", probs))
    permuted_probs = x.new_empty((rows,), dtype=torch.float32) if probs is not None else _absent_probs(x)
    return x.new_empty((rows, x.shape[1])), permuted_probs
