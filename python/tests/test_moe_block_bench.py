"""bench/moe_block_peer.py (permute/unpermute and the whole MoE block beside PyTorch): the smoke mode on
the CPU end to end as a user runs it (a subprocess writing moe_block.json, .md and .png), its presets
against tools/mxmoe/presets.cpp, its router ids, and its PyTorch block's padded permutation against the
same block without padding.

Run: PYTHONPATH=python MXMOE_TORCH_LIBRARY=<build>/python/libmxmoe_torch.so python -m pytest python/tests"""

import json
import os
import re
import subprocess
import sys

import pytest
import torch

import bench_scripts  # noqa: E402  (python/tests/bench_scripts.py)
from bench_scripts import ROOT  # noqa: E402

SCRIPT = bench_scripts.script_path("moe_block_peer")


bench = bench_scripts.load("moe_block_peer")


def _grouped_mm_on_cpu():
    """None when torch._grouped_mm runs forward and backward (k-grouped) on CPU bf16, else why not."""
    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no torch._grouped_mm"
    try:
        a = torch.randn(32, 16, dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(2, 16, 8, dtype=torch.bfloat16, requires_grad=True)
        y = torch._grouped_mm(a, w, offs=torch.tensor([16, 32], dtype=torch.int32))
        y.backward(torch.ones_like(y))  # a real (not expanded) upstream gradient
    except Exception as e:  # noqa: BLE001
        return f"torch._grouped_mm does not run on the CPU here: {type(e).__name__}: {e}"
    return None


NO_GROUPED_MM = _grouped_mm_on_cpu()
needs_grouped_mm = pytest.mark.skipif(NO_GROUPED_MM is not None, reason=NO_GROUPED_MM or "")


def test_presets_match_the_cli():
    with open(os.path.join(ROOT, "tools", "mxmoe", "presets.cpp")) as f:
        text = f.read()
    rows = re.findall(r'\{"([\w.-]+)", (\d+), (\d+), (\d+), (\d+), Activation::(\w+), GluLayout::(\w+)\}', text)
    cli = {name: (int(h), int(f), int(e), int(t), act, layout) for name, h, f, e, t, act, layout in rows}
    assert set(bench.PRESETS) <= set(cli), (sorted(bench.PRESETS), sorted(cli))
    for name, p in bench.PRESETS.items():
        h, f, e, t, act, layout = cli[name]
        assert (p["hidden"], p["ffn"], p["experts"], p["routed"]) == (h, f, e, t), name
        assert bench.pt.PRESET_GLU[name] == (act, layout), name
        assert p["routed"] % p["top_k"] == 0 and p["top_k"] <= p["experts"], name
    assert {n: p["top_k"] for n, p in bench.PRESETS.items()} == {"dsv3": 8, "qwen3-30b": 8, "gptoss-120b": 4,
                                                                  "mixtral": 2}


@pytest.mark.parametrize("split", ["balanced", "skew"])
def test_router_ids(split):
    N, K, E = 64, 4, 16
    ids = bench.make_ids(N, K, E, split, seed=3)
    assert ids.shape == (N, K) and ids.dtype == torch.int64
    assert ids.min() >= 0 and ids.max() < E
    assert all(len(set(row.tolist())) == K for row in ids), "a token picked an expert twice"
    counts = torch.bincount(ids.reshape(-1), minlength=E)
    if split == "balanced":
        assert (counts == N * K // E).all()
    else:
        assert counts.max() > 2 * N * K // E  # skewed
    assert torch.equal(ids, bench.make_ids(N, K, E, split, seed=3))


def test_torch_permute_matches_the_definition():
    N, K, E, H = 40, 3, 8, 16
    ids = bench.make_ids(N, K, E, "skew", seed=5)
    x = torch.randn(N, H).to(torch.bfloat16)
    probs = torch.rand(N, K)
    px, offsets, row_map, pp, tok = bench.torch_permute(x, ids, probs, E)
    assert offsets.tolist() == [0] + torch.cumsum(torch.bincount(ids.reshape(-1), minlength=E), 0).tolist()
    for t in range(N):
        for k in range(K):
            r = int(row_map[t, k])
            assert torch.equal(px[r], x[t]) and pp[r] == probs[t, k] and int(tok[r]) == t
            assert offsets[ids[t, k]] <= r < offsets[ids[t, k] + 1]
    py = torch.randn(N * K, H).to(torch.bfloat16)
    a = bench.torch_unpermute_index_add(py, tok, N)
    b = bench.torch_unpermute_gather(py, row_map)
    want = torch.stack([sum(py[int(row_map[t, k])].float() for k in range(K)) for t in range(N)]).to(torch.bfloat16)
    assert torch.equal(b, want)
    assert (a.float() - want.float()).abs().max() <= want.float().abs().max() * 2 ** -7


@needs_grouped_mm
@pytest.mark.parametrize("preset", ["dsv3", "gptoss-120b"])
def test_padded_torch_block_equals_the_unpadded_one(preset):
    """Padding every expert group to 16 rows (what torch._grouped_mm's k-grouped backward needs on a
    GPU) changes neither y nor any gradient: padding rows are zeros with probability 0."""
    shape = bench.preset_shape(preset, smoke=True)
    N, K, H, F, E = (shape[k] for k in ("tokens", "top_k", "hidden", "ffn", "experts"))
    torch.manual_seed(0)
    x = torch.randn(N, H).to(torch.bfloat16).requires_grad_(True)
    wr = (torch.randn(E, H) / H ** 0.5).requires_grad_(True)
    w1 = (torch.randn(E, 2 * F, H) / H ** 0.5).to(torch.bfloat16).requires_grad_(True)
    w2 = (torch.randn(E, H, F) / F ** 0.5).to(torch.bfloat16).requires_grad_(True)
    dy = torch.randn(N, H).to(torch.bfloat16)
    got = {}
    for align in (1, 16):
        block, rows = bench.make_torch_block(N, K, E, F, shape["activation"], shape["glu_layout"], align)
        assert rows == bench.padded_rows(N, K, E, align) and rows % align == 0
        y = block(x, wr, w1, w2)
        got[align] = [y] + list(torch.autograd.grad(y, (x, wr, w1, w2), dy))
    assert got[16][1:] and len(got[16]) == 5
    for a, b in zip(got[1], got[16]):
        assert bench.rel_err(b, a) < 1e-3


@needs_grouped_mm
def test_smoke_run_writes_the_report(tmp_path):
    """The CPU smoke mode end to end (aot_eager keeps the torch.compile peer to seconds here; the GPU
    run uses inductor)."""
    out = tmp_path / "moe"
    args = [sys.executable, SCRIPT, "--device", "cpu", "--smoke", "--presets", "dsv3,gptoss-120b",
            "--compile-backend", "aot_eager", "--out-dir", str(out)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out / "moe_block.json") as f:
        result = json.load(f)
    meta = result["meta"]
    assert meta["smoke"] and meta["device_type"] == "cpu" and meta["errors"] == []
    assert [(r["preset"], r["split"]) for r in result["permute"]] == [
        ("dsv3", "balanced"), ("dsv3", "skew"), ("gptoss-120b", "balanced"), ("gptoss-120b", "skew")]
    for r in result["permute"]:
        for op, impl, _ in bench.A_CELLS:
            if impl.endswith("_graph"):  # GPU time (CUDA graphs): measured on a CUDA device only
                assert impl not in r["cells"][op], (op, impl)
                continue
            cell = r["cells"][op][impl]
            assert cell.get("ms", 0) > 0 and cell["gbps"] > 0 and cell["pct_copy"] > 0, (op, impl, cell)
        ch = r["checks"]
        assert all(ch[k] for k in ("permute_x_equal", "permute_offsets_equal", "permute_row_map_equal",
                                   "permute_probs_equal", "permute_by_map_equal")), ch
        assert ch["unpermute_max_abs_diff_vs_gather"] <= ch["unpermute_max_abs"] * 2 ** -7, ch
    assert [b["preset"] for b in result["block"]] == ["dsv3", "gptoss-120b"]
    for b in result["block"]:
        for op in ("fwd", "fwd_bwd"):
            for v, _ in bench.B_VARIANTS:
                assert b["ops"][op][v].get("ms", 0) > 0, (b["preset"], op, v, b["ops"][op][v])
        ch = b["checks"]
        assert max(ch["mxmoe_bf16"].values()) < 2e-2, ch
        assert max(ch["mxmoe_mxfp8"].values()) < 0.1, ch
        assert max(ch["torch_compile"].values()) < 1e-2, ch
        assert b["ratios"]["mxmoe_mxfp8"]["compile_over_mxmoe"] > 0
        assert b["compile_graph_breaks"] == 0
    assert len([r for r in result["bars"]["rows"]]) == 4 * 2 + 2
    md = (out / "moe_block.md").read_text()
    for heading in ("## Permute and unpermute against PyTorch ops and the copy ceiling",
                    "## The MoE block, forward + backward", "smoke run", "| dsv3 | balanced |",
                    "compile / mxfp8", "padded to a multiple of 16 rows"):
        assert heading in md, heading
    png = (out / "moe_block.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
