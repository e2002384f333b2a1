"""examples/moe_lm/train.py: a few CPU steps of the byte-level MoE language model, BF16 then MXFP8, as
a user runs it (a subprocess with the CLI flags): the loss goes down, both runs start from the same
weights and data, and curves.json and loss_curves.png are written. Small sizes keep it to seconds.

Run: PYTHONPATH=python MXMOE_TORCH_LIBRARY=<build>/python/libmxmoe_torch.so python -m pytest python/tests"""

import json
import os
import struct
import subprocess
import sys
import zlib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "moe_lm")
SCRIPT = os.path.join(EXAMPLE, "train.py")


def read_png(path):
    """(width, height, rows of RGB bytes) of an 8-bit RGB, non-interlaced PNG (what png_chart.py
    writes); checks the signature and every chunk's CRC."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, kind
        chunks.append((kind, body))
        pos += 12 + length
    assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND"
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    return width, height, depth, color, interlace, b"".join(b for k, b in chunks if k == b"IDAT")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("moe_lm")
    args = [sys.executable, SCRIPT, "--device", "cpu", "--steps", "12", "--out", str(out), "--hidden", "32",
            "--heads", "2", "--ffn", "32", "--layers", "1", "--experts", "4", "--seq-len", "32",
            "--batch-size", "8", "--eval-every", "6", "--eval-batches", "2", "--log-every", "0", "--lr", "1e-2",
            "--warmup", "0"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc.stdout


def test_both_recipes_learn_and_write_their_curves(run):
    out, stdout = run
    with open(out / "curves.json") as f:
        result = json.load(f)
    runs = result["runs"]
    assert list(runs) == ["bf16", "mxfp8"]
    for recipe, r in runs.items():
        losses = r["train_loss"]
        assert len(losses) == 12 and r["steps"] == list(range(12))
        assert all(l == l and l < 20 for l in losses), losses  # finite
        # Byte-level: the first loss is about ln(256) = 5.5; a dozen steps at lr 1e-2 take it well down.
        assert 4.5 < losses[0] < 7.5, losses
        assert sum(losses[-3:]) / 3 < losses[0] - 1.0, (recipe, losses)
        assert r["eval_steps"] == [6, 11] and r["final_eval_loss"] == r["eval_loss"][-1] < losses[0]
    # Same seed, weights and batches: the recipes differ only by rounding at the first step.
    assert abs(runs["bf16"]["train_loss"][0] - runs["mxfp8"]["train_loss"][0]) < 0.05
    assert "relative_gap" in result and abs(result["relative_gap"]) < 0.5
    # The text: fixed standard-library sources, recorded with their hashes.
    assert [f["module"] for f in result["text_files"]][:2] == ["argparse", "textwrap"]
    assert all(len(f["sha256"]) == 64 and f["bytes"] > 1000 for f in result["text_files"])
    # The report on stdout.
    assert "bf16: final held-out loss" in stdout and "mxfp8: final held-out loss" in stdout
    assert "relative gap (mxfp8 - bf16) / bf16:" in stdout


def test_png_is_written(run):
    out, stdout = run
    path = out / "loss_curves.png"
    assert path.exists() and path.stat().st_size > 1000
    if "drawn with matplotlib" in stdout:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        return
    width, height, depth, color, interlace, idat = read_png(path)
    assert (width, height, depth, color, interlace) == (900, 540, 8, 2, 0)
    raw = zlib.decompress(idat)
    assert len(raw) == height * (1 + 3 * width)
    # Both series' colours are on the picture (blue: BF16, orange: MXFP8).
    assert bytes((31, 119, 180)) in raw and bytes((255, 127, 14)) in raw


def test_png_chart_draws_without_dependencies(tmp_path):
    sys.path.insert(0, EXAMPLE)
    try:
        from png_chart import nice_ticks, write_line_chart
    finally:
        sys.path.remove(EXAMPLE)
    assert nice_ticks(2.13, 5.9) == [2.0, 3.0, 4.0, 5.0, 6.0]
    assert nice_ticks(2.1, 2.3) == [2.1, 2.15, 2.2, 2.25, 2.3]
    assert nice_ticks(0, 99) == [0, 20, 40, 60, 80, 100]
    path = tmp_path / "c.png"
    write_line_chart(str(path), {"A": ([0, 1, 2], [3.0, 2.0, 1.5]), "B": ([0, 1, 2], [3.1, 2.2, float("nan")])},
                     title="T", x_label="STEP", y_label="LOSS", width=200, height=120)
    width, height, _, _, _, idat = read_png(path)
    assert (width, height) == (200, 120) and len(zlib.decompress(idat)) == 120 * (1 + 600)
