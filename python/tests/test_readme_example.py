"""The README's PyTorch example runs as written (on the GPU where there is one, else on the CPU)."""
import pathlib
import re

import torch


def test_readme_pytorch_example_runs_and_produces_gradients():
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = re.search(r"```python\n(import torch, mxmoe_torch.*?)```", readme, re.S).group(1)
    scope = {}
    exec(compile(block, "README.md", "exec"), scope)
    y, x, probs, layer = scope["y"], scope["x"], scope["probs"], scope["layer"]
    assert y.shape == x.shape and y.dtype == torch.bfloat16
    assert torch.isfinite(y.float()).all()
    for g in (x.grad, probs.grad, layer.w1.grad, layer.w2.grad, layer.b1.grad, layer.b2.grad):
        assert g is not None and torch.isfinite(g.float()).all() and g.float().abs().sum() > 0
