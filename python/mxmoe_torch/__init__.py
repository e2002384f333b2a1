"""PyTorch integration of mxmoe: torch.ops.mxmoe.* custom ops and the GroupedMLP module.

    import mxmoe_torch
    layer = mxmoe_torch.GroupedMLP(hidden=1024, ffn=512, experts=8, recipe="mxfp8").cuda()
    y = layer(x, offsets, probs)      # x bf16 [T, H] sorted by expert, offsets int32 [E+1] on the device
    y.float().pow(2).mean().backward()

The extension library (libmxmoe_torch.so) is found next to this file (``pip install .``) or at
$MXMOE_TORCH_LIBRARY (a CMake build tree). See docs/pytorch.md.
"""

import glob
import os

import torch

__all__ = ["GroupedMLP", "offsets_from_counts", "quantize_mxfp8", "dequantize_mxfp8", "grouped_gemm_m",
           "grouped_gemm_k", "library_path"]


def library_path():
    env = os.environ.get("MXMOE_TORCH_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "libmxmoe_torch*.so")))
    if not found:
        raise ImportError("mxmoe_torch: libmxmoe_torch.so is not next to the package; install it with "
                          "`pip install .` or point $MXMOE_TORCH_LIBRARY at a CMake-built one")
    return found[0]


torch.ops.load_library(library_path())

from . import _fake  # noqa: E402,F401  (registers the fake kernels)
from ._layer import GroupedMLP, offsets_from_counts  # noqa: E402

_ops = torch.ops.mxmoe


def quantize_mxfp8(x, axis="row", groups=None, scale_layout="compact"):
    """bf16 [M, K] -> (float8_e4m3fn [M, K], uint8 E8M0 scales). axis "col" restarts blocks at each
    group of `groups` (int32 [E+1] offsets)."""
    return _ops.quantize_mxfp8(x, axis, groups, scale_layout)


def dequantize_mxfp8(data, scales, axis="row", groups=None, scale_layout="compact", dtype=torch.float32):
    return _ops.dequantize_mxfp8(data, scales, axis, groups, scale_layout, dtype)


def grouped_gemm_m(a, offsets, b, *, a_scales=None, b_scales=None, b_kn=False, bias=None, scale_layout="compact",
                   dtype=torch.bfloat16):
    """D[t] = A[t] . B_e (+ bias_e) for the rows t of group e. B [E, N, K] (or [E, K, N] with b_kn)."""
    return _ops.grouped_gemm_m(a, a_scales, offsets, b, b_scales, b_kn, bias, scale_layout, dtype)


def grouped_gemm_k(a, b, offsets, *, a_scales=None, b_scales=None, out=None, accumulate=False,
                   scale_layout="compact", dtype=torch.float32):
    """D_e = A_e^T B_e over each group's rows: [E, M, N]. With `out`, writes (or adds, accumulate) there."""
    if out is None:
        return _ops.grouped_gemm_k(a, a_scales, b, b_scales, offsets, scale_layout, dtype)
    _ops.grouped_gemm_k_(a, a_scales, b, b_scales, offsets, out, accumulate, scale_layout)
    return out
