"""bench/ep_bench.py (expert parallelism: dispatch + combine against a raw all-to-all, the layer at EP=2
against one device): its byte arithmetic against hand-computed numbers, its router ids, and the smoke
mode end to end as a user runs it (two gloo processes on the CPU writing ep_bench.json, .md and .png).

Run: PYTHONPATH=python MXMOE_TORCH_LIBRARY=<build>/python/libmxmoe_torch.so python -m pytest python/tests/test_ep_bench.py
"""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

try:  # the byte arithmetic and the router ids need no extension; the run and the layer's constants do
    import mxmoe_torch  # noqa: F401  (loads the extension)
    NO_LIBRARY = None
except (ImportError, OSError, RuntimeError) as error:
    NO_LIBRARY = f"the mxmoe torch library does not load: {type(error).__name__}: {error}"
needs_library = pytest.mark.skipif(NO_LIBRARY is not None, reason=NO_LIBRARY or "")

import bench_scripts  # noqa: E402  (python/tests/bench_scripts.py)
from bench_scripts import ROOT  # noqa: E402

SCRIPT = bench_scripts.script_path("ep_bench")


bench = bench_scripts.load("ep_bench")


def test_scale_and_row_bytes_by_hand():
    # roundup(H / 32, 4): 64 -> 2 -> 4; 2880 -> 90 -> 92; 7168 -> 224; 4096 -> 128; 2048 -> 64
    assert [bench.scale_cols(h) for h in (64, 2880, 7168, 4096, 2048)] == [4, 92, 224, 128, 64]
    # bf16: 2H (the probability has its own call); MXFP8: H + roundup(H/32, 4) + 4 (the packed row carries
    # the float32 probability)
    assert bench.dispatch_row_bytes(64, fp8=False) == 128
    assert bench.dispatch_row_bytes(64, fp8=True) == 64 + 4 + 4 == 72
    assert bench.dispatch_row_bytes(2880, fp8=True) == 2880 + 92 + 4 == 2976
    assert bench.dispatch_row_bytes(7168, fp8=True) == 7168 + 224 + 4 == 7396
    assert bench.combine_row_bytes(7168) == 14336


@needs_library
def test_scale_cols_matches_the_layer():
    from mxmoe_torch._ep import _scale_cols
    for h in (32, 64, 96, 128, 160, 2048, 2880, 4096, 7168):
        assert bench.scale_cols(h) == _scale_cols(h), h


@needs_library
def test_dispatch_row_bytes_match_the_layer():
    """The MXFP8 row the benchmark counts is the packed row the module sends (and what _pack_rows makes)."""
    from mxmoe_torch._ep import _pack_rows, _packed_row_bytes
    for h in (32, 64, 96, 160, 2880, 7168):
        assert bench.dispatch_row_bytes(h, fp8=True) == _packed_row_bytes(h), h
        x = torch.zeros(3, h, dtype=torch.bfloat16)
        assert _pack_rows(x, torch.zeros(3)).shape == (3, bench.dispatch_row_bytes(h, fp8=True)), h


def test_payload_and_bandwidth_by_hand():
    # 10 rows dispatched, 6 received, H = 64: each of the 16 rows crosses once each way
    assert bench.payload_bytes(10, 6, 64, fp8=False) == 16 * (128 + 128) == 4096
    assert bench.payload_bytes(10, 6, 64, fp8=True) == 16 * (72 + 128) == 3200
    # 4 of the 10 rows go to this rank itself: 8 fewer row crossings
    assert bench.off_rank_bytes(10, 6, 4, 64, fp8=False) == 8 * 256 == 2048
    # dsv3, balanced, 2 ranks: 2048 tokens x 8 slots sent, as many received, 7168 wide
    assert bench.payload_bytes(16384, 16384, 7168, fp8=False) == 32768 * 28672 == 939_524_096
    assert bench.payload_bytes(16384, 16384, 7168, fp8=True) == 32768 * (7396 + 14336) == 712_114_176
    # bf16 rows: the probabilities (4 B a row, both ways, their own call) and, without a capacity, the
    # int64 counts of 32 experts both ways; MXFP8 rows carry their probabilities: the counts alone
    assert bench.overhead_bytes(10, 6, 32, capacity=-1) == 64 + 512
    assert bench.overhead_bytes(10, 6, 32, capacity=5) == 64
    assert bench.overhead_bytes(10, 6, 32, capacity=-1, fp8=True) == 512
    assert bench.overhead_bytes(10, 6, 32, capacity=5, fp8=True) == 0
    assert bench.gbps(1e9, 1.0) == pytest.approx(1000.0)
    assert bench.gbps(939_524_096, 2.0) == pytest.approx(469.762048)


@pytest.mark.parametrize("split", ["balanced", "skew"])
def test_router_ids(split):
    N, K, E = 64, 4, 16
    ids = bench.make_ids(N, K, E, split, seed=3, popularity_seed=9, zipf=1.0)
    assert ids.shape == (N, K) and ids.dtype == torch.int64 and ids.min() >= 0 and ids.max() < E
    assert all(len(set(row.tolist())) == K for row in ids), "a token picked an expert twice"
    counts = torch.bincount(ids.reshape(-1), minlength=E)
    if split == "balanced":
        assert (counts == N * K // E).all()
    else:
        assert counts.max() > 2 * N * K // E
        # the popularity order is shared (popularity_seed), the draws are not (seed)
        other = bench.make_ids(N, K, E, split, seed=4, popularity_seed=9, zipf=1.0)
        assert torch.bincount(other.reshape(-1), minlength=E).argmax() == counts.argmax()
    assert torch.equal(ids, bench.make_ids(N, K, E, split, seed=3, popularity_seed=9, zipf=1.0))


@needs_library
def test_smoke_run_writes_the_report(tmp_path):
    """Every cell of both parts on two gloo processes (the chart falls back to examples/moe_lm/png_chart.py
    where matplotlib is missing, so the PNG is always there)."""
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    out = tmp_path / "ep"
    args = [sys.executable, SCRIPT, "--device", "cpu", "--backend", "gloo", "--world", "2", "--smoke",
            "--presets", "dsv3,gptoss-120b", "--out-dir", str(out)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out / "ep_bench.json") as f:
        result = json.load(f)
    meta = result["meta"]
    assert meta["smoke"] and meta["device_type"] == "cpu" and meta["backend"] == "gloo" and meta["world"] == 2
    assert meta["errors"] == [] and meta["git"] is not None

    want = [(p, s, d, c) for p in ("dsv3", "gptoss-120b") for s in ("balanced", "skew") for d in ("bf16", "mxfp8")
            for c in (None, 1.0)]
    rows = result["part_a"]
    assert [(r["preset"], r["split"], r["dispatch"], r["capacity_factor"]) for r in rows] == want
    for r in rows:
        name = (r["preset"], r["split"], r["dispatch"], r["capacity_factor"])
        for cell in ("raw", "dc", "calls"):
            c = r["cells"][cell]
            assert "error" not in c, (name, cell, c)
            assert math.isfinite(c["ms"]) and c["ms"] > 0 and c["gbps"] > 0, (name, cell, c)
        assert r["pct_raw"] > 0 and r["bar_met"] in (True, False), name
        assert r["check"]["roundtrip_equal"], (name, r["check"])
        # the layer's-collectives cell mirrors the module's calls: count (no capacity), rows, bf16: the
        # probabilities, return; MXFP8 rows are one packed call of H + roundup(H/32, 4) + 4 bytes a row
        assert r["check"]["collectives_match"], (name, r["check"])
        calls_per_rank = r["check"]["collectives"]
        n_calls = (1 if r["capacity_factor"] is None else 0) + (2 if r["dispatch"] == "mxfp8" else 3)
        assert all(len(c) == n_calls for c in calls_per_rank), (name, calls_per_rank)
        row = 1 if r["capacity_factor"] is None else 0
        for k, c in zip(r["ranks"], calls_per_rank):
            assert c[row] == [k["n_send"] * bench.dispatch_row_bytes(r["hidden"], r["dispatch"] == "mxfp8"),
                              k["n_recv"] * bench.dispatch_row_bytes(r["hidden"], r["dispatch"] == "mxfp8")], name
        assert len(r["ranks"]) == 2
        fp8 = r["dispatch"] == "mxfp8"
        for k in r["ranks"]:
            assert k["payload_bytes"] == bench.payload_bytes(k["n_send"], k["n_recv"], r["hidden"], fp8), name
        if r["capacity_factor"] is None:
            assert sum(k["n_send"] for k in r["ranks"]) == sum(k["n_recv"] for k in r["ranks"]) == \
                2 * r["tokens"] * r["top_k"], name
        else:
            assert all(k["n_send"] == k["n_recv"] == r["experts"] * r["capacity"] for k in r["ranks"]), name
    assert any(r["check"]["dropped_slots"] > 0 for r in rows if r["split"] == "skew" and r["capacity_factor"])
    assert len(result["bars"]) == len(rows)

    blocks = result["part_b"]
    assert [(b["preset"], b["split"], b["recipe"]) for b in blocks] == [
        ("gptoss-120b", s, rc) for s in ("balanced", "skew") for rc in ("bf16", "mxfp8")]
    for b in blocks:
        for side in ("ep", "single"):
            for op in ("fwd", "fwd_bwd"):
                c = b[side][op]
                assert "error" not in c and math.isfinite(c["ms"]) and c["ms"] > 0 and c["tokens_per_s"] > 0, \
                    (b["split"], b["recipe"], side, op, c)
        assert b["single_over_ep"]["fwd_bwd"] > 0
        assert b["fp8_dispatch"] == (b["recipe"] == "mxfp8")
        assert b["check"]["y_equal"], b["check"]  # EP = the single layer on the gathered batch, bit for bit

    md = (out / "ep_bench.md").read_text()
    for text in ("## Part A: dispatch + combine against all_to_all_single of the same bytes",
                 "## Part B: ExpertParallelMLP at EP=2 against one device", "smoke run", meta["command"],
                 "| dsv3 | balanced | bf16 | none |", "| gptoss-120b | skew | mxfp8 | 1 (C=",
                 "| gptoss-120b | balanced | mxfp8 | 48 |", "Verdict:", "Bar: dispatch + combine >= 80%"):
        assert text in md, text
    png = (out / "ep_bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
