"""mxmoe_torch.hf: mxmoe as a transformers experts backend, on whole tiny models built from the config
classes (random weights, nothing downloaded) of five families: Mixtral, Qwen3-MoE, GPT-OSS (transposed,
interleaved gate/up, biases, clamped SwiGLU), DeepSeek-V3 (a dense layer first, shared experts,
sigmoid group routing) and OLMoE. Each model runs forward and backward with experts_implementation
"eager" and with mxmoe's names; the logits and every parameter's gradient are compared.

Tolerances (docs/numerics.md "Tolerances": relative Frobenius error, with its "Absolute floor":
||got - want|| <= tol (||want|| + 4 rms(want)), so a gradient of a handful of values, such as
GPT-OSS's attention sinks, is not judged by noise): bf16 2e-2; mxfp8 and fp8_blockwise 0.1; with
GPT-OSS's clamped SwiGLU, 0.25 for the quantized recipes and 0.1 for bf16 gradients, since eager
differentiates the clamp at its fp32 C where mxmoe differentiates at the saved bf16 C (numerics.md
"Activation precision", "Clamped SwiGLU"): a C within rounding of +-7 flips a mask. The expert
weights are drawn at unit-preserving scale (GPT-OSS's FC1 larger, so that about 10% of C lies past
the clamp), so the experts carry a real share of the logits and of every upstream gradient. One MoE
layer per model: both implementations then route the same tokens to the same experts (a second MoE
layer could flip a near-tie on rounding alone and fail by far more than any tolerance).

Run: PYTHONPATH=python MXMOE_TORCH_LIBRARY=<build>/python/libmxmoe_torch.so python -m pytest python/tests/test_hf_experts.py"""

import copy
import math

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed "
                                   "(python/requirements-test.txt pins it; scripts/setup.sh installs it)")

import mxmoe_torch  # noqa: E402,F401
from mxmoe_torch import hf  # noqa: E402
from transformers.integrations.moe import ExpertsInterface, use_experts_implementation  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA device"))]
RECIPES = {"mxmoe": "bf16", "mxmoe_mxfp8": "mxfp8", "mxmoe_fp8_blockwise": "fp8_blockwise",
           "mxmoe_fp8_blockwise_pow2": "fp8_blockwise_pow2"}
FAMILIES = ["mixtral", "qwen3_moe", "gpt_oss", "deepseek_v3", "olmoe"]
VOCAB, HIDDEN, FFN = 128, 64, 32


def skip_unserved(device, implementation):
    """fp8_blockwise with fp32 scales has FP8 kernels on Hopper only (docs/numerics.md "FP8 blockwise")."""
    if device == "cuda" and RECIPES[implementation] == "fp8_blockwise" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("fp8_blockwise with fp32 scales needs cuda_sm90 (a Hopper GPU); fp8_blockwise_pow2 runs here")


def make_config(family, experts=8, top_k=2, **overrides):
    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if family == "mixtral":
        cfg = transformers.MixtralConfig(**common, head_dim=32, intermediate_size=FFN, num_local_experts=experts,
                                         num_experts_per_tok=top_k)
    elif family == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(**common, head_dim=32, intermediate_size=2 * FFN, moe_intermediate_size=FFN,
                                          num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=top_k > 1)
    elif family == "gpt_oss":
        cfg = transformers.GptOssConfig(**common, head_dim=32, intermediate_size=FFN, num_local_experts=experts,
                                        num_experts_per_tok=top_k, sliding_window=8)
    elif family == "deepseek_v3":
        # Layer 0 dense, layer 1 MoE (first_k_dense_replace): still one MoE layer.
        common.update(num_hidden_layers=2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        cfg = transformers.DeepseekV3Config(**common, intermediate_size=2 * FFN, moe_intermediate_size=FFN,
                                            n_routed_experts=experts, num_experts_per_tok=top_k, n_group=1,
                                            topk_group=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=32,
                                            qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=32)
    elif family == "olmoe":
        cfg = transformers.OlmoeConfig(**common, intermediate_size=FFN, num_experts=experts, num_experts_per_tok=top_k)
    else:
        raise ValueError(family)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def experts_modules(model):
    return [m for m in model.modules() if hasattr(m, "gate_up_proj") and hasattr(m, "has_gate")]


def build(family, device="cpu", implementation="eager", seed=0, **config):
    """A bf16 model with random weights; expert weights at unit-preserving scale (see the docstring)."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(make_config(family, **config),
                                                          experts_implementation=implementation,
                                                          dtype=torch.bfloat16)
    with torch.no_grad():
        for m in experts_modules(model):
            H = m.gate_up_proj.shape[1] if m.is_transposed else m.gate_up_proj.shape[2]
            F = m.down_proj.shape[1] if m.is_transposed else m.down_proj.shape[2]
            m.gate_up_proj.normal_(0, 0.5 if family == "gpt_oss" else 1 / math.sqrt(H))
            m.down_proj.normal_(0, 1 / math.sqrt(F))
            if m.has_bias:
                m.gate_up_proj_bias.normal_(0, 0.5)
                m.down_proj_bias.normal_(0, 0.5)
    return model.to(device).train()


def tolerance(family, recipe, what):
    """docs/numerics.md "Tolerances" for `what` in "layer" (the experts' own outputs), "logits" and
    "grad" (every parameter of the model), against the float64 experts reference."""
    clamped = family == "gpt_oss"
    if recipe == "bf16":
        return 0.1 if clamped and what != "logits" else 2e-2
    if what == "grad":
        return 0.25
    return 0.25 if clamped else 0.1


def assert_close(got, want, tol, name):
    got, want = got.double(), want.double()
    floor = 4 * want.norm() / math.sqrt(want.numel())  # "Absolute floor": 4 rms(want)
    err = (got - want).norm()
    assert torch.isfinite(got).all(), f"{name}: non-finite values"
    assert err <= tol * (want.norm() + floor), \
        f"{name}: relative error {(err / want.norm().clamp_min(1e-30)).item():.4g} > {tol} (floor {floor.item():.3g})"


def run(model, ids, probe):
    """(logits, {name: grad}) of sum(logits * probe): a random cotangent, so every gradient is random."""
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits
    (logits.float() * probe).sum().backward()
    base = getattr(model, "_orig_mod", model)  # a torch.compile wrapper: the model's own names
    return logits.detach(), {n: p.grad.detach().clone() for n, p in base.named_parameters() if p.grad is not None}


def inputs(device, batch=2, seq=32, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, seq), generator=g)
    probe = torch.randn(batch, seq, VOCAB, generator=g)
    return ids.to(device), probe.to(device)


def eager_f64_experts(self, hidden_states, top_k_index, top_k_weights):
    """transformers' eager experts loop in float64, with the module's own gate (_apply_gate: the
    default act_fn(gate) * up, or GPT-OSS's interleaved clamped SwiGLU): the reference the
    tolerances are stated against. Differentiable in everything, output in hidden_states' dtype."""
    gate_up, down = self.gate_up_proj.double(), self.down_proj.double()
    if not self.is_transposed:
        gate_up, down = gate_up.transpose(1, 2), down.transpose(1, 2)  # [E, H, 2F], [E, F, H]
    x = hidden_states.double()
    out = torch.zeros_like(x)
    for e in range(gate_up.shape[0]):
        token, slot = torch.where(top_k_index == e)
        c = x[token] @ gate_up[e]
        if self.has_bias:
            c = c + self.gate_up_proj_bias[e].double()
        y = self._apply_gate(c) @ down[e]
        if self.has_bias:
            y = y + self.down_proj_bias[e].double()
        out = out.index_add(0, token, y * top_k_weights[token, slot, None].double())
    return out.to(hidden_states.dtype)


ExpertsInterface.register("eager_f64_reference", eager_f64_experts)


def check_against_eager(family, recipe, got, model, ids, probe):
    """got (logits, grads) of `model` with an mxmoe implementation, against the same weights with
    the experts in float64 (tolerance(...)) and with transformers' bf16 eager experts (the recipe's
    tolerance plus bf16's: both are within theirs of the float64 result). Eager's own distance to
    the float64 result is checked too, so the reference and the bounds are sound."""
    results = {}
    for implementation in ("eager_f64_reference", "eager"):
        ref = copy.deepcopy(model)
        ref.set_experts_implementation(implementation)
        results[implementation] = run(ref, ids, probe)
    logits, grads = got
    exact, eager = results["eager_f64_reference"], results["eager"]
    assert sorted(grads) == sorted(exact[1]) == sorted(eager[1]), "the same parameters get gradients"
    for what, name, value, key in [("logits", "logits", logits, None)] + \
            [("grad", f"{n}.grad", g, n) for n, g in grads.items()]:
        want = exact[0] if key is None else exact[1][key]
        from_eager = eager[0] if key is None else eager[1][key]
        tol, bf16_tol = tolerance(family, recipe, what), tolerance(family, "bf16", what)
        assert_close(value, want, tol, f"{name} vs float64 experts")
        assert_close(from_eager, want, bf16_tol, f"{name} of eager vs float64 experts")
        assert_close(value, from_eager, tol + bf16_tol, f"{name} vs eager")


# ---------------------------------------------------------------- every family, every recipe

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("implementation", list(RECIPES))
@pytest.mark.parametrize("family", FAMILIES)
def test_model_matches_eager(family, implementation, device):
    skip_unserved(device, implementation)
    model = build(family, device)
    mx = copy.deepcopy(model)
    mx.set_experts_implementation(implementation)
    assert mx.config._experts_implementation == implementation
    ids, probe = inputs(device)
    check_against_eager(family, RECIPES[implementation], run(mx, ids, probe), model, ids, probe)
    for m in experts_modules(mx):
        for p in m.parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, "every expert parameter gets a gradient"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("implementation", list(RECIPES))
@pytest.mark.parametrize("family", FAMILIES)
def test_experts_outputs_match_reference(family, implementation, device):
    """The experts module alone, the layer outputs numerics.md's tolerances are stated for: y, the
    gradients of hidden_states and top_k_weights and of every expert parameter, against the float64
    loop, at unit-scale inputs (GPT-OSS: with a share of C past the clamp)."""
    skip_unserved(device, implementation)
    recipe = RECIPES[implementation]
    model = build(family, device)
    m = experts_modules(model)[0]
    E, K, T = m.gate_up_proj.shape[0], 2, 256
    g = torch.Generator().manual_seed(3)
    x = torch.randn(T, HIDDEN, generator=g).to(device, torch.bfloat16)
    weights, index = torch.topk(torch.randn(T, E, generator=g).softmax(-1), K)
    weights, index = weights.to(device), index.to(device)
    dy = torch.randn(T, HIDDEN, generator=g).to(device)
    if family == "gpt_oss":
        c = x.float() @ m.gate_up_proj[0].float() + m.gate_up_proj_bias[0].float()
        assert (c.abs() > m.limit).float().mean() > 0.02, "the clamp is exercised"
    results = {}
    for name in ("eager_f64_reference", implementation):
        model.set_experts_implementation(name)
        model.zero_grad(set_to_none=True)
        xs, ws = x.clone().requires_grad_(True), weights.clone().requires_grad_(True)
        y = m(xs, index, ws)
        (y.float() * dy).sum().backward()
        results[name] = {"y": y.detach(), "hidden_states.grad": xs.grad, "top_k_weights.grad": ws.grad,
                         **{f"{n}.grad": p.grad.clone() for n, p in m.named_parameters()}}
    got, want = results[implementation], results["eager_f64_reference"]
    for name, value in want.items():
        assert got[name].dtype == value.dtype, name
        assert_close(got[name], value, tolerance(family, recipe, "layer"), name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family,experts,top_k", [("olmoe", 8, 1), ("qwen3_moe", 8, 1), ("mixtral", 16, 8),
                                                  ("qwen3_moe", 16, 8), ("gpt_oss", 8, 8)])
@pytest.mark.parametrize("implementation", ["mxmoe", "mxmoe_mxfp8"])
def test_top_k_1_and_8(family, experts, top_k, implementation, device):
    model = build(family, device, experts=experts, top_k=top_k)
    mx = copy.deepcopy(model)
    mx.set_experts_implementation(implementation)
    ids, probe = inputs(device)
    check_against_eager(family, RECIPES[implementation], run(mx, ids, probe), model, ids, probe)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_from_config_then_switch_implementations(family, device):
    """from_config(..., experts_implementation="mxmoe") builds a model that runs mxmoe; switching it
    to "eager" and back changes the function the experts call, not the weights."""
    mx = build(family, device, implementation="mxmoe")
    assert mx.config._experts_implementation == "mxmoe"
    eager = build(family, device, implementation="eager")
    ids, probe = inputs(device)
    first = run(mx, ids, probe)
    check_against_eager(family, "bf16", first, eager, ids, probe)
    mx.set_experts_implementation("eager")
    assert torch.equal(run(mx, ids, probe)[0], run(eager, ids, probe)[0]), "switched to eager, it is the eager model"
    mx.set_experts_implementation("mxmoe_mxfp8")
    check_against_eager(family, "mxfp8", run(mx, ids, probe), eager, ids, probe)
    mx.set_experts_implementation("mxmoe")
    assert torch.equal(run(mx, ids, probe)[0], first[0]), "back on mxmoe bf16, the first result again"


# ---------------------------------------------------------------- an expert with no tokens

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("implementation", ["mxmoe", "mxmoe_mxfp8", "mxmoe_fp8_blockwise"])
@pytest.mark.parametrize("family", ["mixtral", "gpt_oss"])
def test_expert_without_tokens(family, implementation, device):
    """The router's choices are rewritten (the same way for both models) so that experts 0 and 5
    receive no token: their weight gradients are exactly zero, everything else matches eager."""
    skip_unserved(device, implementation)
    empty = (0, 5)

    def reroute(module, args):
        hidden, index, weights = args
        for e in empty:
            index = torch.where(index == e, torch.full_like(index, 3), index)
        return hidden, index, weights

    model = build(family, device)
    for m in experts_modules(model):
        m.register_forward_pre_hook(reroute)  # deepcopy keeps it: every copy below is rerouted
    mx = copy.deepcopy(model)
    mx.set_experts_implementation(implementation)
    ids, probe = inputs(device)
    got = run(mx, ids, probe)
    check_against_eager(family, RECIPES[implementation], got, model, ids, probe)
    for name, g in got[1].items():
        if "experts" in name and g.dim() >= 2:
            assert torch.count_nonzero(g[list(empty)]) == 0, f"{name}: an expert without tokens has no gradient"
            assert torch.count_nonzero(g[3]) > 0


# ---------------------------------------------------------------- torch.compile

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("implementation", ["mxmoe", "mxmoe_mxfp8"])
@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_torch_compile(family, implementation, device):
    """torch.compile on the whole model (aot_eager on the CPU, inductor on CUDA), forward and backward:
    the same result as eager mxmoe up to the compiler's own rounding of the rest of the model, and
    eager's within the recipe's tolerance. Two calls with different token counts (dynamic shapes)."""
    model = build(family, device)
    mx = copy.deepcopy(model)
    mx.set_experts_implementation(implementation)
    compiled = torch.compile(mx, backend="aot_eager" if device == "cpu" else "inductor")
    for seq in (32, 24):
        ids, probe = inputs(device, seq=seq, seed=seq)
        eager_mx = run(mx, ids, probe)
        got = run(compiled, ids, probe)
        check_against_eager(family, RECIPES[implementation], got, model, ids, probe)
        if implementation != "mxmoe":
            # Quantized: the compiled model runs mxmoe's quantization, not bf16 experts.
            want = run(model, ids, probe)
            for name in ("gate_up_proj", "down_proj"):
                key = next(k for k in want[1] if k.endswith(name))
                to_mx = (got[1][key] - eager_mx[1][key]).double().norm()
                to_eager = (got[1][key] - want[1][key]).double().norm()
                assert to_mx < 0.5 * to_eager, f"{key}: compiled mxmoe is closer to eager bf16 than to eager mxmoe"


# ---------------------------------------------------------------- weights: in place, cached, updated

def test_bf16_reads_the_parameters_in_place():
    model = build("qwen3_moe")
    m = experts_modules(model)[0]
    layout = hf.experts_layout(m, "bf16")
    assert layout.native
    w1, w2, prepared = hf._weights(m, layout, ("bf16", "swiglu", 7.0, 1.702, 1.0, "halves", False))
    assert w1 is m.gate_up_proj and w2 is m.down_proj and prepared is None


def test_gpt_oss_layout_is_relaid_out_once_per_weight_version():
    model = build("gpt_oss")
    model.set_experts_implementation("mxmoe")
    m = experts_modules(model)[0]
    layout = hf.experts_layout(m, "bf16")
    assert layout.transposed and layout.interleaved and layout.bias and layout.activation == "clamped_swiglu"
    assert (layout.limit, layout.alpha, layout.linear_offset) == (7.0, pytest.approx(1.702), 1.0)
    ids, probe = inputs("cpu")
    run(model, ids, probe)
    cache = m.__dict__[hf._CACHE_ATTR]
    first = cache.w1
    run(model, ids, probe)
    assert cache.w1 is first, "no new copy while the weights are unchanged"
    # The copy is the GPT-OSS weight re-laid out: gate columns (even) first, then up columns (odd).
    E, H, F2 = m.gate_up_proj.shape
    assert torch.equal(first[:, :F2 // 2], m.gate_up_proj[:, :, 0::2].transpose(1, 2))
    assert torch.equal(first[:, F2 // 2:], m.gate_up_proj[:, :, 1::2].transpose(1, 2))
    with torch.no_grad():
        m.gate_up_proj.mul_(1.5)
    run(model, ids, probe)
    assert cache.w1 is not first, "an in-place update makes a new copy"
    hf.release_cached_weights(model)
    assert m.__dict__[hf._CACHE_ATTR].w1 is None


@pytest.mark.parametrize("implementation", ["mxmoe", "mxmoe_mxfp8", "mxmoe_fp8_blockwise"])
@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
@pytest.mark.parametrize("fused", [False, True])
def test_cached_weights_follow_the_optimizer(family, implementation, fused):
    """Three AdamW steps (fused=True writes the parameters without bumping their versions), two
    forwards per step: after every step the model with its cached copies gives exactly what a fresh
    copy of it (no cache) gives, so no stale copy is read."""
    model = build(family)
    model.set_experts_implementation(implementation)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
    for step in range(3):
        ids, probe = inputs("cpu", seed=10 + step)
        run(model, ids, probe)
        opt.step()
        got = run(model, ids, probe)
        fresh = run(copy.deepcopy(model), ids, probe)
        assert torch.equal(got[0], fresh[0]), f"logits after step {step}"
        for name, g in fresh[1].items():
            assert torch.equal(got[1][name], g), f"{name}.grad after step {step}"


# ---------------------------------------------------------------- refusals

def test_refuses_an_activation_it_does_not_compute():
    model = build("mixtral", hidden_act="gelu")
    model.set_experts_implementation("mxmoe")
    ids, _ = inputs("cpu")
    with pytest.raises(hf.UnsupportedExperts, match="MixtralExperts.*MixtralConfig.*GELU"):
        model(input_ids=ids)
    with pytest.raises(hf.UnsupportedExperts, match="^MixtralForCausalLM: .*MixtralExperts"):
        hf.check_model(model)


def test_refuses_float32_weights():
    model = build("qwen3_moe").float()
    model.set_experts_implementation("mxmoe")
    with pytest.raises(hf.UnsupportedExperts, match="Qwen3MoeExperts.*torch.float32.*bf16"):
        model(input_ids=inputs("cpu")[0])


def test_refuses_sizes_the_recipe_cannot_take():
    model = build("olmoe", intermediate_size=48)  # 48: a multiple of 8 (bf16), not of 32 (mxfp8)
    assert hf.check_model(model, "mxmoe") == 1
    with pytest.raises(hf.UnsupportedExperts, match="OlmoeForCausalLM: .*intermediate 48.*multiples of 32.*mxfp8"):
        hf.check_model(model, "mxmoe_mxfp8")


class _Config:
    _experts_implementation = "mxmoe"


def _toy_experts(**flags):
    @use_experts_implementation(**flags)
    class ToyExperts(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            self.gate_up_proj = torch.nn.Parameter(torch.randn(4, 64, 32, dtype=torch.bfloat16))
            self.down_proj = torch.nn.Parameter(torch.randn(4, 32, 32, dtype=torch.bfloat16))
            self.act_fn = torch.nn.SiLU()

        def forward(self, hidden_states, top_k_index, top_k_weights):
            raise AssertionError("the eager forward is not called")

    return ToyExperts


@pytest.mark.parametrize("flags,missing", [({"has_gate": False}, "without a gate"),
                                           ({"has_post_expert_norm": True}, "norm after each expert"),
                                           ({"is_concatenated": False}, "is_concatenated=False")])
def test_refuses_layouts_it_does_not_serve(flags, missing):
    m = _toy_experts(**flags)(_Config())
    x = torch.randn(8, 32, dtype=torch.bfloat16)
    with pytest.raises(hf.UnsupportedExperts, match=f"ToyExperts \\(_Config\\).*{missing}"):
        m(x, torch.zeros(8, 1, dtype=torch.long), torch.ones(8, 1))


def test_refuses_a_gate_function_of_its_own():
    cls = _toy_experts()
    cls._apply_gate = lambda self, gate_up: gate_up.chunk(2, dim=-1)[1]
    with pytest.raises(hf.UnsupportedExperts, match="ToyExperts.*gate function .*lambda.* is not one mxmoe computes"):
        cls(_Config())(torch.randn(8, 32, dtype=torch.bfloat16), torch.zeros(8, 1, dtype=torch.long), torch.ones(8, 1))


def test_every_name_is_registered():
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    for name in RECIPES:
        assert name in ALL_EXPERTS_FUNCTIONS.valid_keys()
    assert hf.IMPLEMENTATIONS == RECIPES
