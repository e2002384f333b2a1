"""Argument checks shared by the module, the op wrappers and the fake kernels. Errors name the
argument and the value they got."""

import torch


def _named_tensors(named):
    for name, value in named:
        if isinstance(value, torch.Tensor):
            yield name, value
        elif isinstance(value, (list, tuple)):
            for i, t in enumerate(value):
                if isinstance(t, torch.Tensor):
                    yield f"{name}[{i}]", t


def check_devices(op, *named):
    """Every tensor of `named` ((name, tensor | None | list of tensors) pairs) on the device of the
    first tensor given. Meta counts as a device: meta offsets with CPU data are an error, not a
    fake result. The C++ kernels check the same for CPU/CUDA mixes (bridge.h, DeviceCheck)."""
    tensors = list(_named_tensors(named))
    if not tensors:
        return
    ref_name, ref = tensors[0]
    wrong = [f"{name} is on {t.device}" for name, t in tensors[1:] if t.device != ref.device]
    if wrong:
        raise RuntimeError(f"mxmoe: {op}: every tensor must be on {ref_name}'s device ({ref.device}), but "
                           + ", ".join(wrong))
