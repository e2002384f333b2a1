#!/usr/bin/env python3
"""The whole MoE block beside PyTorch, same device, same run (issue "The whole MoE block", item 5).

Part A, permute / unpermute (forward ops), every preset, balanced and skewed router ids:
  - mxmoe_torch.permute (routing + row move + probs), permute_by_map (the row move alone, for a given
    row map) and unpermute (fp32 sum of each token's K rows, rounded once to bf16);
  - the same in PyTorch ops: a stable argsort of the flattened ids, index gathers of rows and probs,
    counts by scatter_add + cumsum offsets, the row map by scatter; unpermute by index_add_ into an
    fp32 buffer, and by a gather + fp32 sum over k; each EAGER and under torch.compile;
  - the ceiling: a device copy (dst.copy_(src)) of the permuted rows' bytes.
  GB/s and % of the copy's GB/s for each (bar: mxmoe permute and unpermute >= 70% of the copy).
Part B, the block forward+backward, every preset:
  - a PyTorch MoE block in BF16 (fp32 router linear, softmax, top-k, renormalised; argsort permutation
    with every expert's group padded to a multiple of 16 rows for torch._grouped_mm's k-grouped
    backward; peer_torch.py's torch._grouped_mm FC1 -> GLU (clamped SwiGLU for gptoss-120b) x prob ->
    torch._grouped_mm FC2; unpermute by index_add in fp32), EAGER and under torch.compile;
  - mxmoe_torch.MoE with recipe bf16 and mxfp8, sharing the same parameters (router weight, W1, W2);
  time (median), peak memory, errors against the eager PyTorch block, and torch.compile ms / mxmoe ms
  (bar: mxmoe mxfp8 >= 1.15x the compiled PyTorch BF16 block).

    PYTHONPATH=python MXMOE_TORCH_LIBRARY=build-gpu/python/libmxmoe_torch.so \\
        python3 bench/moe_block_peer.py --out-dir out          # moe_block.json, moe_block.md, moe_block.png
    ... bench/moe_block_peer.py --device cpu --smoke --out-dir /tmp/moe   # tiny sizes, any machine

Presets: tools/mxmoe/presets.cpp (H, F, E, routed rows T, activation, GLU layout; the same as
bench/peer_torch.py's), with the models' top-k; the block runs N = T / top_k tokens, so that the
expert layer sees the preset's T rows (python/tests/test_moe_block_bench.py checks the numbers
against presets.cpp).
"""
import argparse
import datetime
import json
import math
import os
import platform
import random
import shlex
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import peer_torch as pt  # noqa: E402  (make_layer, CLAMP, PRESET_GLU, _git_describe, _device_text; no torch at import)

# tools/mxmoe/presets.cpp: hidden, ffn, experts, routed rows T; top_k of the models (DeepSeek-V3 8 of 256,
# Qwen3-30B-A3B 8 of 128, gpt-oss-120b 4 of 128, Mixtral 8x7B 2 of 8); E is the per-GPU expert count.
PRESETS = {
    "dsv3": {"hidden": 7168, "ffn": 2048, "experts": 32, "routed": 32768, "top_k": 8},
    "qwen3-30b": {"hidden": 2048, "ffn": 768, "experts": 128, "routed": 65536, "top_k": 8},
    "gptoss-120b": {"hidden": 2880, "ffn": 2880, "experts": 32, "routed": 32768, "top_k": 4},
    "mixtral": {"hidden": 4096, "ffn": 14336, "experts": 8, "routed": 16384, "top_k": 2},
}
# --smoke: the same presets at tiny sizes (activation, GLU layout and top-k kept; E capped at 16).
SMOKE = {"hidden": 64, "ffn": 64, "tokens": 48, "max_experts": 16}
SPLITS = ("balanced", "skew")
PERMUTE_BAR = 70.0  # % of the device copy's GB/s, mxmoe permute and unpermute
BLOCK_BAR = 1.15    # torch.compile BF16 block ms / mxmoe mxfp8 block ms, forward+backward
ALIGN = 16          # rows per expert group, a multiple of which torch._grouped_mm's k-grouped backward needs
MIB = 1 << 20

# Part A cells: (op, impl) -> label. Bytes for every permute/unpermute cell: (R + N) * H * 2 (rows read
# once and written once: x's N rows and the R = N*K permuted rows); the copy moves 2 * R * H * 2.
A_CELLS = [
    ("copy", "torch_copy", "device copy (dst.copy_(src), R rows)"),
    ("permute", "mxmoe", "mxmoe permute (route + rows + probs)"),
    ("permute", "torch_eager", "torch permute, eager"),
    ("permute", "torch_compile", "torch permute, torch.compile"),
    ("permute_rows", "mxmoe", "mxmoe permute_by_map (rows only)"),
    ("permute_rows", "torch_eager", "torch index_select (rows only)"),
    ("unpermute", "mxmoe", "mxmoe unpermute"),
    ("unpermute", "torch_eager", "torch index_add fp32, eager"),
    ("unpermute", "torch_compile", "torch index_add fp32, torch.compile"),
    ("unpermute", "torch_gather_eager", "torch gather + fp32 sum, eager"),
    ("unpermute", "torch_gather_compile", "torch gather + fp32 sum, torch.compile"),
    ("copy", "torch_copy_graph", "device copy, GPU time (CUDA graph)"),
    ("permute", "mxmoe_graph", "mxmoe permute, GPU time (CUDA graph)"),
    ("permute_rows", "mxmoe_graph", "mxmoe permute_by_map, GPU time (CUDA graph)"),
    ("unpermute", "mxmoe_graph", "mxmoe unpermute, GPU time (CUDA graph)"),
]
A_LABEL = {(op, impl): label for op, impl, label in A_CELLS}
B_VARIANTS = [
    ("torch_eager", "torch BF16 block, eager"),
    ("torch_compile", "torch BF16 block, torch.compile"),
    ("mxmoe_bf16", "mxmoe MoE bf16"),
    ("mxmoe_mxfp8", "mxmoe MoE mxfp8 (weights prepared every call)"),
    ("mxmoe_mxfp8_cached", "mxmoe MoE mxfp8 (prepared weights reused)"),
]
B_LABEL = dict(B_VARIANTS)


# ----------------------------------------------------------------------------------------------
# Shapes and data
# ----------------------------------------------------------------------------------------------

def preset_shape(name, smoke):
    p = PRESETS[name]
    act, layout = pt.PRESET_GLU[name]
    if smoke:
        E = min(p["experts"], SMOKE["max_experts"])
        return {"preset": name, "hidden": SMOKE["hidden"], "ffn": SMOKE["ffn"], "experts": E,
                "top_k": min(p["top_k"], E), "tokens": SMOKE["tokens"], "activation": act, "glu_layout": layout}
    return {"preset": name, "hidden": p["hidden"], "ffn": p["ffn"], "experts": p["experts"], "top_k": p["top_k"],
            "tokens": p["routed"] // p["top_k"], "activation": act, "glu_layout": layout}


def make_ids(N, K, E, split, seed):
    """Router ids [N, K] int64 (CPU), K distinct experts per token.
    balanced: every expert gets exactly N*K/E slots (when it divides): slot (t, k) -> (t*K + k) mod E,
    tokens shuffled and experts relabelled at random. skew: expert shares from a Dirichlet(0.5) draw
    (plus a small floor, so K distinct experts always exist), K draws per token without replacement."""
    import torch
    g = torch.Generator().manual_seed(seed)
    if split == "balanced":
        base = (torch.arange(N)[:, None] * K + torch.arange(K)[None, :]) % E
        relabel = torch.randperm(E, generator=g)
        return relabel[base[torch.randperm(N, generator=g)]]
    rnd = random.Random(seed)
    shares = [rnd.gammavariate(0.5, 1.0) for _ in range(E)]
    p = torch.tensor(shares, dtype=torch.float64)
    p = p / p.sum() + 1e-3 / E
    return torch.multinomial(p.expand(N, E), K, replacement=False, generator=g)


# ----------------------------------------------------------------------------------------------
# The PyTorch references
# ----------------------------------------------------------------------------------------------

def expert_counts(flat, E):
    # scatter_add, not bincount: bincount sizes its output from max(ids), a host sync on CUDA.
    import torch
    return torch.zeros(E, dtype=torch.int64, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))


def torch_permute(x, ids, probs, E):
    """mxmoe_torch.permute's outputs in PyTorch ops: (x rows sorted by expert, then token, then slot;
    offsets [E+1]; row_map [N, K]; probs in row order; token of each row)."""
    import torch
    import torch.nn.functional as F
    N, K = ids.shape
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # row -> slot t*K+k
    tok = torch.div(order, K, rounding_mode="floor")
    px = x.index_select(0, tok)
    pp = probs.reshape(-1).index_select(0, order)
    offsets = F.pad(torch.cumsum(expert_counts(flat, E), 0), (1, 0)).to(torch.int32)
    row_map = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=x.device)).view(N, K)
    return px, offsets, row_map, pp, tok


def torch_permute_rows(x, tok):
    return x.index_select(0, tok)


def torch_unpermute_index_add(py, tok, N):
    import torch
    y = torch.zeros(N, py.shape[1], dtype=torch.float32, device=py.device)
    return y.index_add_(0, tok, py.float()).to(torch.bfloat16)


def torch_unpermute_gather(py, row_map):
    import torch
    N, K = row_map.shape
    return py.index_select(0, row_map.reshape(-1)).view(N, K, -1).float().sum(1).to(torch.bfloat16)


def padded_rows(N, K, E, align):
    """Static row count of the padded permutation: every group rounded up to `align` rows, at most
    E*(align-1) more rows than N*K, rounded up to a multiple of `align` (the tail joins the last group)."""
    S = N * K
    if align <= 1:
        return S
    return -(-(S + E * (align - 1)) // align) * align


def make_torch_block(N, K, E, Fd, activation, glu_layout, align, normalize=True):
    """The PyTorch MoE block in BF16, as a user writes it; block(x, wr, w1, w2) -> y [N, H] bf16.
    Router: logits = x.float() @ wr^T (fp32), softmax, top-k, renormalised (mxmoe_torch.MoE.route's formula).
    Permutation: stable argsort of the ids; each expert's rows start at a multiple of `align` (padding rows
    read a zero row of x and carry probability 0, so they add nothing to y or to any gradient); the
    rows past the last group's padding join the last group (static row count R_pad, no host read).
    Layer: peer_torch.make_layer (grouped_mm -> GLU in fp32 x prob -> bf16 -> grouped_mm).
    Unpermute: index_add of the R_pad rows into an fp32 [N+1, H] buffer (padding rows go to row N)."""
    import torch
    import torch.nn.functional as F
    layer = pt.make_layer(Fd, activation, glu_layout)
    S = N * K
    R = padded_rows(N, K, E, align)

    def block(x, wr, w1, w2):
        dev = x.device
        logits = F.linear(x.float(), wr)
        scores = logits.softmax(-1)
        top, ids = torch.topk(scores, K, dim=-1)
        if normalize:
            top = top / (top.sum(-1, keepdim=True) + 1e-20)
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = expert_counts(flat, E)
        if align > 1:
            pcounts = torch.div(counts + (align - 1), align, rounding_mode="floor") * align
        else:
            pcounts = counts
        pend = torch.cumsum(pcounts, 0)
        starts = torch.cumsum(counts, 0) - counts
        e_sorted = flat.index_select(0, order)
        rank = torch.arange(S, device=dev) - starts.index_select(0, e_sorted)  # within the expert's rows
        dest = (pend - pcounts).index_select(0, e_sorted) + rank  # padded row of each sorted slot
        tok = torch.div(order, K, rounding_mode="floor")
        src_tok = torch.full((R,), N, dtype=torch.int64, device=dev).scatter(0, dest, tok)
        src_slot = torch.full((R,), S, dtype=torch.int64, device=dev).scatter(0, dest, order)
        offs = torch.cat([pend[:-1], torch.full((1,), R, dtype=pend.dtype, device=dev)]).to(torch.int32)
        xp = torch.cat([x, x.new_zeros(1, x.shape[1])]).index_select(0, src_tok)
        pp = torch.cat([top.reshape(-1), top.new_zeros(1)]).index_select(0, src_slot)
        yp = layer(xp, w1, w2, pp, offs)
        y = torch.zeros(N + 1, yp.shape[1], dtype=torch.float32, device=dev).index_add(0, src_tok, yp.float())
        return y[:N].to(torch.bfloat16)

    return block, R


# ----------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------

def _err(e):
    return f"{type(e).__name__}: {e}".strip()


class Timer:
    """CUDA events on a CUDA device (each sample: events around `inner` back-to-back calls, divided by
    inner), time.perf_counter on the CPU; median of `iters` samples after `warmup` calls."""

    def __init__(self, device):
        import torch
        self.torch = torch
        self.cuda = device.type == "cuda"

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def __call__(self, fn, warmup, iters, inner=1):
        torch = self.torch
        for _ in range(warmup):
            fn()
        self.sync()
        times = []
        for _ in range(iters):
            if self.cuda:
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record()
                for _ in range(inner):
                    fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) / inner)
            else:
                t0 = time.perf_counter()
                for _ in range(inner):
                    fn()
                times.append((time.perf_counter() - t0) * 1e3 / inner)
        return {"ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times)}

    def graph(self, fn, warmup, iters, inner=1):
        """GPU time per call: `inner` calls captured in one CUDA graph, each sample events around one
        replay / inner (no host issue time; the calls' kernels and the gaps between them on the device
        are all counted). Also the host's issue time per call of the same calls run eagerly. On the CPU:
        None (no device time to separate)."""
        if not self.cuda:
            return None
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(max(warmup, 1)):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(inner):
                fn()
        out = self(lambda: g.replay(), warmup, iters, 1)
        for k in ("ms", "min_ms", "max_ms"):
            out[k] /= inner
        issue = []  # median of 5 loops of `inner` eager calls, each loop from an idle device
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            issue.append((time.perf_counter() - t0) * 1e3 / inner)
        out["host_issue_ms"] = statistics.median(issue)
        torch.cuda.synchronize()
        del g
        return out


def _cell(fn, timer=None):
    """fn() -> dict, or {"error": ...}; never raises."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - one failing cell must not stop the benchmark
        if timer is not None:
            try:
                timer.sync()
            except Exception:  # noqa: BLE001
                pass
        return {"error": _err(e), "trace": traceback.format_exc(limit=4)}


def _compile(fn, args):
    import torch
    torch._dynamo.config.suppress_errors = False  # a failed compile must not fall back to eager
    kw = {"dynamic": False, "backend": args.compile_backend}
    if args.compile_mode != "default":
        kw["mode"] = args.compile_mode
    return torch.compile(fn, **kw)


def rel_err(got, want):
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


# ----------------------------------------------------------------------------------------------
# Part A: permute / unpermute
# ----------------------------------------------------------------------------------------------

def part_a(shape, split, args, dev, timer, compile_ok):
    import torch
    import mxmoe_torch
    N, K, H, E = shape["tokens"], shape["top_k"], shape["hidden"], shape["experts"]
    R = N * K
    seed = args.seed + 1000 * sorted(PRESETS).index(shape["preset"]) + SPLITS.index(split)
    ids_cpu = make_ids(N, K, E, split, seed)
    counts = torch.bincount(ids_cpu.reshape(-1), minlength=E)
    rec = {"preset": shape["preset"], "split": split, "tokens": N, "top_k": K, "hidden": H, "experts": E, "rows": R,
           "bytes": (R + N) * H * 2, "copy_bytes": 2 * R * H * 2, "count_min": int(counts.min()),
           "count_max": int(counts.max()), "empty_experts": int((counts == 0).sum()), "cells": {}, "checks": {}}
    t0 = time.monotonic()
    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(N, H, generator=g, device=dev).to(torch.bfloat16)
    probs = torch.rand(N, K, generator=g, device=dev)
    probs = probs / probs.sum(-1, keepdim=True)
    ids = ids_cpu.to(dev)
    W, I, inner = args.warmup, args.iters, args.inner
    cells = rec["cells"]

    def put(op, impl, cell, nbytes):
        if "ms" in cell and cell["ms"] > 0:
            cell["gbps"] = nbytes / cell["ms"] * 1e-6
        cells.setdefault(op, {})[impl] = cell

    with torch.no_grad():
        # references (also the operands of the rows-only and unpermute cells)
        px_ref, off_ref, rm_ref, pp_ref, tok = torch_permute(x, ids, probs, E)
        py = torch.randn(R, H, generator=g, device=dev).to(torch.bfloat16)  # an expert layer's output rows
        rm32 = rm_ref.to(torch.int32)
        dst = torch.empty_like(px_ref)

        put("copy", "torch_copy", _cell(lambda: timer(lambda: dst.copy_(px_ref), W, I, inner), timer),
            rec["copy_bytes"])
        put("permute", "mxmoe", _cell(lambda: timer(lambda: mxmoe_torch.permute(x, ids, probs, experts=E), W, I, inner),
                                      timer), rec["bytes"])
        put("permute", "torch_eager", _cell(lambda: timer(lambda: torch_permute(x, ids, probs, E), W, I, inner), timer),
            rec["bytes"])
        put("permute_rows", "mxmoe", _cell(lambda: timer(lambda: mxmoe_torch.permute_by_map(x, rm32, rows=R), W, I,
                                                         inner), timer), rec["bytes"])
        put("permute_rows", "torch_eager", _cell(lambda: timer(lambda: torch_permute_rows(x, tok), W, I, inner), timer),
            rec["bytes"])
        put("unpermute", "mxmoe", _cell(lambda: timer(lambda: mxmoe_torch.unpermute(py, rm32), W, I, inner), timer),
            rec["bytes"])
        put("unpermute", "torch_eager", _cell(lambda: timer(lambda: torch_unpermute_index_add(py, tok, N), W, I, inner),
                                              timer), rec["bytes"])
        put("unpermute", "torch_gather_eager", _cell(lambda: timer(lambda: torch_unpermute_gather(py, rm_ref), W, I,
                                                                   inner), timer), rec["bytes"])
        # GPU time (CUDA graphs of `inner` calls): the bar's numbers, beside the copy's graph time
        for op, impl, fn, nbytes in (
                ("copy", "torch_copy_graph", lambda: dst.copy_(px_ref), rec["copy_bytes"]),
                ("permute", "mxmoe_graph", lambda: mxmoe_torch.permute(x, ids, probs, experts=E), rec["bytes"]),
                ("permute_rows", "mxmoe_graph", lambda: mxmoe_torch.permute_by_map(x, rm32, rows=R), rec["bytes"]),
                ("unpermute", "mxmoe_graph", lambda: mxmoe_torch.unpermute(py, rm32), rec["bytes"])):
            if timer.cuda:
                put(op, impl, _cell(lambda: timer.graph(fn, W, I, inner), timer), nbytes)

        # torch.compile'd references: one compile per preset (its two splits have the same shapes)
        cache = args._compiled_a
        key = (N, K, H, E)
        why = None
        if args.no_compile:
            why = "--no-compile"
        elif not compile_ok and cache.get("key") != key:
            why = f"time budget ({args.time_budget:g} s) spent before compiling"
        if why:
            for op, impl in (("permute", "torch_compile"), ("unpermute", "torch_compile"),
                             ("unpermute", "torch_gather_compile")):
                put(op, impl, {"skipped": why}, 0)
        else:
            if cache.get("key") != key:
                cache.clear()
                try:
                    torch._dynamo.reset()
                except Exception:  # noqa: BLE001
                    pass
                cache["key"] = key
                cache["permute"] = _compile(torch_permute, args)
                cache["index_add"] = _compile(torch_unpermute_index_add, args)
                cache["gather"] = _compile(torch_unpermute_gather, args)
                cache["first_call_s"] = {}
            fns = {("permute", "torch_compile"): (cache["permute"], lambda f: f(x, ids, probs, E)),
                   ("unpermute", "torch_compile"): (cache["index_add"], lambda f: f(py, tok, N)),
                   ("unpermute", "torch_gather_compile"): (cache["gather"], lambda f: f(py, rm_ref))}
            for (op, impl), (f, call) in fns.items():
                def run(f=f, call=call, name=impl + "/" + op):
                    if name not in cache["first_call_s"]:
                        t = time.monotonic()
                        call(f)  # compiles, outside the timing
                        timer.sync()
                        cache["first_call_s"][name] = round(time.monotonic() - t, 2)
                    return timer(lambda: call(f), W, I, inner)
                put(op, impl, _cell(run, timer), rec["bytes"])
            rec["compile_first_call_s"] = dict(cache.get("first_call_s", {}))

        # checks: mxmoe against the references (exact for permute; unpermute's fp32 sums may differ
        # in summation order from torch's, so the max abs difference is reported)
        ch = rec["checks"]

        def check():
            p = mxmoe_torch.permute(x, ids, probs, experts=E)
            ch["permute_x_equal"] = bool(torch.equal(p.x, px_ref))
            ch["permute_offsets_equal"] = bool(torch.equal(p.offsets.long(), off_ref.long()))
            ch["permute_row_map_equal"] = bool(torch.equal(p.row_map.long(), rm_ref.long()))
            ch["permute_probs_equal"] = bool(torch.equal(p.probs, pp_ref))
            ch["permute_by_map_equal"] = bool(torch.equal(mxmoe_torch.permute_by_map(x, rm32, rows=R), px_ref))
            y = mxmoe_torch.unpermute(py, rm32).float()
            ch["unpermute_max_abs_diff_vs_gather"] = float((y - torch_unpermute_gather(py, rm_ref).float()).abs().max())
            ch["unpermute_max_abs_diff_vs_index_add"] = float(
                (y - torch_unpermute_index_add(py, tok, N).float()).abs().max())
            ch["unpermute_max_abs"] = float(y.abs().max())
            return {}

        err = _cell(check, timer)
        if "error" in err:
            ch["error"] = err["error"]
    copy_gbps = cells.get("copy", {}).get("torch_copy", {}).get("gbps")
    copy_graph_gbps = cells.get("copy", {}).get("torch_copy_graph", {}).get("gbps")
    for op, impls in cells.items():
        for impl, c in impls.items():
            ref = copy_graph_gbps if impl.endswith("_graph") else copy_gbps  # graph cells: the copy's graph time
            if ref and c.get("gbps") is not None:
                c["pct_copy"] = 100.0 * c["gbps"] / ref
    rec["wall_s"] = round(time.monotonic() - t0, 2)
    return rec


# ----------------------------------------------------------------------------------------------
# Part B: the whole block
# ----------------------------------------------------------------------------------------------

def part_b(shape, args, dev, timer, compile_ok):
    import torch
    import mxmoe_torch
    N, K, H, Fd, E = shape["tokens"], shape["top_k"], shape["hidden"], shape["ffn"], shape["experts"]
    act, layout = shape["activation"], shape["glu_layout"]
    rec = {"preset": shape["preset"], "tokens": N, "top_k": K, "hidden": H, "ffn": Fd, "experts": E,
           "activation": act, "glu_layout": layout, "rows": N * K, "align": args.align,
           "ops": {"fwd": {}, "fwd_bwd": {}}, "memory": {}, "checks": {}}
    t0 = time.monotonic()
    W, I = args.warmup, args.iters
    torch.manual_seed(args.seed + 7)
    mods = {}
    mods["mxmoe_bf16"] = mxmoe_torch.MoE(H, Fd, E, K, recipe="bf16", activation=act, glu_layout=layout, device=dev)
    mods["mxmoe_mxfp8"] = mxmoe_torch.MoE(H, Fd, E, K, recipe="mxfp8", activation=act, glu_layout=layout, device=dev)
    ref = mods["mxmoe_bf16"]
    # one set of parameters for every variant: the mxfp8 block and the PyTorch block use bf16's tensors
    m8 = mods["mxmoe_mxfp8"]
    m8.router.weight = ref.router.weight
    m8.grouped_mlp.w1 = ref.grouped_mlp.w1
    m8.grouped_mlp.w2 = ref.grouped_mlp.w2
    m8.grouped_mlp.release_prepared_weights()
    wr, w1, w2 = ref.router.weight, ref.grouped_mlp.w1, ref.grouped_mlp.w2
    g = torch.Generator(device=dev).manual_seed(args.seed + 11)
    x = torch.randn(N, H, generator=g, device=dev).to(torch.bfloat16).requires_grad_(True)
    dy = torch.randn(N, H, generator=g, device=dev).to(torch.bfloat16)
    inputs = (x, wr, w1, w2)
    block, R_pad = make_torch_block(N, K, E, Fd, act, layout, args.align)
    rec["torch_rows_padded"] = R_pad
    with torch.no_grad():
        _, ids = torch.topk(torch.nn.functional.linear(x.float(), wr), K, dim=-1)
        counts = torch.bincount(ids.reshape(-1).cpu(), minlength=E)
    rec["count_min"], rec["count_max"] = int(counts.min()), int(counts.max())
    rec["torch_rows_used"] = int(sum(-(-int(c) // args.align) * args.align for c in counts))

    def torch_fwd(fn):
        return lambda: fn(x, wr, w1, w2)

    def torch_fwd_bwd(fn):
        # autograd.grad: fresh grads every call, nothing accumulated (x, router weight, W1, W2)
        return lambda: torch.autograd.grad(fn(x, wr, w1, w2), inputs, dy)

    def mx_fwd(m, release):
        def f():
            if release:
                m.grouped_mlp.release_prepared_weights()  # as after an optimizer step: prepared once per call
            return m(x)
        return f

    def mx_fwd_bwd(m, release):
        def f():
            if release:
                m.grouped_mlp.release_prepared_weights()
            return torch.autograd.grad(m(x), inputs, dy)
        return f

    runners = {
        "torch_eager": (torch_fwd(block), torch_fwd_bwd(block)),
        "mxmoe_bf16": (mx_fwd(ref, False), mx_fwd_bwd(ref, False)),
        "mxmoe_mxfp8": (mx_fwd(m8, True), mx_fwd_bwd(m8, True)),
        "mxmoe_mxfp8_cached": (mx_fwd(m8, False), mx_fwd_bwd(m8, False)),
    }

    # ---- correctness against the eager PyTorch block (same weights, same routing) ----
    def outputs(fwd_bwd_fn, fwd_fn):
        y = fwd_fn()
        grads = fwd_bwd_fn()
        return [y.detach()] + [gr.detach() for gr in grads]

    names = ["y", "dx", "drouter", "dw1", "dw2"]
    want = None
    try:
        want = outputs(runners["torch_eager"][1], runners["torch_eager"][0])
    except Exception as e:  # noqa: BLE001
        rec["checks"]["torch_eager"] = {"error": _err(e)}

    def check(variant, fwd_fn, fwd_bwd_fn):
        if want is None:
            return
        try:
            got = outputs(fwd_bwd_fn, fwd_fn)
            rec["checks"][variant] = {n: rel_err(a, b) for n, a, b in zip(names, got, want)}
        except Exception as e:  # noqa: BLE001
            rec["checks"][variant] = {"error": _err(e)}
        timer.sync()

    for v in ("mxmoe_bf16", "mxmoe_mxfp8"):
        check(v, runners[v][0], runners[v][1])
    m8.grouped_mlp.release_prepared_weights()  # not resident while the PyTorch block is measured

    # ---- torch.compile'd block ----
    if args.no_compile:
        why = "--no-compile"
    elif not compile_ok:
        why = f"time budget ({args.time_budget:g} s) spent before compiling"
    else:
        why = None
    if why:
        rec["ops"]["fwd"]["torch_compile"] = {"skipped": why}
        rec["ops"]["fwd_bwd"]["torch_compile"] = {"skipped": why}
        rec["memory"]["torch_compile"] = {"skipped": why}
    else:
        try:
            torch._dynamo.reset()
        except Exception:  # noqa: BLE001
            pass
        args._compiled_a.clear()  # the reset dropped Part A's compiled code
        try:
            compiled = _compile(block, args)
            gb0 = pt._graph_breaks()
            tc = time.monotonic()
            torch_fwd_bwd(compiled)()  # compiles forward and backward, outside the timing
            timer.sync()
            rec["compile_first_call_s"] = round(time.monotonic() - tc, 2)
            gb1 = pt._graph_breaks()
            rec["compile_graph_breaks"] = gb1 - gb0 if gb0 is not None and gb1 is not None else None
            runners["torch_compile"] = (torch_fwd(compiled), torch_fwd_bwd(compiled))
            check("torch_compile", runners["torch_compile"][0], runners["torch_compile"][1])
        except Exception as e:  # noqa: BLE001
            err = {"error": _err(e), "trace": traceback.format_exc(limit=4)}
            rec["ops"]["fwd"]["torch_compile"] = dict(err)
            rec["ops"]["fwd_bwd"]["torch_compile"] = dict(err)
            rec["memory"]["torch_compile"] = {"error": err["error"]}
            timer.sync()

    # ---- timing and peak memory ----
    for variant, _label in B_VARIANTS:
        if variant not in runners:
            continue
        fwd_fn, fwd_bwd_fn = runners[variant]
        rec["ops"]["fwd"][variant] = _cell(lambda: timer(fwd_fn, W, I), timer)
        rec["ops"]["fwd_bwd"][variant] = _cell(lambda: timer(fwd_bwd_fn, W, I), timer)
        if timer.cuda:
            rec["memory"][variant] = _cell(lambda: peak_memory(fwd_bwd_fn), timer)
        else:
            rec["memory"][variant] = {"skipped": "CPU run"}
    flops = 18 * N * K * H * Fd  # the expert layer's fwd+bwd GEMMs on the N*K routed rows
    for op, factor in (("fwd", 6), ("fwd_bwd", 18)):
        for c in rec["ops"][op].values():
            if c.get("ms"):
                c["tflops"] = factor * N * K * H * Fd / c["ms"] * 1e-9
    rec["layer_flops_fwd_bwd"] = flops
    fb = rec["ops"]["fwd_bwd"]
    comp = fb.get("torch_compile", {}).get("ms")
    eager = fb.get("torch_eager", {}).get("ms")
    rec["ratios"] = {}
    for v in ("mxmoe_bf16", "mxmoe_mxfp8", "mxmoe_mxfp8_cached"):
        ms = fb.get(v, {}).get("ms")
        rec["ratios"][v] = {"compile_over_mxmoe": comp / ms if comp and ms else None,
                            "eager_over_mxmoe": eager / ms if eager and ms else None}
    for m in mods.values():
        m.grouped_mlp.release_prepared_weights()
    runners.clear()
    mods.clear()
    x = dy = inputs = want = None  # noqa: F841
    timer.sync()
    if timer.cuda:
        torch.cuda.empty_cache()
    rec["wall_s"] = round(time.monotonic() - t0, 2)
    return rec


def peak_memory(fn):
    """Peak allocated bytes over one fwd+bwd, from a clean state after a warm-up call."""
    import torch
    g = fn()
    del g
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    resident = torch.cuda.memory_allocated()
    g = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del g
    return {"peak_mib": peak / MIB, "resident_mib": resident / MIB, "above_resident_mib": (peak - resident) / MIB}


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------

def _short(text, n=60):
    t = " ".join(str(text).split()).replace("|", "/")
    return t if len(t) <= n else t[: n - 1] + "…"


def _ms_text(c):
    if not c:
        return ""
    if "ms" in c:
        return f"{c['ms']:.3f}"
    if "error" in c:
        return "error: " + _short(c["error"], 50)
    if "skipped" in c:
        return "skipped"
    return ""


def _bw_text(c):
    if not c or c.get("gbps") is None:
        return _ms_text(c) if c and "ms" not in c else ""
    pct = c.get("pct_copy")
    return f"{c['gbps']:.0f} ({pct:.0f}%)" if pct is not None else f"{c['gbps']:.0f}"


def _num(v, digits):
    return f"{v:.{digits}f}" if v is not None else ""


def _bar(v, bar):
    if v is None:
        return ""
    return f"{'meets' if v >= bar else 'below'} {bar:g}"


def build_markdown(meta, perm, blocks):
    L = ["# The MoE block beside PyTorch (same device, same run)", ""]
    L.append(f"- date: {meta.get('date', '')}")
    L.append(f"- device: {meta.get('device', '')}")
    L.append(f"- torch {meta.get('torch', '')}, CUDA {meta.get('cuda', '')}, python {meta.get('python', '')}, "
             f"mxmoe_torch {meta.get('mxmoe', '')}")
    if meta.get("git"):
        L.append(f"- mxmoe tree: {meta['git']}")
    L.append(f"- command: `{meta.get('command', '')}`")
    if meta.get("smoke"):
        L.append("- **smoke run**: tiny sizes (H=F=64, 48 tokens, E<=16), not the presets' sizes; the numbers "
                 "only show that the script runs")
    timing = ("CUDA events" if meta.get("device_type") == "cuda" else "time.perf_counter (CPU)")
    L.append(f"- timing: {timing}, median of {meta.get('iters')} timed samples after {meta.get('warmup')} warm-up "
             f"calls; a permute/unpermute sample is {meta.get('inner')} back-to-back calls (time / calls), a block "
             "sample one call; no L2 flush. torch.compile: backend "
             f"{meta.get('compile_backend')}, mode {meta.get('compile_mode')}, dynamic=False, one compile per preset, "
             "compilation outside the timing.")
    L.append("- presets: tools/mxmoe/presets.cpp (H, F, E, routed rows T = N·top_k), top-k of the model; "
             "N tokens enter the block.")
    L.append("")

    # ---- Part A ----
    if perm:
        L.append("## Permute and unpermute against PyTorch ops and the copy ceiling")
        L.append("")
        L.append("GB/s = (R + N)·H·2 bytes / time for every permute and unpermute cell (each x row read once and "
                 "each of the R = N·K permuted rows written once, or the reverse; ids, probs and maps not counted); "
                 "the copy moves the R permuted rows (`dst.copy_(src)`, 2·R·H·2 bytes). % = of the copy's GB/s. "
                 "mxmoe permute is the whole op (routing: counting sort of the ids, offsets, row map; the row move; "
                 "the probs); permute_by_map is the row move alone for a given row map. torch permute: "
                 "`argsort(ids.flatten(), stable=True)`, `index_select` of rows and probs, counts by `scatter_add_` "
                 "(bincount would size its output from max(ids), a host sync on CUDA) + `cumsum`, row map by "
                 "`scatter_`: the same outputs as mxmoe's, checked equal below. torch unpermute: "
                 "`zeros(N, H, fp32).index_add_(0, token_of_row, y.float())` or `y[row_map].float().sum(1)`, "
                 "then bf16. Ids: balanced = exactly N·K/E slots per expert (shuffled); skew = Dirichlet(0.5) "
                 "expert shares, K distinct experts per token.")
        L.append("")
        L.append(f"Bar: mxmoe permute and unpermute each >= {PERMUTE_BAR:.0f}% of the copy, in GPU time: each op "
                 f"and the copy as {meta.get('inner')} calls captured in one CUDA graph and replayed (the op's "
                 "kernels and the gaps between them on the device; no host issue time). Beside it the same op "
                 f"as {meta.get('inner')} eager back-to-back calls between two events (the first call's host issue "
                 "time included, which a short sample cannot hide) and the host's issue time per eager call: "
                 "below the GPU time, a training step's host runs ahead of the device.")
        L.append("")
        L.append("| preset | split | N | K | H | E | MB moved | copy GB/s | mxmoe permute GB/s (% copy) | bar | "
                 "eager back-to-back | host issue ms/call | mxmoe unpermute GB/s (% copy) | bar | eager back-to-back | "
                 "mxmoe permute_by_map (rows only) |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in perm:
            c = r["cells"]
            cp = c.get("copy", {}).get("torch_copy_graph") or c.get("copy", {}).get("torch_copy")
            pm = c.get("permute", {}).get("mxmoe_graph") or c.get("permute", {}).get("mxmoe")
            um = c.get("unpermute", {}).get("mxmoe_graph") or c.get("unpermute", {}).get("mxmoe")
            bm = c.get("permute_rows", {}).get("mxmoe_graph") or c.get("permute_rows", {}).get("mxmoe")
            issue = (c.get("permute", {}).get("mxmoe_graph") or {}).get("host_issue_ms")
            L.append(f"| {r['preset']} | {r['split']} | {r['tokens']} | {r['top_k']} | {r['hidden']} | "
                     f"{r['experts']} | {r['bytes'] / 1e6:.1f} | {_bw_text(cp)} | "
                     f"{_bw_text(pm)} | {_bar((pm or {}).get('pct_copy'), PERMUTE_BAR)} | "
                     f"{_bw_text(c.get('permute', {}).get('mxmoe'))} | {_num(issue, 4)} | {_bw_text(um)} | "
                     f"{_bar((um or {}).get('pct_copy'), PERMUTE_BAR)} | {_bw_text(c.get('unpermute', {}).get('mxmoe'))} | "
                     f"{_bw_text(bm)} |")
        L.append("")
        L.append("### Every permute / unpermute cell")
        L.append("")
        L.append("torch ms / mxmoe ms > 1: mxmoe faster.")
        L.append("")
        L.append("| preset | split | implementation | ms | GB/s | % of copy | impl ms / mxmoe ms |")
        L.append("|---|---|---|---|---|---|---|")
        for r in perm:
            for op, impl, label in A_CELLS:
                c = r["cells"].get(op, {}).get(impl)
                if c is None:
                    continue
                mx = r["cells"].get(op, {}).get("mxmoe", {}).get("ms")
                ratio = f"{c['ms'] / mx:.2f}" if mx and c.get("ms") and impl.startswith("torch_") and op != "copy" \
                    and not impl.endswith("_graph") else ""
                gb = f"{c['gbps']:.0f}" if c.get("gbps") is not None else ""
                pct = f"{c['pct_copy']:.0f}%" if c.get("pct_copy") is not None else ""
                L.append(f"| {r['preset']} | {r['split']} | {label} | {_ms_text(c)} | {gb} | {pct} | {ratio} |")
        L.append("")
        L.append("### Checks (mxmoe against the PyTorch reference, same inputs)")
        L.append("")
        L.append("| preset | split | expert rows min / max (empty) | permute x, offsets, row_map, probs equal | "
                 "permute_by_map equal | unpermute max abs diff vs gather-sum / index_add (max abs y) |")
        L.append("|---|---|---|---|---|---|")
        for r in perm:
            ch = r["checks"]
            if "error" in ch:
                L.append(f"| {r['preset']} | {r['split']} | | error: {_short(ch['error'], 80)} | | |")
                continue
            eq = "/".join("yes" if ch.get(k) else "NO" for k in ("permute_x_equal", "permute_offsets_equal",
                                                                   "permute_row_map_equal", "permute_probs_equal"))
            L.append(f"| {r['preset']} | {r['split']} | {r['count_min']} / {r['count_max']} ({r['empty_experts']}) | "
                     f"{eq} | {'yes' if ch.get('permute_by_map_equal') else 'NO'} | "
                     f"{ch.get('unpermute_max_abs_diff_vs_gather', float('nan')):.3g} / "
                     f"{ch.get('unpermute_max_abs_diff_vs_index_add', float('nan')):.3g} "
                     f"({ch.get('unpermute_max_abs', float('nan')):.3g}) |")
        L.append("")

    # ---- Part B ----
    if blocks:
        L.append("## The MoE block, forward + backward")
        L.append("")
        L.append("Both sides: x bf16 [N, H] -> y bf16 [N, H]; `torch.autograd.grad` of y (upstream dY) for x, "
                 "the fp32 router weight, W1 and W2 (fresh grads each call, nothing accumulated); the same "
                 "parameter tensors for every variant. Router: fp32 `linear`, softmax, top-k, renormalised "
                 "(mxmoe_torch.MoE's formula, so both pick the same experts). PyTorch block: stable argsort "
                 f"permutation with every expert's group padded to a multiple of {meta.get('align')} rows "
                 "(torch._grouped_mm's k-grouped backward needs 16-row groups; bench/peer_torch.py instead moves "
                 "tokens between experts, which a real block cannot do): padding rows gather a zero row of x "
                 "with probability 0 and add nothing; the rows past the last group's padding join the last "
                 "group, so the row count is static (R_pad = round16(N·K + E·15)) and nothing is read on the host; "
                 "then bench/peer_torch.py's layer (grouped_mm -> SwiGLU in fp32, clamped SwiGLU with interleave32 "
                 "for gptoss-120b, × prob -> bf16 -> grouped_mm) and unpermute by `index_add` into fp32, rounded "
                 "to bf16. mxmoe: `mxmoe_torch.MoE` (permute -> GroupedMLP -> unpermute), eager; mxfp8 "
                 "\"prepared every call\" releases the quantized-weight cache before each call (one weight "
                 "quantization per step, as after an optimizer step), \"reused\" keeps it (gradient-accumulation "
                 "micro-batches). TFLOP/s from the expert layer's 18·(N·K)·H·F (fwd: 6·N·K·H·F).")
        L.append("")
        L.append(f"Bar: mxmoe mxfp8 (prepared every call) >= {BLOCK_BAR:.2f}x the torch.compile'd BF16 block "
                 "(ratio = compile ms / mxmoe ms).")
        L.append("")
        L.append("| preset | N | K | E | torch eager ms | torch.compile ms | mxmoe bf16 ms | compile / bf16 | "
                 "mxmoe mxfp8 ms | compile / mxfp8 | bar | mxfp8 reused-weights ms |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for b in blocks:
            fb = b["ops"]["fwd_bwd"]
            rb = b["ratios"].get("mxmoe_bf16", {}).get("compile_over_mxmoe")
            r8 = b["ratios"].get("mxmoe_mxfp8", {}).get("compile_over_mxmoe")
            L.append(f"| {b['preset']} | {b['tokens']} | {b['top_k']} | {b['experts']} | "
                     f"{_ms_text(fb.get('torch_eager'))} | {_ms_text(fb.get('torch_compile'))} | "
                     f"{_ms_text(fb.get('mxmoe_bf16'))} | {f'{rb:.2f}' if rb else ''} | "
                     f"{_ms_text(fb.get('mxmoe_mxfp8'))} | {f'{r8:.2f}' if r8 else ''} | {_bar(r8, BLOCK_BAR)} | "
                     f"{_ms_text(fb.get('mxmoe_mxfp8_cached'))} |")
        L.append("")
        L.append("### Every block cell")
        L.append("")
        L.append("| preset | variant | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | peak MiB | "
                 "above resident MiB | eager / this | compile / this |")
        L.append("|---|---|---|---|---|---|---|---|---|---|")
        for b in blocks:
            fb, fw = b["ops"]["fwd_bwd"], b["ops"]["fwd"]
            comp, eager = fb.get("torch_compile", {}).get("ms"), fb.get("torch_eager", {}).get("ms")
            for v, label in B_VARIANTS:
                if v not in fb and v not in fw:
                    continue
                c, cf, mem = fb.get(v, {}), fw.get(v, {}), b["memory"].get(v, {})
                ms = c.get("ms")
                peak = f"{mem['peak_mib']:.0f}" if "peak_mib" in mem else _ms_text(mem)
                above = f"{mem['above_resident_mib']:.0f}" if "above_resident_mib" in mem else ""
                L.append(f"| {b['preset']} | {label} | {_ms_text(cf)} | {_num(cf.get('tflops'), 0)} | {_ms_text(c)} | "
                         f"{_num(c.get('tflops'), 0)} | {peak} | {above} | "
                         f"{_num(eager / ms if eager and ms else None, 2)} | "
                         f"{_num(comp / ms if comp and ms else None, 2)} |")
        L.append("")
        L.append("### Block details and errors against the eager PyTorch block")
        L.append("")
        L.append("Relative Frobenius error ‖got − torch eager‖ / ‖torch eager‖ of y, dx, d(router weight), dW1, "
                 "dW2 "
                 "(python/tests/test_moe.py's bounds against a float64 reference: bf16 2e-2, mxfp8 0.1).")
        L.append("")
        L.append("| preset | variant | y | dx | drouter | dW1 | dW2 |")
        L.append("|---|---|---|---|---|---|---|")
        for b in blocks:
            for v, ch in b["checks"].items():
                if "error" in ch:
                    L.append(f"| {b['preset']} | {B_LABEL.get(v, v)} | error: {_short(ch['error'], 80)} | | | | |")
                    continue
                L.append(f"| {b['preset']} | {B_LABEL.get(v, v)} | " +
                         " | ".join(f"{ch[n]:.2e}" for n in ("y", "dx", "drouter", "dw1", "dw2")) + " |")
        L.append("")
        for b in blocks:
            bits = [f"{b['activation']}/{b['glu_layout']}",
                    f"routed rows N·K = {b['rows']}, expert rows min/max {b['count_min']}/{b['count_max']}",
                    f"torch block rows R_pad = {b['torch_rows_padded']} ({b['torch_rows_used']} in padded groups, "
                    f"+{100.0 * (b['torch_rows_padded'] - b['rows']) / b['rows']:.1f}% rows through the GEMMs)"]
            if b.get("compile_first_call_s") is not None:
                bits.append(f"first compiled fwd+bwd call {b['compile_first_call_s']:.1f} s")
            if b.get("compile_graph_breaks") is not None:
                bits.append(f"{b['compile_graph_breaks']} dynamo graph breaks")
            bits.append(f"wall {b.get('wall_s', 0):.1f} s")
            L.append(f"- {b['preset']}: " + ", ".join(bits))
        L.append("")

    notes = []
    for r in perm:
        for op, impls in r["cells"].items():
            for impl, c in impls.items():
                if c and "error" in c:
                    notes.append(f"- error, {r['preset']} {r['split']} {A_LABEL.get((op, impl), op + '/' + impl)}: "
                                 f"`{_short(c['error'], 300)}`")
    for b in blocks:
        for op, vs in b["ops"].items():
            for v, c in vs.items():
                if c and "error" in c:
                    notes.append(f"- error, {b['preset']} block {op} {B_LABEL.get(v, v)}: `{_short(c['error'], 300)}`")
        for v, c in b["memory"].items():
            if c and "error" in c:
                notes.append(f"- error, {b['preset']} block peak memory {B_LABEL.get(v, v)}: "
                             f"`{_short(c['error'], 300)}`")
    for e in meta.get("errors", []):
        notes.append(f"- error: `{_short(e, 300)}`")
    skipped = {}
    for name, cells in [(f"{r['preset']} {r['split']}", [c for i in r["cells"].values() for c in i.values()])
                        for r in perm] + [(b["preset"] + " block", [c for o in b["ops"].values() for c in o.values()])
                                          for b in blocks]:
        for c in cells:
            if c and "skipped" in c:
                skipped.setdefault(c["skipped"], []).append(name)
    for why, names in skipped.items():
        notes.append(f"- skipped ({why}): {', '.join(dict.fromkeys(names))}")
    if notes:
        L.append("## Errors and skipped cells")
        L.append("")
        L += notes
        L.append("")
    if meta.get("chart_note"):
        L.append(meta["chart_note"])
        L.append("")
    return "\n".join(L)


def chart_panels(perm, blocks):
    """Bar-chart panels: {title, ylabel, groups, series: [(name, [value or None])], target, target_label}."""
    panels = []
    if perm:
        groups = [f"{r['preset']} {r['split']}" for r in perm]
        series = []
        for op, impl, name in (("permute", "mxmoe_graph", "mxmoe permute (GPU time)"),
                               ("permute", "mxmoe", "mxmoe permute (eager x inner)"),
                               ("permute_rows", "mxmoe_graph", "mxmoe permute_by_map (GPU time)"),
                               ("unpermute", "mxmoe_graph", "mxmoe unpermute (GPU time)"),
                               ("permute", "torch_compile", "torch permute (compile)"),
                               ("unpermute", "torch_compile", "torch index_add (compile)"),
                               ("unpermute", "torch_gather_compile", "torch gather+sum (compile)")):
            series.append((name, [r["cells"].get(op, {}).get(impl, {}).get("pct_copy") for r in perm]))
        panels.append({"title": f"permute / unpermute: % of device copy GB/s (bar {PERMUTE_BAR:.0f}%)",
                       "ylabel": "% of copy", "groups": groups, "series": series, "target": PERMUTE_BAR,
                       "reference": 100.0})
    if blocks:
        groups = [b["preset"] for b in blocks]
        series = [("compile / mxmoe bf16", [b["ratios"]["mxmoe_bf16"]["compile_over_mxmoe"] for b in blocks]),
                  ("compile / mxmoe mxfp8", [b["ratios"]["mxmoe_mxfp8"]["compile_over_mxmoe"] for b in blocks]),
                  ("eager / mxmoe mxfp8", [b["ratios"]["mxmoe_mxfp8"]["eager_over_mxmoe"] for b in blocks])]
        title = f"MoE block fwd+bwd: torch BF16 ms / mxmoe ms (above 1: mxmoe faster), bar {BLOCK_BAR:.2f} for " \
                "compile / mxfp8"
        panels.append({"title": title, "ylabel": "ratio", "groups": groups, "series": series, "target": BLOCK_BAR,
                       "reference": 1.0})
    return panels


def draw_matplotlib(path, panels, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(9.0, 1.3 * max(len(p["groups"]) for p in panels) + 4),
                                                      4.4 * len(panels)), squeeze=False)
    cmap = plt.get_cmap("tab10")
    for ax, p in zip((a[0] for a in axes), panels):
        n = len(p["series"])
        width = 0.8 / max(n, 1)
        ymax = max([p["target"] * 1.2, p["reference"] * 1.1] +
                   [v * 1.15 for _, vals in p["series"] for v in vals if v is not None and math.isfinite(v)])
        for si, (name, vals) in enumerate(p["series"]):
            for gi, v in enumerate(vals):
                if v is None:
                    continue
                x = gi + (si - (n - 1) / 2) * width
                ax.bar(x, v, width, color=cmap(si % 10), label=name if gi == next(
                    i for i, u in enumerate(vals) if u is not None) else None)
                ax.text(x, v, f"{v:.0f}" if p["reference"] >= 10 else f"{v:.2f}", rotation=90, fontsize=6,
                        ha="center", va="bottom")
        ax.axhline(p["target"], color="black", linewidth=1.2, label=f"bar {p['target']:g}")
        ax.axhline(p["reference"], color="gray", linestyle="--", linewidth=0.8)
        ax.set_xticks(range(len(p["groups"])))
        ax.set_xticklabels([g.replace(" ", "\n") for g in p["groups"]], fontsize=8)
        ax.set_xlim(-0.6, len(p["groups"]) - 0.4)
        ax.set_ylim(0, ymax)
        ax.set_ylabel(p["ylabel"])
        ax.set_title(p["title"], fontsize=9)
        ax.grid(axis="y", linewidth=0.3, alpha=0.5)
        ax.legend(fontsize=7, ncol=4, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def draw_fallback(path, panels, title):
    """The same panels with examples/moe_lm/png_chart.py's dependency-free PNG canvas."""
    sys.path.insert(0, os.path.join(ROOT, "examples", "moe_lm"))
    from png_chart import COLORS, Canvas, nice_ticks, text_width
    colors = COLORS + [(140, 86, 75), (227, 119, 194), (127, 127, 127)]
    width = max(900, 130 * max(len(p["groups"]) for p in panels) + 200)
    ph_total, top0 = 380, 40
    height = top0 + ph_total * len(panels)
    cv = Canvas(width, height)
    cv.text((width - text_width(title, 1)) // 2, 12, title, (0, 0, 0), scale=1)
    for pi, p in enumerate(panels):
        y0 = top0 + pi * ph_total
        left, right, top, bottom = 70, 20, y0 + 24, y0 + ph_total - 110
        vals = [v for _, vs in p["series"] for v in vs if v is not None and math.isfinite(v)]
        ticks = nice_ticks(0.0, max(vals + [p["target"] * 1.1, p["reference"] * 1.05]))
        ytop = ticks[-1]

        def py(v, top=top, bottom=bottom, ytop=ytop):
            return int(bottom - (v / ytop) * (bottom - top))

        cv.text(left, y0 + 6, p["title"], (0, 0, 0), scale=1)
        for t in ticks:
            cv.line(left, py(t), width - right, py(t), (225, 225, 225))
            lab = f"{t:g}"
            cv.text(left - 6 - text_width(lab, 1), py(t) - 3, lab, (60, 60, 60), scale=1)
        G, n = len(p["groups"]), len(p["series"])
        gw = (width - left - right) / max(G, 1)
        bw = max(2, int(gw * 0.8 / max(n, 1)))
        for gi, gname in enumerate(p["groups"]):
            gx = left + gi * gw + gw * 0.1
            for si, (_, vs) in enumerate(p["series"]):
                v = vs[gi]
                if v is None or not math.isfinite(v):
                    continue
                cv.rect(int(gx + si * bw), py(min(v, ytop)), int(gx + (si + 1) * bw) - 1, bottom,
                        colors[si % len(colors)])
            for li, part in enumerate(gname.split(" ")):
                cv.text(int(left + gi * gw + (gw - text_width(part, 1)) / 2), bottom + 6 + 10 * li, part, (60, 60, 60),
                        scale=1)
        cv.line(left, py(p["reference"]), width - right, py(p["reference"]), (150, 150, 150))
        cv.line(left, py(p["target"]), width - right, py(p["target"]), (0, 0, 0), width=2)
        cv.line(left, top, left, bottom, (60, 60, 60))
        cv.line(left, bottom, width - right, bottom, (60, 60, 60))
        ly = bottom + 34
        lx = left
        for si, (name, _) in enumerate(p["series"] + [(f"bar {p['target']:g}", None)]):
            col = colors[si % len(colors)] if si < n else (0, 0, 0)
            w = text_width(name, 1) + 24
            if lx + w > width - right:
                lx, ly = left, ly + 14
            cv.rect(lx, ly, lx + 12, ly + 8, col)
            cv.text(lx + 16, ly + 1, name, (0, 0, 0), scale=1)
            lx += w + 10
    with open(path, "wb") as f:
        f.write(cv.png())


def draw_chart(path, panels, title, draw=None, fallback_panels=None):
    """Draws `panels` with matplotlib (`draw`, default draw_matplotlib), else with the dependency-free
    canvas (on `fallback_panels` when given); returns what drew it, or why nothing did. The numbers
    matter more than the picture: a failure here is reported, never raised."""
    try:
        (draw or draw_matplotlib)(path, panels, title)
        return "matplotlib"
    except ImportError:
        try:
            draw_fallback(path, panels if fallback_panels is None else fallback_panels, title)
            return "examples/moe_lm/png_chart.py (matplotlib is not installed)"
        except Exception as e:  # noqa: BLE001
            return f"not drawn: {_err(e)}"
    except Exception as e:  # noqa: BLE001
        return f"not drawn: {_err(e)}"


def write_outputs(out_dir, meta, perm, blocks, with_chart=True):
    md_meta = dict(meta)
    if out_dir and with_chart and (perm or blocks):
        title = f"{meta.get('device', '')}, torch {meta.get('torch', '')}, {meta.get('git') or ''}"
        panels = chart_panels(perm, blocks)
        meta["chart"] = draw_chart(os.path.join(out_dir, "moe_block.png"), panels, title)
        md_meta["chart_note"] = f"Chart: moe_block.png ({meta['chart']})."
    md = build_markdown(md_meta, perm, blocks)
    if out_dir:
        with open(os.path.join(out_dir, "moe_block.json"), "w") as f:
            json.dump({"meta": meta, "bars": bars(perm, blocks), "permute": perm, "block": blocks}, f, indent=1)
        with open(os.path.join(out_dir, "moe_block.md"), "w") as f:
            f.write(md + "\n")
    return md


def bars(perm, blocks):
    """The two bars, per preset/split: value and met (None when not measured)."""
    out = {"permute_pct_copy": PERMUTE_BAR, "block_compile_over_mxfp8": BLOCK_BAR, "rows": []}
    for r in perm:
        for op in ("permute", "unpermute"):
            cells = r["cells"].get(op, {})
            v = (cells.get("mxmoe_graph") or cells.get("mxmoe") or {}).get("pct_copy")
            out["rows"].append({"preset": r["preset"], "split": r["split"], "what": f"mxmoe {op} % of copy",
                                "value": v, "bar": PERMUTE_BAR, "met": None if v is None else v >= PERMUTE_BAR})
    for b in blocks:
        v = b["ratios"].get("mxmoe_mxfp8", {}).get("compile_over_mxmoe")
        out["rows"].append({"preset": b["preset"], "split": "router", "what": "torch.compile bf16 / mxmoe mxfp8",
                            "value": v, "bar": BLOCK_BAR, "met": None if v is None else v >= BLOCK_BAR})
    return out


# ----------------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default=",".join(PRESETS), help=f"comma-separated, from {', '.join(PRESETS)}")
    ap.add_argument("--parts", default="permute,block", help="permute, block or both (comma-separated)")
    ap.add_argument("--out-dir", default="out", help="moe_block.json, moe_block.md and moe_block.png go here")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (H=F=64, 48 tokens, E<=16): checks the script")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up calls (default 3; smoke 1)")
    ap.add_argument("--iters", type=int, default=None, help="timed samples, median reported (default 10; smoke 3)")
    ap.add_argument("--inner", type=int, default=None,
                    help="back-to-back calls per permute/unpermute sample, and calls per CUDA graph (default 20; smoke 1)")
    ap.add_argument("--time-budget", type=float, default=0,
                    help="seconds; once spent, later presets skip torch.compile (0: no limit)")
    ap.add_argument("--no-compile", action="store_true", help="skip every torch.compile peer")
    ap.add_argument("--compile-backend", default="inductor", help="torch.compile backend (default inductor)")
    ap.add_argument("--compile-mode", default="default", help="torch.compile mode (default | max-autotune | ...)")
    ap.add_argument("--align", type=int, default=ALIGN, help="rows per expert group of the PyTorch block (default 16)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 3)
    args.iters = args.iters if args.iters is not None else (3 if args.smoke else 10)
    args.inner = args.inner if args.inner is not None else (1 if args.smoke else 20)
    presets = [p for p in args.presets.split(",") if p]
    bad = [p for p in presets if p not in PRESETS]
    if bad:
        ap.error(f"unknown preset(s) {', '.join(bad)}; known: {', '.join(PRESETS)}")
    parts = set(args.parts.split(","))
    if not parts <= {"permute", "block"} or not parts:
        ap.error("--parts takes permute, block or permute,block")
    if args.align < 1:
        ap.error("--align must be >= 1")

    import torch
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("moe_block_peer: no CUDA device visible to torch (use --device cpu --smoke on a CPU)", file=sys.stderr)
        return 2
    if dev.type == "cuda" and dev.index is not None:
        torch.cuda.set_device(dev)
    if not hasattr(torch, "_grouped_mm"):
        print(f"moe_block_peer: torch {torch.__version__} has no torch._grouped_mm", file=sys.stderr)
        return 2
    import mxmoe_torch
    os.makedirs(args.out_dir, exist_ok=True)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": pt._device_text(torch) if dev.type == "cuda" else
        f"CPU ({platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads)",
        "device_type": dev.type,
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
        "mxmoe": getattr(mxmoe_torch, "__version__", ""), "mxmoe_library": mxmoe_torch.library_path(),
        "git": pt._git_describe(),
        "command": "python3 " + " ".join(shlex.quote(a) for a in (sys.argv if argv is None else [sys.argv[0]] + argv)),
        "presets": presets, "parts": sorted(parts), "smoke": args.smoke, "warmup": args.warmup, "iters": args.iters,
        "inner": args.inner, "compile_backend": "off" if args.no_compile else args.compile_backend,
        "compile_mode": args.compile_mode, "align": args.align, "seed": args.seed, "errors": [],
    }
    print(f"device: {meta['device']}, torch {meta['torch']}, mxmoe_torch {meta['mxmoe']}", file=sys.stderr)
    timer = Timer(dev)
    args._compiled_a = {}
    t0 = time.monotonic()

    def compile_ok():
        return not (args.time_budget > 0 and time.monotonic() - t0 > args.time_budget)

    perm, blocks = [], []
    for name in presets:
        shape = preset_shape(name, args.smoke)
        print(f"{name}: N={shape['tokens']} K={shape['top_k']} H={shape['hidden']} F={shape['ffn']} "
              f"E={shape['experts']} t={time.monotonic() - t0:.0f}s", file=sys.stderr, flush=True)
        if "permute" in parts:
            for split in SPLITS:
                try:
                    rec = part_a(shape, split, args, dev, timer, compile_ok())
                except Exception as e:  # noqa: BLE001
                    meta["errors"].append(f"{name} {split} permute: {_err(e)}")
                    traceback.print_exc()
                    continue
                perm.append(rec)
                for op, impl, label in A_CELLS:
                    c = rec["cells"].get(op, {}).get(impl)
                    if c is not None:
                        print(f"  {split:8s} {label:44s} {_ms_text(c):>12s} {_bw_text(c)}", file=sys.stderr,
                              flush=True)
        if "block" in parts:
            try:
                b = part_b(shape, args, dev, timer, compile_ok())
                blocks.append(b)
                for v, label in B_VARIANTS:
                    c = b["ops"]["fwd_bwd"].get(v)
                    if c is not None:
                        print(f"  block fwd+bwd {label:48s} {_ms_text(c)}", file=sys.stderr, flush=True)
            except Exception as e:  # noqa: BLE001
                meta["errors"].append(f"{name} block: {_err(e)}")
                traceback.print_exc()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        meta["wall_s"] = round(time.monotonic() - t0, 1)
        # partial results survive a kill: numbers and markdown after every preset, the chart at the end
        write_outputs(args.out_dir, meta, perm, blocks, with_chart=False)
    meta["wall_s"] = round(time.monotonic() - t0, 1)
    md = write_outputs(args.out_dir, meta, perm, blocks, with_chart=True)
    print(md)
    return 0 if not meta["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
