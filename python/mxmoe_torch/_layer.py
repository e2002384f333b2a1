"""GroupedMLP: the expert layer y = FC2(act(FC1(x)) * p) over tokens sorted by expert, wired into
autograd through torch.ops.mxmoe.grouped_mlp_{forward,backward}.

What forward saves is a list of real tensors (FC1 output C, and A or the column-wise MXFP8 copies
of X and A), so the layer traces under torch.compile and replays in CUDA graphs.

Weights quantized once per version (recipe "mxfp8"): the module keeps the MXFP8 row- and
column-wise copies of W1 and W2 (torch.ops.mxmoe.grouped_mlp_prepare_weights, an opaque
torch.classes.mxmoe.PreparedWeights in memory from PyTorch's allocator) and hands them to the forward
and backward ops, which then skip their per-call weight quantize steps, bit-identically. The copies
are keyed by the weights' version counters (and storage, device, dtype, shape, stream) and by the
number of torch.optim steps taken: an in-place update of the parameter (copy_ under no_grad,
load_state_dict, an optimizer step) bumps its version, and the next forward prepares again. The
step count is there because the fused optimizers (fused=True) write the parameters without bumping
their versions; any torch.optim step (of any optimizer) therefore invalidates every module's copies.
Writes that bypass both (through `.data`, a collective writing the storage directly, an optimizer
outside torch.optim) are not seen: call release_prepared_weights() after them, or construct with
cache_prepared_weights=False. The cache is bypassed (weights quantized per call, as before) under
torch.compile and while capturing a CUDA graph.

Two training conveniences run in eager mode only:
  - accumulate_into_main_grad: dW and db are added (beta 1) into fp32 `param.main_grad` buffers
    by the mutable op; the parameters get no .grad.
  - delay_wgrad_compute: backward computes dx, dprobs and db; the weight gradients wait for
    module.backward_dw(), which runs them in FIFO order (the operands are kept until then).
"""

import math
import numbers

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from ._checks import check_devices
from ._fake import deferred_buffers

_ops = torch.ops.mxmoe


_INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def offsets_from_counts(counts, *, check_values=None):
    """Token counts per expert [E] (any integer dtype, on any device) -> int32 offsets [E+1], on the
    same device.

    A count below zero is an error. Finding one reads the values: that is done for CPU counts (and
    for any device with check_values=True, at the cost of a host synchronisation); device counts
    are not read by default (check_values=None), so the offsets are made without a host
    synchronisation and inside CUDA-graph capture or torch.compile."""
    if not isinstance(counts, torch.Tensor):
        raise TypeError(f"mxmoe: offsets_from_counts: counts must be a tensor, got {type(counts).__name__}")
    if counts.dtype not in _INTEGER_DTYPES:
        raise TypeError(f"mxmoe: offsets_from_counts: counts must have an integer dtype (int32, int64, ...), "
                        f"got {counts.dtype}")
    if counts.dim() != 1:
        raise ValueError(f"mxmoe: offsets_from_counts: counts must be 1-D [E], got shape {tuple(counts.shape)}")
    if check_values is None:
        check_values = counts.device.type == "cpu" and not torch.compiler.is_compiling()
    if check_values and counts.numel() and counts.dtype != torch.uint8:
        smallest = counts.min().item()
        if smallest < 0:
            first = (counts < 0).nonzero()[0, 0].item()
            raise ValueError(f"mxmoe: offsets_from_counts: token counts must be >= 0, got counts[{first}] = "
                             f"{counts[first].item()} (smallest {smallest})")
    return nn.functional.pad(torch.cumsum(counts, 0, dtype=torch.int32), (1, 0))


# torch.optim steps taken so far, counted by a global step post-hook: part of the prepared-weights
# key, since the fused optimizers (torch._fused_adam_, _fused_sgd_, ...: fused=True) update the
# parameters in place without bumping their version counters.
_optimizer_steps = 0


def _count_optimizer_step(optimizer, args, kwargs):
    global _optimizer_steps
    _optimizer_steps += 1


register_optimizer_step_post_hook(_count_optimizer_step)


class _PreparedCache:
    """The module's prepared weights and the key they were made for. Copies of the module (deepcopy,
    pickle) start without them: the object is tied to this module's weight storage and is rebuilt on
    the next forward."""

    __slots__ = ("key", "weights")

    def __init__(self):
        self.key = None
        self.weights = None

    def __deepcopy__(self, memo):
        return _PreparedCache()

    def __reduce__(self):
        return (_PreparedCache, ())


def _traced(t):
    # Fake or meta tensors (a tracer outside torch.compile): nothing real to quantize.
    return t.device.type == "meta" or torch._subclasses.fake_tensor.is_fake(t)


def weights_cache_key(weights, config):
    """The key under which copies made from `weights` (prepared or re-laid-out) stay valid, or None
    where no copy may be kept across calls: the copies are then made per call.

    The key holds each weight's version counter (bumped by in-place updates: copy_ under no_grad,
    load_state_dict, an optimizer step), the torch.optim step count (fused optimizers write without
    bumping versions), storage, device, dtype and shape, the current CUDA stream (copies made on it
    are ordered before this call's kernels) and `config`."""
    # torch.compile (and torch.export): the cache is Python state keyed by version counters, which
    # a traced graph can neither guard on nor update; the opaque object would also have to be
    # traced as a graph input. Compiled code quantizes per call.
    if torch.compiler.is_compiling() or any(_traced(w) for w in weights):
        return None
    # Inference tensors have no version counter, so an in-place update could not be seen.
    if any(w.is_inference() for w in weights):
        return None
    stream = None
    if weights[0].is_cuda:
        # CUDA-graph capture: a replay re-runs only what was captured, so a graph reading these
        # copies would keep reading them after an optimizer step changed the weights between
        # replays. Captured, the weights are quantized inside the graph, per call.
        if torch.cuda.is_current_stream_capturing():
            return None
        # Made on the current stream, so this forward (and backward, on the same stream) is
        # ordered after the copies are written; another stream gets its own copies.
        stream = torch.cuda.current_stream(weights[0].device).cuda_stream
    per_weight = tuple((w._version, w.device, w.dtype, w.data_ptr(), tuple(w.shape)) for w in weights)
    return (per_weight, _optimizer_steps, stream, config)


class _WgradSink:
    """Where the eager-only modes put the weight gradients: main-grad buffers and/or a FIFO."""

    def __init__(self, module):
        self.module = module
        self.queue = []


class _GroupedMLPFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, offsets, probs, w1, b1, w2, b2, config, sink, prepared, check_finite):
        y, saved = _ops.grouped_mlp_forward(x, offsets, probs, w1, b1, w2, b2, *config, prepared, check_finite)
        # The mxfp8 backward reads X only through its column-wise MXFP8 copy: x is not kept.
        keep_x = x if config[0] == "bf16" else None
        ctx.save_for_backward(keep_x, offsets, probs, w1, b1, w2, b2, *saved)
        ctx.config = config
        ctx.sink = sink
        # The prepared weights of this forward's w1 and w2 (or None): backward reads their
        # column-wise copies. Kept here, they outlive a rebuild or release of the module's cache.
        ctx.prepared = prepared
        ctx.check_finite = check_finite
        return y

    @staticmethod
    def backward(ctx, dy):
        x, offsets, probs, w1, b1, w2, b2, *saved = ctx.saved_tensors
        dx, dprobs, dw1, dw2, db1, db2 = _layer_backward(dy, saved, (x, offsets, probs, w1, b1, w2, b2), ctx.config,
                                                         ctx.sink, ctx.prepared, ctx.check_finite)
        return dx, None, dprobs, dw1, db1, dw2, db2, None, None, None, None


def _layer_backward(dy, saved, inputs, config, sink, prepared, check_finite):
    """The layer's backward (both autograd Functions): (dx, dprobs, dw1, dw2, db1, db2), None for an
    absent bias and for weight gradients the eager-only modes put elsewhere."""
    dy = dy.contiguous()
    b1, b2 = inputs[4], inputs[6]
    if sink is None:
        dx, dprobs, dw1, dw2, db1, db2, _ = _ops.grouped_mlp_backward(dy, saved, *inputs, *config, False, prepared,
                                                                      check_finite)
    else:
        dx, dprobs, dw1, dw2, db1, db2 = _sink_backward(sink, dy, saved, inputs, config, prepared, check_finite)
    return dx, dprobs, dw1, dw2, db1 if b1 is not None else None, db2 if b2 is not None else None


class _PermutedGroupedMLPFunction(torch.autograd.Function):
    """permute (MXFP8 outputs) -> GroupedMLP (X pre-quantized) as one autograd node, recipe mxfp8:
    the permute writes the rows as row- and column-wise MXFP8 (torch.ops.mxmoe.permute_tokens_mxfp8,
    no bf16 copy) and the layer reads them (grouped_mlp_forward_prequantized, no quantize of X). The
    bytes are those of permute_tokens then the layer's own quantize, so y and every gradient equal
    mxmoe_torch.permute followed by GroupedMLP bit for bit. Backward: the layer's backward gives
    d(permuted x) and d(permuted probs) in bf16 / fp32, then permute's backward (unpermute, through
    autograd as _PermuteFunction does) gives dx and dprobs.

    With a capacity (>= 0) the layer runs on R = permuted_rows_bound rows, the rows past offsets[E]
    attached to the last expert's group (MoE.forward's static-shape rule). The permute quantizes the
    kept rows with the real offsets; the rows past offsets[E] are zeros (zero_unused_rows), their
    row-wise scale bytes 0, and the last group's column-wise blocks start where they would with the
    extended offsets (compact scales: a group's chunk depends only on the groups before it), so every
    value the layer reads equals the unfused path's (zero rows quantize to zero data whatever their
    scale). Returns (permuted_y [R, H] bf16, row_map [T, K])."""

    @staticmethod
    def forward(ctx, x, expert_ids, probs, w1, b1, w2, b2, experts, capacity, config, sink, prepared, check_finite):
        offsets, row_map, permuted_probs, _, x_row, x_row_scales, x_col, x_col_scales = _ops.permute_tokens_mxfp8(
            x, expert_ids, probs, experts, capacity, capacity >= 0)
        if capacity >= 0:
            rows = x_row.shape[0]
            offsets = torch.cat([offsets[:-1], torch.full((1,), rows, dtype=offsets.dtype, device=offsets.device)])
        y, saved = _ops.grouped_mlp_forward_prequantized(x_row, x_row_scales, x_col, x_col_scales, offsets,
                                                         permuted_probs, w1, b1, w2, b2, *config, prepared,
                                                         check_finite)
        # The backward's saved list: [c, x_col, x_col_scales, a_col, a_col_scales] (x_col is the permute's).
        saved = [saved[0], x_col, x_col_scales, *saved[1:]]
        ctx.save_for_backward(row_map, offsets, permuted_probs, w1, b1, w2, b2, *saved)
        ctx.config = config
        ctx.sink = sink
        ctx.prepared = prepared
        ctx.check_finite = check_finite
        ctx.mark_non_differentiable(row_map)
        return y, row_map

    @staticmethod
    def backward(ctx, dy, _row_map):
        from ._permute import _gather_sum  # _permute imports nothing of this module; late to keep it so
        row_map, offsets, probs, w1, b1, w2, b2, *saved = ctx.saved_tensors
        d_permuted_x, d_permuted_probs, dw1, dw2, db1, db2 = _layer_backward(
            dy, saved, (None, offsets, probs, w1, b1, w2, b2), ctx.config, ctx.sink, ctx.prepared, ctx.check_finite)
        dx, dprobs = _gather_sum(d_permuted_x, row_map, d_permuted_probs, True)
        return dx, None, dprobs, dw1, db1, dw2, db2, None, None, None, None, None, None


def _main_grad(param, name):
    grad = getattr(param, "main_grad", None)
    if grad is None:
        raise RuntimeError(f"mxmoe: accumulate_into_main_grad is set but {name}.main_grad is missing "
                           "(call allocate_main_grads() or attach fp32 buffers)")
    return grad


def _sink_backward(sink, dy, saved, inputs, config, prepared, check_finite):
    m = sink.module
    defer = m.delay_wgrad_compute
    x, offsets, probs, w1, b1, w2, b2 = inputs
    if m.accumulate_into_main_grad:
        mg = [_main_grad(m.w1, "w1"), _main_grad(m.w2, "w2"),
              _main_grad(m.b1, "b1") if b1 is not None else None, _main_grad(m.b2, "b2") if b2 is not None else None]
        E, F, H = w1.shape[0], w2.shape[2], w2.shape[1]
        deferred = deferred_buffers(dy, config[0], saved[0].shape[0], E, F, H) if defer else []
        dx, dprobs = _ops.grouped_mlp_backward_(dy, saved, *inputs, *config, defer, *mg, deferred, prepared,
                                                check_finite)
        dw1 = dw2 = db1 = db2 = None
    else:
        dx, dprobs, dw1, dw2, db1, db2, deferred = _ops.grouped_mlp_backward(dy, saved, *inputs, *config, defer,
                                                                             prepared, check_finite)
    if defer:
        dw1 = dw2 = None
        # saved[0] (C) is not needed by the wgrad: only the operands travel.
        sink.queue.append((x, dy if config[0] == "bf16" else None, offsets, saved[1:], deferred, config[0]))
    return dx, dprobs, dw1, dw2, db1, db2


def _add_grad(param, grad):
    if param.grad is None:
        param.grad = grad.to(param.dtype)
    else:
        param.grad.add_(grad)


ACTIVATIONS = ("swiglu", "clamped_swiglu")
GLU_LAYOUTS = ("halves", "interleave32")
# "fp8_blockwise_pow2": fp8_blockwise with power-of-two scales (Problem::pow2_scales).
RECIPES = ("mxfp8", "bf16", "fp8_blockwise", "fp8_blockwise_pow2")
# Sizes the library takes per recipe (src/api/types.cpp validate_problem): hidden and ffn multiples of
# this, experts and the sizes at most 2^20.
_ALIGN = {"mxfp8": 32, "bf16": 8, "fp8_blockwise": 16, "fp8_blockwise_pow2": 16}
_MAX_SIZE = 1 << 20


def _choice(name, value, allowed):
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"mxmoe: GroupedMLP: {name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")


def _size(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"mxmoe: GroupedMLP: {name} must be an int, got {value!r}")
    if not 0 < value <= _MAX_SIZE:
        raise ValueError(f"mxmoe: GroupedMLP: {name} must be in [1, 2^20], got {value}")
    return int(value)


def _real(name, value, positive=False):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"mxmoe: GroupedMLP: {name} must be a finite number, got {value!r}")
    if positive and not value > 0:
        raise ValueError(f"mxmoe: GroupedMLP: {name} must be > 0, got {value!r}")
    return float(value)


def _validate_config(hidden, ffn, experts, activation, glu_layout, bias, recipe, scale_fc2_bias, limit, alpha,
                     linear_offset, dtype):
    """The constructor's arguments, checked as the library will check the problem on the first
    forward (docs/pytorch.md "The module"), so a bad one fails here and names itself."""
    _choice("recipe", recipe, RECIPES)
    _choice("activation", activation, ACTIVATIONS)
    _choice("glu_layout", glu_layout, GLU_LAYOUTS)
    hidden, ffn, experts = _size("hidden", hidden), _size("ffn", ffn), _size("experts", experts)
    align = _ALIGN[recipe]
    for name, value in (("hidden", hidden), ("ffn", ffn)):
        if value % align:
            raise ValueError(f"mxmoe: GroupedMLP: {name} must be a multiple of {align} for recipe={recipe!r}, "
                             f"got {value}")
    if glu_layout == "interleave32" and ffn % 32:
        raise ValueError(f"mxmoe: GroupedMLP: ffn must be a multiple of 32 for glu_layout='interleave32', got {ffn}")
    for name, value in (("bias", bias), ("scale_fc2_bias", scale_fc2_bias)):
        if not isinstance(value, bool):
            raise TypeError(f"mxmoe: GroupedMLP: {name} must be a bool, got {value!r}")
    if scale_fc2_bias and not bias:
        raise ValueError("mxmoe: GroupedMLP: scale_fc2_bias=True needs bias=True (it scales the FC2 bias)")
    limit = _real("limit", limit, positive=activation == "clamped_swiglu")
    alpha, linear_offset = _real("alpha", alpha), _real("linear_offset", linear_offset)
    if dtype != torch.bfloat16:
        raise ValueError(f"mxmoe: GroupedMLP: dtype must be torch.bfloat16 (mxmoe weights are bf16), got {dtype}")
    return hidden, ffn, experts, limit, alpha, linear_offset


class GroupedMLP(nn.Module):
    """The MoE expert MLP: for tokens t of expert e (rows offsets[e] .. offsets[e+1]-1 of x),
    y_t = W2_e (act(W1_e x_t + b1_e) * p_t) + b2_e (or p_t * b2_e with scale_fc2_bias).

    Parameters: w1 [E, 2F, H], w2 [E, H, F] (bf16), b1 [E, 2F], b2 [E, H] when bias.
    activation: "swiglu" or "clamped_swiglu" (GPT-OSS: limit, alpha, linear_offset);
    glu_layout: "halves" (a = C[:, :F], b = C[:, F:]) or "interleave32"; recipe: "mxfp8", "bf16",
    "fp8_blockwise" (E4M3 with fp32 scales per 128 values, DeepSeek-V3 style; CPU tensors, and CUDA
    tensors on a Hopper GPU, whose cuda_sm90 runs every GEMM on FP8 tensor cores; other GPUs refuse it,
    saying so) or "fp8_blockwise_pow2" (the same with power-of-two scales; any GPU).

    cache_prepared_weights (mxfp8): keep W1 and W2 quantized (row- and column-wise MXFP8, about the
    bf16 weights' size again, `prepared_weights_bytes`) from one forward to the next and for backward,
    rebuilt when an in-place update bumps a weight's version counter, after any torch.optim step, or
    when the weights' storage, device or dtype changes; release_prepared_weights() drops them. Results
    are bit-identical with and without. Updates that bypass both (`w1.data.copy_(...)`, a collective
    writing the storage, an optimizer outside torch.optim) are not seen: release after them, or pass
    False.

    check_finite: scan x, probs, the weights and biases (forward) and dy (backward) for NaN and Inf
    before anything is written; the first one raises a RuntimeError naming the tensor, the value's
    coordinates and NaN / +Inf / -Inf (the library's Options::check_finite). Off by default: a
    non-finite input then propagates (docs/numerics.md "Non-finite values"). On CUDA each call then
    synchronises the stream, and a call while capturing a CUDA graph raises. A plain attribute: set
    `module.check_finite` to turn it on or off later.
    """

    def __init__(self, hidden, ffn, experts, activation="swiglu", glu_layout="halves", bias=False, recipe="mxfp8", *,
                 scale_fc2_bias=False, limit=7.0, alpha=1.702, linear_offset=1.0, accumulate_into_main_grad=False,
                 delay_wgrad_compute=False, cache_prepared_weights=True, check_finite=False, device=None,
                 dtype=torch.bfloat16):
        super().__init__()
        hidden, ffn, experts, limit, alpha, linear_offset = _validate_config(
            hidden, ffn, experts, activation, glu_layout, bias, recipe, scale_fc2_bias, limit, alpha, linear_offset,
            dtype)
        self.hidden, self.ffn, self.experts = hidden, ffn, experts
        self.config = (recipe, activation, limit, alpha, linear_offset, glu_layout, scale_fc2_bias)
        self.accumulate_into_main_grad = accumulate_into_main_grad
        self.delay_wgrad_compute = delay_wgrad_compute
        if not isinstance(cache_prepared_weights, bool):
            raise TypeError(f"mxmoe: GroupedMLP: cache_prepared_weights must be a bool, got {cache_prepared_weights!r}")
        self.cache_prepared_weights = cache_prepared_weights
        if not isinstance(check_finite, bool):
            raise TypeError(f"mxmoe: GroupedMLP: check_finite must be a bool, got {check_finite!r}")
        self.check_finite = check_finite
        self._prepared = _PreparedCache()
        kw = {"device": device, "dtype": dtype}
        self.w1 = nn.Parameter(torch.empty(experts, 2 * ffn, hidden, **kw))
        self.w2 = nn.Parameter(torch.empty(experts, hidden, ffn, **kw))
        self.b1 = nn.Parameter(torch.empty(experts, 2 * ffn, **kw)) if bias else None
        self.b2 = nn.Parameter(torch.empty(experts, hidden, **kw)) if bias else None
        self._sink = _WgradSink(self)
        self.reset_parameters()

    @property
    def recipe(self):
        return self.config[0]

    def reset_parameters(self):
        with torch.no_grad():
            nn.init.uniform_(self.w1, -1 / math.sqrt(self.hidden), 1 / math.sqrt(self.hidden))
            nn.init.uniform_(self.w2, -1 / math.sqrt(self.ffn), 1 / math.sqrt(self.ffn))
            for b in (self.b1, self.b2):
                if b is not None:
                    b.zero_()

    @property
    def prepared_weights_bytes(self):
        """Bytes of the cached prepared weights (0 when none is held: bf16 recipe, before the first
        forward, after release_prepared_weights(), or with cache_prepared_weights=False)."""
        w = self._prepared.weights
        return w.bytes() if w is not None else 0

    def release_prepared_weights(self):
        """Drops the cached prepared weights; the next forward prepares them again. Memory goes back
        to PyTorch's allocator once no pending backward still holds the object."""
        self._prepared = _PreparedCache()

    def _apply(self, fn, *args, **kwargs):
        # .to(), .cuda(), .float(), ...: the parameters move or change, so the copies are stale.
        self.release_prepared_weights()
        return super()._apply(fn, *args, **kwargs)

    def _prepared_weights(self):
        """The prepared weights for this forward and its backward (built or rebuilt when the key
        changed), or None where the ops quantize the weights per call."""
        if self.recipe == "bf16" or not self.cache_prepared_weights:
            return None  # the bf16 recipe reads the weights as given: nothing to prepare
        w1, w2 = self.w1, self.w2
        key = weights_cache_key((w1, w2), self.config)
        if key is None:
            return None
        cache = self._prepared
        if cache.key != key or cache.weights is None:
            # Drop the old copies first, so the two do not coexist (a pending backward keeps its own).
            cache.weights = None
            with torch.no_grad():
                cache.weights = _ops.grouped_mlp_prepare_weights(w1, w2, *self.config)
            cache.key = key
        return cache.weights

    def allocate_main_grads(self):
        """Zeroed fp32 `main_grad` buffers on every parameter that has none."""
        for p in self.parameters():
            if getattr(p, "main_grad", None) is None:
                p.main_grad = torch.zeros_like(p, dtype=torch.float32)

    def forward(self, x, offsets, probs=None):
        """x [T, H] (cast to bf16), offsets int32 [E+1] (never read on the host), probs [T] or None (= 1),
        all on the parameters' device."""
        check_devices("GroupedMLP.forward", ("x", x), ("offsets", offsets), ("probs", probs), ("w1", self.w1),
                      ("w2", self.w2), ("b1", self.b1), ("b2", self.b2))
        if probs is None:
            probs = torch.ones(x.shape[0], dtype=torch.float32, device=x.device)
        return _GroupedMLPFunction.apply(x.to(torch.bfloat16), offsets.to(torch.int32), probs.to(torch.float32),
                                         self.w1, self.b1, self.w2, self.b2, self.config, self._eager_sink(),
                                         self._prepared_weights(), self.check_finite)

    def _eager_sink(self):
        return self._sink if self.accumulate_into_main_grad or self.delay_wgrad_compute else None

    def _forward_permuted_mxfp8(self, x, expert_ids, probs, experts, capacity):
        """Recipe mxfp8: mxmoe_torch.permute(x, expert_ids, probs, experts=, capacity=) then this layer
        on all R permuted rows (with a capacity the rows past offsets[E] joined to the last expert, as
        MoE.forward does), with the quantize of X fused into the permute: no bf16 permuted x is
        written. x bf16 [T, H], expert_ids [T, K] (int32 or int64), probs float32 [T, K] ->
        (permuted_y bf16 [R, H], row_map int32 [T, K]); bit-identical to the unfused composition."""
        if self.recipe != "mxfp8":
            raise ValueError(f"mxmoe: GroupedMLP: the fused permute needs recipe='mxfp8', got {self.recipe!r}")
        return _PermutedGroupedMLPFunction.apply(x, expert_ids, probs, self.w1, self.b1, self.w2, self.b2, experts,
                                                 capacity, self.config, self._eager_sink(), self._prepared_weights(),
                                                 self.check_finite)

    def backward_dw(self):
        """Runs the weight gradients that delay_wgrad_compute deferred, oldest first."""
        queue, self._sink.queue = self._sink.queue, []
        for x, dy, offsets, saved_tail, deferred, recipe in queue:
            if self.accumulate_into_main_grad:
                _ops.grouped_mlp_wgrad_(x, dy, offsets, saved_tail, deferred, recipe,
                                        _main_grad(self.w1, "w1"), _main_grad(self.w2, "w2"))
            else:
                dw1, dw2 = _ops.grouped_mlp_wgrad(x, dy, offsets, saved_tail, deferred, recipe)
                _add_grad(self.w1, dw1)
                _add_grad(self.w2, dw2)

    def extra_repr(self):
        recipe, activation, _, _, _, glu_layout, _ = self.config
        text = (f"hidden={self.hidden}, ffn={self.ffn}, experts={self.experts}, recipe={recipe}, "
                f"activation={activation}, glu_layout={glu_layout}, bias={self.b1 is not None}")
        if recipe != "bf16":
            text += f", cache_prepared_weights={self.cache_prepared_weights}"
            if self.prepared_weights_bytes:
                text += f", prepared_weights_bytes={self.prepared_weights_bytes}"
        return text
