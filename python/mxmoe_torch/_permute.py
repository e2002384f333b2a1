"""Token permute and unpermute with autograd: the data movement of a whole MoE block around
GroupedMLP, over torch.ops.mxmoe.{permute_tokens, unpermute_tokens, permute_by_map}
(include/mxmoe/permute.h; docs/numerics.md "Permute and unpermute").

    p = mxmoe_torch.permute(x, expert_ids, probs, experts=E, capacity=-1)
    y = mxmoe_torch.unpermute(layer(p.x, p.offsets, p.probs), p.row_map)  # every id valid, no capacity

With a capacity or invalid ids, the layer runs on the first n = int(p.offsets[-1]) rows (a host
read): layer(p.x[:n], p.offsets, p.probs[:n]); unpermute takes those n rows.

Rows are sorted by expert, then token, then slot; with a capacity each expert keeps its first C rows
and drops the rest; an id outside [0, E) is dropped and counted in `invalid`. The router
probabilities are carried, not applied: GroupedMLP multiplies each row by its probability.

All three ops are linear, and each one's backward is another of them: permute's is unpermute
(dx, and dprobs through permuted_probs), unpermute's is permute_by_map, permute_by_map's is
unpermute. The backward calls go through the same autograd Functions, so double backward works.
Gradients flow to x and probs only (ids and row maps are integers). Today the ops run on CPU
tensors; on CUDA tensors they raise a RuntimeError saying no backend serves the step.
"""

from collections import namedtuple

import torch

_ops = torch.ops.mxmoe

Permuted = namedtuple("Permuted", ["x", "offsets", "row_map", "probs", "invalid"])
Permuted.__doc__ = """permute's result: x bf16 [R, H] (rows sorted by expert; rows past offsets[E] are zeros),
offsets int32 [E+1] (GroupedMLP's), row_map int32 [T, K] (the row of slot (t, k), -1 when dropped),
probs float32 [R] in row order (None without probs), invalid int32 [1] (ids outside [0, E))."""
Unpermuted = namedtuple("Unpermuted", ["y", "probs"])
Unpermuted.__doc__ = """unpermute's result with permuted_probs: y bf16 [T, H] and probs float32 [T, K]
(probs[t, k] = permuted_probs[row_map[t, k]], 0 when dropped)."""
PermutedByMap = namedtuple("PermutedByMap", ["x", "probs"])
PermutedByMap.__doc__ = """permute_by_map's result with probs: x bf16 [rows, H] and probs float32 [rows]."""

_INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _gather_sum(dy, row_map, dprobs, has_probs):
    # unpermute through autograd (differentiable again): the backward of permute and permute_by_map.
    y, probs = _UnpermuteFunction.apply(dy, row_map, dprobs if has_probs else None)
    return y, (probs if has_probs else None)


class _PermuteFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, expert_ids, probs, experts, capacity):
        permuted_x, offsets, row_map, permuted_probs, invalid = _ops.permute_tokens(x, expert_ids, probs, experts,
                                                                                    capacity)
        ctx.save_for_backward(row_map)
        ctx.has_probs = probs is not None
        ctx.mark_non_differentiable(offsets, row_map, invalid)
        if not ctx.has_probs:
            ctx.mark_non_differentiable(permuted_probs)
        return permuted_x, offsets, row_map, permuted_probs, invalid

    @staticmethod
    def backward(ctx, d_permuted_x, _offsets, _row_map, d_permuted_probs, _invalid):
        (row_map,) = ctx.saved_tensors
        dx, dprobs = _gather_sum(d_permuted_x, row_map, d_permuted_probs, ctx.has_probs)
        return dx, None, dprobs, None, None


class _UnpermuteFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, permuted_y, row_map, permuted_probs):
        y, probs = _ops.unpermute_tokens(permuted_y, row_map, permuted_probs)
        ctx.save_for_backward(row_map)
        ctx.rows = permuted_y.shape[0]
        ctx.has_probs = permuted_probs is not None
        ctx.mark_non_differentiable(row_map)
        if not ctx.has_probs:
            ctx.mark_non_differentiable(probs)
        return y, probs

    @staticmethod
    def backward(ctx, dy, dprobs):
        (row_map,) = ctx.saved_tensors
        d_permuted_y, d_permuted_probs = _PermuteByMapFunction.apply(dy, row_map, dprobs if ctx.has_probs else None,
                                                                     ctx.rows)
        return d_permuted_y, None, (d_permuted_probs if ctx.has_probs else None)


class _PermuteByMapFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, row_map, probs, rows):
        permuted_x, permuted_probs = _ops.permute_by_map(x, row_map, probs, rows)
        ctx.save_for_backward(row_map)
        ctx.has_probs = probs is not None
        ctx.mark_non_differentiable(row_map)
        if not ctx.has_probs:
            ctx.mark_non_differentiable(permuted_probs)
        return permuted_x, permuted_probs

    @staticmethod
    def backward(ctx, d_permuted_x, d_permuted_probs):
        (row_map,) = ctx.saved_tensors
        dx, dprobs = _gather_sum(d_permuted_x, row_map, d_permuted_probs, ctx.has_probs)
        return dx, None, dprobs, None


def _ids(name, ids, keep_int64=False):
    """int32 as it is; int64 too with keep_int64 (the expert ids: the library reads them, no
    conversion kernel per call); any other integer dtype converted to int32."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"mxmoe: {name} must be a tensor, got {type(ids).__name__}")
    if ids.dtype not in _INTEGER_DTYPES:
        raise TypeError(f"mxmoe: {name} must have an integer dtype (int32, int64, ...), got {ids.dtype}")
    if ids.dtype == torch.int32 or (keep_int64 and ids.dtype == torch.int64):
        return ids
    return ids.to(torch.int32)


def _probs(probs):
    if probs is None or probs.dtype == torch.float32:
        return probs
    return probs.to(torch.float32)  # differentiable: the gradient comes back in probs' dtype


def permute(x, expert_ids, probs=None, *, experts, capacity=-1):
    """x bf16 [T, H], expert_ids [T, K] (the router's top-k; int32 or int64 read as they are, torch.topk's
    int64 included; another integer dtype is converted to int32),
    optional probs [T, K] (used as float32) -> Permuted(x, offsets, row_map, probs, invalid).

    R = T * K rows, or min(T * K, E * capacity) with capacity >= 0 (each expert keeps its first
    `capacity` rows by token, then slot, and drops the rest). offsets[E] is the number of rows kept:
    T * K when every id is valid and nothing is dropped (known without reading it), otherwise pass
    the first offsets[E] rows to GroupedMLP. Differentiable in x and probs."""
    out = _PermuteFunction.apply(x, _ids("expert_ids", expert_ids, keep_int64=True), _probs(probs), experts, capacity)
    return Permuted(*out[:3], out[3] if probs is not None else None, out[4])


def unpermute(permuted_y, row_map, permuted_probs=None):
    """y[t] = sum over k of permuted_y[row_map[t, k]] (bf16 [T, H]; summed in fp32 in slot order,
    rounded once; dropped slots add nothing). The probabilities are not applied (GroupedMLP already
    did). With permuted_probs [R], returns Unpermuted(y, probs) with probs[t, k] =
    permuted_probs[row_map[t, k]] (0 when dropped), otherwise y alone. Differentiable in permuted_y
    and permuted_probs; the backward (permute_by_map) needs each row named by at most one slot, as
    permute writes row maps."""
    y, probs = _UnpermuteFunction.apply(permuted_y, _ids("row_map", row_map), _probs(permuted_probs))
    return y if permuted_probs is None else Unpermuted(y, probs)


def permute_by_map(x, row_map, probs=None, *, rows):
    """The rows permute moves, for an existing row_map: bf16 [rows, H] with row row_map[t, k] =
    x[t] (rows no slot names are zeros). With probs [T, K], returns PermutedByMap(x, probs) with
    the probabilities in row order, otherwise the rows alone. Differentiable in x and probs."""
    permuted_x, permuted_probs = _PermuteByMapFunction.apply(x, _ids("row_map", row_map), _probs(probs), rows)
    return permuted_x if probs is None else PermutedByMap(permuted_x, permuted_probs)
