"""bench/hf_layer_bench.py (one transformers decoder layer, mxmoe vs grouped_mm): the smoke mode on the
CPU end to end as a user runs it (a subprocess writing hf_layer_bench.json, .md and .png), eager and
torch.compile, and its presets' configs against the published model dimensions.

Run: PYTHONPATH=python MXMOE_TORCH_LIBRARY=<build>/python/libmxmoe_torch.so python -m pytest python/tests"""

import json
import subprocess
import sys

import pytest

pytest.importorskip("transformers", reason="transformers is not installed (python/requirements-test.txt pins it)")

import bench_scripts  # noqa: E402  (python/tests/bench_scripts.py)
from bench_scripts import ROOT  # noqa: E402
from test_moe_example import read_png  # noqa: E402

bench = bench_scripts.load("hf_layer_bench")


def test_presets_have_the_models_dimensions():
    # (hidden, expert ffn, experts, top-k, layer class) of Qwen3-30B-A3B, gpt-oss-120b, Mixtral 8x7B.
    want = {"qwen3-30b-a3b": (2048, 768, 128, 8), "gpt-oss-120b": (2880, 2880, 128, 4),
            "mixtral-8x7b": (4096, 14336, 8, 2)}
    for preset, (H, F, E, K) in want.items():
        cfg = bench.make_config(preset, smoke=False)
        experts = getattr(cfg, "num_experts", None) or cfg.num_local_experts
        ffn = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
        assert (cfg.hidden_size, ffn, experts, cfg.num_experts_per_tok, cfg.num_hidden_layers) == (H, F, E, K, 1)


def test_smoke_run_writes_table_and_chart(tmp_path):
    args = [sys.executable, bench_scripts.script_path("hf_layer_bench"), "--device", "cpu", "--smoke",
            "--out-dir", str(tmp_path), "--presets", "gpt-oss-120b", "--implementations", "grouped_mm", "mxmoe",
            "mxmoe_mxfp8", "--warmup", "1", "--iters", "1"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(tmp_path / "hf_layer_bench.json") as f:
        result = json.load(f)
    rows = result["rows"]
    assert [(r["mode"], r["implementation"]) for r in rows] == [
        (m, i) for m in ("eager", "compile") for i in ("grouped_mm", "mxmoe", "mxmoe_mxfp8")]
    for r in rows:
        assert "error" not in r, r
        assert r["ms"] > 0
        if r["implementation"] != "grouped_mm":
            # The same layer: bf16 within bf16 rounding of grouped_mm's expert gradient, mxfp8 within 0.25
            # (clamped SwiGLU, docs/numerics.md "Tolerances").
            assert r["grad_rel_err"] < (2e-2 if r["implementation"] == "mxmoe" else 0.25), r
            assert r["speedup"] > 0
    assert result["shapes"]["gpt-oss-120b"]["layer_class"] == "GptOssDecoderLayer"
    md = (tmp_path / "hf_layer_bench.md").read_text()
    assert "| gpt-oss-120b | compile | mxmoe |" in md and "Target (issue 37)" in md
    width, height, depth, _, _, _ = read_png(tmp_path / "hf_layer_bench.png")
    assert width > 100 and height > 100 and depth == 8
