"""mxmoe as a Hugging Face transformers experts backend (transformers 5.x, `ExpertsInterface`).

    import mxmoe_torch.hf   # registers the names below in transformers' ExpertsInterface
    model = AutoModelForCausalLM.from_config(config, experts_implementation="mxmoe", dtype=torch.bfloat16)
    model.set_experts_implementation("mxmoe_mxfp8")   # another recipe, same weights

The recipe is chosen per model by the registered name (the model's config carries it, so it
survives save/load of the config and reaches every sub-model):

    "mxmoe"                    bf16
    "mxmoe_mxfp8"              mxfp8 (E4M3, one E8M0 scale per 32 values)
    "mxmoe_fp8_blockwise"      fp8_blockwise (fp32 scales per 128 values; Hopper on the GPU)
    "mxmoe_fp8_blockwise_pow2" fp8_blockwise with power-of-two scales (any GPU)

Routing stays in the model's sparse MoE block; the experts function receives the experts module,
hidden_states [T, H], top_k_index [T, K] and top_k_weights [T, K] and runs mxmoe's permute ->
grouped MLP (the router weight multiplies each expert's activation inside the layer) -> unpermute
on the module's own parameters. Gradients reach gate_up_proj, down_proj, their biases,
hidden_states and top_k_weights.

Layouts (docs/hf.md "Layouts"): mxmoe's layer reads W1 [E, 2F, H] with the gate in the first F
rows ("halves") and W2 [E, H, F]. Modules stored that way (Mixtral, Qwen3-MoE, DeepSeek-V3, OLMoE)
are read in place: no weight copy for bf16. Transposed or interleaved storage (GPT-OSS:
gate_up_proj [E, H, 2F] with gate and up alternating column by column, down_proj [E, F, H]) is
re-laid out once per weight version into a cached copy, and the weight gradients are mapped back
through the inverse permutation (one copy of each gradient per backward). Under torch.compile the
re-layout is traced as plain tensor ops instead (one copy per call, fused by the compiler).

What is not served is refused with an error naming the experts class and its config class:
activations other than SiLU-gated (act_fn(gate) * up with SiLU) and GPT-OSS's clamped SwiGLU,
modules without a gate (has_gate=False), a post-expert norm, expert parallelism, non-bf16 weights,
and sizes the recipe cannot take.
"""

import dataclasses

import torch
from torch import nn

try:
    from transformers.activations import SiLUActivation
    from transformers.integrations import moe as _hf_moe
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("mxmoe_torch.hf needs transformers 5.x with transformers.integrations.moe "
                      "(pip install -r python/requirements-test.txt)") from e

from . import _layer
from ._checks import check_devices
from ._layer import _ALIGN, _GroupedMLPFunction, _PermutedGroupedMLPFunction, _PreparedCache, weights_cache_key
from ._permute import _ids, _probs, permute, unpermute

_ops = torch.ops.mxmoe

# Registered name -> mxmoe recipe.
IMPLEMENTATIONS = {
    "mxmoe": "bf16",
    "mxmoe_mxfp8": "mxfp8",
    "mxmoe_fp8_blockwise": "fp8_blockwise",
    "mxmoe_fp8_blockwise_pow2": "fp8_blockwise_pow2",
}

# transformers' GPT-OSS experts gate: interleaved gate/up, clamped SwiGLU with +1 on up. Recognised
# by where the function is defined, so a subclass that overrides it is refused, not misread.
_GPT_OSS_GATE = ("transformers.models.gpt_oss.modeling_gpt_oss", "GptOssExperts._apply_gate")


class UnsupportedExperts(NotImplementedError):
    """An experts module whose activation, layout or settings mxmoe does not compute."""


@dataclasses.dataclass(frozen=True)
class ExpertsLayout:
    """How an experts module maps onto mxmoe's layer: sizes, activation and the storage of its weights."""

    experts: int
    hidden: int
    ffn: int
    activation: str  # "swiglu" or "clamped_swiglu"
    limit: float
    alpha: float
    linear_offset: float
    interleaved: bool  # gate and up alternate column by column (GPT-OSS) instead of [gate; up]
    transposed: bool  # gate_up_proj [E, H, 2F], down_proj [E, F, H]
    bias: bool

    @property
    def native(self):
        """Stored as mxmoe reads it: the parameters go to the layer as they are."""
        return not (self.interleaved or self.transposed)

    # W1 [E, 2F, H] halves <-> gate_up_proj; W2 [E, H, F] <-> down_proj. Plain differentiable tensor
    # ops: the inverse maps of the gradients are the same ops read backwards.
    def to_w1(self, gate_up):
        w = gate_up.transpose(1, 2) if self.transposed else gate_up  # [E, 2F, H], rows gate/up
        if self.interleaved:
            w = w.unflatten(1, (self.ffn, 2)).transpose(1, 2).flatten(1, 2)
        return w.contiguous()

    def from_w1(self, w1):
        g = w1
        if self.interleaved:
            g = g.unflatten(1, (2, self.ffn)).transpose(1, 2).flatten(1, 2)
        return (g.transpose(1, 2) if self.transposed else g).contiguous()

    def to_w2(self, down):
        return down.transpose(1, 2).contiguous() if self.transposed else down

    def from_w2(self, w2):
        return w2.transpose(1, 2).contiguous() if self.transposed else w2

    def to_b1(self, bias):
        return bias.unflatten(-1, (self.ffn, 2)).transpose(-1, -2).flatten(-2) if self.interleaved else bias


def _name(module):
    config = getattr(module, "config", None)
    return f"{type(module).__name__} ({type(config).__name__})"


def _refuse(module, what):
    raise UnsupportedExperts(f"mxmoe: {_name(module)}: {what}; use another experts_implementation for this model")


def _gate_kind(module):
    gate = getattr(type(module), "_apply_gate", None)
    if gate is _hf_moe._default_apply_gate:
        act = getattr(module, "act_fn", None)
        if not isinstance(act, (nn.SiLU, SiLUActivation)):
            _refuse(module, f"the gate activation {type(act).__name__} is not served (mxmoe computes SiLU-gated "
                            f"experts, act_fn(gate) * up with act_fn SiLU, and GPT-OSS's clamped SwiGLU)")
        return "swiglu"
    if gate is not None and (gate.__module__, gate.__qualname__) == _GPT_OSS_GATE:
        return "gpt_oss"
    where = f"{gate.__module__}.{gate.__qualname__}" if gate is not None else "none"
    _refuse(module, f"its gate function {where} is not one mxmoe computes (served: transformers' default "
                    f"SiLU gate and GPT-OSS's clamped SwiGLU)")


def experts_layout(module, recipe="bf16"):
    """The ExpertsLayout of a transformers experts module, or UnsupportedExperts saying what is missing."""
    for flag, wanted, what in (("has_gate", True, "experts without a gate (has_gate=False)"),
                               ("has_post_expert_norm", False, "a norm after each expert (has_post_expert_norm)"),
                               ("_is_expert_parallel", False, "expert parallelism (sentinel expert ids)")):
        if getattr(module, flag, wanted) != wanted:
            _refuse(module, f"{what} is not served")
    kind = _gate_kind(module)
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not isinstance(gate_up, torch.Tensor) or not isinstance(down, torch.Tensor):
        _refuse(module, "it has no gate_up_proj / down_proj tensors")
    if gate_up.dim() != 3 or down.dim() != 3:
        _refuse(module, f"gate_up_proj and down_proj must be 3-D, got {tuple(gate_up.shape)} and {tuple(down.shape)}")
    for name, w in (("gate_up_proj", gate_up), ("down_proj", down)):
        if w.dtype != torch.bfloat16:
            _refuse(module, f"{name} is {w.dtype}; mxmoe's expert weights are bf16 (load or cast the model in "
                            f"torch.bfloat16)")
    transposed = bool(getattr(module, "is_transposed", False))
    experts = gate_up.shape[0]
    hidden, ffn2 = (gate_up.shape[1], gate_up.shape[2]) if transposed else (gate_up.shape[2], gate_up.shape[1])
    ffn = ffn2 // 2
    want_down = (experts, ffn, hidden) if transposed else (experts, hidden, ffn)
    if ffn2 % 2 or tuple(down.shape) != want_down:
        _refuse(module, f"gate_up_proj {tuple(gate_up.shape)} and down_proj {tuple(down.shape)} do not form an "
                        f"expert MLP (is_transposed={transposed})")
    align = _ALIGN[recipe]
    if hidden % align or ffn % align:
        _refuse(module, f"hidden {hidden} and intermediate {ffn} must be multiples of {align} for recipe {recipe!r}")
    bias = bool(getattr(module, "has_bias", False))
    if bias and not all(isinstance(getattr(module, n, None), torch.Tensor)
                        for n in ("gate_up_proj_bias", "down_proj_bias")):
        _refuse(module, "has_bias is set but gate_up_proj_bias / down_proj_bias are missing")
    concatenated = bool(getattr(module, "is_concatenated", True))
    if kind == "swiglu":
        if not concatenated:
            _refuse(module, "the default gate splits gate_up in halves, but is_concatenated=False says interleaved")
        return ExpertsLayout(experts, hidden, ffn, "swiglu", 7.0, 1.702, 1.0, interleaved=False,
                             transposed=transposed, bias=bias)
    if concatenated:
        _refuse(module, "GPT-OSS's gate reads gate and up interleaved, but is_concatenated=True")
    return ExpertsLayout(experts, hidden, ffn, "clamped_swiglu", float(module.limit), float(module.alpha), 1.0,
                         interleaved=True, transposed=transposed, bias=bias)


class _Cache:
    """What the experts module keeps between calls: the re-laid-out weights (non-native layouts)
    and the prepared weights (quantized recipes), with the key they were made for. Copies of the
    module (deepcopy, pickle) start empty."""

    __slots__ = ("key", "w1", "w2", "prepared")

    def __init__(self):
        self.key = self.w1 = self.w2 = self.prepared = None

    def __deepcopy__(self, memo):
        return _Cache()

    def __reduce__(self):
        return (_Cache, ())


_CACHE_ATTR = "_mxmoe_cache"


def release_cached_weights(model):
    """Drops every copy mxmoe keeps of the experts weights under `model` (re-laid-out and prepared);
    the next forward makes them again. Needed only after writes that bump neither the weights'
    version nor the torch.optim step count (through .data, a collective writing the storage)."""
    for m in model.modules():
        if _CACHE_ATTR in m.__dict__:
            m.__dict__[_CACHE_ATTR] = _Cache()


class _CachedRelayout(torch.autograd.Function):
    """The cached copy of a parameter in mxmoe's layout, differentiable in the parameter: forward
    returns the copy (made under no_grad for this weight version), backward maps the gradient back
    with the inverse permutation."""

    @staticmethod
    def forward(ctx, param, copy, back):
        ctx.back = back
        return copy

    @staticmethod
    def backward(ctx, grad):
        return ctx.back(grad), None, None


def _weights(module, layout, config):
    """(w1 [E, 2F, H], w2 [E, H, F], prepared or None) for this call, in mxmoe's layout."""
    gate_up, down = module.gate_up_proj, module.down_proj
    recipe = config[0]
    key = weights_cache_key((gate_up, down), config)
    if key is None:
        # Traced, inference or captured: nothing kept; a non-native layout is re-laid out per call.
        return layout.to_w1(gate_up), layout.to_w2(down), None
    if layout.native and recipe == "bf16":
        return gate_up, down, None  # the parameters themselves: no copy
    cache = module.__dict__.get(_CACHE_ATTR)
    if cache is None:
        cache = module.__dict__[_CACHE_ATTR] = _Cache()
    if cache.key != key:
        # Drop the old copies first, so two versions do not coexist (a pending backward keeps its own).
        cache.key = cache.w1 = cache.w2 = cache.prepared = None
        with torch.no_grad():
            if not layout.native:
                cache.w1, cache.w2 = layout.to_w1(gate_up), layout.to_w2(down)
            if recipe != "bf16":
                src1, src2 = (gate_up, down) if layout.native else (cache.w1, cache.w2)
                cache.prepared = _ops.grouped_mlp_prepare_weights(src1, src2, *config)
        cache.key = key
    if layout.native:
        return gate_up, down, cache.prepared
    w1 = _CachedRelayout.apply(gate_up, cache.w1, layout.from_w1)
    w2 = _CachedRelayout.apply(down, cache.w2, layout.from_w2)
    return w1, w2, cache.prepared


def experts_forward(module, hidden_states, top_k_index, top_k_weights, *, recipe):
    """y [T, H] (hidden_states' dtype) = sum over k of top_k_weights[t, k] * expert_{top_k_index[t, k]}(x_t),
    through mxmoe with `recipe`, on `module`'s parameters."""
    layout = experts_layout(module, recipe)
    b1 = layout.to_b1(module.gate_up_proj_bias) if layout.bias else None
    b2 = module.down_proj_bias if layout.bias else None
    check_devices(f"{type(module).__name__} (experts_implementation mxmoe)", ("hidden_states", hidden_states),
                  ("top_k_index", top_k_index), ("top_k_weights", top_k_weights),
                  ("gate_up_proj", module.gate_up_proj), ("down_proj", module.down_proj), ("gate_up_proj_bias", b1),
                  ("down_proj_bias", b2))
    # transformers applies the routing weight after the down projection's bias: (A W2 + b2) p, which
    # is mxmoe's scale_fc2_bias (p b2) with p applied to the activation.
    config = (recipe, layout.activation, layout.limit, layout.alpha, layout.linear_offset, "halves", layout.bias)
    w1, w2, prepared = _weights(module, layout, config)
    x = hidden_states.to(torch.bfloat16)
    ids = _ids("top_k_index", top_k_index, keep_int64=True)
    probs = _probs(top_k_weights)
    if recipe == "mxfp8":
        # The permute writes the rows as MXFP8 that the layer reads (no bf16 permuted copy of x).
        permuted_y, row_map = _PermutedGroupedMLPFunction.apply(x, ids, probs, w1, b1, w2, b2, layout.experts, -1,
                                                                config, None, prepared, False)
        y = unpermute(permuted_y, row_map)
    else:
        p = permute(x, ids, probs, experts=layout.experts)
        permuted_y = _GroupedMLPFunction.apply(p.x, p.offsets, p.probs, w1, b1, w2, b2, config, None, prepared,
                                               False)
        y = unpermute(permuted_y, p.row_map)
    return y.to(hidden_states.dtype)


def _implementation(recipe):
    def forward(self, hidden_states, top_k_index, top_k_weights):
        return experts_forward(self, hidden_states, top_k_index, top_k_weights, recipe=recipe)

    forward.__name__ = forward.__qualname__ = f"mxmoe_{recipe}_experts_forward"
    return forward


def register():
    """Registers every name of IMPLEMENTATIONS in transformers' ExpertsInterface (done on import;
    calling it again is harmless)."""
    for name, recipe in IMPLEMENTATIONS.items():
        _hf_moe.ExpertsInterface.register(name, _implementation(recipe))


def check_model(model, implementation=None):
    """Raises UnsupportedExperts, naming the model class, if an experts module of `model` cannot run
    with `implementation` (default: the one its config names); returns the number of experts
    modules checked. The same checks run at each forward; this runs them before training starts."""
    checked = 0
    for m in model.modules():
        if not hasattr(m, "gate_up_proj") or not hasattr(m, "has_gate"):
            continue
        name = implementation or getattr(getattr(m, "config", None), "_experts_implementation", None)
        if name not in IMPLEMENTATIONS:
            continue
        try:
            experts_layout(m, IMPLEMENTATIONS[name])
        except UnsupportedExperts as e:
            raise UnsupportedExperts(f"{type(model).__name__}: {e}") from None
        checked += 1
    return checked


register()

__all__ = ["IMPLEMENTATIONS", "ExpertsLayout", "UnsupportedExperts", "experts_layout", "experts_forward",
           "check_model", "register", "release_cached_weights"]
