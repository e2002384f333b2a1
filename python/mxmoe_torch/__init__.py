"""PyTorch integration of mxmoe: torch.ops.mxmoe.* custom ops, the GroupedMLP module and the MoE block.

    import mxmoe_torch
    layer = mxmoe_torch.GroupedMLP(hidden=1024, ffn=512, experts=8, recipe="mxfp8").cuda()
    y = layer(x, offsets, probs)      # x bf16 [T, H] sorted by expert, offsets int32 [E+1] on the device
    y.float().pow(2).mean().backward()

The extension library (libmxmoe_torch.so) is found next to this file (``pip install .``) or at
$MXMOE_TORCH_LIBRARY (a CMake build tree). It records the torch it was built against; under another
torch, importing says so with both versions. See docs/pytorch.md.
"""

import glob
import os

import torch

from . import _build_info

__all__ = ["GroupedMLP", "MoE", "offsets_from_counts", "quantize_mxfp8", "dequantize_mxfp8", "grouped_gemm_m",
           "grouped_gemm_k", "permute", "unpermute", "permute_by_map", "permuted_rows_bound", "Permuted",
           "Unpermuted", "PermutedByMap", "library_path", "build_info", "ExpertParallelMLP", "expert_parallel_mlp",
           "all_to_all", "release_cached_memory"]


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


_LIBRARY = library_path()
_build_info.load(_LIBRARY, torch)


def build_info():
    """{"torch": the torch version the loaded extension was built against, "mxmoe": the project
    version compiled into it} (empty for a library without the record)."""
    return _build_info.read(_LIBRARY)


def release_cached_memory():
    """Give back the device memory mxmoe's own pools keep reserved between calls and no live buffer
    holds: the kernels' scratch (the layer's tensors come from torch's caching allocator, which
    torch.cuda.empty_cache() trims). MXMOE_POOL_RELEASE_BYTES caps what the pools keep. No-op
    without CUDA."""
    torch.ops.mxmoe.release_cached_memory()


def _version():
    # One source of truth: pyproject.toml's version, which equals CMakeLists.txt's project VERSION
    # (python/tests/test_packaging.py checks it). Installed, the package metadata has it; run from a
    # source tree (PYTHONPATH=python), the value CMake compiled into the extension.
    try:
        from importlib import metadata
        dist = metadata.distribution("mxmoe-torch")
        if os.path.realpath(str(dist.locate_file("mxmoe_torch/__init__.py"))) == os.path.realpath(__file__):
            return dist.version
    except Exception:  # not installed (or installed elsewhere than this copy)
        pass
    return build_info().get("mxmoe", "unknown")


__version__ = _version()

from . import _fake  # noqa: E402,F401  (registers the fake kernels)
from ._fake import permuted_rows_bound  # noqa: E402
from ._layer import GroupedMLP, offsets_from_counts  # noqa: E402
from ._moe import MoE  # noqa: E402
from ._ep import ExpertParallelMLP, all_to_all, expert_parallel_mlp  # noqa: E402
from ._permute import Permuted, PermutedByMap, Unpermuted, permute, permute_by_map, unpermute  # noqa: E402

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
