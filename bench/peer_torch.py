#!/usr/bin/env python3
"""Peer measurements beside `mxmoe bench`, on the same GPU in the same session, and the report.

Reads the JSON that `mxmoe bench --json FILE` wrote (its rows, and the exact token split of every
preset/split) and times, on the same shapes and splits, what a Hopper user runs today:
  - torch._grouped_mm BF16 (device-side int32 offsets) for each GEMM of the layer: FC1/FC2 fprop,
    FC2/FC1 dgrad (m-grouped), FC2/FC1 wgrad (k-grouped); plain GEMMs, no epilogue;
  - torch._scaled_grouped_mm FP8 (E4M3, fp32 row-wise scales, use_fast_accum) on the same shapes, the
    operands quantized beforehand (not timed), where the recipe is fp8_blockwise (--no-fp8 skips it);
  - the BF16 layer (grouped_mm -> GLU activation of the preset * router prob -> grouped_mm),
    forward and forward+backward (autograd), EAGER and under torch.compile;
  - the peak GPU memory of one forward+backward of the eager and of the compiled layer;
  - torchao's FP8 row-wise MoE layer (torchao 0.18.0, pinned): the same layer with FC1 and FC2 each
    one torchao.prototype.moe_training._to_fp8_rowwise_then_scaled_grouped_mm call, forward and
    forward+backward under torch.compile, where the JSON has fp8_blockwise rows (--torchao on|off);
    rows torchao_fp8_layer_fwd, torchao_fp8_layer_fwd_bwd, ratios against mxmoe's layer rows.
Ratios are peer_ms / mxmoe_ms: > 1 means mxmoe is faster.

--accuracy DUMP_DIR: the error against fp64 of mxmoe (the outputs `mxmoe run --dump DUMP_DIR`
wrote), of torchao's FP8 row-wise layer and of the BF16 layer, all on the inputs of that dump.

    python3 bench/peer_torch.py --mxmoe-json out/bench.json --out-dir out   # peer.json bench.md bench.png
    python3 bench/peer_torch.py --mxmoe-json out/bench.json --out out/peer.md  # markdown only (old form)
    python3 bench/peer_torch.py --accuracy /tmp/acc --mxmoe-run-json out/run.json --out-dir out  # accuracy.md
    python3 bench/peer_torch.py --selftest   # table + chart from synthetic JSON; no torch, no GPU

torch (and torchao) are imported only inside the measuring functions, so the report code runs on any machine.
"""
import argparse
import datetime
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

GEMM_OPS = ["fc1_fprop", "fc2_fprop", "fc2_dgrad", "fc1_dgrad", "fc2_wgrad", "fc1_wgrad"]
M_GROUPED = {"fc1_fprop", "fc2_fprop", "fc2_dgrad", "fc1_dgrad"}
LAYER_OPS = ["layer_fwd", "layer_fwd_bwd"]
ALL_OPS = LAYER_OPS + GEMM_OPS
FLOP_FACTOR = {"fc1_fprop": 4, "fc2_fprop": 2, "fc2_dgrad": 2, "fc1_dgrad": 4, "fc2_wgrad": 2, "fc1_wgrad": 4,
               "layer_fwd": 6, "layer_fwd_bwd": 18,
               # mxmoe's MXFP8 layer with weights prepared once (prepare_weights), against the same peer
               "layer_fwd_prepared": 6, "layer_fwd_bwd_prepared": 18}  # times T*H*F
# Targets drawn on the chart and checked in the summary (ratio peer/mxmoe to reach).
GEMM_TARGET = 1.0
LAYER_COMPILE_TARGET = {"bf16": 1.10, "mxfp8": 1.15, "fp8_blockwise": 1.70, "fp8_blockwise_pow2": 1.70}  # issues 8, 9, 10

# tools/mxmoe/presets.cpp (activation, GLU layout); the JSON's splits do not carry them. A split that
# does carry "activation"/"glu_layout" keys wins over this table.
PRESET_GLU = {
    "small": ("swiglu", "halves"),
    "dsv3": ("swiglu", "halves"),
    "qwen3-30b": ("swiglu", "halves"),
    "gptoss-120b": ("clamped_swiglu", "interleave32"),
    "mixtral": ("swiglu", "halves"),
}
# include/mxmoe/problem.h ClampedSwiglu defaults; src/common/glu.h has the formula:
#   act = min(a, L) * sigmoid(alpha * min(a, L)) * (clamp(b, -L, L) + linear_offset)
CLAMP = {"limit": 7.0, "alpha": 1.702, "linear_offset": 1.0}
GLU_INTERLEAVE = 32  # interleave32: alternating 32-column a/b blocks of FC1's output
PEER_ROUND = 16      # tokens per expert for the peer's k-grouped GEMMs (and so its layer)
# torchao's FP8 row-wise MoE layer (issue 36): the pinned release and the function both GEMMs call.
TORCHAO_PIN = "0.18.0"
TORCHAO_FN = "torchao.prototype.moe_training._to_fp8_rowwise_then_scaled_grouped_mm"
TORCHAO_LAYER_TARGET = 1.15  # mxmoe's fp8_blockwise layer fwd+bwd >= 1.15x torchao's (issue 36)
AO_OPS = {"layer_fwd": "torchao_fp8_layer_fwd", "layer_fwd_bwd": "torchao_fp8_layer_fwd_bwd"}
ACC_OUTPUTS = ["y", "dx", "dprobs", "dw1", "dw2"]

MIB = 1 << 20


# ----------------------------------------------------------------------------------------------
# Measuring (torch imported lazily)
# ----------------------------------------------------------------------------------------------

def _err(e):
    return f"{type(e).__name__}: {e}".strip()


def median_ms(fn, warmup, iters):
    import torch
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def rounded_sizes(sizes, mult=PEER_ROUND):
    """Round every group down to a multiple of `mult`; the remainder goes to the largest group (same T)."""
    rounded = [s // mult * mult for s in sizes]
    if sizes:
        rounded[max(range(len(sizes)), key=lambda e: sizes[e])] += sum(sizes) - sum(rounded)
    return rounded


def glu_of(split):
    act, layout = PRESET_GLU.get(split["preset"], ("swiglu", "halves"))
    return split.get("activation", act), split.get("glu_layout", layout)


def make_layer(ffn, activation, glu_layout, clamp=CLAMP, gemm=None, act_dtype=None, h_dtype=None):
    """The BF16 layer as a PyTorch user writes it: grouped_mm -> act(a, b) * p (fp32) -> bf16 -> grouped_mm.

    gemm(a [T, K], b_t [E, K, N] (a weight's transposed view, column-major), offs) replaces
    torch._grouped_mm: torchao's FP8 row-wise grouped GEMM (make_torchao_layer) or the fp64
    per-expert reference (_gemm_f64). act_dtype / h_dtype: the GLU's arithmetic and H's storage
    (default fp32 / bf16; the reference passes fp64 for both)."""
    import torch
    import torch.nn.functional as F

    if glu_layout == "halves":
        groups = 1
    elif glu_layout == "interleave32":
        if ffn % GLU_INTERLEAVE:
            raise ValueError(f"interleave32 needs ffn % 32 == 0, got {ffn}")
        groups = ffn // GLU_INTERLEAVE
    else:
        raise ValueError(f"unknown GLU layout {glu_layout}")
    if activation not in ("swiglu", "clamped_swiglu"):
        raise ValueError(f"unknown activation {activation}")
    width = ffn // groups
    L, alpha, off = float(clamp["limit"]), float(clamp["alpha"]), float(clamp["linear_offset"])
    if gemm is None:
        def gemm(a, b_t, offs):
            return torch._grouped_mm(a, b_t, offs=offs)
    act_dtype = act_dtype or torch.float32
    h_dtype = h_dtype or torch.bfloat16

    def layer(x, w1, w2, probs, offs):
        T = x.shape[0]
        c = gemm(x, w1.transpose(-2, -1), offs)  # [T, 2F]
        c4 = c.view(T, groups, 2, width)          # halves: [T,1,2,F]; interleave32: [T,F/32,2,32]
        a = c4[:, :, 0, :].to(act_dtype)
        b = c4[:, :, 1, :].to(act_dtype)
        if activation == "swiglu":
            act = F.silu(a) * b
        else:
            ac = a.clamp(max=L)
            act = ac * torch.sigmoid(alpha * ac) * (b.clamp(-L, L) + off)
        h = (act * probs[:, None, None]).to(h_dtype).reshape(T, ffn)
        return gemm(h, w2.transpose(-2, -1), offs)  # [T, H]

    return layer


def _torchao_fn():
    """torchao's FP8 row-wise grouped GEMM (differentiable), after checking the pin."""
    import torchao
    from torchao.prototype.moe_training import _to_fp8_rowwise_then_scaled_grouped_mm
    if torchao.__version__ != TORCHAO_PIN and not os.environ.get("MXMOE_TORCHAO_UNPINNED"):
        raise RuntimeError(f"torchao {torchao.__version__} found; the peer is pinned to {TORCHAO_PIN} "
                           "(MXMOE_TORCHAO_UNPINNED=1 runs it anyway)")
    return _to_fp8_rowwise_then_scaled_grouped_mm


def make_torchao_layer(ffn, activation, glu_layout, clamp=CLAMP):
    """torchao's FP8 row-wise MoE layer: the BF16 layer with both grouped GEMMs replaced by
    _to_fp8_rowwise_then_scaled_grouped_mm, called as torchao's own override calls it for
    torchtitan's experts (torchao/prototype/moe_training/tensor.py -> utils._quantize_then_scaled_grouped_mm,
    Float8TrainingOpConfig defaults): A = the row-major activation, B_t = the weight's transposed view
    (w.transpose(-2, -1): [E, K, N] column-major, no copy), offs = int32 group END offsets [E],
    out bf16, float8_e4m3fn, pad_token_groups_for_grouped_mm=False (0.18.0 asserts False; every group
    must then hold a multiple of 16 tokens). It quantizes both operands of every GEMM in each call
    (power-of-two row-wise scales), forward and backward."""
    import torch
    fn = _torchao_fn()

    def gemm(a, b_t, offs):
        return fn(a, b_t, offs, torch.bfloat16, torch.float8_e4m3fn, False)

    return make_layer(ffn, activation, glu_layout, clamp, gemm=gemm)


def _gemm_f64(a, b_t, offs):
    """The fp64 reference's grouped GEMM: one matmul per expert (offs: int32 end offsets)."""
    import torch
    outs, start = [], 0
    for e, end in enumerate(offs.tolist()):
        outs.append(a[start:end] @ b_t[e])
        start = end
    return torch.cat(outs) if outs else a.new_zeros((0, b_t.shape[-1]))


def _uniform(shape, scale, dtype):
    import torch
    return (torch.rand(shape, device="cuda", dtype=torch.float32) * 2 - 1).mul_(scale).to(dtype)


def _cell(fn):
    """{"ms": ...} or {"error": ...}; never raises."""
    try:
        return {"ms": fn()}
    except Exception as e:  # noqa: BLE001 - a peer failing must not stop the benchmark
        _cuda_alive()  # let pending work finish (or surface a dead context) before the next cell
        return {"error": _err(e), "trace": traceback.format_exc(limit=3)}


def _cuda_alive():
    import torch
    try:
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001
        return False


def _graph_breaks():
    """Graph breaks dynamo counted since its last reset (0: the layer compiled as one graph)."""
    try:
        from torch._dynamo.utils import counters
        return int(sum(counters["graph_break"].values()))
    except Exception:  # noqa: BLE001
        return None


def _reset_dynamo():
    import torch
    try:
        torch._dynamo.reset()
    except Exception:  # noqa: BLE001
        pass


def peer_gemms(H, Fd, E, T, offs_exact, offs_r, args):
    """Each GEMM of the layer as one torch._grouped_mm call. m-grouped GEMMs run mxmoe's exact split
    (group row offsets times K stay 16-byte aligned for every preset's K); the k-grouped ones need
    16-token groups and run the rounded split."""
    import torch
    bf = torch.bfloat16
    gm = torch._grouped_mm
    torch.manual_seed(args.seed)
    x = _uniform((T, H), 1.0, bf)
    dy = _uniform((T, H), 1.0, bf)
    w1 = _uniform((E, 2 * Fd, H), 1.0 / math.sqrt(H), bf)
    w2 = _uniform((E, H, Fd), 1.0 / math.sqrt(Fd), bf)
    a = _uniform((T, Fd), 1.0, bf)
    dc = _uniform((T, 2 * Fd), 1.0, bf)
    w1t = w1.transpose(-2, -1)  # [E, H, 2F]
    w2t = w2.transpose(-2, -1)  # [E, F, H]
    dyt = dy.t()  # column-major [H, T] views, as autograd passes them to the k-grouped GEMM
    dct = dc.t()
    gemms = {
        "fc1_fprop": lambda o: gm(x, w1t, offs=o),  # [T,H] x [E,H,2F] -> [T,2F]
        "fc2_fprop": lambda o: gm(a, w2t, offs=o),  # [T,F] x [E,F,H] -> [T,H]
        "fc2_dgrad": lambda o: gm(dy, w2, offs=o),  # [T,H] x [E,H,F] -> [T,F]
        "fc1_dgrad": lambda o: gm(dc, w1, offs=o),  # [T,2F] x [E,2F,H] -> [T,H]
        "fc2_wgrad": lambda o: gm(dyt, a, offs=o),  # [H,T] x [T,F] per expert -> [E,H,F]
        "fc1_wgrad": lambda o: gm(dct, x, offs=o),  # [2F,T] x [T,H] per expert -> [E,2F,H]
    }
    out = {}
    for op in GEMM_OPS:
        exact = op in M_GROUPED and not args.round_all
        o = offs_exact if exact else offs_r
        c = _cell(lambda f=gemms[op], o=o: median_ms(lambda: f(o), args.warmup, args.iters))
        c["offsets"] = "exact" if exact else "rounded16"
        out[op] = {"eager": c}
    if getattr(args, "fp8", False):
        try:
            fp8 = fp8_rowwise_gemms(x, dy, w1, w2, a, dc, E)
        except Exception as e:  # noqa: BLE001
            fp8 = {op: (lambda o, e=e: (_ for _ in ()).throw(e)) for op in GEMM_OPS}
        for op in GEMM_OPS:
            o = offs_exact if op in M_GROUPED and not args.round_all else offs_r
            c = _cell(lambda f=fp8[op], o=o: median_ms(lambda: f(o), args.warmup, args.iters))
            c["offsets"] = out[op]["eager"]["offsets"]
            out[op]["fp8_rowwise"] = c
    return out


def _rowwise_fp8(t, dim):
    """E4M3 copy of t with fp32 scales along `dim` (amax / 448 per slice over the other axis), and the
    scales: the row-wise FP8 recipe torch._scaled_grouped_mm takes."""
    import torch
    amax = t.abs().amax(dim=dim, keepdim=True).float().clamp_min(1e-12)
    scale = amax / 448.0
    q = (t.float() / scale).to(torch.float8_e4m3fn)
    return q, scale.squeeze(dim).contiguous()


def fp8_rowwise_gemms(x, dy, w1, w2, a, dc, E):
    """Each GEMM of the layer as one torch._scaled_grouped_mm call (FP8 row-wise; mat_a row-major,
    mat_b column-major, as the op requires), operands quantized once here. The wgrad (2D x 2D)
    scales are one per row per group: the global row scale repeated per expert (timing only)."""
    import torch
    sgm = torch._scaled_grouped_mm
    bf = torch.bfloat16
    x8, sx = _rowwise_fp8(x, 1)        # [T, H], [T]
    dy8, sdy = _rowwise_fp8(dy, 1)
    a8, sa = _rowwise_fp8(a, 1)        # [T, F]
    dc8, sdc = _rowwise_fp8(dc, 1)     # [T, 2F]
    w1q, sw1 = _rowwise_fp8(w1, 2)     # [E, 2F, H] along H -> [E, 2F]: fprop's B^T rows
    w2q, sw2 = _rowwise_fp8(w2, 2)     # [E, H, F] along F -> [E, H]
    w1tq, sw1t = _rowwise_fp8(w1.transpose(-2, -1).contiguous(), 2)  # [E, H, 2F] along 2F -> [E, H]
    w2tq, sw2t = _rowwise_fp8(w2.transpose(-2, -1).contiguous(), 2)  # [E, F, H] along H -> [E, F]
    dyT8, sdyT = _rowwise_fp8(dy.t().contiguous(), 1)  # [H, T], [H]
    dcT8, sdcT = _rowwise_fp8(dc.t().contiguous(), 1)  # [2F, T]
    aT8, saT = _rowwise_fp8(a.t().contiguous(), 1)     # [F, T]: a as column-major [T, F]
    xT8, sxT = _rowwise_fp8(x.t().contiguous(), 1)     # [H, T]
    rep = lambda s: s.repeat(E).contiguous()  # noqa: E731  (2D x 2D: a scale per row per group)
    sdyT_e, sdcT_e, saT_e, sxT_e = rep(sdyT), rep(sdcT), rep(saT), rep(sxT)

    def call(ma, mb, sa_, sb_):
        return lambda o: sgm(ma, mb, sa_, sb_, offs=o, out_dtype=bf, use_fast_accum=True)
    return {
        "fc1_fprop": call(x8, w1q.transpose(-2, -1), sx, sw1),    # [T,H] x [E,H,2F] col-major
        "fc2_fprop": call(a8, w2q.transpose(-2, -1), sa, sw2),    # [T,F] x [E,F,H]
        "fc2_dgrad": call(dy8, w2tq.transpose(-2, -1), sdy, sw2t),  # [T,H] x [E,H,F]
        "fc1_dgrad": call(dc8, w1tq.transpose(-2, -1), sdc, sw1t),  # [T,2F] x [E,2F,H]
        "fc2_wgrad": call(dyT8, aT8.t(), sdyT_e, saT_e),          # [H,T] x [T,F] per expert
        "fc1_wgrad": call(dcT8, xT8.t(), sdcT_e, sxT_e),          # [2F,T] x [T,H] per expert
    }


def peer_split(split, args, over_budget):
    """Everything the peer measures for one preset/split. Returns a JSON-able dict."""
    import torch

    H, Fd, E, T = (int(split[k]) for k in ("hidden", "ffn", "experts", "tokens"))
    sizes = [int(s) for s in split["sizes"]]
    activation, layout = glu_of(split)
    peer_sizes = rounded_sizes(sizes)
    rec = {"preset": split["preset"], "split": split["split"], "hidden": H, "ffn": Fd, "experts": E, "tokens": T,
           "activation": activation, "glu_layout": layout, "sizes": sizes, "peer_sizes_rounded16": peer_sizes,
           "tokens_moved_by_rounding": sum(abs(a - b) for a, b in zip(sizes, peer_sizes)) // 2,
           "ops": {}, "memory": {}}
    ops = rec["ops"]
    t_start = time.monotonic()
    bf = torch.bfloat16
    W, I = args.warmup, args.iters

    def offs_of(s):
        return torch.cumsum(torch.tensor(s, dtype=torch.int64), 0).to(torch.int32).cuda()  # end offsets

    offs_exact = offs_of(sizes)
    offs_r = offs_of(peer_sizes)

    # ---- the six GEMMs, plain torch._grouped_mm (their tensors live only inside peer_gemms) ----
    try:
        ops.update(peer_gemms(H, Fd, E, T, offs_exact, offs_r, args))
    except Exception as e:  # noqa: BLE001
        for op in GEMM_OPS:
            ops.setdefault(op, {"eager": {"error": _err(e)}})
    torch.cuda.synchronize()
    torch.cuda.empty_cache()

    # ---- the layer: inputs, weights, dy (all that stays resident) ----
    try:
        torch.manual_seed(args.seed + 1)
        x = _uniform((T, H), 1.0, bf).requires_grad_(True)
        w1 = _uniform((E, 2 * Fd, H), 1.0 / math.sqrt(H), bf).requires_grad_(True)
        w2 = _uniform((E, H, Fd), 1.0 / math.sqrt(Fd), bf).requires_grad_(True)
        probs = torch.rand(T, device="cuda", dtype=torch.float32).requires_grad_(True)
        dy = _uniform((T, H), 1.0, bf)
        eager_fn = make_layer(Fd, activation, layout)
    except Exception as e:  # noqa: BLE001
        for op in LAYER_OPS:
            ops[op] = {"eager": {"error": _err(e)}, "compile": {"error": _err(e)}}
        rec["memory"] = {"eager": {"error": _err(e)}, "compile": {"error": _err(e)}}
        return rec
    inputs = (x, w1, w2, probs)

    def fwd(fn):
        return fn(x, w1, w2, probs, offs_r)

    def fwd_bwd(fn):
        # autograd.grad: fresh grads every call, no accumulation into .grad (mxmoe overwrites its dW)
        y = fn(x, w1, w2, probs, offs_r)
        return torch.autograd.grad(y, inputs, dy)

    def peak(fn):
        """Peak allocated bytes over one fwd+bwd, from a clean state after a warm-up run."""
        g = fwd_bwd(fn)
        del g
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        resident = torch.cuda.memory_allocated()
        g = fwd_bwd(fn)
        torch.cuda.synchronize()
        p = torch.cuda.max_memory_allocated()
        grads = sum(t.numel() * t.element_size() for t in g if t is not None)
        del g
        return {"peak_mib": p / MIB, "resident_mib": resident / MIB, "grads_mib": grads / MIB}

    def mem_cell(fn):
        try:
            return peak(fn)
        except Exception as e:  # noqa: BLE001
            return {"error": _err(e)}
        finally:
            torch.cuda.empty_cache()

    for op in LAYER_OPS:
        ops[op] = {}
    ops["layer_fwd"]["eager"] = _cell(lambda: median_ms(lambda: fwd(eager_fn), W, I))
    ops["layer_fwd_bwd"]["eager"] = _cell(lambda: median_ms(lambda: fwd_bwd(eager_fn), W, I))
    rec["memory"]["eager"] = mem_cell(eager_fn)

    # ---- the same layer under torch.compile ----
    key = (H, Fd, E, T, activation, layout)
    cache = args._compiled
    if args.no_compile:
        why = {"skipped": "--no-compile"}
    elif over_budget() and cache.get("key") != key:  # a split whose preset is compiled already still runs
        why = {"skipped": f"time budget ({args.time_budget:.0f} s) spent before compiling"}
    else:
        why = None
    if why:
        for op in LAYER_OPS:
            ops[op]["compile"] = dict(why)
        rec["memory"]["compile"] = dict(why)
    else:
        compiled = None
        try:
            if cache.get("key") != key:  # one compile per preset; its balanced and skewed splits share it
                cache.clear()
                _reset_dynamo()
                torch._dynamo.config.suppress_errors = False  # a failed compile must not fall back to eager
                kw = {"dynamic": False}
                if args.compile_mode != "default":
                    kw["mode"] = args.compile_mode
                cache["fn"] = torch.compile(make_layer(Fd, activation, layout), **kw)
                cache["key"] = key
            if cache.get("error"):
                raise RuntimeError(f"(compile failed on this preset's earlier split) {cache['error']}")
            compiled = cache["fn"]
            t0 = time.monotonic()
            gb0 = _graph_breaks()
            fwd_bwd(compiled)  # compiles forward and backward (on a preset's first split), outside any timing
            torch.cuda.synchronize()
            rec["compile_first_call_s"] = time.monotonic() - t0
            gb1 = _graph_breaks()
            if "breaks" not in cache:
                cache["breaks"] = gb1 - gb0 if gb0 is not None and gb1 is not None else None
            rec["compile_graph_breaks"] = cache["breaks"]
        except Exception as e:  # noqa: BLE001
            cache.setdefault("error", _err(e))
            for op in LAYER_OPS:
                ops[op]["compile"] = {"error": _err(e), "trace": traceback.format_exc(limit=4)}
            rec["memory"]["compile"] = {"error": _err(e)}
            compiled = None
        if compiled is not None:
            ops["layer_fwd"]["compile"] = _cell(lambda: median_ms(lambda: fwd(compiled), W, I))
            ops["layer_fwd_bwd"]["compile"] = _cell(lambda: median_ms(lambda: fwd_bwd(compiled), W, I))
            rec["memory"]["compile"] = mem_cell(compiled)

    # ---- torchao's FP8 row-wise layer (both GEMMs through _to_fp8_rowwise_then_scaled_grouped_mm),
    # under torch.compile (eager with --no-compile), on the same inputs and the same 16-rounded split ----
    if getattr(args, "torchao", False):
        peer_torchao(rec, key, (Fd, activation, layout), fwd, fwd_bwd, mem_cell, args, over_budget)
    x = w1 = w2 = probs = dy = inputs = None  # free the split's tensors before the next one
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    rec["wall_s"] = time.monotonic() - t_start
    return rec


def peer_torchao(rec, key, layer_args, fwd, fwd_bwd, mem_cell, args, over_budget):
    """Times torchao's FP8 row-wise layer into rec["ops"]["torchao_fp8_layer_fwd(_bwd)"][variant] and its
    peak memory into rec["memory"]["torchao_fp8"]. One compile per preset, outside the timing."""
    import torch
    ops = rec["ops"]
    variant = "eager" if args.no_compile else "compile"
    for name in AO_OPS.values():
        ops[name] = {}
    cache = args._compiled_ao
    why = None
    if variant == "compile" and over_budget() and cache.get("key") != key:
        why = {"skipped": f"time budget ({args.time_budget:.0f} s) spent before compiling"}
    fn = None
    if why is None:
        try:
            if cache.get("key") != key:
                cache.clear()
                cache["key"] = key
                layer = make_torchao_layer(*layer_args)
                if variant == "compile":
                    torch._dynamo.config.suppress_errors = False
                    kw = {"dynamic": False}
                    if args.compile_mode != "default":
                        kw["mode"] = args.compile_mode
                    layer = torch.compile(layer, **kw)
                cache["fn"] = layer
            if cache.get("error"):
                raise RuntimeError(f"(failed on this preset's earlier split) {cache['error']}")
            fn = cache["fn"]
            t0 = time.monotonic()
            gb0 = _graph_breaks()
            fwd_bwd(fn)  # compiles forward and backward (on a preset's first split), outside any timing
            torch.cuda.synchronize()
            rec["torchao_first_call_s"] = time.monotonic() - t0
            gb1 = _graph_breaks()
            if "breaks" not in cache:
                cache["breaks"] = gb1 - gb0 if gb0 is not None and gb1 is not None else None
            rec["torchao_graph_breaks"] = cache["breaks"]
        except Exception as e:  # noqa: BLE001
            cache.setdefault("error", _err(e))
            why = {"error": _err(e), "trace": traceback.format_exc(limit=4)}
            fn = None
            _cuda_alive()
    if fn is None:
        for name in AO_OPS.values():
            ops[name][variant] = dict(why)
        rec["memory"]["torchao_fp8"] = {k: v for k, v in why.items() if k != "trace"}
        return
    W, I = args.warmup, args.iters
    ops[AO_OPS["layer_fwd"]][variant] = _cell(lambda: median_ms(lambda: fwd(fn), W, I))
    ops[AO_OPS["layer_fwd_bwd"]][variant] = _cell(lambda: median_ms(lambda: fwd_bwd(fn), W, I))
    rec["memory"]["torchao_fp8"] = mem_cell(fn)


# ----------------------------------------------------------------------------------------------
# Accuracy: mxmoe's and the peers' errors against fp64 on the inputs `mxmoe run --dump` wrote
# ----------------------------------------------------------------------------------------------

def _read_npy(path, torch):
    """A .npy v1/v2 file (little-endian f4/i4/f8, C order) as a CPU tensor; numpy not needed."""
    import ast
    import struct
    with open(path, "rb") as f:
        if f.read(6) != b"\x93NUMPY":
            raise ValueError(f"{path}: not a .npy file")
        major = f.read(2)[0]
        n = struct.unpack("<H" if major == 1 else "<I", f.read(2 if major == 1 else 4))[0]
        header = ast.literal_eval(f.read(n).decode("latin1"))
        data = bytearray(f.read())
    dtypes = {"<f4": torch.float32, "<i4": torch.int32, "<f8": torch.float64, "<i8": torch.int64}
    if header.get("fortran_order") or header["descr"] not in dtypes:
        raise ValueError(f"{path}: unsupported .npy header {header}")
    shape = tuple(header["shape"])
    t = torch.frombuffer(data, dtype=dtypes[header["descr"]]) if data else torch.empty(0, dtype=dtypes[header["descr"]])
    return t.reshape(shape)


def _rel_err(out, ref):
    """Relative Frobenius error ||out - ref|| / ||ref|| in fp64 (inf when out has a NaN or Inf)."""
    import torch
    o = out.detach().to(torch.float64).reshape(-1)
    r = ref.detach().to(torch.float64).reshape(-1).to(o.device)
    if o.numel() != r.numel():
        raise ValueError(f"shape mismatch {tuple(out.shape)} vs {tuple(ref.shape)}")
    if not bool(torch.isfinite(o).all()):
        return math.inf
    num = float(torch.linalg.vector_norm(o - r))
    den = float(torch.linalg.vector_norm(r))
    return num / den if den > 0 else num


def _mxmoe_run_checks(path):
    """{output: [(error, scope), ...]} of the "fp64 reference" checks in `mxmoe run --json`."""
    with open(path) as f:
        j = json.load(f)
    out = {}
    for c in j.get("checks", []):
        if c.get("kind") == "fp64 reference" and c.get("values", 0):
            out.setdefault(c["output"], []).append((c.get("error"), c.get("scope", "")))
    return {"checks": out, "device": j.get("device"), "description": (j.get("problem") or {}).get("description"),
            "pass": j.get("pass")}


def accuracy_run(dump_dir, args):
    """Errors against an fp64 reference of the layer (x, W1, W2, probs -> y; dY -> dx, dW1, dW2, dprobs),
    all on the inputs `mxmoe run --dump DIR` wrote: mxmoe's (its dumped outputs), torchao's FP8
    row-wise layer's and the BF16 torch layer's (run here, eager, on those inputs). Returns a JSON-able dict."""
    import torch
    with open(os.path.join(dump_dir, "problem.json")) as f:
        p = json.load(f)
    dev = torch.device(args.accuracy_device or ("cuda" if torch.cuda.is_available() else "cpu"))
    H, Fd, E, T = (int(p[k]) for k in ("hidden", "ffn", "experts", "tokens"))
    clamp = {"limit": p.get("clamp_limit", CLAMP["limit"]), "alpha": p.get("clamp_alpha", CLAMP["alpha"]),
             "linear_offset": p.get("clamp_linear_offset", CLAMP["linear_offset"])}
    act, layout = p["activation"], p["glu_layout"]
    rec = {"dump": dump_dir, "problem": p, "device": str(dev), "errors": {}, "notes": [], "failed": {}}
    if p.get("fc1_bias") or p.get("fc2_bias"):
        raise SystemExit("peer_torch --accuracy: the dumped problem has biases; the torch and torchao peer layers "
                         "have none (run `mxmoe run` without --bias)")
    ld = lambda name: _read_npy(os.path.join(dump_dir, name + ".npy"), torch)  # noqa: E731
    starts = ld("offsets").to(torch.int64)
    sizes = [int(starts[e + 1] - starts[e]) for e in range(E)]
    rec["sizes"] = sizes
    x32, w1_32, w2_32, dy32, probs = ld("x"), ld("w1"), ld("w2"), ld("dy"), ld("probs")
    mx_out = {k: ld(k) for k in ACC_OUTPUTS}

    # ---- the fp64 reference: the same layer code, fp64 GEMMs (one per expert) and fp64 GLU ----
    offs = torch.cumsum(torch.tensor(sizes, dtype=torch.int64), 0).to(torch.int32)
    f64 = torch.float64
    xr = x32.to(dev, f64).requires_grad_(True)
    w1r = w1_32.to(dev, f64).requires_grad_(True)
    w2r = w2_32.to(dev, f64).requires_grad_(True)
    pr = probs.to(dev, f64).requires_grad_(True)
    ref_layer = make_layer(Fd, act, layout, clamp, gemm=_gemm_f64, act_dtype=f64, h_dtype=f64)
    y = ref_layer(xr, w1r, w2r, pr, offs)
    grads = torch.autograd.grad(y, (xr, w1r, w2r, pr), dy32.to(dev, f64))
    ref = {"y": y.detach(), "dx": grads[0], "dw1": grads[1], "dw2": grads[2], "dprobs": grads[3]}
    del xr, w1r, w2r, pr, y, grads
    rec["errors"]["mxmoe"] = {k: _rel_err(mx_out[k].to(dev), ref[k]) for k in ACC_OUTPUTS}
    del mx_out

    # ---- the peers on the same bf16 values (the dump holds bf16 values as f32: exact) ----
    # torch._grouped_mm's k-grouped GEMMs and torchao (pad_token_groups_for_grouped_mm=False) need groups
    # of a multiple of 16 tokens: where the split has others, each group is padded with zero rows (x, dY
    # and prob 0), which changes no real row's result (row-wise scales are per row; a zero row adds
    # nothing to any amax or to dW), and the padding rows' outputs are dropped.
    psizes = [-(-s // PEER_ROUND) * PEER_ROUND for s in sizes]
    padded = psizes != sizes
    rec["padded_sizes"] = psizes if padded else None
    if padded:
        rec["notes"].append(f"groups padded with zero rows to multiples of {PEER_ROUND} for the peers "
                            f"({sum(psizes) - T} rows; exact: the padding rows' outputs are dropped)")
    idx = torch.cat([torch.arange(s, dtype=torch.int64) + sum(psizes[:e]) for e, s in enumerate(sizes)]) \
        if T else torch.zeros(0, dtype=torch.int64)
    Tp = sum(psizes)

    def pad_rows(t):
        out = t.new_zeros((Tp,) + tuple(t.shape[1:]))
        out[idx] = t
        return out

    bf = torch.bfloat16
    xp = pad_rows(x32).to(dev, bf)
    dyp = pad_rows(dy32).to(dev, bf)
    pp = pad_rows(probs).to(dev, torch.float32)
    w1b = w1_32.to(dev, bf)
    w2b = w2_32.to(dev, bf)
    offs_p = torch.cumsum(torch.tensor(psizes, dtype=torch.int64), 0).to(torch.int32).to(dev)
    idx = idx.to(dev)

    def run_peer(name, make):
        try:
            fn = make()
            xi = xp.clone().requires_grad_(True)
            w1i = w1b.clone().requires_grad_(True)
            w2i = w2b.clone().requires_grad_(True)
            pi = pp.clone().requires_grad_(True)
            yp = fn(xi, w1i, w2i, pi, offs_p)
            g = torch.autograd.grad(yp, (xi, w1i, w2i, pi), dyp)
            out = {"y": yp.detach()[idx], "dx": g[0][idx], "dw1": g[1], "dw2": g[2], "dprobs": g[3][idx]}
            rec["errors"][name] = {k: _rel_err(out[k], ref[k]) for k in ACC_OUTPUTS}
        except Exception as e:  # noqa: BLE001
            rec["failed"][name] = _err(e)
        finally:
            if dev.type == "cuda":
                _cuda_alive()
                torch.cuda.empty_cache()

    run_peer("torchao_fp8_rowwise", lambda: make_torchao_layer(Fd, act, layout, clamp))
    run_peer("torch_bf16", lambda: make_layer(Fd, act, layout, clamp))
    if args.mxmoe_run_json:
        try:
            rec["mxmoe_run"] = _mxmoe_run_checks(args.mxmoe_run_json)
        except Exception as e:  # noqa: BLE001
            rec["failed"]["mxmoe_run_json"] = _err(e)
    return rec


# ----------------------------------------------------------------------------------------------
# Report (pure Python; matplotlib for the chart)
# ----------------------------------------------------------------------------------------------

def load_mxmoe(paths):
    """Merge one or more `mxmoe bench --json` files: rows appended, splits deduplicated."""
    out = {"device": None, "rows": [], "splits": []}
    seen = set()
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        out["device"] = out["device"] or d.get("device")
        dw = d.get("dw_dtype", "f32")  # files written before the field existed: f32
        if out.get("dw_dtype", dw) != dw:
            raise SystemExit(f"peer_torch: {p} has dW in {dw}, an earlier file in {out['dw_dtype']}: compare one at a time")
        out["dw_dtype"] = dw
        if "pool_release_bytes" in d:  # files before session 16 lack it (their pool kept nothing)
            out["pool_release_bytes"] = d["pool_release_bytes"]
        out["rows"].extend(d.get("rows", []))
        for s in d.get("splits", []):
            k = (s["preset"], s["split"])
            if k not in seen:
                seen.add(k)
                out["splits"].append(s)
    return out


def _mxmoe_peak_mib(row):
    """mxmoe's own peak memory for a row, if its JSON carries one (any key with 'peak' in it)."""
    for k, v in row.items():
        if "peak" not in k.lower() or not isinstance(v, (int, float)):
            continue
        kl = k.lower()
        if "mib" in kl or kl.endswith("_mb"):
            return float(v)
        if "gib" in kl:
            return float(v) * 1024
        return float(v) / MIB  # bytes
    return None


def _fmt_ms(v):
    return f"{v:.3f}"


def _short(text, n=60):
    t = " ".join(str(text).split()).replace("|", "/")
    return t if len(t) <= n else t[: n - 1] + "…"


def _cell_text(cell):
    if cell is None:
        return "", None
    if "ms" in cell:
        return _fmt_ms(cell["ms"]), cell["ms"]
    if "error" in cell:
        return "error: " + _short(cell["error"]), None
    if "skipped" in cell:
        return "skipped: " + _short(cell["skipped"], 40), None
    return "", None


def combine(mx, peer_splits):
    """Rows of the side-by-side table, in mxmoe's row order: one per mxmoe (preset, split, recipe, op)."""
    peers = {(s["preset"], s["split"]): s for s in peer_splits}
    splits = {(s["preset"], s["split"]): s for s in mx["splits"]}
    rows = []
    for r in mx["rows"]:
        if r["op"] not in FLOP_FACTOR:
            continue  # e.g. quantize_x: no peer
        key = (r["preset"], r["split"])
        sp = splits.get(key)
        pe = peers.get(key)
        thf = sp["tokens"] * sp["hidden"] * sp["ffn"] if sp else None
        flops = FLOP_FACTOR[r["op"]] * thf if thf else None
        out = {"preset": r["preset"], "split": r["split"], "op": r["op"], "recipe": r["recipe"],
               "mxmoe_ms": r["ms"], "mxmoe_tflops": flops / r["ms"] * 1e-9 if flops and r["ms"] > 0 else None,
               "mxmoe_peak_mib": _mxmoe_peak_mib(r)}
        base_op = r["op"].replace("_prepared", "")
        pe_ops = (pe or {}).get("ops", {})
        ops = pe_ops.get(base_op, {})
        for variant in ("eager", "compile"):
            c = ops.get(variant)
            out[f"{variant}_cell"] = c
            ms = c.get("ms") if c else None
            out[f"{variant}_ms"] = ms
            out[f"{variant}_tflops"] = flops / ms * 1e-9 if (flops and ms) else None
            out[f"{variant}_ratio"] = ms / r["ms"] if (ms and r["ms"] > 0) else None
        c = ops.get("fp8_rowwise") if r["op"] in GEMM_OPS else None
        out["fp8_cell"] = c
        ms = c.get("ms") if c else None
        out["fp8_ms"] = ms
        out["fp8_tflops"] = flops / ms * 1e-9 if (flops and ms) else None
        out["fp8_ratio"] = ms / r["ms"] if (ms and r["ms"] > 0) else None
        # torchao's FP8 row-wise layer (compiled; eager where --no-compile), against every layer row
        ao = pe_ops.get(AO_OPS.get(base_op, ""), {})
        c = ao.get("compile", ao.get("eager")) if ao else None
        out["torchao_cell"] = c
        out["torchao_variant"] = next((v for v in ("compile", "eager") if v in ao), None) if ao else None
        ms = c.get("ms") if c else None
        out["torchao_ms"] = ms
        out["torchao_tflops"] = flops / ms * 1e-9 if (flops and ms) else None
        out["torchao_ratio"] = ms / r["ms"] if (ms and r["ms"] > 0) else None
        if r["op"] in GEMM_OPS:
            out["target_vs_eager"] = GEMM_TARGET
        elif r["recipe"] in LAYER_COMPILE_TARGET:
            out["target_vs_compile"] = LAYER_COMPILE_TARGET[r["recipe"]]
        if _torchao_bar(r["recipe"], r["op"]) is not None:
            out["target_vs_torchao"] = TORCHAO_LAYER_TARGET
        rows.append(out)
    return rows


def _torchao_bar(recipe, op):
    """The issue-36 bar against torchao's layer: fp8_blockwise layer forward+backward rows only."""
    if str(recipe).startswith("fp8_blockwise") and op in ("layer_fwd_bwd", "layer_fwd_bwd_prepared"):
        return TORCHAO_LAYER_TARGET
    return None


def _tf(v):
    return f"{v:.0f}" if v is not None else ""


def _ratio(v):
    return f"{v:.2f}" if v is not None else ""


def build_markdown(meta, mx, peer_splits, rows, accuracy=None):
    L = []
    L.append("# mxmoe bench beside PyTorch (same GPU, same process session)")
    L.append("")
    L.append(f"- date: {meta.get('date', '')}")
    L.append(f"- device: {meta.get('device', '')} (mxmoe JSON: {mx.get('device') or 'n/a'})")
    L.append(f"- torch {meta.get('torch', '')}, CUDA {meta.get('cuda', '')}, python {meta.get('python', '')}")
    if meta.get("git"):
        L.append(f"- mxmoe tree: {meta['git']}")
    L.append(f"- command: `{meta.get('command', '')}`")
    L.append(f"- mxmoe JSON: {', '.join(meta.get('mxmoe_json', []))}")
    L.append(f"- timing: CUDA events, median of {meta.get('iters')} timed runs after {meta.get('warmup')} warm-ups, "
             "both sides; no L2 flush, no input rotation. torch.compile mode: "
             f"{meta.get('compile_mode')}, dynamic=False, compiled once per preset, compilation outside the timing.")
    L.append("- ratio = peer ms / mxmoe ms: > 1 means mxmoe is faster. TFLOP/s from 4·T·H·F (FC1 GEMMs), "
             "2·T·H·F (FC2 GEMMs), 6·T·H·F (layer fwd), 18·T·H·F (layer fwd+bwd).")
    keep = mx.get("pool_release_bytes")
    if keep is not None:
        L.append("- mxmoe's device memory pool keeps "
                 + ("its reserved memory across calls" if keep == "all" else f"up to {keep} bytes across a synchronize")
                 + " (MXMOE_POOL_RELEASE_BYTES; torch's caching allocator keeps its own).")
    dw = (mx.get("dw_dtype") or "f32").upper()  # JSONs written before the field existed used f32
    L.append("- peer GEMMs: plain BF16 `torch._grouped_mm`, no epilogue, BF16 outputs (mxmoe fuses its epilogues "
             f"and writes {dw} dW; `mxmoe bench --dw-dtype`). k-grouped GEMMs (and so the peer layer, whose backward has them) need "
             f"{PEER_ROUND}-token groups: every expert is rounded down to a multiple of {PEER_ROUND}, the remainder "
             "given to the largest expert (same T); the m-grouped GEMMs run "
             + ("the same rounded split." if meta.get("m_grouped_offsets") == "rounded16"
                else "mxmoe's exact split.") + " mxmoe runs the exact split everywhere.")
    if meta.get("torchao") or any(AO_OPS["layer_fwd_bwd"] in sp.get("ops", {}) for sp in peer_splits):
        L.append(f"- torchao FP8 row-wise layer: torchao {meta.get('torchao', 'n/a')} (pinned {TORCHAO_PIN}); the "
                 f"peer layer below with FC1 and FC2 each one `{TORCHAO_FN}(A, W.transpose(-2, -1), offs, bf16, "
                 "float8_e4m3fn, pad_token_groups_for_grouped_mm=False)` call, as torchao's own grouped_mm override "
                 "calls it for torchtitan's experts: E4M3, power-of-two scales, both operands of all six GEMMs "
                 "quantized in every call (A row-wise, W per output column; wgrad per group column-wise), "
                 "`use_fast_accum`, bf16 outputs (dW too); under torch.compile, on the "
                 f"{PEER_ROUND}-rounded split (torchao 0.18.0 asserts pad_token_groups_for_grouped_mm=False, and "
                 f"then needs every group a multiple of {PEER_ROUND} tokens).")
    L.append("- peer layer: grouped_mm -> GLU of the preset in FP32 (SwiGLU; gptoss-120b: clamped SwiGLU "
             f"min(a,{CLAMP['limit']:g})·σ({CLAMP['alpha']:g}·min(a,{CLAMP['limit']:g}))·(clamp(b,±{CLAMP['limit']:g})"
             f"+{CLAMP['linear_offset']:g}), interleave32 layout) × prob -> BF16 -> grouped_mm; "
             "backward by autograd (`torch.autograd.grad`, grads of x, W1, W2, prob; nothing accumulated).")
    L.append("")

    # ---- summary: the layer against torch.compile ----
    L.append("## Layer forward+backward against torch.compile (the targets)")
    L.append("")
    L.append("MXFP8 twice: weights quantized in each call, and prepared once (`prepare_weights`, reused "
             "as across micro-batches; the prepare time is in the JSON as `prepare_weights`).")
    L.append("")
    L.append("| preset | split | torch eager ms | torch.compile ms | mxmoe bf16 ms | bf16: compile/mxmoe | "
             "mxmoe mxfp8 ms | mxfp8: compile/mxmoe | mxfp8 prepared ms | prepared: compile/mxmoe |")
    L.append("|---|---|---|---|---|---|---|---|---|---|")
    keys = []
    for r in rows:
        k = (r["preset"], r["split"])
        if k not in keys:
            keys.append(k)
    by = {(r["preset"], r["split"], r["recipe"], r["op"]): r for r in rows}
    for k in keys:
        cells = [k[0], k[1]]
        any_r = by.get(k + ("bf16", "layer_fwd_bwd")) or by.get(k + ("mxfp8", "layer_fwd_bwd"))
        if not any_r:
            continue
        cells.append(_cell_text(any_r["eager_cell"])[0])
        cells.append(_cell_text(any_r["compile_cell"])[0])
        for rec, op in (("bf16", "layer_fwd_bwd"), ("mxfp8", "layer_fwd_bwd"), ("mxfp8", "layer_fwd_bwd_prepared")):
            r = by.get(k + (rec, op))
            if not r:
                cells += ["", ""]
                continue
            cells.append(_fmt_ms(r["mxmoe_ms"]))
            t = LAYER_COMPILE_TARGET[rec]
            v = r["compile_ratio"]
            cells.append(f"{_ratio(v)} ({'meets' if v is not None and v >= t else 'below'} {t:.2f})"
                         if v is not None else "")
        L.append("| " + " | ".join(cells) + " |")
    L.append("")

    # ---- memory ----
    have_mx_peak = any(r.get("mxmoe_peak_mib") is not None for r in rows)
    L.append("## Peak GPU memory of one forward+backward (MiB)")
    L.append("")
    L.append("Allocated bytes (`torch.cuda.max_memory_allocated`) from a clean state after a warm-up run, "
             "including what stays resident (x, W1, W2, prob, dY) and the returned grads.")
    L.append("")
    hdr = "| preset | split | resident (x, W, prob, dY) | torch eager peak | torch.compile peak |"
    sep = "|---|---|---|---|---|"
    have_ao_mem = any("torchao_fp8" in sp.get("memory", {}) for sp in peer_splits)
    if have_ao_mem:
        hdr += " torchao fp8 row-wise peak |"
        sep += "---|"
    if have_mx_peak:
        hdr += " mxmoe bf16 peak | mxmoe mxfp8 peak | mxmoe mxfp8 prepared peak (copies included) |"
        sep += "---|---|---|"
    else:
        L.append("(mxmoe's JSON carries no peak-memory field; its column is left out.)")
        L.append("")
    L.append(hdr)
    L.append(sep)
    peers = {(s["preset"], s["split"]): s for s in peer_splits}
    for k in keys:
        pe = peers.get(k)
        if not pe:
            continue
        mem = pe.get("memory", {})

        def mtxt(c):
            if not c:
                return ""
            if "peak_mib" in c:
                return f"{c['peak_mib']:.0f}"
            if "error" in c:
                return "error: " + _short(c["error"], 40)
            if "skipped" in c:
                return "skipped"
            return ""

        res = next((mem[v]["resident_mib"] for v in ("eager", "compile") if "resident_mib" in mem.get(v, {})), None)
        line = [k[0], k[1], f"{res:.0f}" if res is not None else "", mtxt(mem.get("eager")), mtxt(mem.get("compile"))]
        if have_ao_mem:
            line.append(mtxt(mem.get("torchao_fp8")))
        if have_mx_peak:
            for rec, op in (("bf16", "layer_fwd_bwd"), ("mxfp8", "layer_fwd_bwd"), ("mxfp8", "layer_fwd_bwd_prepared")):
                r = by.get(k + (rec, op))
                v = r.get("mxmoe_peak_mib") if r else None
                line.append(f"{v:.0f}" if v is not None else "")
        L.append("| " + " | ".join(line) + " |")
    L.append("")

    # ---- every row ----
    # ---- fp8_blockwise GEMMs: against BF16 grouped_mm (the bars) and FP8 row-wise scaled_grouped_mm ----
    fp8_rows = [r for r in rows if r["op"] in GEMM_OPS and str(r["recipe"]).startswith("fp8_blockwise")]
    if fp8_rows:
        L.append("## FP8-blockwise GEMMs against torch._grouped_mm BF16 and torch._scaled_grouped_mm FP8 row-wise")
        L.append("")
        L.append("Bars (issue 10): at least 1.8x BF16 `torch._grouped_mm` (fprop, dgrad), 1.5x (wgrad). The FP8 "
                 "row-wise peer: E4M3 operands with one fp32 scale per row (per row per group for the wgrad), "
                 "quantized before the timing, `use_fast_accum=True`; mxmoe's rows include its epilogues.")
        L.append("")
        L.append("| preset | split | op | recipe | mxmoe ms | mxmoe TFLOP/s | bf16 grouped_mm ms | bf16/mxmoe | bar | "
                 "fp8 row-wise ms | fp8 row-wise TFLOP/s | fp8/mxmoe |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in fp8_rows:
            bar = 1.5 if r["op"].endswith("wgrad") else 1.8
            ratio = r["eager_ratio"]
            verdict = "" if ratio is None else ("meets" if ratio >= bar else "below")
            f_txt = _cell_text(r["fp8_cell"])[0] if r.get("fp8_cell") else "not measured"
            L.append(f"| {r['preset']} | {r['split']} | {r['op']} | {r['recipe']} | {_fmt_ms(r['mxmoe_ms'])} | "
                     f"{_tf(r['mxmoe_tflops'])} | {_cell_text(r['eager_cell'])[0]} | {_ratio(ratio)} | "
                     f"{bar:.1f} {verdict} | {f_txt} | {_tf(r.get('fp8_tflops'))} | {_ratio(r.get('fp8_ratio'))} |")
        L.append("")
    fp8_layer = [r for r in rows if r["op"] in ("layer_fwd_bwd", "layer_fwd_bwd_prepared")
                 and str(r["recipe"]).startswith("fp8_blockwise")]
    if fp8_layer:
        L.append("## FP8-blockwise layer forward+backward against the BF16 layers")
        L.append("")
        L.append(f"Bar (issue 10): at least {LAYER_COMPILE_TARGET['fp8_blockwise']:.1f}x the torch.compile BF16 layer. "
                 "`layer_fwd_bwd` quantizes the weights in the call, `layer_fwd_bwd_prepared` reuses "
                 "`prepare_weights`' copies.")
        L.append("")
        L.append("| preset | split | op | recipe | mxmoe ms | torch eager ms | eager/mxmoe | torch.compile ms | "
                 "compile/mxmoe | bar |")
        L.append("|---|---|---|---|---|---|---|---|---|---|")
        for r in fp8_layer:
            bar = LAYER_COMPILE_TARGET.get(r["recipe"])
            ratio = r["compile_ratio"]
            verdict = "" if ratio is None or bar is None else ("meets" if ratio >= bar else "below")
            L.append(f"| {r['preset']} | {r['split']} | {r['op']} | {r['recipe']} | {_fmt_ms(r['mxmoe_ms'])} | "
                     f"{_cell_text(r['eager_cell'])[0]} | {_ratio(r['eager_ratio'])} | "
                     f"{_cell_text(r['compile_cell'])[0]} | {_ratio(ratio)} | "
                     f"{'' if bar is None else f'{bar:.1f} {verdict}'} |")
        L.append("")

    ao_rows = [r for r in rows if r.get("torchao_cell") is not None and r["recipe"] != "bf16"]
    if ao_rows:
        L.append(f"## Layer against torchao's FP8 row-wise MoE layer (torchao {meta.get('torchao', TORCHAO_PIN)})")
        L.append("")
        L.append(f"Bar (issue 36): mxmoe's fp8_blockwise layer forward+backward at least {TORCHAO_LAYER_TARGET:.2f}x "
                 "torchao's FP8 row-wise layer (peer ms / mxmoe ms), with the weights quantized in the call "
                 "(`layer_fwd_bwd`, as torchao does) and with `prepare_weights` (`layer_fwd_bwd_prepared`). "
                 "torchao runs the 16-rounded split (see the peer layer above); mxmoe the exact one.")
        L.append("")
        L.append("| preset | split | op | recipe | mxmoe ms | mxmoe TFLOP/s | torchao ms | torchao TFLOP/s | "
                 "torchao/mxmoe | bar |")
        L.append("|---|---|---|---|---|---|---|---|---|---|")
        for r in ao_rows:
            bar = _torchao_bar(r["recipe"], r["op"])
            ratio = r["torchao_ratio"]
            verdict = "" if ratio is None or bar is None else ("meets" if ratio >= bar else "below")
            txt = _cell_text(r["torchao_cell"])[0]
            if r.get("torchao_variant") == "eager" and r.get("torchao_ms") is not None:
                txt += " (eager)"
            L.append(f"| {r['preset']} | {r['split']} | {r['op']} | {r['recipe']} | {_fmt_ms(r['mxmoe_ms'])} | "
                     f"{_tf(r['mxmoe_tflops'])} | {txt} | {_tf(r['torchao_tflops'])} | {_ratio(ratio)} | "
                     f"{'' if bar is None else f'{bar:.2f} {verdict}'} |")
        L.append("")
    if accuracy is not None:
        L += build_accuracy_markdown(accuracy)

    L.append("## All rows")
    L.append("")
    L.append("torch ms = eager `torch._grouped_mm` for GEMMs, the eager layer for layer rows; "
             "compile = the layer under torch.compile; torchao = torchao's FP8 row-wise layer (compiled).")
    L.append("")
    L.append("| preset | split | op | mxmoe recipe | mxmoe ms | mxmoe TFLOP/s | torch ms | torch TFLOP/s | "
             "torch/mxmoe | compile ms | compile TFLOP/s | compile/mxmoe | torchao ms | torchao/mxmoe |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        e_txt = _cell_text(r["eager_cell"])[0]
        is_layer = r["op"].replace("_prepared", "") in LAYER_OPS
        c_txt = _cell_text(r["compile_cell"])[0] if is_layer else ""
        a_txt = _cell_text(r.get("torchao_cell"))[0] if is_layer else ""
        L.append(f"| {r['preset']} | {r['split']} | {r['op']} | {r['recipe']} | {_fmt_ms(r['mxmoe_ms'])} | "
                 f"{_tf(r['mxmoe_tflops'])} | {e_txt} | {_tf(r['eager_tflops'])} | {_ratio(r['eager_ratio'])} | "
                 f"{c_txt} | {_tf(r['compile_tflops']) if is_layer else ''} | "
                 f"{_ratio(r['compile_ratio']) if is_layer else ''} | {a_txt} | "
                 f"{_ratio(r.get('torchao_ratio')) if is_layer else ''} |")
    L.append("")

    # ---- peer notes: errors, rounding, compile time ----
    notes = []
    for s in peer_splits:
        for op, variants in s.get("ops", {}).items():
            for v, c in variants.items():
                if c and "error" in c:
                    notes.append(f"- error, {s['preset']} {s['split']} {op} ({v}): `{_short(c['error'], 300)}`")
        for v, c in s.get("memory", {}).items():
            if c and "error" in c:
                notes.append(f"- error, {s['preset']} {s['split']} peak memory ({v}): `{_short(c['error'], 300)}`")
    info = []
    for s in peer_splits:
        bits = [f"{s['activation']}/{s['glu_layout']}"]
        if s.get("tokens_moved_by_rounding"):
            bits.append(f"{s['tokens_moved_by_rounding']} tokens moved by the {PEER_ROUND}-rounding")
        if s.get("compile_first_call_s") is not None:
            bits.append(f"first compiled fwd+bwd call {s['compile_first_call_s']:.1f} s")
        if s.get("compile_graph_breaks") is not None:
            bits.append(f"{s['compile_graph_breaks']} dynamo graph breaks")
        if s.get("torchao_first_call_s") is not None:
            bits.append(f"torchao layer: first fwd+bwd call {s['torchao_first_call_s']:.1f} s")
        if s.get("torchao_graph_breaks") is not None:
            bits.append(f"torchao layer: {s['torchao_graph_breaks']} dynamo graph breaks")
        if s.get("wall_s") is not None:
            bits.append(f"peer wall {s['wall_s']:.1f} s")
        info.append(f"- {s['preset']} {s['split']}: " + ", ".join(bits))
    if info:
        L.append("## Peer details")
        L.append("")
        L += info
        L.append("")
    if notes:
        L.append("## Peer errors")
        L.append("")
        L += notes
        L.append("")
    return "\n".join(L)


ACC_LABELS = {"mxmoe": "mxmoe", "torchao_fp8_rowwise": "torchao fp8 row-wise", "torch_bf16": "torch bf16 layer"}


def _sci(v):
    if v is None:
        return ""
    if isinstance(v, float) and not math.isfinite(v):
        return "inf (NaN/Inf in the output)"
    return f"{v:.3e}"


def build_accuracy_markdown(acc):
    """The section "error vs fp64: mxmoe | torchao fp8 row-wise | ratio" (pure Python)."""
    p = acc.get("problem", {})
    recipe = p.get("recipe", "?")
    errs = acc.get("errors", {})
    mx, ao, bf = errs.get("mxmoe", {}), errs.get("torchao_fp8_rowwise", {}), errs.get("torch_bf16", {})
    run = acc.get("mxmoe_run") or {}
    checks = run.get("checks", {})
    L = [f"## Error against fp64 on the same inputs: mxmoe {recipe} and torchao's FP8 row-wise layer", ""]
    L.append(f"Problem: preset {p.get('preset', '?')} shape, H={p.get('hidden')} F={p.get('ffn')} "
             f"E={p.get('experts')} T={p.get('tokens')}, {p.get('activation')}/{p.get('glu_layout')}, seed "
             f"{p.get('seed')}, {'skewed' if p.get('skew') else 'balanced'} split {acc.get('sizes', '')[:8]}"
             f"{' ...' if len(acc.get('sizes', [])) > 8 else ''}. Inputs: `mxmoe run --dump` ({acc.get('dump')}); "
             "mxmoe's outputs are the dumped ones, torchao's and the BF16 layer's are computed here on the same "
             f"bf16 x, W1, W2, dY and fp32 prob ({acc.get('device')}, eager: compiling changes only the fp32 GLU's "
             "fusion). Reference: the same layer in fp64 (per-expert fp64 GEMMs, fp64 GLU) from the same "
             "inputs, unquantized. Error = ||out - ref||_F / ||ref||_F over every element.")
    if run.get("description"):
        L.append("")
        L.append(f"mxmoe run: {run['description']} on {run.get('device')}; its own fp64 checks "
                 "(src/cpu/reference_f64, rows or experts sampled on large problems) in the last column.")
    L.append("")
    L.append(f"| output | mxmoe {recipe} | torchao fp8 row-wise | torchao / mxmoe | torch bf16 layer | "
             "mxmoe run's own fp64 check |")
    L.append("|---|---|---|---|---|---|")
    ratios = []
    for k in ACC_OUTPUTS:
        m, a = mx.get(k), ao.get(k)
        ratio = a / m if (m and a is not None and math.isfinite(a) and math.isfinite(m)) else None
        if ratio:
            ratios.append(ratio)
        own = "; ".join(f"{_sci(e)} ({sc})" for e, sc in checks.get(k, []))
        L.append(f"| {k} | {_sci(m)} | {_sci(a)} | {_ratio(ratio)} | {_sci(bf.get(k))} | {own} |")
    L.append("")
    if ratios:
        g = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        more = "more" if g >= 1 else "less"
        L.append(f"torchao's FP8 row-wise error / mxmoe's {recipe} error: {min(ratios):.2f}-{max(ratios):.2f} over "
                 f"the {len(ratios)} outputs, geometric mean {g:.2f} (torchao's error {abs(g - 1) * 100:.0f}% {more}).")
        L.append("")
    for n in acc.get("notes", []):
        L.append(f"- {n}")
    for name, e in acc.get("failed", {}).items():
        L.append(f"- {ACC_LABELS.get(name, name)} failed: `{_short(e, 300)}`")
    if acc.get("notes") or acc.get("failed"):
        L.append("")
    return L


CHART_SERIES = [(op, "eager", f"{op} / grouped_mm") for op in GEMM_OPS] + [
    ("layer_fwd", "eager", "layer fwd / eager"),
    ("layer_fwd", "compile", "layer fwd / compile"),
    ("layer_fwd_bwd", "eager", "layer fwd+bwd / eager"),
    ("layer_fwd_bwd", "compile", "layer fwd+bwd / compile"),
    ("layer_fwd", "torchao", "layer fwd / torchao fp8"),
    ("layer_fwd_bwd", "torchao", "layer fwd+bwd / torchao fp8"),
]


def _series_target(op, variant, recipe):
    if op in GEMM_OPS:
        return GEMM_TARGET
    if variant == "compile":
        return LAYER_COMPILE_TARGET.get(recipe)
    if variant == "torchao":
        return _torchao_bar(recipe, op)
    return None


def build_chart(rows, path, title=""):
    """One panel per recipe; x: preset/split; one bar per (op, peer) ratio; line at 1.0 and target ticks."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recipes = []
    groups = []
    for r in rows:
        if r["recipe"] not in recipes:
            recipes.append(r["recipe"])
        g = (r["preset"], r["split"])
        if g not in groups:
            groups.append(g)
    by = {(r["preset"], r["split"], r["recipe"], r["op"]): r for r in rows}
    n = len(CHART_SERIES)
    width = 0.8 / n
    cmap = plt.get_cmap("tab20")
    colors = [cmap(i) for i in (0, 1, 2, 3, 4, 5, 8, 9, 6, 7, 16, 17)]
    fig_w = max(10.0, 1.25 * len(groups) + 3.0)
    fig, axes = plt.subplots(max(1, len(recipes)), 1, figsize=(fig_w, 4.6 * max(1, len(recipes))), squeeze=False)
    ymax = 1.3
    for r in rows:
        for v in ("eager_ratio", "compile_ratio", "torchao_ratio"):
            if r.get(v) is not None and math.isfinite(r[v]):
                ymax = max(ymax, r[v] * 1.12)
    for pi, recipe in enumerate(recipes or ["(none)"]):
        ax = axes[pi][0]
        for si, (op, variant, label) in enumerate(CHART_SERIES):
            for gi, g in enumerate(groups):
                x = gi + (si - (n - 1) / 2) * width
                r = by.get(g + (recipe, op))
                v = r.get(f"{variant}_ratio") if r else None
                if r is not None and v is None and (r.get(f"{variant}_cell") or {}).get("error"):
                    ax.text(x, 0.02, "err", rotation=90, fontsize=5, ha="center", va="bottom", color="red")
                if v is None:
                    continue
                ax.bar(x, v, width, color=colors[si % len(colors)], label=label, edgecolor="none")
                ax.text(x, v, f"{v:.2f}", rotation=90, fontsize=5, ha="center", va="bottom")
                t = _series_target(op, variant, recipe)
                if t is not None:
                    ax.hlines(t, x - width / 2, x + width / 2, colors="black", linewidth=1.2)
        ax.axhline(1.0, color="gray", linestyle="--", linewidth=0.8)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f"{p}\n{s}" for p, s in groups], fontsize=8)
        ax.set_xlim(-0.6, len(groups) - 0.4)
        ax.set_ylim(0, ymax)
        ax.set_ylabel("peer ms / mxmoe ms  (>1: mxmoe faster)")
        tgt = LAYER_COMPILE_TARGET.get(recipe)
        ax.set_title(f"mxmoe {recipe}: black ticks = targets (GEMMs {GEMM_TARGET:.2f} vs grouped_mm"
                     + (f", layer {tgt:.2f} vs torch.compile" if tgt else "")
                     + (f", layer fwd+bwd {TORCHAO_LAYER_TARGET:.2f} vs torchao"
                        if str(recipe).startswith("fp8_blockwise") else "") + ")", fontsize=9)
        ax.grid(axis="y", linewidth=0.3, alpha=0.5)
    # one legend for all panels, under the figure, one entry per series
    uniq = {}
    for row in axes:
        for h, lab in zip(*row[0].get_legend_handles_labels()):
            uniq.setdefault(lab, h)
    if uniq:
        fig.legend(list(uniq.values()), list(uniq.keys()), fontsize=7, ncol=5, loc="lower center",
                   bbox_to_anchor=(0.5, 0.0), frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.07 / max(1, len(recipes)), 1, 1))
    fig.savefig(path, dpi=130)
    plt.close(fig)


def write_outputs(out_dir, out_md, meta, mx, peer_splits, with_chart=True, accuracy=None):
    rows = combine(mx, peer_splits)
    md = build_markdown(meta, mx, peer_splits, rows, accuracy)
    chart_note = None
    if out_dir and with_chart:
        try:
            build_chart(rows, os.path.join(out_dir, "bench.png"),
                        title=f"{meta.get('device', '')}, torch {meta.get('torch', '')}, {meta.get('date', '')}")
        except Exception as e:  # noqa: BLE001 - the numbers matter more than the picture
            chart_note = f"chart not drawn: {_err(e)}"
            md += f"\n\n{chart_note}\n"
    if out_dir:
        with open(os.path.join(out_dir, "peer.json"), "w") as f:
            json.dump({"meta": meta, "peer": peer_splits, "rows": [
                {k: v for k, v in r.items() if not k.endswith("_cell")} for r in rows],
                "accuracy": _json_safe(accuracy), "chart_note": chart_note}, f, indent=1)
        with open(os.path.join(out_dir, "bench.md"), "w") as f:
            f.write(md + "\n")
    if out_md:
        with open(out_md, "w") as f:
            f.write(md + "\n")
    return md, rows


def _device_text(torch):
    try:
        p = torch.cuda.get_device_properties(0)
        return f"{p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, {p.total_memory // MIB} MiB"
    except Exception:  # noqa: BLE001
        return torch.cuda.get_device_name(0)


def _git_describe():
    # MXMOE_TREE names the tree when git cannot: the GPU machine gets a copy of the working tree whose
    # .git (if any) is not this checkout's (scripts/gpu_check.sh sets it from .scratch/commit.txt).
    if os.environ.get("MXMOE_TREE"):
        return os.environ["MXMOE_TREE"]
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        r = subprocess.run(["git", "-C", here, "describe", "--always", "--dirty"], capture_output=True, text=True,
                           timeout=5)
        return r.stdout.strip() if r.returncode == 0 else None
    except Exception:  # noqa: BLE001
        return None


# ----------------------------------------------------------------------------------------------
# Self-test: synthetic JSON, no torch
# ----------------------------------------------------------------------------------------------

def _synthetic():
    presets = [("dsv3", 7168, 2048, 32, 32768), ("gptoss-120b", 2880, 2880, 32, 32768)]
    mx = {"device": "SYNTHETIC GPU", "pool_release_bytes": "all", "rows": [], "splits": []}
    peer = []
    for pi, (name, H, F, E, T) in enumerate(presets):
        for split in ("balanced", "skew"):
            sizes = [T // E] * E if split == "balanced" else [0, 3, 77] + [T // E] * (E - 3)
            sizes[-1] += T - sum(sizes)
            mx["splits"].append({"preset": name, "split": split, "hidden": H, "ffn": F, "experts": E, "tokens": T,
                                 "sizes": sizes})
            thf = T * H * F
            for recipe, eff in (("mxfp8", 180e12), ("bf16", 300e12), ("fp8_blockwise_pow2", 1200e12)):
                if recipe.startswith("fp8") and name != "dsv3":
                    continue
                extra = ["layer_fwd_bwd_prepared"] if recipe.startswith("fp8") else []
                for op in ["layer_fwd", "layer_fwd_bwd", "quantize_x"] + extra + GEMM_OPS:
                    if op == "quantize_x":
                        if recipe == "mxfp8":
                            mx["rows"].append({"preset": name, "split": split, "recipe": recipe, "op": op,
                                               "ms": 0.33, "tflops": 0.0, "gbps": 2800.0})
                        continue
                    ms = FLOP_FACTOR[op] * thf / eff * 1e3
                    mx["rows"].append({"preset": name, "split": split, "recipe": recipe, "op": op, "ms": ms,
                                       "tflops": FLOP_FACTOR[op] * thf / ms * 1e-9, "gbps": 0.0})
            ops = {op: {"eager": {"ms": FLOP_FACTOR[op] * thf / 600e12 * 1e3,
                                  "offsets": "exact" if op in M_GROUPED else "rounded16"}} for op in GEMM_OPS}
            if name == "dsv3":  # the FP8 row-wise peer, measured where mxmoe has fp8_blockwise rows
                for op in GEMM_OPS:
                    ops[op]["fp8_rowwise"] = {"ms": FLOP_FACTOR[op] * thf / 1000e12 * 1e3}
            ops["layer_fwd"] = {"eager": {"ms": 6 * thf / 550e12 * 1e3}, "compile": {"ms": 6 * thf / 600e12 * 1e3}}
            ops["layer_fwd_bwd"] = {"eager": {"ms": 18 * thf / 480e12 * 1e3},
                                    "compile": {"ms": 18 * thf / 320e12 * 1e3}}
            mem = {"eager": {"peak_mib": 6000.0 + pi, "resident_mib": 3584.0, "grads_mib": 3000.0},
                   "compile": {"peak_mib": 7000.0, "resident_mib": 3584.0, "grads_mib": 3000.0}}
            if name == "dsv3":  # torchao's FP8 row-wise layer, measured where mxmoe has fp8_blockwise rows
                ops[AO_OPS["layer_fwd"]] = {"compile": {"ms": 6 * thf / 900e12 * 1e3}}
                ops[AO_OPS["layer_fwd_bwd"]] = {"compile": {"ms": 18 * thf / 1000e12 * 1e3}}
                mem["torchao_fp8"] = {"peak_mib": 5000.0, "resident_mib": 3584.0, "grads_mib": 3000.0}
            if name == "gptoss-120b" and split == "skew":  # a failed compile cell and a failed GEMM
                ops["layer_fwd"]["compile"] = {"error": "BackendCompilerFailed: inductor | raised\nsomething"}
                ops["layer_fwd_bwd"]["compile"] = {"error": "BackendCompilerFailed: inductor | raised\nsomething"}
                mem["compile"] = {"error": "BackendCompilerFailed: inductor"}
                ops["fc2_wgrad"]["eager"] = {"error": "RuntimeError: offsets must be multiples of 16"}
                ops[AO_OPS["layer_fwd"]] = {"compile": {"error": "AssertionError: B must be column-major"}}
                ops[AO_OPS["layer_fwd_bwd"]] = {"compile": {"error": "AssertionError: B must be column-major"}}
                mem["torchao_fp8"] = {"error": "AssertionError: B must be column-major"}
            act, layout = PRESET_GLU[name]
            peer.append({"preset": name, "split": split, "hidden": H, "ffn": F, "experts": E, "tokens": T,
                         "activation": act, "glu_layout": layout, "sizes": sizes,
                         "peer_sizes_rounded16": rounded_sizes(sizes),
                         "tokens_moved_by_rounding": sum(abs(a - b) for a, b in zip(sizes, rounded_sizes(sizes))) // 2,
                         "ops": ops, "memory": mem, "compile_first_call_s": 12.5, "wall_s": 20.0})
    return mx, peer


def _synthetic_accuracy():
    p = {"hidden": 7168, "ffn": 2048, "experts": 4, "tokens": 4096, "activation": "swiglu", "glu_layout": "halves",
         "recipe": "fp8_blockwise", "preset": "dsv3", "seed": 1, "skew": False}
    mx = {"y": 0.0600, "dx": 0.0620, "dprobs": 0.0610, "dw1": 0.0630, "dw2": 0.0600}
    ao = {"y": 0.0660, "dx": 0.0682, "dprobs": 0.0610, "dw1": 0.0693, "dw2": math.inf}  # dw2: a NaN came out
    bf = {k: 0.0034 for k in ACC_OUTPUTS}
    return {"dump": "out/acc/dump", "problem": p, "device": "cuda", "sizes": [1024] * 4, "padded_sizes": None,
            "errors": {"mxmoe": mx, "torchao_fp8_rowwise": ao, "torch_bf16": bf}, "notes": [], "failed": {},
            "mxmoe_run": {"checks": {"y": [(0.0601, "256 sampled rows")],
                                     "dw1": [(0.063, "expert 0 (1024 rows)"), (0.0629, "expert 2 (1024 rows)")]},
                          "device": "cuda:0 (SYNTHETIC)", "description": "H=7168 F=2048 E=4 recipe=fp8_blockwise",
                          "pass": True}}


def selftest(out_dir=None):
    mx, peer = _synthetic()
    tmp = out_dir or tempfile.mkdtemp(prefix="peer_torch_selftest_")
    os.makedirs(tmp, exist_ok=True)
    src = os.path.join(tmp, "selftest_mxmoe.json")  # never clobbers a real bench.json
    with open(src, "w") as f:
        json.dump(mx, f)
    mx2 = load_mxmoe([src, src])  # merging a file with itself must not duplicate splits
    assert len(mx2["splits"]) == len(mx["splits"]), "splits merged twice"
    mx2["rows"] = mx["rows"]
    meta = {"date": "2000-01-01T00:00:00Z", "device": "SYNTHETIC GPU", "torch": "n/a", "cuda": "n/a",
            "python": sys.version.split()[0], "command": "bench/peer_torch.py --selftest", "mxmoe_json": [src],
            "warmup": 3, "iters": 10, "compile_mode": "default"}
    meta["torchao"] = TORCHAO_PIN
    acc = _synthetic_accuracy()
    md, rows = write_outputs(tmp, os.path.join(tmp, "selftest_peer.md"), meta, mx2, peer, accuracy=acc)  # --out too
    # checks
    n_expected = sum(1 for r in mx["rows"] if r["op"] in FLOP_FACTOR)
    assert len(rows) == n_expected, (len(rows), n_expected)
    table = md.split("## All rows")[1]
    n_lines = sum(1 for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| preset"))
    assert n_lines == n_expected, (n_lines, n_expected)
    r = next(r for r in rows if r["preset"] == "dsv3" and r["split"] == "balanced" and r["recipe"] == "bf16"
             and r["op"] == "fc1_fprop")
    assert abs(r["eager_ratio"] - 0.5) < 1e-9, r["eager_ratio"]  # 300 vs 600 TFLOP/s
    assert abs(r["mxmoe_tflops"] - 300) < 1e-6, r["mxmoe_tflops"]
    r = next(r for r in rows if r["preset"] == "dsv3" and r["split"] == "skew" and r["recipe"] == "mxfp8"
             and r["op"] == "layer_fwd_bwd")
    assert abs(r["compile_ratio"] - 180 / 320) < 1e-9 and abs(r["eager_ratio"] - 180 / 480) < 1e-9
    assert "| dsv3 | balanced | layer_fwd_bwd | bf16 | " in md
    assert "memory pool keeps its reserved memory across calls" in md, "the pool line is missing"
    assert "error: BackendCompilerFailed: inductor / raised something" in md, "error text not in the cell"
    assert "## Peer errors" in md and "fc2_wgrad (eager)" in md
    assert "mxmoe's JSON carries no peak-memory field" in md
    assert "quantize_x" not in table
    # fp8_blockwise rows: their section, with the bar verdicts and the FP8 row-wise ratio (1200 vs 1000)
    fp8_sec = md.split("## FP8-blockwise GEMMs")[1].split("## All rows")[0]
    assert "| dsv3 | balanced | fc1_fprop | fp8_blockwise_pow2 | " in fp8_sec and "1.8 meets" in fp8_sec, fp8_sec
    r = next(r for r in rows if r["recipe"] == "fp8_blockwise_pow2" and r["op"] == "fc2_wgrad" and r["split"] == "skew")
    assert abs(r["fp8_ratio"] - 1.2) < 1e-9 and abs(r["eager_ratio"] - 2.0) < 1e-9, r
    # ... and the layer rows against the BF16 layers, with the 1.7 bar
    fp8_layer_sec = md.split("## FP8-blockwise layer")[1].split("## All rows")[0]
    r = next(r for r in rows if r["recipe"] == "fp8_blockwise_pow2" and r["op"] == "layer_fwd_bwd" and r["split"] == "skew")
    assert r["compile_ratio"] is not None and r["compile_ratio"] >= 1.7, r
    assert "| dsv3 | skew | layer_fwd_bwd | fp8_blockwise_pow2 | " in fp8_layer_sec and "1.7 meets" in fp8_layer_sec, \
        fp8_layer_sec
    # torchao's FP8 row-wise layer: its section (before "All rows"), the 1.15 bar on fp8 fwd+bwd rows only
    assert md.index("## Layer against torchao's FP8 row-wise MoE layer") < md.index("## All rows")
    ao_sec = md.split("## Layer against torchao's FP8 row-wise MoE layer")[1].split("## ")[0]
    r = next(r for r in rows if r["recipe"] == "fp8_blockwise_pow2" and r["op"] == "layer_fwd_bwd"
             and r["split"] == "balanced")
    assert abs(r["torchao_ratio"] - 1200 / 1000) < 1e-9 and r["target_vs_torchao"] == TORCHAO_LAYER_TARGET, r
    assert "| dsv3 | balanced | layer_fwd_bwd | fp8_blockwise_pow2 | " in ao_sec, ao_sec
    assert "| 1.20 | 1.15 meets |" in ao_sec, ao_sec
    r = next(r for r in rows if r["recipe"] == "fp8_blockwise_pow2" and r["op"] == "layer_fwd_bwd_prepared"
             and r["split"] == "skew")
    assert r["torchao_ratio"] is not None and "| dsv3 | skew | layer_fwd_bwd_prepared | fp8_blockwise_pow2 | " in ao_sec
    r = next(r for r in rows if r["recipe"] == "fp8_blockwise_pow2" and r["op"] == "layer_fwd" and r["split"] == "skew")
    assert abs(r["torchao_ratio"] - 1200 / 900) < 1e-9 and "target_vs_torchao" not in r, r
    r = next(r for r in rows if r["recipe"] == "bf16" and r["op"] == "layer_fwd_bwd" and r["preset"] == "dsv3")
    assert abs(r["torchao_ratio"] - 300 / 1000) < 1e-9 and "target_vs_torchao" not in r, r  # no bar for bf16
    assert not any(r.get("torchao_cell") for r in rows if r["op"] in GEMM_OPS)
    assert "| dsv3 | balanced | layer_fwd_bwd | bf16 | " not in ao_sec, "bf16 rows belong in All rows only"
    assert "torchao_fp8_layer_fwd_bwd (compile): `AssertionError: B must be column-major`" in md, "torchao error note"
    assert "| error: AssertionError: B must be column-major |  |" in md.split("## All rows")[1], "torchao error cell"
    assert "torchao fp8 row-wise peak" in md and "| 5000 |" in md, "torchao memory column missing"
    assert f"torchao {TORCHAO_PIN} (pinned {TORCHAO_PIN})" in md and TORCHAO_FN in md
    # the accuracy table: mxmoe vs torchao vs fp64, ratios, mxmoe run's own checks; inf shown, None in JSON
    acc_sec = md.split("## Error against fp64 on the same inputs")[1].split("## All rows")[0]
    assert "| y | 6.000e-02 | 6.600e-02 | 1.10 | 3.400e-03 | 6.010e-02 (256 sampled rows) |" in acc_sec, acc_sec
    assert "| dw2 | 6.000e-02 | inf (NaN/Inf in the output) |  |" in acc_sec, acc_sec
    assert "6.300e-02 (expert 0 (1024 rows)); 6.290e-02 (expert 2 (1024 rows))" in acc_sec
    assert "1.00-1.10 over the 4 outputs, geometric mean 1.07 (torchao's error 7% more)" in acc_sec, acc_sec
    md_acc = accuracy_markdown_page(meta, acc)
    assert md_acc.startswith("# mxmoe and torchao's FP8 row-wise layer against fp64") and "| dprobs |" in md_acc
    with open(os.path.join(tmp, "peer.json")) as f:
        pj = json.load(f)
    assert pj["accuracy"]["errors"]["torchao_fp8_rowwise"]["dw2"] is None, "inf must become null in peer.json"
    assert len(pj["rows"]) == n_expected and pj["peer"][0]["ops"]["fc1_fprop"]["eager"]["ms"] > 0
    png = os.path.join(tmp, "bench.png")
    chart_ok = os.path.exists(png) and os.path.getsize(png) > 1000
    if pj.get("chart_note"):
        print(f"selftest: {pj['chart_note']}")
    # with an mxmoe peak field the memory columns appear
    for row in mx2["rows"]:
        if row["op"] == "layer_fwd_bwd":
            row["peak_bytes"] = 4224 * MIB
    md2, _ = write_outputs(None, None, meta, mx2, peer, with_chart=False)
    assert "mxmoe bf16 peak" in md2 and "| 4224 | 4224 |" in md2, "mxmoe peak column missing"
    assert "torch" not in sys.modules, "the report path imported torch"
    print(md)
    print(f"\nselftest: {len(rows)} rows, markdown + peer.json in {tmp}, chart "
          f"{'written (%d bytes)' % os.path.getsize(png) if chart_ok else 'NOT written'}")
    print("selftest: OK")
    return 0


# ----------------------------------------------------------------------------------------------

def _torchao_version():
    try:
        import torchao
        return torchao.__version__
    except Exception as e:  # noqa: BLE001
        return f"not importable ({_err(e)})"


def _json_safe(v):
    """inf/NaN -> None, recursively (JSON has neither)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    return v


def accuracy_markdown_page(meta, acc):
    L = ["# mxmoe and torchao's FP8 row-wise layer against fp64", ""]
    for k in ("date", "device", "torch", "torchao", "git", "command"):
        if meta.get(k):
            L.append(f"- {k}: {meta[k]}")
    L.append("")
    return "\n".join(L + build_accuracy_markdown(acc))


def accuracy_main(args, torch):
    """--accuracy without --mxmoe-json: accuracy.md and accuracy.json (out-dir), or --out."""
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "device": _device_text(torch) if torch.cuda.is_available() else "cpu", "torch": torch.__version__,
            "torchao": _torchao_version(), "git": _git_describe(),
            "command": "python3 " + " ".join(shlex.quote(a) for a in sys.argv)}
    acc = accuracy_run(args.accuracy, args)
    md = accuracy_markdown_page(meta, acc)
    if args.out_dir:
        with open(os.path.join(args.out_dir, "accuracy.json"), "w") as f:
            json.dump({"meta": meta, "accuracy": _json_safe(acc)}, f, indent=1)
        with open(os.path.join(args.out_dir, "accuracy.md"), "w") as f:
            f.write(md + "\n")
    if args.out:
        with open(args.out, "w") as f:
            f.write(md + "\n")
    print(md)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mxmoe-json", nargs="+", help="JSON file(s) written by `mxmoe bench --json` (merged)")
    ap.add_argument("--out-dir", default=None, help="write peer.json, bench.md and bench.png here")
    ap.add_argument("--out", default=None, help="also write the markdown to this file (old interface)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile-mode", default="default",
                    help="torch.compile mode: default | reduce-overhead | max-autotune | ...")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    ap.add_argument("--time-budget", type=float, default=0,
                    help="seconds; once spent, remaining splits skip torch.compile (0: no limit)")
    ap.add_argument("--round-all", action="store_true",
                    help="run the m-grouped GEMMs on the 16-rounded split too (default: mxmoe's exact split)")
    ap.add_argument("--only", default=None, help="comma-separated presets to measure (default: every split)")
    ap.add_argument("--no-fp8", action="store_true",
                    help="skip the torch._scaled_grouped_mm FP8 row-wise GEMMs (measured when mxmoe's JSON has "
                         "fp8_blockwise rows)")
    ap.add_argument("--torchao", choices=("auto", "on", "off"), default="auto",
                    help=f"torchao's FP8 row-wise layer ({TORCHAO_FN}, torchao {TORCHAO_PIN}) beside every split: "
                         "auto = where mxmoe's JSON has fp8_blockwise rows")
    ap.add_argument("--accuracy", metavar="DUMP_DIR", default=None,
                    help="errors against fp64 of mxmoe (its dumped outputs), torchao's FP8 row-wise layer and the "
                         "BF16 layer, on the inputs `mxmoe run --dump DUMP_DIR` wrote; alone -> accuracy.md/.json, "
                         "with --mxmoe-json -> a section of bench.md")
    ap.add_argument("--mxmoe-run-json", default=None,
                    help="with --accuracy: the `mxmoe run --json` of the dumped run (its own fp64 checks, "
                         "shown beside)")
    ap.add_argument("--accuracy-device", default=None, help="with --accuracy: cuda (default where present) or cpu")
    ap.add_argument("--selftest", action="store_true", help="build the report from synthetic JSON (no torch/GPU)")
    args = ap.parse_args()
    if args.selftest:
        return selftest(args.out_dir)
    if not args.mxmoe_json and not args.accuracy:
        ap.error("--mxmoe-json or --accuracy is required (or --selftest)")
    if args.iters < 10:
        print(f"note: --iters {args.iters} < 10", file=sys.stderr)
    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
    mx = load_mxmoe(args.mxmoe_json) if args.mxmoe_json else None
    has_fp8 = bool(mx) and any(str(r.get("recipe", "")).startswith("fp8_blockwise") for r in mx["rows"])
    args.fp8 = not args.no_fp8 and has_fp8
    args.torchao = args.torchao == "on" or (args.torchao == "auto" and has_fp8)

    import torch
    if args.accuracy and not args.mxmoe_json:
        return accuracy_main(args, torch)
    if not torch.cuda.is_available():
        print("peer_torch: no CUDA device visible to torch", file=sys.stderr)
        return 2
    accuracy = None
    if args.accuracy:
        print(f"accuracy: {args.accuracy}", file=sys.stderr, flush=True)
        accuracy = accuracy_run(args.accuracy, args)
        torch.cuda.empty_cache()
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": _device_text(torch),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "command": "python3 " + " ".join(shlex.quote(a) for a in sys.argv),
        "mxmoe_json": args.mxmoe_json,
        "warmup": args.warmup,
        "iters": args.iters,
        "compile_mode": "off" if args.no_compile else args.compile_mode,
        "m_grouped_offsets": "rounded16" if args.round_all else "exact",
        "git": _git_describe(),
    }
    if args.torchao or args.accuracy:
        meta["torchao"] = _torchao_version()
    print(f"device: {meta['device']}, torch {meta['torch']}, CUDA {meta['cuda']}"
          + (f", torchao {meta['torchao']}" if "torchao" in meta else ""), file=sys.stderr)
    args._compiled = {}
    args._compiled_ao = {}
    t0 = time.monotonic()

    def over_budget():
        return args.time_budget > 0 and time.monotonic() - t0 > args.time_budget

    only = set(args.only.split(",")) if args.only else None
    peer_splits = []
    for split in mx["splits"]:
        if only and split["preset"] not in only:
            continue
        label = f"{split['preset']} {split['split']}"
        print(f"peer: {label} (T={split['tokens']} H={split['hidden']} F={split['ffn']} E={split['experts']}) "
              f"t={time.monotonic() - t0:.0f}s", file=sys.stderr, flush=True)
        try:
            rec = peer_split(split, args, over_budget)
        except Exception as e:  # noqa: BLE001
            act, layout = glu_of(split)
            rec = {"preset": split["preset"], "split": split["split"], "activation": act, "glu_layout": layout,
                   "ops": {op: {"eager": {"error": _err(e)}} for op in ALL_OPS}, "memory": {},
                   "error": traceback.format_exc(limit=4)}
        peer_splits.append(rec)
        for op in ALL_OPS + list(AO_OPS.values()):
            for v, c in rec["ops"].get(op, {}).items():
                print(f"  {op:14s} {v:8s} {_cell_text(c)[0]}", file=sys.stderr, flush=True)
        try:
            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001
            pass
        # partial results survive a kill: numbers and markdown after every split, the chart at the end
        write_outputs(args.out_dir, args.out, meta, mx, peer_splits, with_chart=False, accuracy=accuracy)
    meta["peer_wall_s"] = round(time.monotonic() - t0, 1)
    md, _ = write_outputs(args.out_dir, args.out, meta, mx, peer_splits, with_chart=True, accuracy=accuracy)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
