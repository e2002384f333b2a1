"""Arguments are checked before anything runs, and errors name the argument and what it got: tensors
on different devices (meta included), GroupedMLP's constructor arguments, offsets_from_counts' counts.

Run: PYTHONPATH=python MXMOE_TORCH_LIBRARY=<build>/python/libmxmoe_torch.so python -m pytest python/tests"""

import re

import pytest
import torch

import mxmoe_torch

ops = torch.ops.mxmoe
CUDA = torch.cuda.is_available()
LAYER_SCALARS = ("bf16", "swiglu", 7.0, 1.702, 1.0, "halves", False)


def layer_inputs(device="cpu", counts=(5, 3), H=64, F=64):
    g = torch.Generator().manual_seed(0)
    E, T = len(counts), sum(counts)
    bf = {"dtype": torch.bfloat16, "device": device}
    return {"x": torch.randn(T, H, generator=g).to(**bf),
            "offsets": mxmoe_torch.offsets_from_counts(torch.tensor(counts)).to(device),
            "probs": torch.rand(T, generator=g).to(device),
            "w1": (torch.randn(E, 2 * F, H, generator=g) / 8).to(**bf), "b1": None,
            "w2": (torch.randn(E, H, F, generator=g) / 8).to(**bf), "b2": None}


def device_error(name, device, ref="x", ref_device="cpu"):
    """The message of a device mismatch: `name` is on `device`, not on `ref`'s device."""
    return re.escape(f"every tensor must be on {ref}'s device ({ref_device})") + ".*" + re.escape(f"{name} is on {device}")


# ---------------------------------------------------------------- devices

@pytest.mark.parametrize("name", ["offsets", "probs", "w1", "w2"])
def test_layer_op_with_a_meta_tensor_among_cpu_ones_is_an_error(name):
    """Meta offsets with CPU data used to dispatch to the fake kernel and return uninitialised y
    (all NaN) and zero gradients, without an error."""
    args = layer_inputs()
    args[name] = args[name].to("meta")
    with pytest.raises(RuntimeError, match=device_error(name, "meta")):
        ops.grouped_mlp_forward(*args.values(), *LAYER_SCALARS)


def test_module_with_meta_offsets_is_an_error_naming_both_devices():
    args = layer_inputs()
    layer = mxmoe_torch.GroupedMLP(64, 64, 2, recipe="bf16")
    x = args["x"].requires_grad_(True)
    with pytest.raises(RuntimeError, match=device_error("offsets", "meta")):
        layer(x, args["offsets"].to("meta"), args["probs"])
    with pytest.raises(RuntimeError, match=device_error("probs", "meta")):
        layer(x, args["offsets"], args["probs"].to("meta"))
    meta_layer = mxmoe_torch.GroupedMLP(64, 64, 2, recipe="bf16", device="meta")
    with pytest.raises(RuntimeError, match=device_error("w1", "meta") + ".*w2 is on meta"):
        meta_layer(x, args["offsets"], args["probs"])


def test_backward_and_wgrad_ops_check_devices_too():
    args = layer_inputs()
    y, saved = ops.grouped_mlp_forward(*args.values(), *LAYER_SCALARS)
    dy = torch.ones_like(y)
    inputs = list(args.values())
    inputs[1] = inputs[1].to("meta")  # offsets
    with pytest.raises(RuntimeError, match=device_error("offsets", "meta")):
        ops.grouped_mlp_backward(dy, saved, *inputs, *LAYER_SCALARS, False)
    with pytest.raises(RuntimeError, match=device_error("saved_tail[0]", "meta")):
        ops.grouped_mlp_wgrad(args["x"], dy, args["offsets"], [saved[1].to("meta")], [torch.empty_like(saved[0])],
                              "bf16")


def test_lowlevel_ops_with_meta_offsets_are_errors():
    a = torch.randn(8, 64).bfloat16()
    b = torch.randn(2, 32, 64).bfloat16()
    offsets = mxmoe_torch.offsets_from_counts(torch.tensor([5, 3])).to("meta")
    with pytest.raises(RuntimeError, match=device_error("offsets", "meta", ref="a")):
        mxmoe_torch.grouped_gemm_m(a, offsets, b)
    with pytest.raises(RuntimeError, match=device_error("offsets", "meta", ref="a")):
        mxmoe_torch.grouped_gemm_k(a, a, offsets)
    with pytest.raises(RuntimeError, match=device_error("groups", "meta")):
        mxmoe_torch.quantize_mxfp8(a, "col", offsets)


def test_all_meta_still_traces():
    """A call whose tensors are all on meta is shape propagation, as before."""
    args = {k: v.to("meta") if v is not None else None for k, v in layer_inputs().items()}
    y, saved = ops.grouped_mlp_forward(*args.values(), *LAYER_SCALARS)
    assert y.device.type == "meta" and y.shape == args["x"].shape


@pytest.mark.skipif(not CUDA, reason="no CUDA device")
@pytest.mark.parametrize("name", ["offsets", "probs", "w1"])
def test_cuda_layer_op_with_a_cpu_tensor_is_an_error(name):
    """The C++ kernels' DeviceCheck (a CPU/CUDA mix dispatches to the CUDA kernel)."""
    args = layer_inputs("cuda")
    args[name] = args[name].cpu()
    with pytest.raises(RuntimeError, match=device_error(name, "cpu", ref_device="cuda:0")):
        ops.grouped_mlp_forward(*args.values(), *LAYER_SCALARS)
    a = args["x"]
    with pytest.raises(RuntimeError, match=device_error("offsets", "cpu", ref="a", ref_device="cuda:0")):
        mxmoe_torch.grouped_gemm_m(a, args["offsets"].cpu(), args["w2"])


# ---------------------------------------------------------------- GroupedMLP's arguments

@pytest.mark.parametrize("kwargs, error, message", [
    ({"hidden": 0}, ValueError, "hidden must be in \\[1, 2\\^20\\], got 0"),
    ({"ffn": -64}, ValueError, "ffn must be in \\[1, 2\\^20\\], got -64"),
    ({"experts": 0}, ValueError, "experts must be in \\[1, 2\\^20\\], got 0"),
    ({"experts": 2.5}, TypeError, "experts must be an int, got 2.5"),
    ({"hidden": True}, TypeError, "hidden must be an int, got True"),
    ({"hidden": 48}, ValueError, "hidden must be a multiple of 32 for recipe='mxfp8', got 48"),
    ({"ffn": 36, "recipe": "bf16"}, ValueError, "ffn must be a multiple of 8 for recipe='bf16', got 36"),
    ({"ffn": 40, "recipe": "bf16", "glu_layout": "interleave32"}, ValueError,
     "ffn must be a multiple of 32 for glu_layout='interleave32', got 40"),
    ({"activation": "gelu"}, ValueError, "activation must be one of 'swiglu', 'clamped_swiglu', got 'gelu'"),
    ({"glu_layout": "interleaved"}, ValueError, "glu_layout must be one of 'halves', 'interleave32', got 'interleaved'"),
    ({"recipe": "fp8"}, ValueError, "recipe must be one of 'mxfp8', 'bf16', 'fp8_blockwise', 'fp8_blockwise_pow2', got 'fp8'"),
    ({"recipe": None}, ValueError, "recipe must be one of 'mxfp8', 'bf16', 'fp8_blockwise', 'fp8_blockwise_pow2', got None"),
    ({"bias": "yes"}, TypeError, "bias must be a bool, got 'yes'"),
    ({"scale_fc2_bias": True}, ValueError, "scale_fc2_bias=True needs bias=True"),
    ({"activation": "clamped_swiglu", "limit": 0.0}, ValueError, "limit must be > 0, got 0.0"),
    ({"activation": "clamped_swiglu", "limit": float("inf")}, ValueError, "limit must be a finite number, got inf"),
    ({"alpha": float("nan")}, ValueError, "alpha must be a finite number, got nan"),
    ({"linear_offset": "1"}, ValueError, "linear_offset must be a finite number, got '1'"),
    ({"dtype": torch.float32}, ValueError, "dtype must be torch.bfloat16"),
])
def test_grouped_mlp_rejects_bad_arguments_naming_them(kwargs, error, message):
    args = {"hidden": 64, "ffn": 64, "experts": 4, **kwargs}
    with pytest.raises(error, match="GroupedMLP: " + message):
        mxmoe_torch.GroupedMLP(**args)


def test_grouped_mlp_accepts_what_the_library_takes():
    m = mxmoe_torch.GroupedMLP(8, 16, 1, "clamped_swiglu", "halves", True, "bf16", scale_fc2_bias=True, limit=3,
                               alpha=2, linear_offset=0)
    assert m.config == ("bf16", "clamped_swiglu", 3.0, 2.0, 0.0, "halves", True)
    assert all(isinstance(v, float) for v in m.config[2:5])


# ---------------------------------------------------------------- offsets_from_counts

def test_offsets_from_counts_rejects_negative_counts():
    with pytest.raises(ValueError, match=re.escape("token counts must be >= 0, got counts[1] = -3")):
        mxmoe_torch.offsets_from_counts(torch.tensor([4, -3, 5]))
    with pytest.raises(ValueError, match="counts\\[0\\] = -1"):
        mxmoe_torch.offsets_from_counts(torch.tensor([-1, 2], dtype=torch.int16), check_values=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool])
def test_offsets_from_counts_rejects_non_integer_dtypes(dtype):
    with pytest.raises(TypeError, match=f"counts must have an integer dtype.*got {dtype}"):
        mxmoe_torch.offsets_from_counts(torch.tensor([1, 2, 3]).to(dtype))


def test_offsets_from_counts_shape_and_values():
    with pytest.raises(ValueError, match="counts must be 1-D"):
        mxmoe_torch.offsets_from_counts(torch.tensor([[1, 2]]))
    with pytest.raises(TypeError, match="counts must be a tensor, got list"):
        mxmoe_torch.offsets_from_counts([1, 2])
    for dtype in (torch.uint8, torch.int8, torch.int32, torch.int64):
        got = mxmoe_torch.offsets_from_counts(torch.tensor([3, 0, 2], dtype=dtype))
        assert got.dtype == torch.int32 and got.tolist() == [0, 3, 3, 5]
    assert mxmoe_torch.offsets_from_counts(torch.tensor([], dtype=torch.int64)).tolist() == [0]
