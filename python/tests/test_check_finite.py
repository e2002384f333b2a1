"""GroupedMLP(check_finite=True): the library's Options::check_finite through the torch ops. A NaN or
Inf in x, probs, a weight or a bias (forward) or in dy (backward) raises naming the tensor, the first
bad value's coordinates and its kind, before anything is written; off (the default) a NaN propagates
(docs/numerics.md "Non-finite values").

Run: PYTHONPATH=python MXMOE_TORCH_LIBRARY=<build>/python/libmxmoe_torch.so python -m pytest python/tests"""

import re

import pytest
import torch

import mxmoe_torch

CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])
BAD = [("NaN", float("nan")), ("+Inf", float("inf")), ("-Inf", float("-inf"))]


def make(device, recipe="mxfp8", check_finite=True, counts=(5, 0, 4)):
    torch.manual_seed(0)
    layer = mxmoe_torch.GroupedMLP(64, 64, len(counts), bias=True, recipe=recipe, check_finite=check_finite,
                                   device=device)
    with torch.no_grad():
        layer.b1.uniform_(-0.5, 0.5)
        layer.b2.uniform_(-0.5, 0.5)
    T = sum(counts)
    x = torch.randn(T, 64, device=device, dtype=torch.bfloat16)
    offsets = mxmoe_torch.offsets_from_counts(torch.tensor(counts)).to(device)
    probs = torch.rand(T, device=device)
    return layer, x, offsets, probs


def message(name, kind, at):
    return re.escape(f"{name}: holds {kind} at [{', '.join(map(str, at))}]")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,value", BAD)
@pytest.mark.parametrize("name,first,later", [
    ("x", (3, 7), (8, 0)), ("probs", (2,), (6,)), ("w1", (1, 100, 5), (2, 0, 0)), ("b1", (0, 9), (2, 3)),
    ("w2", (2, 63, 1), (2, 63, 2)), ("b2", (1, 60), (2, 0))])
def test_forward_refuses_a_non_finite_input_naming_it(device, kind, value, name, first, later):
    layer, x, offsets, probs = make(device)
    inputs = {"x": x, "probs": probs}
    target = inputs[name] if name in inputs else getattr(layer, name)
    with torch.no_grad():
        target[first] = value
        target[later] = float("nan")
    with pytest.raises(RuntimeError, match=message(name, kind, first)):
        layer(x, offsets, probs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,value", BAD)
def test_backward_refuses_a_non_finite_dy_and_leaves_no_gradient(device, kind, value):
    layer, x, offsets, probs = make(device)
    x.requires_grad_(True)
    y = layer(x, offsets, probs)
    dy = torch.randn_like(y)
    dy[4, 10] = value
    dy[7, 0] = float("nan")
    with pytest.raises(RuntimeError, match=message("dy", kind, (4, 10))):
        y.backward(dy)
    assert x.grad is None and layer.w1.grad is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["mxfp8", "bf16"])
def test_finite_inputs_give_the_same_results_checked_or_not(device, recipe):
    outs = []
    for check in (False, True):
        layer, x, offsets, probs = make(device, recipe, check)
        x.requires_grad_(True)
        y = layer(x, offsets, probs)
        y.backward(torch.ones_like(y))
        outs.append((y, x.grad, layer.w1.grad, layer.b2.grad))
    for a, b in zip(*outs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_off_by_default_a_nan_propagates(device):
    layer, x, offsets, probs = make(device, check_finite=False)
    assert mxmoe_torch.GroupedMLP(64, 64, 2).check_finite is False
    x[3, 7] = float("nan")
    y = layer(x, offsets, probs)
    assert not torch.isfinite(y[3]).all() and torch.isfinite(y[:3]).all()


def test_the_attribute_turns_it_on_later_and_must_be_a_bool():
    layer, x, offsets, probs = make("cpu", check_finite=False)
    x[0, 0] = float("inf")
    layer(x, offsets, probs)
    layer.check_finite = True
    with pytest.raises(RuntimeError, match=message("x", "+Inf", (0, 0))):
        layer(x, offsets, probs)
    with pytest.raises(TypeError, match="check_finite must be a bool"):
        mxmoe_torch.GroupedMLP(64, 64, 2, check_finite=1)


def test_the_ops_take_it_last():
    layer, x, offsets, probs = make("cpu")
    x[1, 2] = float("-inf")
    with pytest.raises(RuntimeError, match=message("x", "-Inf", (1, 2))):
        torch.ops.mxmoe.grouped_mlp_forward(x, offsets, probs, layer.w1, layer.b1, layer.w2, layer.b2, *layer.config,
                                            None, True)
    torch.ops.mxmoe.grouped_mlp_forward(x, offsets, probs, layer.w1, layer.b1, layer.w2, layer.b2, *layer.config)
