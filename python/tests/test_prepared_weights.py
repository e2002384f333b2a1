"""Weights quantized once per version in PyTorch: GroupedMLP (recipe mxfp8) caches
torch.ops.mxmoe.grouped_mlp_prepare_weights's object, keyed by the weights' version counters, and hands
it to the forward and backward ops. With the cache the results are the same bits as without it; the
object is made once while the weights do not change and again after an in-place update (an optimizer
step); the bf16 recipe makes none. CUDA cases run where a GPU is visible and are skipped elsewhere."""

import copy

import pytest
import torch

import mxmoe_torch
from mxmoe_torch import _fake, _layer
from test_torch_ops import DEVICES, Data, config, opcheck

ops = torch.ops.mxmoe
CUDA = torch.cuda.is_available()


def bits(t):
    """The raw bits of a tensor, for exact comparison (NaN payloads and -0.0 included)."""
    t = t.detach().contiguous()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def assert_same_bits(got, want, what=""):
    assert got.keys() == want.keys()
    for name in want:
        if want[name] is None:
            assert got[name] is None, f"{what}{name}"
            continue
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, f"{what}{name}"
        assert torch.equal(bits(got[name]), bits(want[name])), f"{what}{name}: results differ"


class CountingOps:
    """torch.ops.mxmoe as _layer sees it, counting grouped_mlp_prepare_weights calls and recording
    the `prepared` argument (the one before the last, check_finite) each layer op was given."""

    LAYER_OPS = ("grouped_mlp_forward", "grouped_mlp_backward", "grouped_mlp_backward_")

    def __init__(self):
        self.prepared = 0
        self.given = []  # (op name, prepared argument)

    def __getattr__(self, name):
        op = getattr(ops, name)
        if name != "grouped_mlp_prepare_weights" and name not in self.LAYER_OPS:
            return op

        def counted(*args):
            if name in self.LAYER_OPS:
                self.given.append((name, args[-2]))
            else:
                self.prepared += 1
            return op(*args)
        return counted


@pytest.fixture
def counting(monkeypatch):
    c = CountingOps()
    monkeypatch.setattr(_layer, "_ops", c)
    return c


def module_for(d, cfg, **kw):
    recipe, activation, limit, alpha, offset, layout, scale = cfg
    E, F, H = d.w1.shape[0], d.w2.shape[2], d.w2.shape[1]
    m = mxmoe_torch.GroupedMLP(H, F, E, activation, layout, d.b1 is not None, recipe, scale_fc2_bias=scale,
                               limit=limit, alpha=alpha, linear_offset=offset, device=d.x.device, **kw)
    with torch.no_grad():
        for p, v in ((m.w1, d.w1), (m.w2, d.w2), (m.b1, d.b1), (m.b2, d.b2)):
            if p is not None:
                p.copy_(v)
    return m


def step(m, x, offsets, probs, dy):
    """One forward and backward of m on fresh leaves: y and every gradient (then cleared)."""
    m.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    probs = probs.clone().requires_grad_(True)
    y = m(x, offsets, probs)
    y.backward(dy)
    out = {"y": y.detach(), "dx": x.grad, "dprobs": probs.grad, "dw1": m.w1.grad, "dw2": m.w2.grad,
           "db1": m.b1.grad if m.b1 is not None else None, "db2": m.b2.grad if m.b2 is not None else None}
    m.zero_grad(set_to_none=True)
    return out


def fresh_inputs(d, seed):
    """New x, probs and dy for d's split, from `seed`."""
    g = torch.Generator().manual_seed(seed)
    T, H = d.x.shape
    dev = d.x.device
    x = (torch.rand(T, H, generator=g) * 2 - 1).bfloat16().to(dev)
    probs = torch.rand(T, generator=g).to(dev)
    dy = (torch.rand(T, H, generator=g) * 2 - 1).bfloat16().to(dev)
    return x, probs, dy


def expected_bytes(E, H, F):
    """PreparedWeights::bytes() from the layout (include/mxmoe/mxfp8_layout.h): W1 [E, 2F, H] and
    W2 [E, H, F], each as E4M3 data plus scales, once row-wise and once column-wise (one group per
    expert matrix)."""
    total = 0
    for rows, cols in ((2 * F, H), (H, F)):
        total += E * (rows * cols + _fake.rowwise_scale_bytes(rows, cols))
        total += E * (rows * cols + _fake.colwise_matrix_scale_bytes(rows, cols))
    return total


def bytes_match_layout(got, E, H, F, device):
    """Where cuda_sm90 serves the device (a Hopper build), the object keeps BF16 copies of the
    dequantized weights alone, 2 bytes per value per orientation (WeightsArgs::bf16_copies: its GEMMs
    never read the FP8 bytes); elsewhere exactly the layout's bytes."""
    copies = 2 * 2 * E * 3 * F * H
    return got in ((expected_bytes(E, H, F), copies) if device == "cuda" else (expected_bytes(E, H, F),))


# ---------------------------------------------------------------- the ops

@pytest.mark.parametrize("device", DEVICES)
def test_prepare_op_bytes_and_layer_ops_with_it(device):
    d = Data(device, [5, 0, 27, 32], hidden=128, ffn=96, bias=True, seed=21)
    cfg = config("mxfp8", "clamped_swiglu", "interleave32", scale_fc2_bias=True)
    pw = ops.grouped_mlp_prepare_weights(d.w1, d.w2, *cfg)
    assert isinstance(pw, torch.ScriptObject) and pw.valid()
    # Not test_aot_dispatch_dynamic: it compares the outputs with assert_close, which has no
    # comparison for an opaque object (and the module never traces this op).
    torch.library.opcheck(ops.grouped_mlp_prepare_weights.default, (d.w1, d.w2, *cfg),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    assert bytes_match_layout(pw.bytes(), 4, 128, 96, device)
    assert torch.device(pw.device()) == d.w1.device
    y0, saved0 = ops.grouped_mlp_forward(*d.inputs(), *cfg)
    y1, saved1 = ops.grouped_mlp_forward(*d.inputs(), *cfg, pw)
    assert torch.equal(bits(y0), bits(y1))
    for a, b in zip(saved0, saved1):
        assert torch.equal(bits(a), bits(b))
    inputs = (None, d.offsets, d.probs, d.w1, d.b1, d.w2, d.b2)
    g0 = ops.grouped_mlp_backward(d.dy, saved0, *inputs, *cfg, False)
    g1 = ops.grouped_mlp_backward(d.dy, saved1, *inputs, *cfg, False, pw)
    for a, b in zip(g0[:6], g1[:6]):
        assert torch.equal(bits(a), bits(b))
    # The ops read the object: the copies of other weights give other results (forward y; backward
    # dx, whose dgrad GEMMs read the column-wise copies).
    other = ops.grouped_mlp_prepare_weights(d.w1 * 2, d.w2 * 2, *cfg)
    assert not torch.equal(bits(ops.grouped_mlp_forward(*d.inputs(), *cfg, other)[0]), bits(y0))
    assert not torch.equal(bits(ops.grouped_mlp_backward(d.dy, saved0, *inputs, *cfg, False, other)[0]), bits(g0[0]))
    # bf16: nothing to prepare, and a forward given the (empty) object is unchanged.
    bf = config("bf16")
    none = ops.grouped_mlp_prepare_weights(d.w1, d.w2, *bf)
    assert none.valid() and none.bytes() == 0
    d.b1 = d.b2 = None
    assert torch.equal(bits(ops.grouped_mlp_forward(*d.inputs(), *bf)[0]),
                       bits(ops.grouped_mlp_forward(*d.inputs(), *bf, none)[0]))


@pytest.mark.parametrize("device", DEVICES)
def test_layer_ops_with_prepared_pass_opcheck(device):
    d = Data(device, [5, 0, 27, 32], bias=True, seed=22)
    cfg = config("mxfp8", "clamped_swiglu", "interleave32", scale_fc2_bias=True)
    pw = ops.grouped_mlp_prepare_weights(d.w1, d.w2, *cfg)
    _, saved = ops.grouped_mlp_forward(*d.inputs(), *cfg, pw)
    inputs = (None, d.offsets, d.probs, d.w1, d.b1, d.w2, d.b2)
    E, F, H = d.w1.shape[0], d.w2.shape[2], d.w2.shape[1]
    f32 = {"dtype": torch.float32, "device": device}
    main_grads = [torch.randn(E, 2 * F, H, **f32), torch.randn(E, H, F, **f32), torch.randn(E, 2 * F, **f32),
                  torch.randn(E, H, **f32)]
    for op, args in ((ops.grouped_mlp_forward.default, (*d.inputs(), *cfg, pw)),
                     (ops.grouped_mlp_backward.default, (d.dy, saved, *inputs, *cfg, False, pw)),
                     (ops.grouped_mlp_backward.default, (d.dy, saved, *inputs, *cfg, True, pw)),
                     (ops.grouped_mlp_backward_.default, (d.dy, saved, *inputs, *cfg, False, *main_grads, [], pw))):
        opcheck(op, args)



def test_prepare_op_fake_kernel_gives_an_empty_object():
    d = Data("meta", [4, 4], seed=23)
    pw = ops.grouped_mlp_prepare_weights(d.w1, d.w2, *config("mxfp8"))
    assert not pw.valid() and pw.bytes() == 0
    y, _ = ops.grouped_mlp_forward(*d.inputs(), *config("mxfp8"), pw)  # the fake forward ignores it
    assert y.shape == d.x.shape and y.device.type == "meta"


def test_mismatched_or_empty_prepared_weights_are_errors_naming_prepared():
    d = Data("cpu", [5, 11], seed=24)
    cfg = config("mxfp8")
    other_layout = ops.grouped_mlp_prepare_weights(d.w1, d.w2, *config("mxfp8", glu_layout="interleave32"))
    with pytest.raises(RuntimeError, match="prepared.*glu_layout"):
        ops.grouped_mlp_forward(*d.inputs(), *cfg, other_layout)
    smaller = Data("cpu", [5, 11], hidden=32, seed=24)
    with pytest.raises(RuntimeError, match="prepared.*hidden"):
        ops.grouped_mlp_forward(*d.inputs(), *cfg, ops.grouped_mlp_prepare_weights(smaller.w1, smaller.w2, *cfg))
    with pytest.raises(RuntimeError, match="prepared.*empty"):
        ops.grouped_mlp_forward(*d.inputs(), *cfg, torch.classes.mxmoe.PreparedWeights())
    with pytest.raises(RuntimeError, match="w2"):
        ops.grouped_mlp_prepare_weights(d.w1, d.w2.float(), *cfg)


# ---------------------------------------------------------------- the module's cache

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["swiglu", "clamped_bias_interleave", "main_grad", "deferred"])
def test_cached_results_are_bit_identical_to_uncached(device, variant, counting):
    bias = variant != "swiglu"
    cfg = (config("mxfp8", "clamped_swiglu", "interleave32", scale_fc2_bias=True) if variant != "swiglu"
           else config("mxfp8"))
    d = Data(device, [37, 0, 64, 3, 20], hidden=96, ffn=64, bias=bias, weight_gain=4.0, seed=25)
    kw = {"accumulate_into_main_grad": variant == "main_grad", "delay_wgrad_compute": variant == "deferred"}
    cached, plain = module_for(d, cfg, **kw), module_for(d, cfg, cache_prepared_weights=False, **kw)

    def run(m, x, probs, dy):
        if not (kw["accumulate_into_main_grad"] or kw["delay_wgrad_compute"]):
            return step(m, x, d.offsets, probs, dy)
        if kw["accumulate_into_main_grad"]:
            for p in m.parameters():
                p.main_grad = torch.zeros_like(p, dtype=torch.float32)
        xg, pg = x.clone().requires_grad_(True), probs.clone().requires_grad_(True)
        y = m(xg, d.offsets, pg)
        y.backward(dy)
        m.backward_dw()
        grad = (lambda p: p.main_grad) if kw["accumulate_into_main_grad"] else (lambda p: p.grad)
        out = {"y": y.detach(), "dx": xg.grad, "dprobs": pg.grad}
        out.update({"d" + n: grad(p) for n, p in m.named_parameters()})
        m.zero_grad(set_to_none=True)
        return out

    for seed in (0, 1, 2):  # fresh inputs each micro-batch, one weight version
        x, probs, dy = fresh_inputs(d, seed)
        assert_same_bits(run(cached, x, probs, dy), run(plain, x, probs, dy), f"micro-batch {seed}: ")
    assert counting.prepared == 1
    # The cached module handed its object to every forward and backward (the uncached one None).
    given = [p for _, p in counting.given]
    assert len(given) == 12  # 3 micro-batches x (forward, backward) x (cached, plain)
    cached_calls = [p for p in given if p is not None]
    assert len(cached_calls) == 6 and all(p is cached._prepared.weights for p in cached_calls)
    assert {n for n, p in counting.given if p is not None} == {
        "grouped_mlp_forward", "grouped_mlp_backward_" if variant == "main_grad" else "grouped_mlp_backward"}
    assert cached.prepared_weights_bytes > 0 and plain.prepared_weights_bytes == 0


@pytest.mark.parametrize("device", DEVICES)
def test_cache_is_built_once_across_forwards_and_used_by_backward(device, counting):
    d = Data(device, [12, 40, 0, 12], bias=True, seed=26)
    m = module_for(d, config("mxfp8"))
    assert m.prepared_weights_bytes == 0 and counting.prepared == 0
    y1 = m(d.x, d.offsets, d.probs)
    first = m._prepared.weights
    assert counting.prepared == 1 and first is not None
    y2 = m(d.x, d.offsets, d.probs)  # a second micro-batch, weights unchanged
    assert counting.prepared == 1 and m._prepared.weights is first
    (y1.float().sum() + y2.float().sum()).backward()
    assert counting.prepared == 1 and m._prepared.weights is first
    # Both forwards and both backwards were handed that one object.
    assert [n for n, _ in counting.given] == ["grouped_mlp_forward"] * 2 + ["grouped_mlp_backward"] * 2
    assert all(p is first for _, p in counting.given)
    with torch.no_grad():
        m(d.x, d.offsets, d.probs)  # inference reuses it too
    assert counting.prepared == 1
    assert m.prepared_weights_bytes == first.bytes() and bytes_match_layout(first.bytes(), 4, 64, 64, device)
    assert f"prepared_weights_bytes={m.prepared_weights_bytes}" in repr(m)


def _update(m, how):
    if how == "add_":
        with torch.no_grad():
            m.w1.add_(1e-2)
        return
    if how == "load_state_dict":
        state = {k: v.clone() for k, v in m.state_dict().items()}
        state["w2"] = state["w2"] * 1.5
        m.load_state_dict(state)
        return
    opt = {"sgd": lambda p: torch.optim.SGD(p, lr=0.5, foreach=False),
           "sgd_foreach": lambda p: torch.optim.SGD(p, lr=0.5, foreach=True),
           "sgd_fused": lambda p: torch.optim.SGD(p, lr=0.5, fused=True),
           "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
           "adam_fused": lambda p: torch.optim.Adam(p, lr=1e-2, fused=True)}[how](m.parameters())
    x = torch.ones(m.w1.shape[0] * 8, m.hidden, dtype=torch.bfloat16, device=m.w1.device)
    offsets = mxmoe_torch.offsets_from_counts(torch.full((m.w1.shape[0],), 8, device=m.w1.device))
    m(x, offsets).float().square().mean().backward()
    opt.step()
    m.zero_grad(set_to_none=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("how", ["add_", "load_state_dict", "sgd", "sgd_foreach", "sgd_fused", "adam", "adam_fused"])
def test_inplace_weight_update_invalidates_the_cache(device, how, counting):
    """In-place updates bump the weights' version counters. The fused optimizers do not (torch
    2.15's _fused_adam_ / _fused_sgd_ leave w1._version as it was): their steps are seen through the
    torch.optim step hook."""
    d = Data(device, [30, 0, 34, 7], bias=True, seed=27)
    cfg = config("mxfp8")
    m = module_for(d, cfg)
    before = step(m, d.x, d.offsets, d.probs, d.dy)
    stale = m._prepared.weights
    versions = (m.w1._version, m.w2._version)
    weights = (bits(m.w1.detach()).clone(), bits(m.w2.detach()).clone())
    n = counting.prepared
    _update(m, how)
    if "fused" not in how:
        assert (m.w1._version, m.w2._version) != versions
    # Whether the update changed the weights' bits. Every update here does on torch 2.15; torch
    # 2.11's fused SGD step on CPU bf16 parameters left them as they were (seen on the GPU machine),
    # and then the outputs cannot differ either: only the cache checks below apply.
    changed = not (torch.equal(bits(m.w1.detach()), weights[0]) and torch.equal(bits(m.w2.detach()), weights[1]))
    if how != "sgd_fused":
        assert changed, f"{how} did not change the weights"
    after = step(m, d.x, d.offsets, d.probs, d.dy)
    assert m._prepared.weights is not stale
    # Two prepares at most: the optimizer cases ran one forward before their step (on the cached
    # object: no prepare), the step changed the weights, then one forward after it.
    assert counting.prepared == n + 1
    # Same bits as a fresh module given the updated weights, without any cache.
    fresh = module_for(d, cfg, cache_prepared_weights=False)
    with torch.no_grad():
        fresh.load_state_dict(m.state_dict())
    assert_same_bits(after, step(fresh, d.x, d.offsets, d.probs, d.dy))
    if not changed:
        return
    assert not torch.equal(bits(after["y"]), bits(before["y"]))
    # The test can tell: the stale object gives other bits than the new weights' own.
    y_stale, _ = ops.grouped_mlp_forward(d.x, d.offsets, d.probs, m.w1, m.b1, m.w2, m.b2, *cfg, stale)
    assert not torch.equal(bits(y_stale), bits(after["y"]))


@pytest.mark.parametrize("device", DEVICES)
def test_writes_through_data_need_release(device, counting):
    """`.data` has its own version counter: a write through it is not seen (documented); after
    release_prepared_weights() the next forward prepares the new weights."""
    d = Data(device, [16, 16], seed=28)
    m = module_for(d, config("mxfp8"))
    m(d.x, d.offsets, d.probs)
    m.w1.data.mul_(2)
    fresh = module_for(d, config("mxfp8"), cache_prepared_weights=False)
    with torch.no_grad():
        fresh.w1.copy_(m.w1)
    want = step(fresh, d.x, d.offsets, d.probs, d.dy)
    assert counting.prepared == 1
    m.release_prepared_weights()
    assert m.prepared_weights_bytes == 0
    assert_same_bits(step(m, d.x, d.offsets, d.probs, d.dy), want)
    assert counting.prepared == 2


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_recipe_builds_no_cache(device, counting):
    d = Data(device, [20, 0, 12], bias=True, seed=29)
    m = module_for(d, config("bf16"))
    step(m, d.x, d.offsets, d.probs, d.dy)
    step(m, d.x, d.offsets, d.probs, d.dy)
    assert counting.prepared == 0 and m.prepared_weights_bytes == 0 and m._prepared.weights is None
    assert "prepared" not in repr(m)


@pytest.mark.parametrize("device", DEVICES)
def test_release_copy_and_move_drop_the_cache(device, counting):
    d = Data(device, [20, 0, 12], seed=30)
    m = module_for(d, config("mxfp8"))
    m(d.x, d.offsets, d.probs)
    assert bytes_match_layout(m.prepared_weights_bytes, 3, 64, 64, device)
    clone = copy.deepcopy(m)  # the opaque object is not copied: the copy prepares its own
    assert clone.prepared_weights_bytes == 0 and m.prepared_weights_bytes > 0
    assert_same_bits(step(clone, d.x, d.offsets, d.probs, d.dy), step(m, d.x, d.offsets, d.probs, d.dy))
    m.to(device)  # any _apply (to, cuda, ...) drops it
    assert m.prepared_weights_bytes == 0
    m(d.x, d.offsets, d.probs)
    m.release_prepared_weights()
    assert m.prepared_weights_bytes == 0 and m._prepared.weights is None
    m.cache_prepared_weights = False
    m(d.x, d.offsets, d.probs)
    assert m.prepared_weights_bytes == 0
    assert counting.prepared == 3  # m, clone, m after the move
    with pytest.raises(TypeError, match="cache_prepared_weights"):
        mxmoe_torch.GroupedMLP(64, 64, 2, cache_prepared_weights=1)


def test_inference_tensor_weights_bypass_the_cache(counting):
    """A module made under inference_mode has weights without version counters: no cache (a module
    made outside it keeps its cache in inference_mode)."""
    d = Data("cpu", [9, 7], seed=35)
    with torch.inference_mode():
        m = module_for(d, config("mxfp8"))
        y = m(d.x, d.offsets, d.probs)
    assert counting.prepared == 0 and m.prepared_weights_bytes == 0
    plain = module_for(d, config("mxfp8"))
    with torch.inference_mode():
        assert torch.equal(bits(plain(d.x, d.offsets, d.probs)), bits(y))
    assert counting.prepared == 1 and plain.prepared_weights_bytes > 0


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_bypasses_the_cache(device):
    torch._dynamo.reset()
    d = Data(device, [16, 0, 40, 8], seed=31)
    m = module_for(d, config("mxfp8"))
    compiled = torch.compile(m, fullgraph=True, backend="inductor" if device == "cuda" else "aot_eager")
    got = step(compiled, d.x, d.offsets, d.probs, d.dy)
    assert m.prepared_weights_bytes == 0  # the compiled forward quantized per call
    want = step(m, d.x, d.offsets, d.probs, d.dy)  # eager: cached
    assert m.prepared_weights_bytes > 0
    step(compiled, d.x, d.offsets, d.probs, d.dy)  # a cache made eagerly does not disturb the graph
    if device == "cpu":  # aot_eager runs the same ops: the same bits
        assert_same_bits(got, want)
    else:
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=1e-6, atol=0)
    torch._dynamo.reset()


@pytest.mark.skipif(not CUDA, reason="no CUDA device")
def test_cuda_graph_capture_quantizes_inside_the_graph():
    """A graph captured while the module has a cache does not read it: after an in-place weight
    update between replays, the replay matches eager results with the new weights."""
    d = Data("cuda", [24, 24, 24, 24], bias=True, seed=32)
    m = module_for(d, config("mxfp8"))
    x = d.x.clone().requires_grad_(True)
    params = [x, m.w1, m.w2]

    def run():
        y = m(x, d.offsets, d.probs)
        return (y,) + torch.autograd.grad(y.float().square().sum(), params)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(side)
    assert m.prepared_weights_bytes > 0
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = run()
    with torch.no_grad():
        m.w1.mul_(1.5)
        m.w2.add_(1e-2)
    graph.replay()
    eager = run()
    for got, want in zip(static, eager):
        assert torch.equal(bits(got), bits(want))


@pytest.mark.skipif(not CUDA, reason="no CUDA device")
def test_cuda_other_stream_gets_its_own_copies(counting):
    d = Data("cuda", [8, 8], seed=33)
    m = module_for(d, config("mxfp8"))
    y = m(d.x, d.offsets, d.probs)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y_side = m(d.x, d.offsets, d.probs)
    torch.cuda.current_stream().wait_stream(side)
    assert counting.prepared == 2
    assert torch.equal(bits(y), bits(y_side))


@pytest.mark.skipif(not CUDA, reason="no CUDA device")
def test_cuda_prepared_weights_on_another_device_are_an_error():
    d = Data("cuda", [8, 8], seed=34)
    cpu = Data("cpu", [8, 8], seed=34)
    pw = ops.grouped_mlp_prepare_weights(cpu.w1, cpu.w2, *config("mxfp8"))
    with pytest.raises(RuntimeError, match="prepared"):
        ops.grouped_mlp_forward(*d.inputs(), *config("mxfp8"), pw)
