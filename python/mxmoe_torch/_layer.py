"""GroupedMLP: the expert layer y = FC2(act(FC1(x)) * p) over tokens sorted by expert, wired into
autograd through torch.ops.mxmoe.grouped_mlp_{forward,backward}.

What forward saves is a list of real tensors (FC1 output C, and A or the column-wise MXFP8 copies
of X and A), so the layer traces under torch.compile and replays in CUDA graphs. Two training
conveniences run in eager mode only:
  - accumulate_into_main_grad: dW and db are added (beta 1) into fp32 `param.main_grad` buffers
    by the mutable op; the parameters get no .grad.
  - delay_wgrad_compute: backward computes dx, dprobs and db; the weight gradients wait for
    module.backward_dw(), which runs them in FIFO order (the operands are kept until then).
"""

import math
import numbers

import torch
from torch import nn

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


class _WgradSink:
    """Where the eager-only modes put the weight gradients: main-grad buffers and/or a FIFO."""

    def __init__(self, module):
        self.module = module
        self.queue = []


class _GroupedMLPFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, offsets, probs, w1, b1, w2, b2, config, sink):
        y, saved = _ops.grouped_mlp_forward(x, offsets, probs, w1, b1, w2, b2, *config)
        # The mxfp8 backward reads X only through its column-wise MXFP8 copy: x is not kept.
        keep_x = x if config[0] == "bf16" else None
        ctx.save_for_backward(keep_x, offsets, probs, w1, b1, w2, b2, *saved)
        ctx.config = config
        ctx.sink = sink
        return y

    @staticmethod
    def backward(ctx, dy):
        x, offsets, probs, w1, b1, w2, b2, *saved = ctx.saved_tensors
        config, sink = ctx.config, ctx.sink
        dy = dy.contiguous()
        inputs = (x, offsets, probs, w1, b1, w2, b2)
        if sink is None:
            dx, dprobs, dw1, dw2, db1, db2, _ = _ops.grouped_mlp_backward(dy, saved, *inputs, *config, False)
        else:
            dx, dprobs, dw1, dw2, db1, db2 = _sink_backward(sink, dy, saved, inputs, config)
        return (dx, None, dprobs, dw1, db1 if b1 is not None else None, dw2, db2 if b2 is not None else None,
                None, None)


def _main_grad(param, name):
    grad = getattr(param, "main_grad", None)
    if grad is None:
        raise RuntimeError(f"mxmoe: accumulate_into_main_grad is set but {name}.main_grad is missing "
                           "(call allocate_main_grads() or attach fp32 buffers)")
    return grad


def _sink_backward(sink, dy, saved, inputs, config):
    m = sink.module
    defer = m.delay_wgrad_compute
    x, offsets, probs, w1, b1, w2, b2 = inputs
    if m.accumulate_into_main_grad:
        mg = [_main_grad(m.w1, "w1"), _main_grad(m.w2, "w2"),
              _main_grad(m.b1, "b1") if b1 is not None else None, _main_grad(m.b2, "b2") if b2 is not None else None]
        E, F, H = w1.shape[0], w2.shape[2], w2.shape[1]
        deferred = deferred_buffers(dy, config[0], saved[0].shape[0], E, F, H) if defer else []
        dx, dprobs = _ops.grouped_mlp_backward_(dy, saved, *inputs, *config, defer, *mg, deferred)
        dw1 = dw2 = db1 = db2 = None
    else:
        dx, dprobs, dw1, dw2, db1, db2, deferred = _ops.grouped_mlp_backward(dy, saved, *inputs, *config, defer)
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
RECIPES = ("mxfp8", "bf16")
# Sizes the library takes per recipe (src/api/types.cpp validate_problem): hidden and ffn multiples of
# this, experts and the sizes at most 2^20.
_ALIGN = {"mxfp8": 32, "bf16": 8}
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
    glu_layout: "halves" (a = C[:, :F], b = C[:, F:]) or "interleave32"; recipe: "mxfp8" or "bf16".
    """

    def __init__(self, hidden, ffn, experts, activation="swiglu", glu_layout="halves", bias=False, recipe="mxfp8", *,
                 scale_fc2_bias=False, limit=7.0, alpha=1.702, linear_offset=1.0, accumulate_into_main_grad=False,
                 delay_wgrad_compute=False, device=None, dtype=torch.bfloat16):
        super().__init__()
        hidden, ffn, experts, limit, alpha, linear_offset = _validate_config(
            hidden, ffn, experts, activation, glu_layout, bias, recipe, scale_fc2_bias, limit, alpha, linear_offset,
            dtype)
        self.hidden, self.ffn, self.experts = hidden, ffn, experts
        self.config = (recipe, activation, limit, alpha, linear_offset, glu_layout, scale_fc2_bias)
        self.accumulate_into_main_grad = accumulate_into_main_grad
        self.delay_wgrad_compute = delay_wgrad_compute
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
        eager_only = self.accumulate_into_main_grad or self.delay_wgrad_compute
        return _GroupedMLPFunction.apply(x.to(torch.bfloat16), offsets.to(torch.int32), probs.to(torch.float32),
                                         self.w1, self.b1, self.w2, self.b2, self.config,
                                         self._sink if eager_only else None)

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
        return (f"hidden={self.hidden}, ffn={self.ffn}, experts={self.experts}, recipe={recipe}, "
                f"activation={activation}, glu_layout={glu_layout}, bias={self.b1 is not None}")
