"""Expert parallelism over torch.distributed: the E experts of a GroupedMLP split over the ep_size
ranks of a process group, E_local = E / ep_size per rank (global expert e lives on rank e // E_local,
as local expert e % E_local). Every rank brings its own tokens.

    ep = mxmoe_torch.ExpertParallelMLP(hidden, ffn, experts=E, group=group, recipe="bf16")
    y = ep(x, expert_ids, probs)      # x [T, H], expert_ids [T, K], probs [T, K]: this rank's tokens

Forward (the all-to-all dispatcher of Megatron-LM, over torch.distributed):
  1. permute the tokens by global expert (mxmoe_torch.permute, experts=E): rows sorted by expert,
     hence by destination rank;
  2. exchange the per-expert row counts (all_to_all_single of an int64 [E] tensor);
  3. without a capacity, one host read: the split sizes per rank (`.tolist()`, as Megatron's
     dispatcher does); with a capacity the splits are static and nothing is read on the host;
  4. all_to_all_single the rows and their probabilities (float32) with those splits: bf16 rows and
     the probabilities in two calls; MXFP8 rows (see Recipes) in one, each row packed with its scales
     and its probability (packed before the host read, so that only the exchange waits on it; the
     local offsets likewise). The calls are launched together (async_op) and waited for after the
     regrouping index below is queued, so its small device ops run beside the transfer instead of
     after it;
  5. the received rows come grouped by source rank, then local expert: a device-side permutation
     (index_select with indices built from the received counts by torch ops, no Python loop over
     tokens) regroups them by local expert, then source rank (so the rows of an expert are in global
     token order: rank 0's tokens, then rank 1's, ...); MXFP8 rows are regrouped as bytes, then
     dequantized. With one rank, or one local expert per rank, the received order is already the
     local order and nothing is regrouped (nor ungrouped in step 7);
  6. the local GroupedMLP runs with the probabilities (applied inside the layer) and device offsets;
  7. the regrouping is undone, the rows go back by the reverse all_to_all, and unpermute sums each
     token's k rows (fp32, slot order, rounded once).

Everything is differentiable in x, probs and the local experts' parameters: the all-to-all of rows
is an autograd Function whose backward is the reverse all-to-all (torch.distributed.nn.functional's
all_to_all_single has the same backward but is deprecated and warns on every call); the MXFP8
dispatch's backward sends the rows' gradient (bf16) and the probabilities' (float32) back by two
reverse all-to-alls, as the bf16 dispatch's does. The local experts' weight gradients are complete
on their rank (every token routed to them arrived there): no all-reduce of expert gradients over the
EP group is needed. Gradients of parameters replicated over the EP group (a router, say) still need
the usual data-parallel reduction.

Capacity (capacity_factor, None: no limit). C = ceil(capacity_factor * T * K / E), T this rank's
token count (the exact integer arithmetic of MoE.capacity). Every rank must have the same T, so that
C and hence the fixed split sizes agree (nothing checks it: a mismatch makes the collective fail).
Drop policy: on each source rank, each expert keeps its first C slots in (token, slot) order, the
order of mxmoe_torch.permute's capacity, and drops the rest; a dropped slot adds nothing to its
token (a token whose slots are all dropped gets y = 0). An expert thus receives at most ep_size * C
rows per step, C from each rank; this is MoE's capacity applied per source rank, not to the global
batch. Every rank pair exchanges exactly E_local * C rows (padded with zero rows of probability 0),
so the splits are static: no count is read on the host, and the exchange of counts is skipped. The
padding rows run through the local experts (their outputs are never gathered, their upstream
gradient is zero, so every kept row's result and every gradient is unaffected by them, up to
the summation order of zero terms).

Recipes: "bf16" and "mxfp8". With "mxfp8" the rows travel as row-wise MXFP8 by default
(fp8_dispatch): the sender quantizes its permuted rows (E4M3 and one E8M0 scale per 32 values,
docs/numerics.md) and packs each row's H E4M3 bytes, its roundup(H/32, 4) scale bytes and its
probability's 4 bytes into one uint8 row (one copy): ONE all_to_all_single of H + roundup(H/32, 4) +
4 bytes a row, instead of 2H + 4 bytes in two calls for bf16 rows. The receiver splits the rows with
views and, while regrouping them, compacts the E4M3 bytes into a contiguous matrix and writes the
scale rows straight into the 128-row-padded compact scale matrix dequantize_mxfp8 reads (the
regrouping moves H bytes a row instead of 2H), then dequantizes them to bf16 (exact) for its
GroupedMLP. So the layer sees x' = dequant(quant_row(x)) instead of x: its row-wise MXFP8 copy of x'
has the same values as that of x, and its column-wise copy (for dW1) is quantized from x'. The
gradient passes the quantization straight through (dx is the reverse all_to_all of the bf16 gradient
of x'). fp8_dispatch=False sends bf16 rows, as the bf16 recipe does. The bf16 dispatch keeps two
calls (rows, probabilities): packing the probabilities in would cost a copy of every 2H-byte row on
the sender (permute writes its own buffer) to save one small collective.

Cost beside the transfer. all_to_all_single moves contiguous blocks per rank, so each direction needs
a reordering on both sides: permute and the regrouping on the way out, the regrouping's inverse and
unpermute on the way back, four passes over the rows in device memory (two where the regrouping is the
identity), plus the count exchange and its host read. Measured at EP = 1 on one H200 (the all-to-all a
copy inside the GPU, bench/results/2026-12-04-h200-s21-ep-world1.md): dsv3 bf16 rows, no capacity,
dispatch + combine 1.2-1.5 ms against 0.58-0.60 ms for the copies alone. Over NVLink between two H200s the
transfer is roughly eight to ten times slower per byte than such a copy while the passes cost the same, so the
share of the raw all-to-all's bandwidth is higher there; it has not been measured (no two-GPU machine
was lent). MXFP8 rows add the quantization, the packing copy and the dequantization, which at EP = 1
cost more than the halved bytes save.
"""

import torch
from torch import nn
import torch.distributed as dist

from ._layer import GroupedMLP
from ._moe import expert_capacity
from ._permute import permute, permute_by_map, unpermute

_ops = torch.ops.mxmoe

__all__ = ["ExpertParallelMLP", "all_to_all", "expert_parallel_mlp"]


def _error(message):
    return f"mxmoe: ExpertParallelMLP: {message}"


class _AllToAll(torch.autograd.Function):
    """all_to_all_single over dim 0 with split sizes (lists of ints, or None for equal splits);
    backward is the reverse all_to_all of the gradient."""

    @staticmethod
    def forward(ctx, x, output_splits, input_splits, group):
        ctx.group = group
        ctx.output_splits, ctx.input_splits = output_splits, input_splits
        ctx.input_rows = x.shape[0]
        x = x.contiguous()
        rows = sum(output_splits) if output_splits is not None else x.shape[0]
        out = x.new_empty((rows,) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x, output_split_sizes=output_splits, input_split_sizes=input_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, dy):
        dx = _AllToAll.apply(dy.contiguous(), ctx.input_splits, ctx.output_splits, ctx.group)
        return dx, None, None, None


_PROB_BYTES = 4  # a float32 probability


def _scale_cols(hidden):
    return (hidden // 32 + 3) // 4 * 4  # compact row-wise E8M0 scales: roundup(H / 32, 4) a row


def _packed_row_bytes(hidden):
    """Bytes of one MXFP8-dispatched row: H E4M3 bytes, roundup(H/32, 4) E8M0 scale bytes, the 4 bytes of
    its float32 probability."""
    return hidden + _scale_cols(hidden) + _PROB_BYTES


def _pack_rows(x, probs):
    """bf16 rows x [n, H] and their float32 probabilities [n] -> uint8 [n, _packed_row_bytes(H)]: each row
    quantized row-wise to MXFP8 (docs/numerics.md), its E4M3 bytes, then its row of the compact scale
    matrix (roundup(H/32, 4) bytes; the padding columns are the quantizer's zeros), then its probability's
    bytes. One copy (torch.cat, in 4-byte words: H and the scale columns are multiples of 4) besides the
    quantization; the scale matrix's padding rows (to 128) stay behind."""
    n, hidden = x.shape
    if probs.dtype != torch.float32 or probs.shape != (n,):
        raise ValueError(_error(f"the dispatched probabilities must be float32 [{n}], got {probs.dtype} "
                                f"{tuple(probs.shape)}"))
    q, scales = _ops.quantize_mxfp8(x.contiguous(), "row")
    return torch.cat([q.view(torch.int32), scales.view(-1, _scale_cols(hidden))[:n].view(torch.int32),
                      probs.contiguous().view(torch.int32).view(n, 1)], 1).view(torch.uint8)


def _unpack_rows(packed, hidden):
    """Views (no copy) of _pack_rows' uint8 [n, _packed_row_bytes(H)] rows: (E4M3 bytes uint8 [n, H], scale
    bytes uint8 [n, roundup(H/32, 4)], probabilities float32 [n]), each strided by the packed row."""
    n, cols = packed.shape[0], _scale_cols(hidden)
    width = hidden + cols
    return packed[:, :hidden], packed[:, hidden:width], packed[:, width:].view(torch.float32).view(n)


def _regroup(t, order, out=None, copy=False):
    """The rows of t [n, ...] (received order) in the local order: order is an int64 index [n] (local row
    j = received row order[j], _regroup_index_n's inv), (W, L, C), the capacity mode's blocks ([W, L, C]
    -> [L, W, C]), or None (the received order is the local order). Without out, the expressions the
    bf16 dispatch's gradient mirrors (_ungroup: index_select; reshape, transpose, reshape: a view where
    no copy is needed; t itself for None), contiguous where copy; with out (contiguous, t's shape and
    dtype), written there."""
    if order is None:
        if out is not None:
            return out.copy_(t)
        return t.contiguous() if copy else t
    if isinstance(order, torch.Tensor):
        return t.index_select(0, order) if out is None else torch.index_select(t, 0, order, out=out)
    W, L, C = order
    rest = tuple(t.shape[1:])
    if out is None:
        r = t.reshape((W, L, C) + rest).transpose(0, 1).reshape((W * L * C,) + rest)
        return r.contiguous() if copy else r
    out.view((L, W, C) + rest).copy_(t.view((W, L, C) + rest).transpose(0, 1))
    return out


def _ungroup(g, order, n):
    """The gradient of _regroup(t, order) for t with n rows, given that of its result: the very ops autograd
    runs for _regroup's expressions (index_select's backward; the reshapes' and the transpose's)."""
    rest = list(g.shape[1:])
    if order is None:
        return g
    if isinstance(order, torch.Tensor):
        return torch.ops.aten.index_select_backward(g, [n] + rest, 0, order)
    W, L, C = order
    return g.reshape([L, W, C] + rest).transpose(0, 1).reshape([n] + rest)


def _exchange(pairs, output_splits, input_splits, group):
    """all_to_all_single of every (out, inp) pair, all launched before any is waited for; returns the
    works (wait() each before reading its out). On NCCL the calls queue on the communication stream,
    so device work queued on the current stream meanwhile runs beside them."""
    return [dist.all_to_all_single(out, inp, output_split_sizes=output_splits, input_split_sizes=input_splits,
                                   group=group, async_op=True) for out, inp in pairs]


def _wait(works):
    for work in works:
        work.wait()


class _Dispatch(torch.autograd.Function):
    """Rows x [n_send, H] (bf16) and their float32 probabilities [n_send] to their ranks, regrouped in the
    local order: (bf16 [n_recv, H], float32 [n_recv], dest). `plan` is called once the exchange is
    launched (so its device work runs beside the collectives) and returns (order, dest): order for
    _regroup (an int64 index, the capacity mode's (W, L, C) blocks, or None where the received order is
    already the local one: one rank, or one local expert), dest the index the results go back by
    (None: the local order is the received order; a non-differentiable output).

    bf16 rows (packed None): the rows and the probabilities by two all-to-alls, then the regrouping.
    MXFP8 rows: packed is _pack_rows(x, probs), made by the caller (before the host read of the splits);
    ONE all_to_all_single; the receiver splits the packed rows with views and regroups them while
    compacting: the E4M3 bytes into a contiguous [n_recv, H], the scale rows straight into the compact
    scale matrix dequantize_mxfp8 reads (roundup(n_recv, 128) rows, the padding rows zeroed), the
    probabilities into [n_recv]; then one dequantization to bf16 (exact).

    Backward: the gradients are un-regrouped (the ops autograd runs for _regroup's expressions,
    _ungroup) and go back by the reverse all_to_all, the rows' in bf16 (straight through the MXFP8
    quantization), the probabilities' in float32, one collective each (each only where its input needs
    a gradient), both launched before either is waited for."""

    @staticmethod
    def forward(ctx, x, probs, packed, plan, output_splits, input_splits, group):
        ctx.group = group
        ctx.output_splits, ctx.input_splits = output_splits, input_splits
        n_send, hidden = x.shape
        n_recv = sum(output_splits) if output_splits is not None else n_send
        ctx.n_recv = n_recv
        if packed is None:
            recv_x = x.new_empty((n_recv, hidden))
            recv_p = probs.new_empty((n_recv,))
            works = _exchange([(recv_x, x.contiguous()), (recv_p, probs.contiguous())], output_splits,
                              input_splits, group)
        else:
            recv = packed.new_empty((n_recv, packed.shape[1]))
            works = _exchange([(recv, packed)], output_splits, input_splits, group)
        order, dest = plan()
        _wait(works)
        ctx.order = order if not isinstance(order, torch.Tensor) else None
        ctx.save_for_backward(*([order] if isinstance(order, torch.Tensor) else []))
        if dest is not None:
            ctx.mark_non_differentiable(dest)
        if packed is None:
            return _regroup(recv_x, order, copy=True), _regroup(recv_p, order, copy=True), dest
        del packed
        q, s, p = _unpack_rows(recv, hidden)
        # The bytes move as 4-byte words (H and the scale columns are multiples of 4).
        scales = recv.new_empty(((n_recv + 127) // 128 * 128, s.shape[1]))
        scales[n_recv:].zero_()
        _regroup(s.view(torch.int32), order, out=scales[:n_recv].view(torch.int32))
        # Contiguous E4M3 rows (one copy, the regrouping's), which dequantize_mxfp8 reads in place.
        q = _regroup(q.view(torch.int32), order, copy=True).view(torch.float8_e4m3fn)
        local_x = _ops.dequantize_mxfp8(q, scales.view(-1), "row", dtype=torch.bfloat16)
        return local_x, _regroup(p, order, copy=True), dest

    @staticmethod
    def backward(ctx, d_x, d_probs, _d_dest):
        order = ctx.saved_tensors[0] if ctx.saved_tensors else ctx.order
        pairs, grads = [], [None, None]
        for i, g in enumerate((d_x, d_probs)):
            if ctx.needs_input_grad[i]:
                g = _ungroup(g, order, ctx.n_recv).contiguous()
                grads[i] = g.new_empty((sum(ctx.input_splits) if ctx.input_splits is not None else g.shape[0],)
                                       + tuple(g.shape[1:]))
                pairs.append((grads[i], g))
        _wait(_exchange(pairs, ctx.input_splits, ctx.output_splits, ctx.group))
        return grads[0], grads[1], None, None, None, None, None


def _in_local_order(W, L):
    """Whether rows received by (source rank, local expert) are already by local expert, then source rank:
    with one rank, or one local expert a rank, nothing is regrouped."""
    return W == 1 or L == 1


def all_to_all(x, output_splits=None, input_splits=None, group=None):
    """Differentiable all_to_all_single over dim 0: rank r sends x[sum(input_splits[:j]) ...] (input_splits[j]
    rows) to rank j and receives output_splits[j] rows from rank j, concatenated by source rank. None:
    equal splits (dim 0 divisible by the group size). Backward: the reverse all_to_all."""
    return _AllToAll.apply(x, output_splits, input_splits, group)


def _regroup_index_n(counts, n):
    """counts int64 [W, L]: n rows received grouped by (source w, local expert l), counts[w, l] rows each,
    in that order. Returns dest int64 [n] (received row i goes to row dest[i] of the layout grouped by
    (l, w)) and inv [n] with inv[dest[i]] = i (layout[j] = received[inv[j]]). Torch ops on counts'
    device; n is given, so nothing is read on the host."""
    W, L = counts.shape
    flat = counts.reshape(-1)                                          # segment g = w * L + l
    src_start = torch.cumsum(flat, 0) - flat                           # start of g in received order
    by_expert = counts.t().reshape(-1)                                 # segment order (l, w)
    dst_start_lw = torch.cumsum(by_expert, 0) - by_expert
    dst_start = dst_start_lw.reshape(L, W).t().reshape(-1)             # indexed by g = w * L + l
    seg = torch.repeat_interleave(torch.arange(W * L, device=counts.device), flat, output_size=n)
    i = torch.arange(n, device=counts.device)
    dest = dst_start[seg] + (i - src_start[seg])
    inv = torch.empty_like(dest)
    inv[dest] = i
    return dest, inv


def expert_parallel_mlp(x, expert_ids, probs, layer, *, experts, group=None, capacity=-1, fp8_dispatch=None):
    """The functional form of ExpertParallelMLP.forward: `layer` is this rank's GroupedMLP of
    E_local = experts / ep_size experts (global experts rank * E_local ...), x [T, H], expert_ids [T, K]
    (global ids; an id outside [0, experts) is dropped), probs [T, K] or None (= 1). capacity >= 0: the
    static-capacity mode with C = capacity rows per expert per source rank (every rank must pass the
    same C); -1: no capacity (one host read of the split sizes). fp8_dispatch: the rows travel as
    row-wise MXFP8 (default for an mxfp8 layer; an error for bf16). Returns y bf16 [T, H]."""
    if fp8_dispatch is None:
        fp8_dispatch = layer.recipe == "mxfp8"
    elif fp8_dispatch and layer.recipe != "mxfp8":
        raise ValueError(_error(f"fp8_dispatch needs the mxfp8 recipe, the layer's is {layer.recipe!r}"))
    W = dist.get_world_size(group)
    E = experts
    if E % W:
        raise ValueError(_error(f"experts={E} must be divisible by the group size {W}"))
    L = E // W
    if layer.experts != L:
        raise ValueError(_error(f"the local GroupedMLP must have experts / ep_size = {L} experts, "
                                f"got {layer.experts}"))
    T, K = expert_ids.shape
    dev = x.device
    x = x.to(torch.bfloat16)
    if probs is None:
        probs = torch.ones(T, K, dtype=torch.float32, device=dev)
    if capacity >= 0:
        return _capacity_forward(x, expert_ids, probs, layer, E, W, L, capacity, group, fp8_dispatch)

    p = permute(x, expert_ids, probs, experts=E)
    counts = (p.offsets[1:] - p.offsets[:-1]).to(torch.int64)          # [E] rows per global expert
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)           # [W * L]: (source w, local l)
    recv_counts = recv_counts.reshape(W, L)
    # Queued before the host read, so that nothing but the exchange waits on it: the local offsets and,
    # for MXFP8 rows, the packed rows (every permuted row; rows past offsets[E], from invalid ids, are
    # cut off below).
    local_offsets = nn.functional.pad(torch.cumsum(recv_counts.sum(0), 0), (1, 0)).to(torch.int32)
    packed = _pack_rows(p.x, p.probs) if fp8_dispatch else None
    send_splits = counts.reshape(W, L).sum(1)
    recv_splits = recv_counts.sum(1)
    # The one host synchronisation: the split sizes of the row exchange.
    splits = torch.cat([send_splits, recv_splits]).tolist()
    send_splits, recv_splits = splits[:W], splits[W:]
    n_send, n_recv = sum(send_splits), sum(recv_splits)

    rows_x = p.x if p.x.shape[0] == n_send else p.x[:n_send]           # invalid ids: rows past offsets[E]
    rows_p = p.probs if p.probs.shape[0] == n_send else p.probs[:n_send]
    if packed is not None and packed.shape[0] != n_send:
        packed = packed[:n_send]

    def plan():  # the regrouping's index, built on the device while the rows travel
        if _in_local_order(W, L):
            return None, None
        dest, inv = _regroup_index_n(recv_counts, n_recv)
        return inv, dest

    local_x, local_p, dest = _Dispatch.apply(rows_x, rows_p, packed, plan, recv_splits, send_splits, group)
    local_y = layer(local_x, local_offsets, local_p)
    back_y = all_to_all(local_y if dest is None else local_y.index_select(0, dest), send_splits, recv_splits, group)
    return unpermute(back_y, p.row_map)


def _capacity_forward(x, expert_ids, probs, layer, E, W, L, C, group, fp8_dispatch):
    dev = x.device
    # Permute's capacity decides which slots are kept (its row map); the rows are then written
    # straight into the padded layout [E, C] (expert e's j-th kept row at e * C + j) by permute_by_map.
    with torch.no_grad():
        p = permute(x, expert_ids, None, experts=E, capacity=C)
        ids = expert_ids.to(torch.int64).clamp(0, E - 1)
        start = p.offsets.to(torch.int64)[ids]
        kept = p.row_map >= 0
        row_map = torch.where(kept, ids * C + (p.row_map.to(torch.int64) - start), -1).to(torch.int32)
    rows = E * C
    padded = permute_by_map(x, row_map, probs, rows=rows)              # [W * L * C] rows, zeros padded
    # received [W (source), L, C] rows, regrouped to [L, W, C]
    blocks = None if _in_local_order(W, L) else (W, L, C)
    packed = _pack_rows(padded.x, padded.probs) if fp8_dispatch else None
    local_x, local_p, _ = _Dispatch.apply(padded.x, padded.probs, packed, lambda: (blocks, None), None, None, group)
    local_offsets = torch.arange(L + 1, dtype=torch.int32, device=dev) * (W * C)
    local_y = layer(local_x, local_offsets, local_p)
    back_y = all_to_all(_ungroup(local_y, blocks, rows), None, None, group)  # [L, W, C] -> [W, L, C]
    return unpermute(back_y, row_map)


class ExpertParallelMLP(nn.Module):
    """E experts of a GroupedMLP spread over the ranks of `group` (default: the world): this rank holds
    `local` = GroupedMLP(hidden, ffn, E / ep_size, ...) for global experts
    [rank * E_local, (rank + 1) * E_local). forward(x [T, H], expert_ids [T, K], probs [T, K] or None)
    -> y bf16 [T, H] for this rank's tokens. See the module docstring (mxmoe_torch._ep) for the
    exchange, the capacity mode, the recipes and the cost.

    The group must be initialised; every rank of it must call forward (and backward) together, with
    the same capacity mode (and the same T with a capacity_factor, so that C agrees)."""

    def __init__(self, hidden, ffn, experts, group=None, activation="swiglu", glu_layout="halves", bias=False,
                 recipe="mxfp8", *, capacity_factor=None, fp8_dispatch=None, scale_fc2_bias=False, limit=7.0,
                 alpha=1.702, linear_offset=1.0, cache_prepared_weights=True, device=None):
        super().__init__()
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(_error("torch.distributed must be initialised (init_process_group) first"))
        self.group = group
        self.ep_size = dist.get_world_size(group)
        self.ep_rank = dist.get_rank(group)
        if isinstance(experts, bool) or not isinstance(experts, int) or experts <= 0:
            raise ValueError(_error(f"experts must be a positive int, got {experts!r}"))
        if experts % self.ep_size:
            raise ValueError(_error(f"experts={experts} must be divisible by the group size {self.ep_size}"))
        self.experts = experts
        self.local_experts = experts // self.ep_size
        self.first_expert = self.ep_rank * self.local_experts
        expert_capacity(capacity_factor, 1, 1, 1)  # checks the factor (None or finite > 0)
        self.capacity_factor = capacity_factor
        self.local = GroupedMLP(hidden, ffn, self.local_experts, activation, glu_layout, bias, recipe,
                                scale_fc2_bias=scale_fc2_bias, limit=limit, alpha=alpha, linear_offset=linear_offset,
                                cache_prepared_weights=cache_prepared_weights, device=device)
        self.hidden, self.ffn = self.local.hidden, self.local.ffn
        if fp8_dispatch and self.local.recipe != "mxfp8":
            raise ValueError(_error(f"fp8_dispatch needs the mxfp8 recipe, got {self.local.recipe!r}"))
        self.fp8_dispatch = self.local.recipe == "mxfp8" if fp8_dispatch is None else bool(fp8_dispatch)

    @property
    def recipe(self):
        return self.local.recipe

    def capacity(self, tokens, top_k):
        """C = ceil(capacity_factor * tokens * top_k / experts) rows per expert per source rank (-1: none)."""
        return expert_capacity(self.capacity_factor, tokens, top_k, self.experts)

    @classmethod
    def from_grouped_mlp(cls, layer, group=None, *, capacity_factor=None, fp8_dispatch=None, device=None):
        """This rank's slice of a full GroupedMLP (`layer`, E experts, the same on every rank): the
        configuration is copied and w1, w2 (b1, b2) [rank * E_local : (rank + 1) * E_local] are copied in."""
        recipe, activation, limit, alpha, linear_offset, glu_layout, scale_fc2_bias = layer.config
        ep = cls(layer.hidden, layer.ffn, layer.experts, group, activation, glu_layout, layer.b1 is not None, recipe,
                 capacity_factor=capacity_factor, fp8_dispatch=fp8_dispatch, scale_fc2_bias=scale_fc2_bias,
                 limit=limit, alpha=alpha,
                 linear_offset=linear_offset, cache_prepared_weights=layer.cache_prepared_weights,
                 device=device if device is not None else layer.w1.device)
        ep.load_from_full(layer)
        return ep

    def expert_slice(self):
        """The slice of global expert indices held here."""
        return slice(self.first_expert, self.first_expert + self.local_experts)

    def load_from_full(self, layer):
        """Copies this rank's experts out of a full GroupedMLP (or a dict with w1, w2[, b1, b2] [E, ...])."""
        get = (lambda n: layer[n] if n in layer else None) if isinstance(layer, dict) else \
            (lambda n: getattr(layer, n))
        s = self.expert_slice()
        with torch.no_grad():
            for name in ("w1", "w2", "b1", "b2"):
                mine, full = getattr(self.local, name), get(name)
                if mine is None:
                    continue
                if full is None or full.shape[0] != self.experts or full.shape[1:] != mine.shape[1:]:
                    raise ValueError(_error(f"{name}: the full layer's tensor must be [{self.experts}, "
                                            f"{', '.join(map(str, mine.shape[1:]))}]"))
                mine.copy_(full[s])

    def forward(self, x, expert_ids, probs=None):
        """x [T, H] (cast to bf16), expert_ids [T, K] global ids, probs [T, K] or None -> y bf16 [T, H]."""
        if x.dim() != 2 or x.shape[1] != self.hidden:
            raise ValueError(_error(f"x must be [T, hidden={self.hidden}], got {tuple(x.shape)}"))
        if expert_ids.dim() != 2 or expert_ids.shape[0] != x.shape[0]:
            raise ValueError(_error(f"expert_ids must be [T={x.shape[0]}, K], got {tuple(expert_ids.shape)}"))
        if probs is not None and probs.shape != expert_ids.shape:
            raise ValueError(_error(f"probs must be like expert_ids {tuple(expert_ids.shape)}, got "
                                    f"{tuple(probs.shape)}"))
        T, K = expert_ids.shape
        capacity = self.capacity(T, K)
        return expert_parallel_mlp(x, expert_ids, probs, self.local, experts=self.experts, group=self.group,
                                   capacity=capacity, fp8_dispatch=self.fp8_dispatch)

    def extra_repr(self):
        return (f"experts={self.experts}, ep_size={self.ep_size}, ep_rank={self.ep_rank}, "
                f"local_experts={self.local_experts}, capacity_factor={self.capacity_factor}, "
                f"fp8_dispatch={self.fp8_dispatch}")
