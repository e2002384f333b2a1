"""MoE: a whole Mixture-of-Experts block that replaces a dense MLP: router (fp32 linear, softmax or
sigmoid scores, top-k, optional renormalisation, optional load-balancing loss) -> mxmoe_torch.permute
-> GroupedMLP -> mxmoe_torch.unpermute (recipe mxfp8: the permute writes MXFP8 rows that GroupedMLP
reads without quantizing them again).

    moe = mxmoe_torch.MoE(hidden=1024, ffn=512, experts=8, top_k=2, recipe="mxfp8", aux_loss_coef=1e-2)
    y = moe(x)                        # x [..., H] -> y [..., H], x's dtype
    loss = task_loss(y) + moe.aux_loss

Nothing in forward reads a tensor on the host: every shape is known from x's shape (permuted rows
use permuted_rows_bound, a static bound), so the block traces under torch.compile (fullgraph,
dynamic token counts) and can be captured in a CUDA graph. See docs/pytorch.md "The MoE block".
"""

import fractions
import math
import numbers

import torch
from torch import nn
from torch.nn import functional as F

from ._checks import check_devices
from ._layer import GroupedMLP, _validate_config
from ._permute import permute, unpermute

SCORE_FUNCS = ("softmax", "sigmoid")


def _error(message):
    return f"mxmoe: MoE: {message}"


def _int_arg(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(_error(f"{name} must be an int, got {value!r}"))
    return int(value)


def _capacity_fraction(capacity_factor):
    """The capacity factor as an exact fraction of its decimal value (1.1 -> 11/10), so that
    C = ceil(factor * T * K / E) is integer arithmetic: no float rounding moves C across an integer
    (1.1 * 100 * 2 / 4 is 55.000000000000007 in floats), and symbolic token counts stay symbolic."""
    if capacity_factor is None:
        return None
    if isinstance(capacity_factor, bool) or not isinstance(capacity_factor, numbers.Real) \
            or not math.isfinite(capacity_factor) or not capacity_factor > 0:
        raise ValueError(_error(f"capacity_factor must be None or a finite number > 0, got {capacity_factor!r}"))
    if isinstance(capacity_factor, numbers.Rational):
        return fractions.Fraction(capacity_factor)
    return fractions.Fraction(repr(float(capacity_factor)))


def _capacity(ratio, tokens, top_k, experts):
    # ceil(num / den * tokens * top_k / experts) in integers (tokens may be a SymInt).
    if ratio is None:
        return -1
    num, den = ratio
    return (tokens * top_k * num + experts * den - 1) // (experts * den)


def expert_capacity(capacity_factor, tokens, top_k, experts):
    """C = ceil(capacity_factor * tokens * top_k / experts): the rows each expert keeps (-1 when
    capacity_factor is None). Exact integer arithmetic on the factor's decimal value."""
    frac = _capacity_fraction(capacity_factor)
    return _capacity(None if frac is None else (frac.numerator, frac.denominator), tokens, top_k, experts)


class MoE(nn.Module):
    """A Mixture-of-Experts MLP block over mxmoe: y = sum over the top-k experts e of token t of
    GroupedMLP_e(x_t) with the router's probability p_{t,e} (applied inside the expert, as GroupedMLP
    does: y = W2_e (act(W1_e x + b1_e) * p) + b2_e, or + p * b2_e with scale_fc2_bias).

    Router (fp32): logits = x W_r^T with W_r [E, H] a float32 parameter (`router.weight`), computed
    from x in float32 whatever x's dtype, so that the top-k choice and the probabilities do not
    carry bf16 rounding. Scores: softmax over the E logits (score_func="softmax", Switch/GShard/
    Mixtral) or an independent sigmoid per expert ("sigmoid", DeepSeek-V3). The k largest scores
    pick the experts (torch.topk; ties go to the lower expert id); their scores are the
    probabilities, divided by their sum when normalize_top_k (Mixtral, DeepSeek-V3, Qwen3-MoE).
    normalize_top_k=None means top_k > 1 (with top_k = 1 a normalised probability is always 1 and
    the router would learn only from the auxiliary loss).

    Experts: GroupedMLP(hidden, ffn, experts, activation, glu_layout, bias, recipe, scale_fc2_bias,
    limit, alpha, linear_offset, cache_prepared_weights) as `grouped_mlp` (its parameters w1, w2,
    b1, b2, bf16). Tokens reach it through mxmoe_torch.permute and leave through unpermute (the K
    rows of a token are summed in fp32, rounded once to bf16); the output is cast to x's dtype.

    capacity_factor (None: no limit, no token is dropped): each expert keeps at most
    C = ceil(capacity_factor * T * K / E) rows (T tokens in this call, computed exactly on the
    factor's decimal value); the rows it keeps are its first C in token order, then slot order
    (permute's order), and a dropped slot adds nothing to its token's output (a token whose every
    slot is dropped gets y = 0). The expert layer then runs on the static bound
    R = min(T K, E C) rows: the unused rows past offsets[E] are zeros with probability 0 and are
    attached to the last expert's group, which leaves every kept row's result and every gradient
    as it is (their outputs are never gathered and their upstream gradient is zero); no token
    count is read on the host.

    fuse_permute_quantize (recipe mxfp8; default True): the permute writes the permuted rows as row-
    and column-wise MXFP8 (torch.ops.mxmoe.permute_tokens_mxfp8) and the expert layer reads them as
    its X (grouped_mlp_forward_prequantized): no bf16 permuted copy of x is written and the layer runs
    no quantize of it. The results are bit-identical to False (permute, then GroupedMLP quantizing the
    bf16 rows itself), with or without a capacity; the attribute may be changed between calls. Other
    recipes ignore it.

    aux_loss_coef (0: none): the Switch/GShard load-balancing loss
    aux_loss = aux_loss_coef * E * sum_e f_e P_e, with f_e = (slots routed to e) / (T K), counted
    from the router's top-k choice before any capacity drop (not differentiable), and P_e the mean
    over tokens of the router's score distribution (the softmax, or the sigmoid scores divided by
    their sum per token), differentiable through the router. Perfectly balanced routing gives
    aux_loss_coef. Stored after each forward as the attribute `aux_loss` (a 0-dim float32 tensor;
    None when aux_loss_coef is 0): add it to the training loss. With T = 0 it is 0.
    """

    def __init__(self, hidden, ffn, experts, top_k, recipe="bf16", activation="swiglu", glu_layout="halves",
                 bias=False, *, score_func="softmax", normalize_top_k=None, capacity_factor=None, aux_loss_coef=0.0,
                 scale_fc2_bias=False, limit=7.0, alpha=1.702, linear_offset=1.0, cache_prepared_weights=True,
                 fuse_permute_quantize=True, device=None):
        super().__init__()
        # hidden, ffn, experts, recipe, activation, glu_layout, the bias flags and the clamp scalars:
        # GroupedMLP's checks (their errors name the argument), first, before anything is allocated.
        _, _, experts_n, _, _, _ = _validate_config(hidden, ffn, experts, activation, glu_layout, bias, recipe,
                                                    scale_fc2_bias, limit, alpha, linear_offset, torch.bfloat16)
        top_k = _int_arg("top_k", top_k)
        if not 1 <= top_k <= experts_n:
            raise ValueError(_error(f"top_k must be in [1, experts={experts_n}], got {top_k}"))
        if not isinstance(score_func, str) or score_func not in SCORE_FUNCS:
            raise ValueError(_error(f"score_func must be one of {', '.join(map(repr, SCORE_FUNCS))}, "
                                    f"got {score_func!r}"))
        if normalize_top_k is None:
            normalize_top_k = top_k > 1
        if not isinstance(normalize_top_k, bool):
            raise TypeError(_error(f"normalize_top_k must be a bool or None, got {normalize_top_k!r}"))
        if isinstance(aux_loss_coef, bool) or not isinstance(aux_loss_coef, numbers.Real) \
                or not math.isfinite(aux_loss_coef) or aux_loss_coef < 0:
            raise ValueError(_error(f"aux_loss_coef must be a finite number >= 0, got {aux_loss_coef!r}"))
        self.grouped_mlp = GroupedMLP(hidden, ffn, experts, activation, glu_layout, bias, recipe,
                                      scale_fc2_bias=scale_fc2_bias, limit=limit, alpha=alpha,
                                      linear_offset=linear_offset, cache_prepared_weights=cache_prepared_weights,
                                      device=device)
        self.hidden, self.ffn, self.experts = self.grouped_mlp.hidden, self.grouped_mlp.ffn, self.grouped_mlp.experts
        self.top_k = top_k
        self.score_func = score_func
        self.normalize_top_k = normalize_top_k
        self.capacity_factor = capacity_factor  # a property: checked, kept as an exact fraction
        self.aux_loss_coef = float(aux_loss_coef)
        if not isinstance(fuse_permute_quantize, bool):
            raise TypeError(_error(f"fuse_permute_quantize must be a bool, got {fuse_permute_quantize!r}"))
        self.fuse_permute_quantize = fuse_permute_quantize
        # The router: float32 whatever the block's other parameters are (nn.Linear's default init).
        self.router = nn.Linear(self.hidden, self.experts, bias=False, device=device, dtype=torch.float32)
        self.aux_loss = None

    @property
    def recipe(self):
        return self.grouped_mlp.recipe

    @property
    def capacity_factor(self):
        return self._capacity_factor

    @capacity_factor.setter
    def capacity_factor(self, value):
        frac = _capacity_fraction(value)
        # Plain ints, so forward's arithmetic traces (no float or Fraction work under torch.compile).
        self._capacity_ratio = None if frac is None else (frac.numerator, frac.denominator)
        self._capacity_factor = value

    def capacity(self, tokens):
        """Rows each expert keeps for `tokens` tokens: ceil(capacity_factor * tokens * top_k / experts),
        or -1 without a capacity."""
        return _capacity(self._capacity_ratio, tokens, self.top_k, self.experts)

    def route(self, x2d):
        """x [T, H] -> (scores [T, E] float32, expert_ids [T, K] int64, probs [T, K] float32)."""
        logits = F.linear(x2d.float(), self.router.weight.float())
        scores = logits.softmax(-1) if self.score_func == "softmax" else logits.sigmoid()
        top, ids = torch.topk(scores, self.top_k, dim=-1)
        if self.normalize_top_k:
            top = top / (top.sum(-1, keepdim=True) + 1e-20)
        return scores, ids, top

    def load_balancing_loss(self, scores, ids):
        """aux_loss_coef * E * sum_e f_e P_e (see the class docstring); differentiable in scores."""
        T, E, K = scores.shape[0], self.experts, self.top_k
        dist = scores if self.score_func == "softmax" else scores / (scores.sum(-1, keepdim=True) + 1e-20)
        counts = torch.zeros(E, dtype=torch.float32, device=scores.device)
        counts = counts.scatter_add(0, ids.reshape(-1), torch.ones_like(ids.reshape(-1), dtype=torch.float32))
        f = counts / max(T * K, 1)  # Python max: SymInts under dynamic shapes, no torch.* int op for Dynamo
        P = dist.sum(0) / max(T, 1)
        return (f * P).sum() * (self.aux_loss_coef * E)

    def forward(self, x):
        """x [..., H] (any floating dtype) -> y [..., H] in x's dtype. Sets self.aux_loss."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(_error(f"x must be a tensor, got {type(x).__name__}"))
        if not x.is_floating_point():
            raise TypeError(_error(f"x must have a floating dtype, got {x.dtype}"))
        if x.dim() < 1 or x.shape[-1] != self.hidden:
            raise ValueError(_error(f"x must have shape [..., hidden={self.hidden}], got {tuple(x.shape)}"))
        check_devices("MoE.forward", ("x", x), ("router.weight", self.router.weight),
                      ("w1", self.grouped_mlp.w1))
        # Drop the last call's loss first: it holds that call's autograd graph, whose AccumulateGrad
        # nodes (router.weight's) autograd would otherwise reuse, bound to the stream they were made
        # on; under CUDA-graph capture that stream is not the capturing one and the backward fails
        # ("operation would make the legacy stream depend on a capturing blocking stream").
        self.aux_loss = None
        shape = x.shape
        x2d = x.reshape(-1, self.hidden)
        T, E = x2d.shape[0], self.experts
        scores, ids, probs = self.route(x2d)
        self.aux_loss = self.load_balancing_loss(scores, ids) if self.aux_loss_coef > 0 else None

        capacity = self.capacity(T)
        if self.fuse_permute_quantize and self.recipe == "mxfp8":
            # The permute writes the rows as MXFP8 and the layer reads them (no bf16 permuted x, no
            # quantize of it), with the same offsets rule as below; the same bits as the path below.
            permuted_y, row_map = self.grouped_mlp._forward_permuted_mxfp8(x2d.to(torch.bfloat16), ids, probs, E,
                                                                           capacity)
            return unpermute(permuted_y, row_map).to(x.dtype).reshape(shape)
        p = permute(x2d.to(torch.bfloat16), ids, probs, experts=E, capacity=capacity)
        offsets = p.offsets
        if capacity >= 0:
            # R = min(T K, E C) rows; the rows past offsets[E] (dropped slots leave them zero, with
            # probability 0) join the last expert's group, so the layer runs on a static row count
            # and nothing reads offsets[E] on the host. Their outputs are never gathered and their
            # upstream gradient is zero: every kept row and every gradient is unchanged.
            rows = p.x.shape[0]
            offsets = torch.cat([offsets[:-1], torch.full((1,), rows, dtype=offsets.dtype, device=offsets.device)])
        y = unpermute(self.grouped_mlp(p.x, offsets, p.probs), p.row_map)
        return y.to(x.dtype).reshape(shape)

    def extra_repr(self):
        return (f"top_k={self.top_k}, score_func={self.score_func}, normalize_top_k={self.normalize_top_k}, "
                f"capacity_factor={self.capacity_factor}, aux_loss_coef={self.aux_loss_coef}")
