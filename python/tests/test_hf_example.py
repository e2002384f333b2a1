"""examples/hf/train.py: a few CPU steps of the small Qwen3-MoE-shaped transformers model with
experts_implementation grouped_mm, mxmoe and mxmoe_mxfp8, as a user runs it (a subprocess with the CLI
flags): the three runs start from the same weights and batches (the same first loss up to the
recipe's rounding), every loss falls, and curves.csv, curves.json and a valid PNG are written.

Run: PYTHONPATH=python MXMOE_TORCH_LIBRARY=<build>/python/libmxmoe_torch.so python -m pytest python/tests"""

import csv
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers", reason="transformers is not installed (python/requirements-test.txt pins it)")

from test_moe_example import read_png  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "hf", "train.py")
STEPS = 16


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf")
    args = [sys.executable, SCRIPT, "--device", "cpu", "--steps", str(STEPS), "--out", str(out), "--hidden", "64",
            "--layers", "1", "--heads", "2", "--experts", "8", "--top-k", "2", "--moe-ffn", "32", "--seq-len", "32",
            "--batch-size", "8", "--eval-batches", "2", "--log-every", "0", "--lr", "3e-3"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc.stdout


def test_three_implementations_learn_from_the_same_start(run):
    out, stdout = run
    with open(out / "curves.json") as f:
        result = json.load(f)
    runs = result["runs"]
    assert list(runs) == ["grouped_mm", "mxmoe", "mxmoe_mxfp8"]
    first = runs["grouped_mm"]["train_loss"][0]
    for name, r in runs.items():
        losses = r["train_loss"]
        assert len(losses) == STEPS
        assert abs(losses[0] - first) < 0.01 * first, f"{name} starts where grouped_mm does"
        assert sum(losses[-4:]) / 4 < 0.8 * losses[0], f"{name}: the loss falls"
        assert r["eval"][-1][0] == STEPS - 1
        assert f"{name:>12}: final held-out loss" in stdout
    assert result["meta"]["model"] == "Qwen3MoeForCausalLM"


def test_writes_csv_and_png(run):
    out, _ = run
    with open(out / "curves.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["step", "grouped_mm", "mxmoe", "mxmoe_mxfp8"]
    assert [int(r[0]) for r in rows[1:]] == list(range(STEPS))
    width, height, depth, color, interlace, _ = read_png(out / "loss_curves.png")
    assert width > 100 and height > 100 and depth == 8 and interlace == 0
